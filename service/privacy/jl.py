"""The accounting of DP-SGD with JL-estimated per-example norms (Bu, Gopi, Kulkarni, Lee,
Shen & Tantipongpipat 2021, "Fast and Memory Efficient Differentially Private-SGD via JL
Projections", NeurIPS; "DP-SGD-JL").

The engine (worker/mechanisms/grad_engines.py) estimates the norm of example i's gradient
g_i ∈ R^P from r Jacobian-vector products with independent directions v_1 … v_r ~ N(0, I_P):

    M̂_i² = (1/r) Σ_j ⟨g_i, v_j⟩²,

and weights the example by min(1, C/M̂_i). Its contribution then has norm

    ‖g_i‖·min(1, C/M̂_i) ≤ C·‖g_i‖/M̂_i = C·R_i,

and for any fixed g_i ≠ 0 the ⟨g_i, v_j⟩/‖g_i‖ are i.i.d. N(0, 1) (rotation invariance of
the standard Gaussian), so M̂_i²/‖g_i‖² ~ χ²_r/r and R_i² ~ r/χ²_r, whatever g_i is. The
sensitivity is random and unbounded: E[exp(λ/χ²_r)] = ∞ for every λ > 0, so no finite
Rényi bound holds for the uncapped mechanism at any order (the χ²_r density is ∝ x^{r/2−1}
near 0). Two statements are made instead, both for add/remove-one neighbours:

1. **High-probability bound (the uncapped algorithm of Bu et al.)**. Fix p ∈ (0, 1) and let
   x_p be the p-quantile of χ²_r, κ = √(r/x_p). Then P(R_i > κ) = P(χ²_r < x_p) = p for
   every g_i, and the directions are drawn fresh each step, independently of the past.
   Let D' = D ∪ {x*}. Define M̃ as the same algorithm except that, in any step where x*'s
   ratio exceeds κ, x*'s contribution is scaled down to norm κC. M̃ is the Poisson-
   subsampled Gaussian mechanism with sensitivity κC (noise σC ⇒ noise multiplier σ/κ),
   conditionally on every value of the directions (a mixture over the directions of
   bounded-sensitivity Gaussians; hockey-stick divergence is jointly convex), so it has
   that mechanism's (ε, δ_g). M̃(D) = M(D) exactly (x* is absent), and M(D'), M̃(D') differ
   only on the event "x* is sampled in some step t and R_t > κ", of probability at most
   β = T·q·p (union bound; x*'s inclusion and the directions are independent). Hence
   P[M(D') ∈ S] ≤ e^ε P[M(D) ∈ S] + δ_g + β and P[M(D) ∈ S] ≤ e^ε P[M(D') ∈ S] + δ_g + e^ε·β:
   M is (ε, δ_g + e^ε·β)-DP (:func:`uncapped_delta`).
   Such a total-variation term cannot be expressed as a Rényi curve, so the ledger (an RDP
   filter, service/privacy/filters.py) could not charge it as it stands.

2. **The capped algorithm the product runs**. Where the model gives the exact norm ‖g_i‖
   cheaply (every parameter in Linear layers: the ghost norm), the worker also caps every
   example at κC: weight min(1, C/M̂_i, κC/‖g_i‖). Then the sensitivity is κC surely and the
   run *is* M̃ above: the Poisson-subsampled Gaussian with noise multiplier σ/κ, charged as
   such (its RDP curve; proven, no δ term). The cap is active for x* only on the event of
   probability ≤ β, so the capped algorithm is the algorithm of Bu et al. except on that
   event. The plan calibrates σ/κ at δ_g = δ − e^ε·β, with β = JL_DELTA_SHARE·δ/e^ε, so
   the stated (ε, δ) holds for both the capped run (by its RDP curve) and the uncapped
   analysis (by statement 1).

So at equal (ε, δ) JL adds κ times the noise of the exact engine (σ = κ·σ_exact), and is
never charged less: its charged curve is the subsampled Gaussian at σ_eff = σ/κ ≤ σ.
κ falls with r and grows as p falls; ``kappa(r, p)`` for p = 1e-7 (a typical p: δ = 1e-5,
T·q = 3): r = 1: 8.0e6, r = 5: 31.2, r = 20: 3.18, r = 64: 1.73 (unit tests pin them).
A sound JL at r = 1 is useless (its noise exceeds the sampler's range for any usable ε),
and at r = 5 it costs ~30× the noise: that is the finding, not a bug.

Assumption, stated plainly: statement 1 uses exact N(0, 1) directions. The worker draws
them in floating point from the server-side generator (worker/noise.py), so the law of R
is that of r/χ²_r only up to floating-point effects. The capped run (statement 2) does not
depend on it: its sensitivity bound holds for any directions whatever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from scipy import special

__all__ = [
    "JL_DELTA_SHARE",
    "JlBound",
    "chi2_lower_quantile",
    "jl_bound",
    "kappa",
    "uncapped_delta",
]

JL_DELTA_SHARE: Final[float] = 0.1
"""Share of the request's δ that the plan reserves for e^ε·β (statement 1 above)."""

