"""ExpM+NF: the exponential mechanism for model training, sampled through a normalizing flow.

Mechanism (McSherry & Talwar 2007; for training, Bridges, Tombs & Stanley 2023,
arXiv:2311.09200): release θ ∈ R^P with density p_D(θ) = exp(ε·u(θ; D)/s) / Z_D where

    u(θ; D) = −Σ_i (ŷ(x_i; θ) − y_i)² − λ·‖θ‖²,   ŷ = sigmoid(logit) ∈ [0, 1], y ∈ [0, 1],

s = 1 and λ > 0. This is the *monotone* calibration (no factor 1/2): it is ε-DP under the
ledger's neighbouring relation, add/remove one row, and NOT under replace-one.

Proof (add/remove one row). Let D′ = D ∪ {(x, y)}. The regulariser does not depend on the
data, so u(θ; D′) = u(θ; D) − a(θ) with a(θ) = (ŷ(x; θ) − y)² ∈ [0, 1] = [0, s] for every θ:
the utility is monotone in the data set (the case in which McSherry & Talwar 2007 drop the
factor 2 of the general calibration exp(ε·u/(2s))). The proof is self-contained:

    p_D(θ) / p_D′(θ) = exp(ε·a(θ)/s) · Z_D′ / Z_D,
    exp(ε·a(θ)/s) ∈ [1, e^ε],
    Z_D′ = ∫ exp(ε·u(θ; D)/s − ε·a(θ)/s) dθ ∈ [e^{−ε}·Z_D, Z_D],

so the ratio lies in [1·e^{−ε}, e^ε·1] for every θ: ε-DP for both directions of the
add/remove relation (removal is the same statement with D and D′ swapped). Moreover the
log-ratio ε·a(θ)/s + log(Z_D′/Z_D) is a constant plus a function of θ with values in
[0, ε], so it ranges over an interval of length ≤ ε: the mechanism is ε-bounded-range
(Durfee & Rogers 2019), which is what the ledger's ExponentialMechanismEvent assumes for
its RDP bound min(RR, α·ε²/8) (Cesar & Rogers 2021; service/privacy/rdp.py,
bounded_range_rdp).

Why the relation matters: under replace-one, u(θ; D′) − u(θ; D) = b(θ) − a(θ) ∈ [−1, 1]
takes both signs, the two bounds above no longer pair up, and exp(ε·u/s) is only
2ε-DP (the log-ratio can approach ±2ε; tests/unit/worker/test_expm_nf.py shows it exceeding
ε). The replace-one calibration would be exp(ε·u/(2s)); it is not used here.

Normalisation: Z_D must be finite for p_D to exist. The data term lies in [−n, 0], so
e^{−εn/s}·G ≤ Z_D ≤ G with G = ∫ exp(−ε·λ‖θ‖²/s) dθ = (π·s/(ε·λ))^{P/2}, finite only
because λ > 0 (a Gaussian tail). With λ = 0 the integrand is ≥ e^{−εn/s} on all of R^P
and Z_D = ∞: there is no mechanism to sample from, so :class:`ExpmNfParams` and
:class:`ExpMTarget` refuse λ ≤ 0.

Releasing k independent draws costs kε (basic composition). The sampler is pluggable
(:mod:`worker.mechanisms.samplers`); the flow sampler only approximates p_D, so the
released ε is **nominal** (no proof covers the approximation gap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from service.modelspec import GrudSpec, ModelSpec
from worker.flows import Flow, FlowConfig, grid_comparison
from worker.flows.diagnostics import GridComparison
from worker.mechanisms.base import MechanismOutput, ProgressFn, TabularTrainingSet
from worker.mechanisms.fidelity import FLOW_DRAWS, SquaredErrorTarget, flow_fidelity
from worker.mechanisms.samplers import (
    FlowSampler,
    FlowSamplerConfig,
    Guarantee,
    LogDensityTarget,
    Sampler,
)
from worker.models import BatchedModel, LinearBatchedModel, build_batched

__all__ = [
    "CALIBRATION",
    "EXPM_NF_GUARANTEE",
    "SENSITIVITY",
    "ExpMTarget",
    "ExpmNfParams",
    "exact_grid_comparison",
    "make_sampler",
    "run_expm_nf",
    "squared_error_utility",
]

# s = 1: outputs and targets in [0, 1], so adding or removing one row changes u by
# a(θ) ∈ [0, 1] for every θ, always in the same direction (see the module docstring).
SENSITIVITY = 1.0
# The calibration the target implements: density ∝ exp(ε·u/s), valid for a utility that is
# monotone under add/remove one row (module docstring). Plans may name it; see expm_job.
CALIBRATION = "monotone"
EXPM_NF_GUARANTEE: Guarantee = FlowSampler.guarantee


@dataclass(frozen=True)
class ExpmNfParams:
    """Knobs of one ExpM+NF run. ε in nats; everything else only shapes the sampler.

    The defaults were tuned on Adult (d = 104, n ≈ 30k) on a 2-core CPU (≈ 10–20 s/run);
    see benchmarks/expm_adult.py. ``affine`` appends a learnable elementwise affine layer
    (without it the flow cannot change its scale much beyond base_std, and under-disperses).
    ``init_scale`` is the affine layer's initial per-coordinate scale (None: the std of the
    regulariser-only density, sqrt(s/(2ελ)), a public quantity).
    ``l2`` = λ must be > 0: without the Gaussian tail exp(−ελ‖θ‖²/s) the density does not
    normalise (Z_D = ∞ over unbounded θ, see the module docstring), so there is no
    exponential mechanism to sample and no ε to claim.
    ``grud_public_means`` (GRU-D only) is the public per-variable mean x̄ from the schema.

    Memory: one training step keeps the autograd graph of N·b model evaluations. That is
    nothing for logistic regression, but GRU-D keeps T hidden states per (θ, row) pair:
    ≈ 55 KiB per pair at T = 48, H = 16 (benchmarks/results/grud_memory.md), so the Adult
    defaults N = 64, b = 1024 would need ≈ 3.5 GiB; use e.g. N = 32, b = 64 for GRU-D on CPU.
    """

    epsilon: float
    samples: int = 1
    flow: Literal["planar", "sylvester"] = "planar"
    layers: int = 4
    base_std: float = 1.0
    steps: int = 1500
    n_samples_per_step: int = 64
    batch_size: int = 1024
    lr: float = 2e-2
    l2: float = 1.0
    affine: bool = True
    householder_reflections: int | None = 8
    init_scale: float | None = None
    diagnostic_samples: int = 1024
    grud_public_means: tuple[float, ...] | None = None
    # The public box (−R, R)^P θ is restricted to (the ExpM target then normalises for
    # any λ ≥ 0), or None: all of R^P, where λ > 0 is needed.
    domain_radius: float | None = None

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError("epsilon must be a positive finite number")
        if self.samples < 1:
            raise ValueError("samples must be ≥ 1")
        # λ = 0 on R^P: Z_D = ∞, the ExpM density does not exist (module docstring).
        _check_l2(self.l2, self.domain_radius)
        if self.grud_public_means is not None and not all(
            math.isfinite(v) for v in self.grud_public_means
        ):
            raise ValueError("grud_public_means must be finite")
        # The remaining range checks live in the configs built below.
        self.sampler_config()

    def prior_std(self) -> float:
        """Std of the regulariser-only ExpM density exp(−ε·λ‖θ‖²/s) = N(0, s/(2ελ)·I); on a
        box, at most the box's own scale R/2 (a flat λ = 0 target fills the box)."""
        if self.l2 == 0:
            assert self.domain_radius is not None
            return self.domain_radius / 2.0
        std = math.sqrt(SENSITIVITY / (2.0 * self.epsilon * self.l2))
        return std if self.domain_radius is None else min(std, self.domain_radius / 2.0)

    def flow_config(self) -> FlowConfig:
        # Data-independent initial scale: the regulariser-only density (the target's shape
        # when the data term is flat), unless given. On a box the affine layer feeds
        # R·tanh(·), near-linear with slope R at 0, so its scale is divided by R.
        init = self.init_scale if self.init_scale is not None else self.prior_std()
        if self.domain_radius is not None and self.init_scale is None:
            init = init / self.domain_radius
        return FlowConfig(
            kind=self.flow,
            layers=self.layers,
            affine=self.affine,
            base_std=self.base_std,
            reflections=self.householder_reflections,
            affine_init_scale=init,
            domain_radius=self.domain_radius,
        )

    def sampler_config(self) -> FlowSamplerConfig:
        return FlowSamplerConfig(
            flow=self.flow_config(),
            steps=self.steps,
            n_samples_per_step=self.n_samples_per_step,
            batch_size=self.batch_size,
            lr=self.lr,
            diagnostic_samples=self.diagnostic_samples,
        )


