"""One step of DP-SGD as a pessimistic privacy-loss distribution on a grid: the
hockey-stick curve of the Gaussian pair (Balle & Wang 2018), connect-the-dots
discretisation (Doroshenko et al. 2022), and the single-step PLDs of the
Poisson-subsampled Gaussian in both directions of add/remove-one. The fast PLD
(:mod:`service.privacy.calibrate.fast_pld`) composes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy import special

__all__ = [
    "MAX_GRID",
    "FastPldUnavailable",
    "GridPld",
    "add_step_pld",
    "log_gaussian_delta",
    "remove_step_pld",
]


class FastPldUnavailable(Exception):
    """The fast PLD cannot give a sound answer within its limits (grid too large, or the
    floating-point allowance would eat too much of δ). Callers fall back (never guess)."""


MAX_GRID: Final[int] = 1 << 21
"""Largest single-step support or FFT length the fast PLD accepts (16 MiB per array)."""


@dataclass(frozen=True)
class GridPld:
    """Privacy-loss masses under the first distribution P of a pair (P, Q): ``probs[i]``
    at loss (``lower`` + i)·h nats, plus ``inf_mass`` at +∞ (mass where Q vanishes, or
    put there pessimistically)."""

    lower: int
    probs: np.ndarray
    inf_mass: float
    entry_error: float = 0.0  # bound on |probs[i] − exact| for every i (rounding)
    l2_error: float = 0.0  # bound on the ℓ2 norm of probs − exact (rounding)


def log_gaussian_delta(eta: np.ndarray, mu: float | np.ndarray) -> np.ndarray:
    """log δ_μ(η) of the Gaussian pair (N(μ, 1), N(0, 1)) at ε = η (any real η):

        δ_μ(η) = Φ(μ/2 − η/μ) − e^η Φ(−μ/2 − η/μ)

    (Balle & Wang 2018, "Improving the Gaussian Mechanism for Differential Privacy",
    Thm. 8). Evaluated as e^a (1 − e^{b−a}) with a, b the logs of the two terms
    (scipy's log_ndtr), so tiny δ keep their relative accuracy (the difference of the
    two Φ terms would lose it); −inf where δ = 0. ``mu`` may also be an array of the
    shape of ``eta`` (elementwise).
    """
    a = special.log_ndtr(0.5 * mu - eta / mu)
    b = eta + special.log_ndtr(-0.5 * mu - eta / mu)
    with np.errstate(divide="ignore"):
        return np.asarray(a + np.log(-np.expm1(np.minimum(b - a, 0.0))))


def _connect_the_dots(lower: int, deltas: np.ndarray, h: float) -> GridPld:
    """Pessimistic PLD on the grid from the hockey-stick values δ(ε_i) at ε_i = (lower+i)·h.

    Connect-the-dots (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022, "Connect the
    Dots: Tighter Discrete Approximations of Privacy Loss Distributions", PETS, Alg. 1;
    the same closed form as dp_accounting's create_pmf_pessimistic_connect_dots_fixed_gap):

        p_1 = 1 − δ_1 + (δ_2 − δ_1)/(e^h − 1),
        p_i = ((δ_{i+1} − δ_i) − e^h (δ_i − δ_{i−1}))/(e^h − 1),   1 < i < n,
        p_n = (δ_n − δ_{n−1})/(e^{−h} − 1),      mass δ_n at +∞.

    Its hockey-stick curve interpolates the δ_i linearly in e^ε, which lies above the
    true (convex in e^ε) curve, and below ε_1 it dominates as well (their Thm. 3.3), so
    the discrete pair dominates the mechanism for every ε, negative ones included — what
    composition needs (Zhu, Dong & Wang 2022, "Optimal Accounting of Differential
    Privacy via Characteristic Function", Thm. 10). As in dp_accounting, δ is made
    non-increasing and tiny negative masses from rounding are clipped to 0.
    """
    if not np.all(np.isfinite(deltas)):
        raise FastPldUnavailable("non-finite hockey-stick values")
    d = np.minimum.accumulate(deltas)
    diff = np.diff(d)
    em1 = math.expm1(h)
    p = np.empty_like(d)
    p[0] = 1.0 - d[0] + diff[0] / em1
    p[1:-1] = (diff[1:] - diff[:-1] * math.exp(h)) / em1
    p[-1] = diff[-1] / math.expm1(-h)
    return GridPld(lower=lower, probs=np.maximum(p, 0.0), inf_mass=float(d[-1]))


def _grid(lo: float, hi: float, h: float) -> tuple[int, np.ndarray]:
    k_lo, k_hi = math.floor(lo / h), math.ceil(hi / h)
    k_hi = max(k_hi, k_lo + 2)
    if k_hi - k_lo + 1 > MAX_GRID:
        raise FastPldUnavailable(f"single-step PLD needs {k_hi - k_lo + 1} grid points")
    return k_lo, np.arange(k_lo, k_hi + 1, dtype=np.float64) * h


def remove_step_pld(q: float, sigma: float, h: float, tail: float) -> GridPld:
    """One step, 'remove' direction: P = (1−q)N(0, σ²) + qN(1, σ²) against Q = N(0, σ²)
    (the dominating pair of the Poisson-subsampled Gaussian under add/remove-one, as in
    dp_accounting; Zhu, Dong & Wang 2022, Prop. 30).

    Hockey stick: P − e^ε Q = q (N(1, σ²) − e^{ε'} N(0, σ²)) with
    e^{ε'} = 1 + (e^ε − 1)/q, so δ(ε) = q δ_{1/σ}(ε') for ε > log(1 − q), and
    δ(ε) = 1 − e^ε below (P − e^ε Q ≥ 0 everywhere; Balle, Barthe & Gaboardi 2018,
    "Privacy Amplification by Subsampling", Thm. 8, for the same identity). The loss
    is ≥ log(1 − q), so the grid starts at the last point below it (exact); it stops
    where δ ≤ ``tail`` (that mass goes to +∞). q = 1: the plain Gaussian pair, the grid
    cut at the P-quantiles ``tail`` of its loss N(μ²/2, μ²), μ = 1/σ.
    """
    mu = 1.0 / sigma
    if q == 1.0:
        z = -float(special.ndtri(tail))
        k_lo, eps = _grid(0.5 * mu * mu - z * mu, 0.5 * mu * mu + z * mu, h)
        return _connect_the_dots(k_lo, np.exp(log_gaussian_delta(eps, mu)), h)
    log_1mq, log_q = math.log1p(-q), math.log(q)
    z = -float(special.ndtri(min(tail / q, 0.5)))
    eps_hi = float(np.logaddexp(log_1mq, log_q + mu * (0.5 * mu + z)))
    k_lo, eps = _grid(log_1mq, eps_hi, h)
    deltas = -np.expm1(np.minimum(eps, 0.0))  # the exact value at ε ≤ log(1 − q)
    # ε' = log(1 + (e^ε − 1)/q), in a form that neither overflows (ε > 0) nor cancels
    ratio = np.where(eps <= 0.0, np.expm1(np.minimum(eps, 0.0)) / q, 0.0)
    above = (ratio > -1.0) | (eps > 0.0)  # > −1 ⇔ ε > log(1 − q); rounding may disagree
    e = eps[above]
    eps_prime = np.where(
        e <= 0.0,
        np.log1p(np.maximum(ratio[above], -1.0)),
        e - log_q + np.log1p(-(1.0 - q) * np.exp(-np.maximum(e, 0.0))),
    )
    deltas[above] = np.exp(log_q + log_gaussian_delta(eps_prime, mu))
    return _connect_the_dots(k_lo, deltas, h)


def add_step_pld(q: float, sigma: float, h: float, tail: float) -> GridPld:
    """One step, 'add' direction: P = N(0, σ²) against Q = (1−q)N(0, σ²) + qN(1, σ²).

    P − e^ε Q = e^ε q (c N(0, σ²) − N(1, σ²)) with c = (e^{−ε} − 1 + q)/q, so for
    ε < −log(1 − q) (c > 0), by the reflection x ↦ 1 − x,
    δ(ε) = q e^{ε − η} δ_{1/σ}(η) with η = −log c; δ = 0 from −log(1 − q) on (the
    largest loss). The grid starts where P(loss ≤ ε_1) ≤ ``tail`` (mass below is moved
    up to ε_1 by connect-the-dots: pessimistic).
    """
    mu = 1.0 / sigma
    log_1mq, log_q = math.log1p(-q), math.log(q)
    z = -float(special.ndtri(tail))
    # loss at x = σz: −log(1 − q + q·exp((2σz − 1)/(2σ²)))
    eps_lo = -float(np.logaddexp(log_1mq, log_q + (2.0 * sigma * z - 1.0) * 0.5 * mu * mu))
    top = -log_1mq
    k_lo, eps = _grid(min(eps_lo, top - 2.0 * h), top, h)
    deltas = np.zeros_like(eps)  # the exact value at ε ≥ −log(1 − q)
    # η = −log(1 + (e^{−ε} − 1)/q), in a form that neither overflows (ε < 0) nor cancels
    ratio = np.where(eps >= 0.0, np.expm1(-np.maximum(eps, 0.0)) / q, 0.0)
    below = (ratio > -1.0) | (eps < 0.0)  # > −1 ⇔ ε < −log(1 − q); rounding may disagree
    e = eps[below]
    eta = np.where(
        e >= 0.0,
        -np.log1p(np.maximum(ratio[below], -1.0)),
        e + log_q - np.log1p(-(1.0 - q) * np.exp(np.minimum(e, 0.0))),
    )
    finite = np.isfinite(eta)  # η = +∞ where rounding puts ε at the top: δ = 0 there
    part = np.zeros_like(e)
    part[finite] = np.exp(log_q + e[finite] - eta[finite] + log_gaussian_delta(eta[finite], mu))
    deltas[below] = part
    return _connect_the_dots(k_lo, deltas, h)
