"""The regularised exponential mechanism for logistic regression, sampled by Hamiltonian
Monte Carlo (method ``expm``, sampler ``"mcmc"``; the plan is
service/methods/expm.py:_expm_mcmc_plan). Guarantee: **asymptotic**.

Target (Gopi, Lee & Liu 2022): π(θ) ∝ exp(−k·(Σᵢ ℓᵢ(θ) + μ‖θ‖²/2)), ℓᵢ(θ) the logistic
loss of row i with the bias, θ = (w, b), k and μ from the plan. An exact draw from π is
Gaussian-DP with the μ_GDP the plan charged; this module only has to sample π, and
neither the privacy argument nor anything here bounds how far the finite run is from π.

Algorithm (vectorised over chains, float64): HMC with ``leapfrog_steps`` leapfrog steps
and a Metropolis correction, so every transition leaves π invariant (Neal 2011, "MCMC
using Hamiltonian dynamics"). Chains start from N(0, (kμ)⁻¹·I), the regulariser's own
Gaussian, which is wider than π in every direction (π is kμ-strongly log-concave), so
that split-R̂ can detect chains that have not forgotten their start. The warm-up adapts
one step size shared by the chains (dual averaging to a mean acceptance probability of
0.8, Hoffman & Gelman 2014, Alg. 5) and, twice (:func:`metric_updates`), a dense metric,
the inverse of the target's Hessian averaged over the chains' states (:class:`Metric`).
Both are frozen afterwards: the sampling iterations run one fixed π-invariant kernel, so
the law of each final state tends to π as ``steps`` grows, whatever the warm-up chose.
The warm-up reads private rows; that is covered by the same asymptotic claim (the limit
is π for any frozen kernel), not by a proof of the finite run.

The release is the final state of chains 0 … samples − 1 (independent chains). The
rank-normalised split-R̂ and bulk ESS of every coordinate and of the log-density, and the
acceptance rate, are enclave diagnostics (MechanismOutput.enclave_diagnostics): they are
derived from private rows and stay in the enclave's log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from service.modelspec import ModelSpec
from worker.mechanisms.base import MechanismOutput, PlanMismatch, ProgressFn, TabularTrainingSet
from worker.mechanisms.guards import nonnegative_finite, positive_finite
from worker.mechanisms.mcmc_diagnostics import rhat_and_ess_by_coordinate
from worker.models import build_module
from worker.rng import secure_generator

TARGET_ACCEPTANCE = 0.8
MAX_KEPT_DRAWS = 1000  # per chain, for the diagnostics (thinned beyond that)
MIN_WARMUP_FOR_METRIC = 20


def metric_updates(warmup: int) -> tuple[int, ...]:
    """Warm-up iterations after which the metric is re-estimated at the chains' states:
    W/4 (the chains have left their start) and 3W/4 (they have moved under the first
    metric); the last quarter tunes the step size alone. None for a warm-up under 20."""
    if warmup < MIN_WARMUP_FOR_METRIC:
        return ()
    return (warmup // 4 - 1, 3 * warmup // 4 - 1)


@dataclass(frozen=True)
class McmcParams:
    """The plan's public values that the run may depend on (and nothing else)."""

    chains: int
    steps: int
    warmup: int
    leapfrog_steps: int
    step_size: float
    l2: float
    inverse_temperature: float
    parameters: int
    row_norm_sq_bound: int

    def __post_init__(self) -> None:
        # π is μ-GDP with μ = √(B·k/l2) only for k > 0 and l2 > 0 (Gopi, Lee & Liu 2022).
        positive_finite(
            "expm mcmc",
            chains=self.chains,
            steps=self.steps,
            leapfrog_steps=self.leapfrog_steps,
            step_size=self.step_size,
            l2=self.l2,
            inverse_temperature=self.inverse_temperature,
            parameters=self.parameters,
            row_norm_sq_bound=self.row_norm_sq_bound,
        )
        nonnegative_finite("expm mcmc", warmup=self.warmup)

    @classmethod
    def from_plan(cls, mechanism: dict[str, Any]) -> McmcParams:
        if mechanism.get("sampler") != "mcmc":
            raise PlanMismatch(f"not an MCMC plan: sampler {mechanism.get('sampler')!r}")
        params = cls(
            chains=int(mechanism["chains"]),
            steps=int(mechanism["steps"]),
            warmup=int(mechanism["warmup"]),
            leapfrog_steps=int(mechanism["leapfrog_steps"]),
            step_size=float(mechanism["step_size"]),
            l2=float(mechanism["l2"]),
            inverse_temperature=float(mechanism["inverse_temperature"]),
            parameters=int(mechanism["parameters"]),
            row_norm_sq_bound=int(mechanism["row_norm_sq_bound"]),
        )
        if params.l2 <= 0 or params.inverse_temperature <= 0:
            raise PlanMismatch("the MCMC target needs k > 0 and l2 > 0")
        return params