def squared_error_utility(
    model: BatchedModel,
    theta: Tensor,
    x: Tensor,
    y: Tensor,
    *,
    l2: float,
    data_scale: float = 1.0,
) -> Tensor:
    """u(θ) = −data_scale·Σ_i (sigmoid(f(x_i; θ)) − y_i)² − λ‖θ‖² for θ (N, P) → (N,).

    All N parameter vectors in one batched computation (one matmul for logistic regression).
    ``data_scale`` = n/b turns a minibatch sum into an unbiased estimate of the full sum.
    """
    logits = model.logits(theta, x)  # (N, B)
    sq = (torch.sigmoid(logits) - y).square().sum(-1)
    return -data_scale * sq - l2 * theta.square().sum(-1)


@dataclass(frozen=True)
class ExpMTarget:
    """log p̃(θ) = (ε/s)·u(θ; D): the exponential mechanism's unnormalised log-density,
    calibrated for add/remove neighbours with a monotone utility (module docstring).

    ε in nats; λ = ``l2`` > 0 (else the density does not normalise); s = ``sensitivity``.
    """

    model: BatchedModel
    x: Tensor
    y: Tensor
    epsilon: float
    l2: float
    sensitivity: float = SENSITIVITY
    # Full-data evaluation works on blocks of (parameter vectors × rows) so memory stays
    # bounded: a linear model holds one float per pair, a recurrent one a whole sequence of
    # hidden states (see benchmarks/results/grud_memory.md).
    chunk_rows: int = 8192
    max_pairs: int | None = None
    # The public box the target lives on (None: R^P); the flow maps onto it, so its draws
    # are always inside, and :meth:`log_density` is −∞ outside.
    domain_radius: float | None = None

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError("epsilon must be a positive finite number")
        _check_l2(self.l2, self.domain_radius)
        if not (self.sensitivity > 0 and math.isfinite(self.sensitivity)):
            raise ValueError("sensitivity must be a positive finite number")

    @property
    def dim(self) -> int:
        return self.model.n_params

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def scale(self) -> float:
        """ε/s: the monotone calibration (no factor 1/2; valid under add/remove only)."""
        return self.epsilon / self.sensitivity

    def _pair_budget(self) -> int:
        if self.max_pairs is not None:
            return self.max_pairs
        return 2**24 if isinstance(self.model, LinearBatchedModel) else 2**13

    def utility(self, theta: Tensor) -> Tensor:
        """u(θ; D) on all rows, in blocks of at most ``max_pairs`` (θ, row) pairs; (N, P) →
        (N,)."""
        rows = max(1, min(self.chunk_rows, self._pair_budget() // max(1, theta.shape[0])))
        per_block = max(1, self._pair_budget() // rows)
        parts = []
        for th in theta.split(per_block):
            total = -self.l2 * th.square().sum(-1)
            for xs, ys in zip(self.x.split(rows), self.y.split(rows), strict=True):
                total = total + squared_error_utility(self.model, th, xs, ys, l2=0.0)
            parts.append(total)
        return torch.cat(parts)

    def log_density(self, theta: Tensor) -> Tensor:
        log_p = self.scale * self.utility(theta)
        if self.domain_radius is None:
            return log_p
        inside = (theta.abs() < self.domain_radius).all(dim=-1)
        return torch.where(inside, log_p, torch.full_like(log_p, -math.inf))

    def minibatch_log_density(
        self, theta: Tensor, *, batch_size: int, generator: torch.Generator
    ) -> Tensor:
        """(ε/s)·û(θ) with û the n/b-scaled sum over b rows drawn uniformly without
        replacement from ``generator``; the same rows for all N parameter vectors."""
        b = min(batch_size, self.n)
        if b == self.n:
            return self.log_density(theta)
        idx = torch.randperm(self.n, generator=generator, device=generator.device)[:b]
        idx = idx.to(self.x.device)
        u = squared_error_utility(
            self.model, theta, self.x[idx], self.y[idx], l2=self.l2, data_scale=self.n / b
        )
        return self.scale * u


def _check_l2(l2: float, domain_radius: float | None = None) -> None:
    if domain_radius is not None:
        if not (domain_radius > 0 and math.isfinite(domain_radius)):
            raise ValueError("domain_radius must be a positive finite number")
        if not (l2 >= 0 and math.isfinite(l2)):
            raise ValueError("l2 must be a finite number ≥ 0")
        return
    if not (l2 > 0 and math.isfinite(l2)):
        raise ValueError(
            "l2 must be a positive finite number: with l2 = 0 the ExpM density over "
            "unbounded parameters does not normalise"
        )


def make_sampler(params: ExpmNfParams) -> Sampler:
    """The sampler for these params (today always the flow sampler, guarantee "nominal")."""
    return FlowSampler(params.sampler_config())


def _n_features(spec: ModelSpec, params: ExpmNfParams, x: Tensor) -> int:
    if isinstance(spec, GrudSpec):
        if params.grud_public_means is None:
            raise ValueError("GRU-D needs grud_public_means from the public schema")
        return len(params.grud_public_means)
    if x.dim() != 2:
        raise ValueError("tabular models need x of shape (n, d)")
    return int(x.shape[1])


def run_expm_nf(
    *,
    spec: ModelSpec,
    params: ExpmNfParams,
    data: TabularTrainingSet,
    device: torch.device,
    generator: torch.Generator,
    progress: ProgressFn,
) -> MechanismOutput:
    """Train the flow, release ``params.samples`` draws as state dicts of build_module(spec, d).

    ``generator`` must be seeded by the caller from a CSPRNG (never an analyst's seed): it
    drives the base samples, minibatches and released draws. Releasing k draws costs kε.
    """
    y = data.y.to(device=device, dtype=torch.float32)
    if y.numel() and not bool(((y >= 0) & (y <= 1)).all()):
        # Sensitivity 1 needs targets in [0, 1]; the message stays generic on purpose.
        raise ValueError("targets outside [0, 1]")
    x = data.x.to(device=device, dtype=torch.float32)
    # The module's own initial weights are never used (θ comes from the sampler); fork the
    # global RNG so that building it leaves no trace in the process's random state.
    with torch.random.fork_rng(devices=[]):
        model = build_batched(
            spec, _n_features(spec, params, x), public_means=params.grud_public_means
        )
    model.module.to(device)
    target = ExpMTarget(
        model=model,
        x=x,
        y=y,
        epsilon=params.epsilon,
        l2=params.l2,
        domain_radius=params.domain_radius,
    )
    sampler = make_sampler(params)
    result = sampler.sample(target, k=params.samples, generator=generator, progress=progress)
    releases = [model.state_dict(theta) for theta in result.samples]
    diagnostics = dict(result.diagnostics)
    flow = getattr(sampler, "flow", None)
    if (
        isinstance(model, LinearBatchedModel)
        and flow is not None
        and params.diagnostic_samples
        and params.domain_radius is None  # the reference chains run on R^P
    ):
        # Enclave-only: the flow against an MCMC reference on the same density (issue 13).
        with torch.no_grad():
            draws = flow.rsample(FLOW_DRAWS, generator=generator).x
        rows = torch.cat(
            [x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64, device=device)], 1
        )
        reference_target = SquaredErrorTarget(
            rows=rows, y=y.double(), scale=target.scale, l2=params.l2
        )
        diagnostics.update(
            flow_fidelity(flow_draws=draws, target=reference_target, generator=generator)
        )
    return MechanismOutput(releases=releases, enclave_diagnostics=diagnostics)


def exact_grid_comparison(
    target: LogDensityTarget,
    flow: Flow,
    bounds: Sequence[tuple[float, float]],
    *,
    points_per_dim: int = 100,
) -> GridComparison:
    """The flow's density vs the exactly normalised target density on a grid (1–3
    parameters). Both are evaluated in the flow's dtype; see :func:`grid_comparison`."""
    if target.dim > 3 or target.dim != flow.dim:
        raise ValueError("grid comparisons are for targets with 1–3 parameters")
    dtype = next(flow.parameters()).dtype
    device = next(flow.parameters()).device

    def log_p(t: Tensor) -> Tensor:
        return target.log_density(t.to(device, dtype))

    def log_q(t: Tensor) -> Tensor:
        return flow.log_prob(t.to(device, dtype))

    return grid_comparison(log_p, log_q, bounds, points_per_dim=points_per_dim)
