"""White-box gradient canaries for the one-run audit of DP-SGD (issue 22, item 1).

The black-box audit (worker/audits.py: mislabeled rows scored by their loss) showed ε ≥ 0
on every configuration. This is the paper's white-box setting instead: Steinke, Nasr &
Jagielski 2023 ("Privacy auditing with one (1) training run", arXiv:2305.08846, its
white-box experiments: the auditor inserts canary *gradients* and sees the model's updates,
scoring a canary by its inner product with them), with the Dirac canaries of Nasr, Hayes,
Steinke, Balle, Tramèr, Jagielski, Carlini & Terzis 2023 ("Tight auditing of differentially
private machine learning", USENIX Security 2023, arXiv:2302.07956: a gradient that is zero
except on one coordinate). (The white-box section's text was not at hand when this was
written; the paper's setting is cited from its abstract and Nasr et al.)

1. **Design** (public values only): m distinct coordinates j_1 … j_m of the model's flat
   parameter vector, the m with the least public-data gradient there (Σ over the bundled
   public rows of the squared per-example gradient at a freshly built model, ties in a
   secure random order), so the data's own gradients interfere as little as they can with
   the canaries' (Nasr et al. 2023 put Dirac canaries where gradients are small for the same
   reason). Canary i is the vector 2^k·e_{j_i} on the engine's integer grid (k = the plan's
   grid_bits): a clipped per-row contribution of norm exactly C, the bound the run is
   accounted with. m ≤ the number of parameters.
2. Each canary is included independently with probability 1/2 (S_i, secure RNG).
3. ONE run of the real DP-SGD code (worker.mechanisms.dpsgd.run_dpsgd_with_canaries: the
   plan's Poisson sampler, engine, integer noise and step, as a job), the included canaries
   being rows n, n+1, … of the same Poisson sampler: in each step with probability q.
4. **Score**, from what the worker itself observed (white box): O_i = ⟨Σ_t (S_t + N_t),
   e_{j_i}⟩, the run's summed noisy gradient sums at the canary's coordinate (for SGD
   without momentum, as here, ⟨θ_0 − θ_T, e_{j_i}⟩ times the public constant
   q·n̂/(lr·C·2^−k)), the inner-product score of the white-box one-run audit. Two
   refinements for power, both functions of the public rows and the observed iterates only
   (any function of the mechanism's output keeps Theorem 3.1's guarantee):
   a. a control variate: the data's expected share given the iterates,
      M_i = Σ_t q·Σ_r clip_C(∇ℓ_r(θ_{t−1}))_{j_i}·2^k/C, is subtracted (R_i = O_i − M_i),
      with its Poisson-sampling variance V_i = Σ_t q(1 − q)·Σ_r clip_C(…)²_{j_i}·4^k/C²
      (:func:`data_moments`);
   b. the ranking is the Gaussian likelihood ratio of "in" (R ~ N(μ, v + w), μ = q·T·2^k,
      w = q(1 − q)·T·4^k the canary's own Binomial(T, q) spread) against "out"
      (R ~ N(0, v)), v = V_i + Σ_t σ_t²·4^k (Neyman–Pearson).
   An included canary adds q·T·2^k in expectation against a noise spread of σ·2^k·√T, so
   the power is about q·√T/σ = (epochs)/(σ·√T) per canary: full-batch plans (q = 1) are
   where it shows (benchmarks/results/one_run_audit_gradient.md).
5. The guesses and the bound are worker/audits.py's and service/privacy/one_run_audit.py's
   (top-k "in", bottom-k "out"; Theorem 3.1).

The scores never leave the worker: the audit returns counts and the bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from service.modelspec import ModelSpec
from service.schemas import PrivacyPlan
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.dpsgd import DpsgdParams, GradientCanaries, run_dpsgd_with_canaries
from worker.models import build_module

__all__ = [
    "CanaryScores",
    "DataMoments",
    "data_moments",
    "gradient_canary_run",
    "per_row_gradients",
    "quiet_coordinates",
]

_CHUNK = 8192  # rows per vmap call of the per-example gradients


@dataclass(frozen=True)
class CanaryScores:
    """What the guesser needs from a run (either kind of canary): each canary's score
    and whether it was in."""

    scores: np.ndarray  # (m,) float64, higher = more likely in
    included: np.ndarray  # (m,) bool, S_i


PerRowGradients = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


def per_row_gradients(module: torch.nn.Module) -> PerRowGradients:
    """(params, x, y) → the (rows, P) float64 per-example gradients of the binary
    cross-entropy (the audited models are binary), flattened in ``module.parameters()``
    order, the order of DP-SGD's flat buffer."""

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logit = functional_call(module, p, (x.unsqueeze(0),))
        return torch.nn.functional.binary_cross_entropy_with_logits(logit, y.unsqueeze(0))

    each = vmap(grad(loss), in_dims=(None, 0, 0))

    def flat(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        g = each(p, x.double(), y.double())
        return torch.cat([g[k].reshape(len(x), -1) for k in p], dim=1)

    return flat


def _unflatten(module: torch.nn.Module, theta: torch.Tensor) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for name, p in module.named_parameters():
        out[name] = theta[at : at + p.numel()].view(p.shape)
        at += p.numel()
    return out


def quiet_coordinates(
    *, spec: ModelSpec, data: TabularTrainingSet, count: int, tie_break: np.ndarray
) -> np.ndarray:
    """The ``count`` flat parameter indices where the public rows' squared per-example
    gradients, summed, are smallest at a freshly built model; ties ordered by
    ``tie_break`` (one entry per parameter). Public data and a heuristic: any choice keeps
    the audit valid."""
    module = build_module(spec, data.n_features, public_means=data.public_means).double()
    params = {k: v.detach() for k, v in module.named_parameters()}
    rows = per_row_gradients(module)
    mass = torch.zeros(sum(v.numel() for v in params.values()), dtype=torch.float64)
    for x, y in zip(data.x.split(_CHUNK), data.y.split(_CHUNK), strict=True):
        g = rows(params, x, y)
        mass += (g * g).sum(0)
    order = np.lexsort((tie_break, mass.numpy()))
    return order[:count]


@dataclass(frozen=True)
class DataMoments:
    """The data's share of the summed noisy updates at the canaries' coordinates, given the
    iterates, in the run's integer units: its conditional mean and variance."""

    mean: np.ndarray  # Σ_t E[S_t | θ_{t−1}]
    variance: np.ndarray  # Σ_t Var[S_t | θ_{t−1}] under Poisson sampling


def data_moments(
    *,
    spec: ModelSpec,
    data: TabularTrainingSet,
    iterates: list[torch.Tensor],
    coords: np.ndarray,
    sampling_rate: float,
    max_grad_norm: float,
    grid_bits: int,
) -> DataMoments:
    """Given θ_{t−1}, step t's data sum is Σ_r B_r·c_r with B_r ~ Bernoulli(q) independent and
    c_r row r's gradient clipped to C (scaled by 2^k/C), so its mean is q·Σ_r c_r and its
    variance q(1 − q)·Σ_r c_r² per coordinate; summed over the steps. Float64 per-example
    gradients of the public rows (the auditor's estimate, not the engine's exact sum)."""
    module = build_module(spec, data.n_features, public_means=data.public_means).double()
    rows = per_row_gradients(module)
    at = torch.from_numpy(coords)
    first = torch.zeros(len(coords), dtype=torch.float64)
    second = torch.zeros(len(coords), dtype=torch.float64)
    for theta in iterates:
        params = _unflatten(module, theta)
        for x, y in zip(data.x.split(_CHUNK), data.y.split(_CHUNK), strict=True):
            g = rows(params, x, y)
            weight = (max_grad_norm / g.norm(dim=1)).clamp(max=1.0).nan_to_num(1.0)
            c = g[:, at] * weight[:, None]
            first += c.sum(0)
            second += (c * c).sum(0)
    unit = 2.0**grid_bits / max_grad_norm
    q = sampling_rate
    return DataMoments(
        mean=(first * (q * unit)).numpy(), variance=(second * (q * (1 - q) * unit**2)).numpy()
    )


def gradient_canary_run(
    *,
    plan: PrivacyPlan,
    spec: ModelSpec,
    data: TabularTrainingSet,
    canaries: int,
    rng: np.random.Generator,
) -> CanaryScores:
    """Design m Dirac canaries, include each w.p. 1/2, run the plan once with them, score
    them (module text). ``data``: the public training rows (all of them: no row is a
    canary here)."""
    mech = plan.mechanism
    parameters, bits = int(mech["parameters"]), int(mech["grid_bits"])
    if not 1 <= canaries <= parameters:
        raise ValueError(f"{canaries} gradient canaries for {parameters} parameters")
    coords = quiet_coordinates(
        spec=spec, data=data, count=canaries, tie_break=rng.permutation(parameters)
    )
    included = rng.random(canaries) < 0.5  # S_i
    inside = coords[included]
    vectors = torch.zeros((len(inside), parameters), dtype=torch.int64)
    vectors[torch.arange(len(inside)), torch.from_numpy(inside)] = 1 << bits  # 2^k·e_j
    hook = GradientCanaries(vectors, grid_bits=bits)
    run_dpsgd_with_canaries(
        spec=spec, mechanism=mech, data=data, device=torch.device("cpu"), canaries=hook
    )
    observed = hook.observed[torch.from_numpy(coords)].double().numpy()
    moments = data_moments(
        spec=spec,
        data=data,
        iterates=hook.iterates,
        coords=coords,
        sampling_rate=float(mech["sampling_rate"]),
        max_grad_norm=float(mech["max_grad_norm"]),
        grid_bits=bits,
    )
    params = DpsgdParams.from_plan(mech)
    steps = len(hook.iterates)
    noise = sum((params.sigma_at(t) * 2.0**bits) ** 2 for t in range(1, steps + 1))
    # Gaussian log-likelihood ratio of "in" against "out" for the residual R = observed −
    # data mean: out, R ~ N(0, v) with v = the data's variance + the noise's; in, the
    # canary adds Binomial(T, q)·2^k, R ~ N(μ, v + w) with μ = q·T·2^k and
    # w = q(1 − q)·T·4^k (Neyman–Pearson: ranking by the likelihood ratio is the most
    # powerful test of the two, here under a Gaussian approximation; any ranking keeps
    # the bound valid, this one is chosen for power).
    q = params.sampling_rate
    mu = q * steps * 2.0**bits
    w = q * (1 - q) * steps * 4.0**bits
    v = np.maximum(moments.variance + noise, 1.0)
    r = observed - moments.mean
    llr = -0.5 * np.log1p(w / v) - (r - mu) ** 2 / (2 * (v + w)) + r * r / (2 * v)
    return CanaryScores(scores=llr, included=included)