def checked_rows(x: Tensor, *, norm_sq_bound: int) -> Tensor:
    """(n, d + 1) float64: the features and the bias column 1, after checking what the
    plan's Lipschitz constant G = √B assumed: x ∈ [0, 1] and ‖(x, 1)‖² ≤ B for every row
    (raises :class:`PlanMismatch`). The check is exact in effect: a row of 0/1 entries sums
    exactly, and a float32 entry strictly inside (0, 1) is below 1 − 5·10⁻⁸, far more
    than float64's rounding of the sum."""
    if x.shape[0] and (float(x.min()) < 0.0 or float(x.max()) > 1.0):
        raise PlanMismatch("encoded features outside [0, 1]")
    rows = torch.cat(
        [x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64, device=x.device)], 1
    )
    if bool(((rows * rows).sum(dim=1) > norm_sq_bound).any()):
        raise PlanMismatch("an encoded row exceeds the schema's norm bound")
    return rows


class HmcTarget(Protocol):
    """What :func:`sample_hmc` needs of a target: its rows (device, and d + 1 = the
    parameter count), log π and its gradient for a batch of chains, and an SPD
    approximation of −∇² log π averaged over chains (the metric's precision)."""

    @property
    def rows(self) -> Tensor: ...

    def log_density_and_grad(self, theta: Tensor) -> tuple[Tensor, Tensor]: ...

    def mean_hessian(self, theta: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class LogisticTarget:
    """log π(θ) = −k·(Σᵢ [softplus(θ·xᵢ) − yᵢ·θ·xᵢ] + μ‖θ‖²/2) + const, for a batch of
    chains θ (chains, d + 1); ``rows`` carries the bias column."""

    rows: Tensor  # (n, d + 1) float64
    y: Tensor  # (n,) float64
    inverse_temperature: float
    l2: float

    def log_density_and_grad(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        z = theta @ self.rows.T  # (chains, n)
        loss = (torch.nn.functional.softplus(z) - self.y * z).sum(dim=1)
        grad_loss = (torch.sigmoid(z) - self.y) @ self.rows
        k = self.inverse_temperature
        log_p = -k * (loss + 0.5 * self.l2 * (theta * theta).sum(dim=1))
        return log_p, -k * (grad_loss + self.l2 * theta)

    def mean_hessian(self, theta: Tensor) -> Tensor:
        """The Hessian of −log π averaged over the chains θ (chains, d + 1):
        k·(Σᵢ s̄ᵢ·xᵢxᵢᵀ + μ·I), s̄ᵢ the chains' mean of σ(zᵢ)(1 − σ(zᵢ))."""
        p = torch.sigmoid(theta @ self.rows.T)
        weights = (p * (1.0 - p)).mean(dim=0)
        eye = torch.eye(self.rows.shape[1], dtype=self.rows.dtype, device=self.rows.device)
        return self.inverse_temperature * ((self.rows.T * weights) @ self.rows + self.l2 * eye)


@dataclass
class _DualAveraging:
    """Step-size adaptation of Hoffman & Gelman (2014), Algorithm 5 (their constants)."""

    step_size: float
    gamma: float = 0.05
    t0: float = 10.0
    kappa: float = 0.75

    def __post_init__(self) -> None:
        self.mu = math.log(10.0 * self.step_size)
        self.h_bar = 0.0
        self.log_avg = 0.0
        self.m = 0

    def update(self, accept_prob: float) -> float:
        self.m += 1
        w = 1.0 / (self.m + self.t0)
        self.h_bar = (1.0 - w) * self.h_bar + w * (TARGET_ACCEPTANCE - accept_prob)
        log_step = self.mu - math.sqrt(self.m) / self.gamma * self.h_bar
        eta = self.m**-self.kappa
        self.log_avg = eta * log_step + (1.0 - eta) * self.log_avg
        self.step_size = math.exp(log_step)
        return self.step_size

    @property
    def final(self) -> float:
        return math.exp(self.log_avg) if self.m else self.step_size


@dataclass(frozen=True)
class HmcRun:
    """The chains' final states and what the diagnostics need (enclave only)."""

    final: Tensor  # (chains, d + 1) float64, CPU
    draws: np.ndarray  # (chains, kept, d + 1): post-warm-up draws, thinned
    log_density: np.ndarray  # (chains, kept)
    acceptance_rate: float  # mean acceptance probability after the warm-up
    step_size: float
    divergent: int  # post-warm-up transitions with a non-finite energy


@dataclass(frozen=True)
class Metric:
    """HMC's inverse mass matrix Σ (momentum p ~ N(0, Σ⁻¹), kinetic energy ½·pᵀΣp), dense.

    Adapted as the inverse of the target's Hessian averaged over the chains' states (a
    Laplace-type metric, exact for a Gaussian target): it captures the directions that
    only the regulariser constrains, which a covariance estimated from a short warm-up of
    a few chains cannot (with a one-hot encoding, the sum of a categorical column's levels
    equals the bias column, and rare levels carry little data, so many directions have
    the regulariser's spread 1/√(kμ) while others are tight)."""

    scale: Tensor  # Σ, (d, d)
    cholesky: Tensor  # L with Σ = LLᵀ

    @classmethod
    def identity(cls, dim: int, device: torch.device) -> Metric:
        eye = torch.eye(dim, dtype=torch.float64, device=device)
        return cls(eye, eye)

    @classmethod
    def from_precision(cls, precision: Tensor) -> Metric:
        """Σ = precision⁻¹ (a symmetric positive-definite (d, d) matrix)."""
        scale = torch.cholesky_inverse(torch.linalg.cholesky(precision))
        scale = 0.5 * (scale + scale.T)
        return cls(scale, torch.linalg.cholesky(scale))

    def momentum(self, shape: torch.Size, generator: torch.Generator) -> Tensor:
        z = torch.randn(
            shape, generator=generator, dtype=self.scale.dtype, device=self.scale.device
        )
        # p = L⁻ᵀz has covariance (LLᵀ)⁻¹ = Σ⁻¹ (rows are chains).
        return torch.linalg.solve_triangular(self.cholesky.T, z.T, upper=True).T

    def velocity(self, p: Tensor) -> Tensor:
        return p @ self.scale

    def kinetic(self, p: Tensor) -> Tensor:
        return 0.5 * (p * self.velocity(p)).sum(dim=1)


def _hmc_step(
    target: HmcTarget,
    theta: Tensor,
    log_p: Tensor,
    grad: Tensor,
    *,
    step_size: float,
    leapfrog_steps: int,
    metric: Metric,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One Metropolis-corrected HMC transition for every chain. Returns the new state, its
    log-density and gradient, the acceptance probabilities and the non-finite mask."""
    momentum = metric.momentum(theta.shape, generator)
    energy0 = -log_p + metric.kinetic(momentum)
    q, p, g = theta, momentum + 0.5 * step_size * grad, grad
    for i in range(leapfrog_steps):
        q = q + step_size * metric.velocity(p)
        lp, g = target.log_density_and_grad(q)
        p = p + (step_size if i < leapfrog_steps - 1 else 0.5 * step_size) * g
    energy1 = -lp + metric.kinetic(p)
    log_accept = energy0 - energy1
    bad = ~torch.isfinite(log_accept)
    log_accept = torch.where(bad, torch.full_like(log_accept, -math.inf), log_accept)
    accept_prob = log_accept.clamp(max=0.0).exp()
    u = torch.rand(log_accept.shape, generator=generator, dtype=theta.dtype, device=theta.device)
    take = u < accept_prob
    theta = torch.where(take[:, None], q, theta)
    log_p = torch.where(take, lp, log_p)
    grad = torch.where(take[:, None], g, grad)
    return theta, log_p, grad, accept_prob, bad


def sample_hmc(
    target: HmcTarget,
    *,
    params: McmcParams,
    generator: torch.Generator,
    progress: ProgressFn,
) -> HmcRun:
    """Run the plan's ``chains`` chains for ``warmup`` + ``steps`` iterations (see the
    module docstring). ``generator`` must come from :func:`worker.rng.secure_generator`
    in a job; tests pass a seeded one."""
    device, dim = target.rows.device, target.rows.shape[1]
    prior_std = 1.0 / math.sqrt(params.inverse_temperature * params.l2)
    theta = prior_std * torch.randn(
        (params.chains, dim), generator=generator, dtype=torch.float64, device=device
    )
    log_p, grad = target.log_density_and_grad(theta)
    metric = Metric.identity(dim, device)
    adapt = _DualAveraging(params.step_size)
    step_size = params.step_size
    updates = metric_updates(params.warmup)
    thin = max(1, math.ceil(params.steps / MAX_KEPT_DRAWS))
    kept: list[Tensor] = []
    kept_lp: list[Tensor] = []
    accepted = torch.zeros((), dtype=torch.float64, device=device)
    divergent = 0
    total = params.warmup + params.steps
    for it in range(total):
        warm = it < params.warmup
        theta, log_p, grad, accept_prob, bad = _hmc_step(
            target,
            theta,
            log_p,
            grad,
            step_size=step_size,
            leapfrog_steps=params.leapfrog_steps,
            metric=metric,
            generator=generator,
        )
        if warm:
            step_size = adapt.update(float(accept_prob.mean()))
            if it in updates:
                metric = Metric.from_precision(target.mean_hessian(theta))
                adapt = _DualAveraging(step_size)
            if it == params.warmup - 1:
                step_size = adapt.final
        else:
            accepted += accept_prob.sum()
            divergent += int(bad.sum())
            if (it - params.warmup) % thin == thin - 1 or it == total - 1:
                kept.append(theta.cpu())
                kept_lp.append(log_p.cpu())
        progress(it + 1, total)
    return HmcRun(
        final=theta.cpu(),
        draws=torch.stack(kept, 1).numpy(),
        log_density=torch.stack(kept_lp, 1).numpy(),
        acceptance_rate=float(accepted) / (params.chains * params.steps),
        step_size=step_size,
        divergent=divergent,
    )


def diagnostics(run: HmcRun) -> dict[str, float]:
    """R̂ (worst coordinate and log-density), bulk ESS (smallest), acceptance: enclave only."""
    out = {
        "acceptance_rate": run.acceptance_rate,
        "step_size": run.step_size,
        "divergent_transitions": float(run.divergent),
        "draws_per_chain_kept": float(run.draws.shape[1]),
    }
    if run.draws.shape[1] >= 4:
        rhats, esses = rhat_and_ess_by_coordinate(run.draws)
        out["rhat_max"] = max(rhats)
        out["ess_bulk_min"] = min(esses)
        (rhat,), (ess,) = rhat_and_ess_by_coordinate(run.log_density[:, :, None])
        out["rhat_log_density"] = rhat
        out["ess_bulk_log_density"] = ess
    return out


def run_expm_mcmc(
    *,
    spec: ModelSpec,
    mechanism: dict[str, Any],
    samples: int,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    """`samples` final states of independent chains, as logistic state dicts, with the
    chains' diagnostics for the enclave log."""
    params = McmcParams.from_plan(mechanism)
    if samples > params.chains:
        raise PlanMismatch("more samples than chains")
    module = build_module(spec, int(data.x.shape[1]))
    if [k for k, _ in module.named_parameters()] != ["linear.weight", "linear.bias"]:
        raise PlanMismatch("the MCMC sampler is for logistic regression only")
    rows = checked_rows(data.x.to(device), norm_sq_bound=params.row_norm_sq_bound)
    if rows.shape[1] != params.parameters:
        raise PlanMismatch("the model's parameter count differs from the plan's")
    target = LogisticTarget(
        rows=rows,
        y=data.y.to(device).double(),
        inverse_temperature=params.inverse_temperature,
        l2=params.l2,
    )
    run = sample_hmc(target, params=params, generator=secure_generator(device), progress=progress)
    releases = [
        {
            "linear.weight": run.final[i, :-1].reshape(1, -1).float().clone(),
            "linear.bias": run.final[i, -1:].float().clone(),
        }
        for i in range(samples)
    ]
    return MechanismOutput(releases=releases, enclave_diagnostics=diagnostics(run))