# Relative safety margin on the computed quantile: scipy's gammaincinv/gammainc are accurate
# to ~1e-14 relative; the quantile is lowered by this much and then checked forward.
_QUANTILE_MARGIN: Final[float] = 1e-9


def chi2_lower_quantile(r: int, p: float) -> float:
    """A value x with P(χ²_r < x) ≤ p, within ~1e-9 relative of the p-quantile (never above
    it, up to scipy's accuracy of the regularised incomplete gamma, checked forward).

    Closed forms the tests compare with: r = 1: x = 2·erfinv(p)² (P(|Z| < √x) = p);
    r = 2: x = −2·log(1 − p) (χ²_2 is exponential with mean 2).
    """
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"r must be a positive integer, got {r!r}")
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    x = 2.0 * float(special.gammaincinv(r / 2.0, p)) * (1.0 - _QUANTILE_MARGIN)
    step = _QUANTILE_MARGIN
    while math.isfinite(x) and x > 0.0 and float(special.gammainc(r / 2.0, x / 2.0)) > p:
        x *= 1.0 - step  # never above the quantile; the step doubles, so this ends quickly
        step = min(2.0 * step, 0.5)
    if not (math.isfinite(x) and x > 0.0):
        raise ValueError(f"the χ² quantile underflowed for r = {r}, p = {p:g}")
    return x


def kappa(r: int, p: float) -> float:
    """κ = √(r / x_p): P(‖g‖/M̂ > κ) ≤ p for r Gaussian projections (module docstring)."""
    return math.sqrt(r / chi2_lower_quantile(r, p))


def uncapped_delta(*, delta_gaussian: float, epsilon: float, beta: float) -> float:
    """δ of the uncapped JL algorithm: δ_g + e^ε·β (statement 1 of the module docstring)."""
    return delta_gaussian + math.exp(epsilon) * beta


@dataclass(frozen=True)
class JlBound:
    """The public numbers of a JL plan (all functions of the request and public values)."""

    projections: int  # r
    tail_probability: float  # p, per (example, step)
    kappa: float  # κ = √(r / x_p)
    beta: float  # T·q·p: probability that x*'s cap is ever active
    delta_gaussian: float  # δ_g = δ − e^ε·β, what σ/κ is calibrated at


def jl_bound(
    *, projections: int, epsilon: float, delta: float, sampling_rate: float, steps: int
) -> JlBound:
    """p chosen so that e^ε·β = JL_DELTA_SHARE·δ, with β = T·q·p."""
    if not (0.0 < delta < 1.0 and epsilon > 0.0 and 0.0 < sampling_rate <= 1.0 and steps >= 1):
        raise ValueError("jl_bound needs ε > 0, δ ∈ (0, 1), q ∈ (0, 1], T ≥ 1")
    reserved = JL_DELTA_SHARE * delta
    p = reserved / (math.exp(epsilon) * steps * sampling_rate)
    if not 0.0 < p < 1.0:
        raise ValueError(f"no valid tail probability (p = {p:g})")
    beta = steps * sampling_rate * p
    return JlBound(
        projections=projections,
        tail_probability=p,
        kappa=kappa(projections, p),
        beta=beta,
        delta_gaussian=delta - math.exp(epsilon) * beta,
    )
