"""Noise calibration for one DP-SGD job, and (ε, δ) of an event by RDP or PLD.

Inside one job every parameter (q, σ, steps) is fixed before the job runs, so
the job is a non-adaptive composition and any valid accountant may be used to
*calibrate* it, PLD included. What the ledger charges is always the event's RDP
curve (filters.py); a PLD-calibrated job therefore has the (ε, δ) of its PLD
accounting as its stated guarantee, while its ledger charge is its RDP curve
(RDP ε = 1.44 vs PLD ε = 1.00 at q = 256/30162, T = 354, σ = 0.9867; the
benchmark lists both for every cell). :class:`NoiseCalibration` carries the stated ε.

Accountants (every ε they return is an upper bound on the true ε):

* ``"rdp"`` — the RDP curve on :data:`~service.privacy.orders.CALIBRATION_ORDERS`
  converted with :func:`~service.privacy.rdp.epsilon_from_rdp` (Canonne, Kamath &
  Steinke 2020, Prop. 12). All integer orders are summed at once
  (:func:`~service.privacy.rdp.subsampled_gaussian_rdp_integer_orders`); fractional
  orders, whose series is the slow part, only downhill from the best integer order
  (:func:`_rdp_epsilon_of`). A subset of orders is always a valid bound; on every case
  checked it equals the full-grid minimum (within 6e-8 relative, never below).
* ``"pld"`` — a pessimistic privacy-loss distribution, connect-the-dots discretisation
  (Doroshenko et al. 2022, "Connect the Dots") composed by FFT (Koskela, Jälkö &
  Honkela 2020), implemented here for Poisson-subsampled Gaussian trees
  (:func:`_fast_pld_epsilon`; vectorised, ~1 ms per ε instead of dp_accounting's
  30–300 ms, whose cost is a Python loop over the grid in its PLD construction) and
  by dp_accounting (Meiser & Mohammadi 2018; Doroshenko et al. 2022) for trees with
  pure leaves. Where the fast PLD is unavailable it answers with RDP, also an upper
  bound ("fall back to RDP only where PLD fails").

What is proven and what is not, for the fast PLD. Truncations of each step's loss and
of the composed window (Chernoff) put their mass at +∞; FFT aliasing only adds mass;
the rounding of the FFTs, of the powers and of the final sums is bounded explicitly
and subtracted from δ (:func:`_compose`, :func:`_epsilon_at_delta`). Not bounded: the
rounding of the single-step connect-the-dots masses (second differences of hockey-stick
values computed to ~1e-15 relative), exactly as in dp_accounting; the tests check that
our ε is never below dp_accounting's at the same grid (over 300 cases: +3e-9 … +3e-3
relative, the larger ones at δ = 1e-8 where the rounding allowance is a visible part of
δ) and never below the exact ε where one is known (q = 1; one step). If the allowances
exceed δ/8 the PLD declines (a δ of 1e-10 with thousands of steps) and RDP answers.

Discretisation. The pessimistic PLD is an upper bound at every interval h, so h only
decides how much it overshoots: :func:`pld_value_discretization` uses
h = clip(ε / (16 √steps), 1e-6, 1e-2), which keeps the calibrated σ within 0.45 % of
its limit on an 8× finer grid on every case measured (q ∈ {0.001 … 1},
T ∈ {1 … 20000}, ε ∈ {0.01 … 10}, δ = 1e-5; search tolerance included). The old clip
to [1e-5, 1e-3] was there for dp_accounting's cost; at h = 1e-5 it cost 1.0 % at
q = 0.001, T = 20000, ε = 0.01, and at ε = 10 the finer 1e-3 only made it slower.

Search (:func:`_search_sigma`). σ starts at the central-limit (μ-GDP) estimate and a
guarded secant on log ε against log σ needs 4–5 evaluations, against 12–17 for the
bisection from σ = 1 it replaces; the result is verified on both sides (ε(σ) ≤ target,
ε(σ·(1 − rel_tol)) > target, both evaluated). Everything is a deterministic function
of the inputs, so the worker re-derives bit-identical σ; :func:`calibrate` also caches
results per exact input (bounded LRU, 512 entries), and a cache hit returns the object
the miss computed. (Plans calibrated before this version have slightly different σ and
would be refused by the worker's re-derivation: an accepted, one-time cost.)

Measured (benchmarks/results/calibration.md; q = 256/30162, δ = 1e-5, 2-core container;
cold = first call in a fresh process, imports ≈ 0.3 s excluded; warm = cache hit;
gap = σ over the tightest σ we can compute, bisection on an 8× finer grid or on every
order). Before (the previous version, same grid, fresh processes): PLD 0.22–7.1 s,
RDP 0.24–6.0 s per calibration.

    accountant  T      ε: 0.01     0.1      1        10       cold      warm    gap
    pld         354    39.076   5.0549   0.98668  0.46986   6–12 ms   < 6 µs  ≤ 0.29 %
    pld         3540   123.37   15.617   2.0434   0.62076   9–11 ms   < 6 µs  ≤ 0.39 %
    rdp         354    44.948   5.5748   1.1437   0.49859   4–10 ms   < 6 µs  ≤ 0.08 %
    rdp         3540   141.84   17.216   2.1923   0.64324   3–8 ms    < 6 µs  ≤ 0.05 %
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Literal

import numpy as np
from scipy import fft as sp_fft
from scipy import special

from service.privacy.deadline import check_deadline
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
    leaf_counts,
)
from service.privacy.orders import CALIBRATION_ORDERS
from service.privacy.rdp import (
    epsilon_from_rdp,
    subsampled_gaussian_rdp,
    subsampled_gaussian_rdp_integer_orders,
)

__all__ = [
    "NOISE_MULTIPLIER_MAX",
    "NOISE_MULTIPLIER_MIN",
    "PLD_VALUE_DISCRETIZATION",
    "PLD_VALUE_DISCRETIZATION_MAX",
    "PLD_VALUE_DISCRETIZATION_MIN",
    "Accountant",
    "NoiseCalibration",
    "PldUnavailable",
    "calibrate",
    "calibrate_noise_multiplier",
    "epsilon_for",
    "pld_epsilon",
    "pld_value_discretization",
]

Accountant = Literal["rdp", "pld"]

NOISE_MULTIPLIER_MAX: Final[float] = 1e4
"""Calibration gives up (ValueError) if more noise than this would be needed."""
NOISE_MULTIPLIER_MIN: Final[float] = 1e-2
"""Calibration never returns less noise than this (more noise is always safe)."""
PLD_VALUE_DISCRETIZATION: Final[float] = 1e-3
"""Default PLD discretisation interval (nats) of :func:`pld_epsilon` and :func:`epsilon_for`."""
PLD_VALUE_DISCRETIZATION_MIN: Final[float] = 1e-6
"""Finest PLD discretisation interval (nats) calibration uses; bounds its cost."""
PLD_VALUE_DISCRETIZATION_MAX: Final[float] = 1e-2
"""Coarsest PLD discretisation interval (nats) calibration uses; bounds its overshoot."""


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float):
        raise ValueError(f"delta must be a real number, got {delta!r}")
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def _check_epsilon(epsilon: float) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise ValueError(f"epsilon must be a real number, got {epsilon!r}")
    if not (math.isfinite(float(epsilon)) and epsilon > 0.0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    return float(epsilon)


def _check_accountant(accountant: str) -> Accountant:
    if accountant == "rdp":
        return "rdp"
    if accountant == "pld":
        return "pld"
    raise ValueError(f"accountant must be 'rdp' or 'pld', got {accountant!r}")


# ---------------------------------------------------------------------- PLD


def pld_value_discretization(*, epsilon: float, steps: int) -> float:
    """PLD value_discretization_interval (nats) for calibrating ``steps`` compositions
    to a target ``epsilon`` (nats): clip(ε / (16 √steps), 1e-6, 1e-2).

    Soundness does not depend on this choice (the pessimistic PLD is an upper bound
    at every interval); tightness and cost do. See the module docstring for the
    measurements behind the constants.
    """
    eps = _check_epsilon(epsilon)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    h = eps / (16.0 * math.sqrt(steps))
    return min(PLD_VALUE_DISCRETIZATION_MAX, max(PLD_VALUE_DISCRETIZATION_MIN, h))


class PldUnavailable(ValueError):
    """The event tree has a leaf type with no PLD here (random stopping, any-of): the PLD
    ε is not available for it. Only informational figures use PLD over arbitrary events
    (admission and charges use RDP curves), so callers showing one report "not available"
    rather than fail; calibration never sees such trees."""


# ------------------------------------------------------------------ fast PLD engine


class _PldUnavailable(Exception):
    """The fast PLD cannot give a sound answer within its limits (grid too large, or the
    floating-point allowance would eat too much of δ). Callers fall back (never guess)."""


_U: Final[float] = 2.0**-53
"""Unit roundoff of IEEE double precision."""
_MAX_GRID: Final[int] = 1 << 21
"""Largest single-step support or FFT length the fast PLD accepts (16 MiB per array)."""
_STEP_TAIL: Final[float] = 1e-7
"""Per-step truncated mass, as a fraction of δ/T (it goes to +∞: costs ≤ 1e-7·δ in all)."""
_WINDOW_TAIL: Final[float] = 1e-6
"""Mass outside the composed window, as a fraction of δ (it goes to +∞ too)."""
_MAX_LOSS: Final[float] = 700.0
"""Composed losses above this (nats) are treated as +∞ (e^{±700} stays finite)."""
_MAX_ALLOWANCE: Final[float] = 1.0 / 8.0
"""Give up (fall back) if truncations and rounding allowances exceed this fraction of δ."""


@dataclass(frozen=True)
class _GridPld:
    """Privacy-loss masses under the first distribution P of a pair (P, Q): ``probs[i]``
    at loss (``lower`` + i)·h nats, plus ``inf_mass`` at +∞ (mass where Q vanishes, or
    put there pessimistically)."""

    lower: int
    probs: np.ndarray
    inf_mass: float
    entry_error: float = 0.0  # bound on |probs[i] − exact| for every i (rounding)
    l2_error: float = 0.0  # bound on the ℓ2 norm of probs − exact (rounding)


def _log_gaussian_delta(eta: np.ndarray, mu: float) -> np.ndarray:
    """log δ_μ(η) of the Gaussian pair (N(μ, 1), N(0, 1)) at ε = η (any real η):

        δ_μ(η) = Φ(μ/2 − η/μ) − e^η Φ(−μ/2 − η/μ)

    (Balle & Wang 2018, "Improving the Gaussian Mechanism for Differential Privacy",
    Thm. 8). Evaluated as e^a (1 − e^{b−a}) with a, b the logs of the two terms
    (scipy's log_ndtr), so tiny δ keep their relative accuracy (the difference of the
    two Φ terms would lose it); −inf where δ = 0.
    """
    a = special.log_ndtr(0.5 * mu - eta / mu)
    b = eta + special.log_ndtr(-0.5 * mu - eta / mu)
    with np.errstate(divide="ignore"):
        return np.asarray(a + np.log(-np.expm1(np.minimum(b - a, 0.0))))


def _connect_the_dots(lower: int, deltas: np.ndarray, h: float) -> _GridPld:
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
        raise _PldUnavailable("non-finite hockey-stick values")
    d = np.minimum.accumulate(deltas)
    diff = np.diff(d)
    em1 = math.expm1(h)
    p = np.empty_like(d)
    p[0] = 1.0 - d[0] + diff[0] / em1
    p[1:-1] = (diff[1:] - diff[:-1] * math.exp(h)) / em1
    p[-1] = diff[-1] / math.expm1(-h)
    return _GridPld(lower=lower, probs=np.maximum(p, 0.0), inf_mass=float(d[-1]))


def _grid(lo: float, hi: float, h: float) -> tuple[int, np.ndarray]:
    k_lo, k_hi = math.floor(lo / h), math.ceil(hi / h)
    k_hi = max(k_hi, k_lo + 2)
    if k_hi - k_lo + 1 > _MAX_GRID:
        raise _PldUnavailable(f"single-step PLD needs {k_hi - k_lo + 1} grid points")
    return k_lo, np.arange(k_lo, k_hi + 1, dtype=np.float64) * h


def _remove_step_pld(q: float, sigma: float, h: float, tail: float) -> _GridPld:
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
        return _connect_the_dots(k_lo, np.exp(_log_gaussian_delta(eps, mu)), h)
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
    deltas[above] = np.exp(log_q + _log_gaussian_delta(eps_prime, mu))
    return _connect_the_dots(k_lo, deltas, h)


def _add_step_pld(q: float, sigma: float, h: float, tail: float) -> _GridPld:
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
    part[finite] = np.exp(log_q + e[finite] - eta[finite] + _log_gaussian_delta(eta[finite], mu))
    deltas[below] = part
    return _connect_the_dots(k_lo, deltas, h)


def _chernoff_window(parts: Sequence[tuple[_GridPld, int]], tau: float) -> tuple[int, int]:
    """Index range [lo, hi] of the composed grid sum Σ_c Σ^{T_c} Y (Y = grid index −
    ``lower``) outside which at most τ/2 of the mass lies on each side.

    Chernoff: P(S − m ≥ a) ≤ exp(Σ_c T_c log E e^{t(Y_c − m_c)} − t a) for every t > 0,
    also for sub-probability masses; so a(t) = (Σ_c T_c log M_c(t) + log(2/τ))/t, and
    the same with t < 0 below. A few t around the Gaussian optimum √(2 log(2/τ))/sd,
    smaller ones for the heavy upper tail of the subsampled loss.
    """
    log_2_tau = math.log(2.0 / tau)
    mean_total, var_total, top = 0.0, 0.0, 0
    stats = []
    for pld, count in parts:
        positive = pld.probs > 0.0
        if not np.any(positive):
            raise _PldUnavailable("a step's PLD has no finite mass")
        y = np.arange(len(pld.probs), dtype=np.float64)[positive]
        p = pld.probs[positive]
        mass = float(np.sum(p))
        m = float(np.dot(p, y)) / mass
        v = float(np.dot(p, (y - m) ** 2)) / mass
        stats.append((y - m, np.log(p)))
        mean_total += count * m
        var_total += count * v
        top += count * (len(pld.probs) - 1)
    t_star = math.sqrt(2.0 * log_2_tau / max(var_total, 1.0))
    ts = t_star * np.array([1.0 / 32.0, 1.0 / 8.0, 0.25, 0.5, 1.0, 2.0])
    up, down = np.full(len(ts), log_2_tau), np.full(len(ts), log_2_tau)
    for (_pld, count), (x, log_p) in zip(parts, stats, strict=True):
        for j, t in enumerate(ts):
            for sign, acc in ((1.0, up), (-1.0, down)):
                z = (sign * t) * x + log_p
                peak = float(np.max(z))
                lm = peak + math.log(float(np.sum(np.exp(z - peak))))  # the sum is ≥ 1
                # the computed log-MGF is accurate to ~n·u; 1e-9 per step covers it
                acc[j] += count * (lm + 1e-9)
    hi = min(math.ceil(mean_total + float(np.min(up / ts))), top)
    lo = max(math.floor(mean_total - float(np.min(down / ts))), 0)
    return lo, hi


def _compose(parts: Sequence[tuple[_GridPld, int]], *, tau: float) -> _GridPld:
    """The pessimistic PLD of the composition Π_c (P_c, Q_c)^{T_c}, by FFT.

    The composed loss is the sum of independent losses, so its masses are the
    convolution of the parts' (Dwork & Rothblum 2016; Koskela, Jälkö & Honkela 2020,
    "Computing Tight Differential Privacy Guarantees Using FFT"), and +∞ absorbs
    1 − Π(1 − inf_c)^{T_c}. We compute it as a cyclic convolution of length
    N ≥ the Chernoff window (:func:`_chernoff_window`): each part folded modulo N,
    transformed, raised to its count in the Fourier domain, multiplied, transformed
    back. Cyclically, mass outside the window lands *inside* it (aliasing only adds
    non-negative mass), and the ≤ τ outside is also added at +∞: both err on the
    pessimistic side. This is what dp_accounting's self_compose does too (FFT power,
    no repeated squaring), without its per-part Python loops.

    Rounding, bounded explicitly (``entry_error`` and ``l2_error``): the forward FFT of
    a non-negative f has componentwise error ≤ E = 16⌈log₂N⌉u‖f‖₁ (each output is
    built by ⌈log₂N⌉ levels of butterflies from inputs of total modulus ‖f‖₁, each
    level adding a relative error below ≈ 7u; Higham 2002, "Accuracy and Stability of
    Numerical Algorithms", §24.1, states the normwise version; a factor > 2 of margin);
    the power and product, |ΠF̂^T − ΠF^T| ≤ e_j = R·Σ_c T_c (E_c/R_c + 4u) + C·u
    with R_c = |F̂_c| + E_c ≥ |F_c|, R = ΠR_c^{T_c}, C parts (telescoping, plus evaluating
    exp(Σ T_c (log|F̂_c| + i arg F̂_c)): the phase and exp errors are ≤ 4u·T·R, the log's
    T·u·|log|F̂||·|F̂|^T ≤ u/e); the inverse FFT adds 16⌈log₂N⌉u times its input's norm.
    So every entry is within (1/N)Σ_j (e_j + 16⌈log₂N⌉u|Ĝ_j|) of exact, and by
    Parseval the ℓ2 norm of the error is within (‖e‖₂ + 16⌈log₂N⌉u‖Ĝ‖₂)/√N (norms
    over the full spectrum, ≤ √2 times those over the half that rfft returns).
    """
    lo, hi = _chernoff_window(parts, tau)
    width = hi - lo + 1
    n_fft = int(sp_fft.next_fast_len(width, real=True))
    if n_fft > _MAX_GRID:
        raise _PldUnavailable(f"composed PLD needs an FFT of length {n_fft}")
    levels = math.ceil(math.log2(max(n_fft, 2)))
    log_abs = np.zeros(n_fft // 2 + 1)
    phase = np.zeros(n_fft // 2 + 1)
    log_r = np.zeros(n_fft // 2 + 1)
    rel = np.zeros(n_fft // 2 + 1)
    inf_keep = 0.0  # log Π(1 − inf_c)^{T_c}
    offset = 0
    for pld, count in parts:
        p = pld.probs
        pad = (-len(p)) % n_fft
        folded = np.concatenate((p, np.zeros(pad))).reshape(-1, n_fft).sum(axis=0)
        spec = sp_fft.rfft(folded)
        e_c = 16.0 * levels * _U * float(np.sum(folded)) * (1.0 + 1e-6)
        r_c = np.abs(spec) + e_c
        with np.errstate(divide="ignore"):
            log_abs += count * np.log(np.abs(spec))
        phase += count * np.angle(spec)
        log_r += count * np.log(r_c)
        rel += count * (e_c / r_c + 4.0 * _U)
        inf_keep += count * math.log1p(-pld.inf_mass)
        offset += count * pld.lower
    g = np.exp(log_abs) * np.exp(1j * phase)
    out = sp_fft.irfft(g, n_fft)
    r = np.exp(log_r)
    # + u per part: T·u·|log x|·x^T ≤ u/e bounds the rounding of log|F̂| in the power
    e = r * rel + len(parts) * _U
    abs_g = np.abs(g)
    ifft_level = 16.0 * levels * _U
    # full-spectrum sums ≤ 2 × the half-spectrum ones
    entry_error = (2.0 / n_fft) * float(np.sum(e + ifft_level * abs_g))
    l2_error = (
        math.sqrt(2.0 * float(np.dot(e, e)))
        + ifft_level * math.sqrt(2.0 * float(np.dot(g.real, g.real) + np.dot(g.imag, g.imag)))
    ) / math.sqrt(n_fft)
    idx = (lo + np.arange(width)) % n_fft
    probs = np.maximum(out[idx], 0.0)
    return _GridPld(
        lower=offset + lo,
        probs=probs,
        inf_mass=-math.expm1(inf_keep) + tau,
        entry_error=entry_error * (1.0 + 1e-6),
        l2_error=l2_error * (1.0 + 1e-6),
    )


def _epsilon_at_delta(pld: _GridPld, h: float, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ ``delta``, where δ(ε) = inf + Σ_{ℓ > ε} p_ℓ (1 − e^{ε−ℓ})
    is the hockey stick of the (discrete, pessimistic) pair, plus the rounding allowances.

    With U_i = Σ_{m ≥ i} p_m and L_i = Σ_{m ≥ i} p_m e^{−ℓ_m} (suffix sums over losses
    ℓ_m > 0), δ(ε) = inf + U_i − e^ε L_i on (ℓ_{i−1}, ℓ_i], solved in closed form on
    the first grid interval where δ drops below the target (as dp_accounting's
    _get_epsilon_for_delta). Only the n masses at ℓ > 0 matter for ε ≥ 0; their rounding
    error is at most min(n·``entry_error``, √n·``l2_error``) in ℓ1, and the suffix sums
    of non-negative terms add below 2·n·u (all masses ≤ 1): both are subtracted from δ,
    as is ``inf_mass``.
    """
    width = len(pld.probs)
    losses = (pld.lower + np.arange(width, dtype=np.float64)) * h
    first = int(np.searchsorted(losses, 0.0, side="right"))  # first ℓ > 0
    n = width - first
    rounding = min(n * pld.entry_error, math.sqrt(n) * pld.l2_error) + 4.0 * n * _U
    allowance = pld.inf_mass + rounding
    if allowance > _MAX_ALLOWANCE * delta:
        raise _PldUnavailable(f"allowances {allowance:.3g} exceed {_MAX_ALLOWANCE:g}·δ")
    last = int(np.searchsorted(losses, _MAX_LOSS, side="right"))
    # Losses above _MAX_LOSS nats count as +∞ (pessimistic; keeps e^{±ℓ} finite).
    budget = delta - allowance - float(np.sum(pld.probs[last:]))
    p = pld.probs[first:last]
    ell = losses[first:last]
    if budget <= 0.0:
        return math.inf  # more than δ of mass above _MAX_LOSS: a trivial, valid bound
    if len(p) == 0:
        return 0.0
    upper = np.cumsum(p[::-1])[::-1]
    lower = np.cumsum((p * np.exp(-ell))[::-1])[::-1]  # e^{−ℓ} ≤ 1: no overflow
    # δ at ε = ℓ_i, i.e. over masses m > i (the last grid point has none above it)
    at_grid = np.append(upper[1:], 0.0) - np.exp(ell) * np.append(lower[1:], 0.0)
    at_zero = float(upper[0] - lower[0])
    if at_zero <= budget:
        return 0.0
    i = int(np.argmax(at_grid <= budget))  # exists: at_grid[-1] = 0
    floor = float(ell[i - 1]) if i > 0 else 0.0
    excess = float(upper[i]) - budget
    if excess <= 0.0 or float(lower[i]) <= 0.0:
        eps = floor
    else:
        eps = min(max(math.log(excess / float(lower[i])), floor), float(ell[i]))
    return eps + (abs(eps) + 1.0) * 2.0**-40  # the log and its inputs' last-bit errors


@dataclass(frozen=True)
class _GaussianParts:
    """A Poisson-subsampled-Gaussian-only event tree: ((q, σ, count), ...) sorted (so the
    result never depends on the order of the leaves), and the total PmfSlack τ."""

    gaussians: tuple[tuple[float, float, int], ...]
    slack_tau: float


def _gaussian_parts(event: DpEvent) -> _GaussianParts | None:
    """The tree as :class:`_GaussianParts`, or None if it has other leaves."""
    gaussians: list[tuple[float, float, int]] = []
    tau = 0.0
    for leaf, count in leaf_counts(event).items():
        if isinstance(leaf, PoissonSubsampledGaussianEvent):
            gaussians.append((leaf.sampling_rate, leaf.noise_multiplier, count))
        elif isinstance(leaf, PmfSlackEvent):
            tau += count * leaf.tau
        else:
            return None
    return _GaussianParts(gaussians=tuple(sorted(gaussians)), slack_tau=tau)


def _fast_pld_epsilon(parts: _GaussianParts, delta: float, h: float) -> float:
    """ε (nats) at ``delta`` of a Poisson-subsampled-Gaussian composition (with slack) by
    the fast pessimistic PLD on the grid h; raises :class:`_PldUnavailable`.

    Both directions of add/remove-one are composed separately (each one's step pairs
    dominate that direction's; the composition of dominating pairs dominates,
    Zhu, Dong & Wang 2022, Thm. 10) and the larger ε is returned. A slack τ enters as
    in :func:`_pld_epsilon_of`: ε' at δ·e^{−τ}, plus 2τ.
    """
    if not parts.gaussians:
        return 2.0 * parts.slack_tau
    d = delta * math.exp(-parts.slack_tau)
    steps = sum(c for _, _, c in parts.gaussians)
    tail = _STEP_TAIL * d / steps
    directions = [_remove_step_pld]
    if any(q < 1.0 for q, _, _ in parts.gaussians):
        directions.append(_add_step_pld)
    eps = 0.0
    for step_pld in directions:
        composed_parts = []
        for q, sigma, count in parts.gaussians:
            # q = 1: the pair is symmetric (reflection), both directions are the same
            one = (_remove_step_pld if q == 1.0 else step_pld)(q, sigma, h, tail)
            composed_parts.append((one, count))
        composed = _compose(composed_parts, tau=_WINDOW_TAIL * d)
        eps = max(eps, _epsilon_at_delta(composed, h, d))
    if math.isnan(eps):  # defensive: never hand a NaN to a comparison with a target
        raise _PldUnavailable("ε came out NaN")
    return eps + 2.0 * parts.slack_tau


# ------------------------------------------------------- dp_accounting (general trees)


@dataclass(frozen=True)
class _EventPld:
    """The PLD of an event tree's mechanisms, and the total pointwise slack τ of its
    PmfSlackEvent leaves (corrections, not mechanisms: they have no PLD of their own)."""

    pld: Any
    slack_tau: float


def _pld_of(event: DpEvent, value_discretization_interval: float) -> _EventPld:
    """dp_accounting PLD (pessimistic) of an event tree, add/remove-one neighbours;
    raises :class:`PldUnavailable` for a tree with a leaf other than pure, DP-SGD or
    slack leaves (RandomStoppingEvent, AnyOfEvent: no PLD is implemented for them)."""
    from dp_accounting.pld import common, privacy_loss_distribution

    pld = privacy_loss_distribution.identity(
        value_discretization_interval=value_discretization_interval
    )
    tau = 0.0
    for leaf, count in leaf_counts(event).items():
        if isinstance(leaf, PmfSlackEvent):
            # Pointwise factors e^{±τ} multiply along a composition (also an adaptive
            # one: the joint law factorises into conditionals), so the slacks add.
            tau += count * leaf.tau
            continue
        if isinstance(leaf, PureDpEvent):
            if leaf.epsilon == 0.0:
                continue
            # The worst-case PLD of an ε-DP mechanism: randomized response
            # (Kairouz, Oh & Viswanath 2015; dp_accounting from_privacy_parameters).
            part = privacy_loss_distribution.from_privacy_parameters(
                common.DifferentialPrivacyParameters(epsilon=leaf.epsilon, delta=0.0),
                value_discretization_interval=value_discretization_interval,
            )
        elif isinstance(leaf, PoissonSubsampledGaussianEvent):
            part = privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=leaf.noise_multiplier,
                sampling_prob=leaf.sampling_rate,
                value_discretization_interval=value_discretization_interval,
            )
        else:
            raise PldUnavailable(f"no PLD for {type(leaf).__name__}")
        pld = pld.compose(part.self_compose(count) if count > 1 else part)
    return _EventPld(pld=pld, slack_tau=tau)


def _dp_accounting_epsilon_of(event: DpEvent, delta: float, vdi: float) -> float:
    """ε at ``delta`` of the event by dp_accounting's PLD, slack included.

    If the laws P̂, Q̂ that run are within e^{±τ} of the analysed P, Q pointwise and
    P(O) ≤ e^{ε'} Q(O) + δ', then P̂(O) ≤ e^{τ}(e^{ε'} e^{τ} Q̂(O) + δ'), i.e. (ε' + 2τ,
    e^{τ} δ')-DP: we evaluate the PLD at δ' = δ e^{−τ} and add 2τ.
    """
    parts = _pld_of(event, vdi)
    tau = parts.slack_tau
    eps = float(parts.pld.get_epsilon_for_delta(delta * math.exp(-tau)))
    return max(0.0, eps) + 2.0 * tau


def _dp_accounting_dpsgd_epsilon(
    *, sampling_rate: float, noise_multiplier: float, steps: int, delta: float, vdi: float
) -> float:
    """dp_accounting's PLDAccountant on its own events: the independent reference the
    tests and the benchmark hold the fast PLD against (not used to calibrate)."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    acc = PLDAccountant(value_discretization_interval=vdi)
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
            ),
            steps,
        )
    )
    return max(0.0, float(acc.get_epsilon(delta)))


def _pld_epsilon_of(event: DpEvent, delta: float, vdi: float) -> float:
    """ε at ``delta`` of an event tree by a pessimistic PLD at interval ``vdi``.

    Trees of Poisson-subsampled Gaussians (and slack) go to the fast PLD; where it is
    unavailable, to the RDP bound (:func:`_rdp_epsilon_of`, also an upper bound: the
    issue's "fall back to RDP only where PLD fails"). Trees with pure leaves go to
    dp_accounting (randomized-response PLD per pure leaf).
    """
    parts = _gaussian_parts(event)
    if parts is None:
        return _dp_accounting_epsilon_of(event, delta, vdi)
    try:
        return _fast_pld_epsilon(parts, delta, vdi)
    except _PldUnavailable:
        return _rdp_epsilon_of(event, delta)


def pld_epsilon(
    *,
    events: Sequence[DpEvent],
    delta: float,
    value_discretization_interval: float = PLD_VALUE_DISCRETIZATION,
) -> float:
    """PLD-composed ε (nats) of a list of events at ``delta``: INFORMATION ONLY.

    This is the ε of the *non-adaptive* composition of the events (parameters
    fixed in advance). Across jobs the analyst chooses the next job after seeing
    earlier outputs, and PLD/f-DP composition is not known to be valid as a filter
    under such adaptive choice (natural f-DP filters can fail: Tran, Koskela,
    Räisä & Honkela 2026). Never use this number to admit a request; the RDP
    filter in filters.py is what admits. Pure events, exponential-mechanism
    events included, enter as the worst-case PLD of an ε-DP mechanism
    (randomized response): the bounded-range refinement that the RDP curve of
    ExponentialMechanismEvent uses is not modelled here, so for many ExpM releases
    the RDP number can be the smaller one: this figure may be tighter or looser
    than the filter's. PmfSlackEvent leaves (a sampler's pointwise e^{±τ} gap) add
    up to one τ, and the result is ε' + 2τ with ε' taken at δ·e^{−τ}.
    Lists of DP-SGD events alone use the fast PLD (see :func:`_pld_epsilon_of`).
    Raises :class:`PldUnavailable` (a ValueError) where an event's tree holds a leaf with
    no PLD here (RandomStoppingEvent, AnyOfEvent): the figure is then not available.
    """
    d = _check_delta(delta)
    evs = list(events)
    if not evs:
        return 0.0
    for e in evs:
        if not isinstance(e, DpEvent):
            raise ValueError(f"events must be DpEvent instances, got {e!r}")
    return _pld_epsilon_of(ComposedEvent(events=tuple(evs)), d, value_discretization_interval)


# ---------------------------------------------------------------------- RDP


_INTEGER_ORDERS: Final[tuple[int, ...]] = tuple(
    int(a) for a in CALIBRATION_ORDERS if float(a).is_integer()
)
_FRACTIONAL_ORDERS: Final[tuple[float, ...]] = tuple(
    a for a in CALIBRATION_ORDERS if not float(a).is_integer()
)


def _leaf_curves(event: DpEvent, orders: Sequence[float], *, integer: bool) -> np.ndarray:
    """Σ_leaves count × curve(leaf) on ``orders`` (each leaf's own upper bound; Mironov
    2017, Prop. 1), with the vectorised integer-order sum for DP-SGD leaves."""
    total = np.zeros(len(orders))
    for leaf, count in leaf_counts(event).items():
        if integer and isinstance(leaf, PoissonSubsampledGaussianEvent):
            curve = subsampled_gaussian_rdp_integer_orders(
                sampling_rate=leaf.sampling_rate,
                noise_multiplier=leaf.noise_multiplier,
                orders=[int(a) for a in orders],
            )
        elif isinstance(leaf, PoissonSubsampledGaussianEvent):
            curve = subsampled_gaussian_rdp(
                sampling_rate=leaf.sampling_rate,
                noise_multiplier=leaf.noise_multiplier,
                orders=orders,
            )
        else:
            curve = leaf.rdp(orders)
        total += count * curve
    return total


def _cks_epsilons(rdp: np.ndarray, orders: np.ndarray, delta: float) -> np.ndarray:
    """Per-order ε of the CKS conversion (see :func:`~service.privacy.rdp.epsilon_from_rdp`),
    only used to pick orders; the returned ε always comes from epsilon_from_rdp."""
    with np.errstate(invalid="ignore"):
        return rdp + np.log1p(-1.0 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1.0)


def _rdp_epsilon_of(event: DpEvent, delta: float) -> float:
    """ε (nats) at ``delta`` by RDP on CALIBRATION_ORDERS, searching the fractional orders
    only from the best integer order downhill.

    Any subset of orders gives a valid bound (each order's conversion is one); the
    subset is what makes it fast: the fractional-order series of rdp.py costs ~1 ms per
    order at small σ, and up to ~σ²·log(1/q) terms (≈ 1e4 at σ ≈ 45). All integer orders
    are evaluated (vectorised); then, on the grid's fractional orders within ±1 of the
    best integer order α*, we walk from α* towards whichever neighbour is lower, for as
    long as ε decreases (typically 2–6 orders instead of 99). If
    ε(α) is unimodal on the grid (it is in every case we checked, see the tests), this
    finds the full-grid minimum; otherwise the result can only be larger (still sound).
    """
    ints = np.asarray(_INTEGER_ORDERS, dtype=np.float64)
    rdp_int = _leaf_curves(event, _INTEGER_ORDERS, integer=True)
    eps_int = _cks_epsilons(rdp_int, ints, delta)
    best_i = int(np.nanargmin(eps_int))
    best = float(ints[best_i])
    window = sorted({best, *(a for a in _FRACTIONAL_ORDERS if best - 1.0 < a < best + 1.0)})
    values: dict[float, tuple[float, float]] = {best: (float(rdp_int[best_i]), eps_int[best_i])}

    def value(a: float) -> float:
        if a not in values:
            r = float(_leaf_curves(event, (a,), integer=False)[0])
            values[a] = (r, float(_cks_epsilons(np.array([r]), np.array([a]), delta)[0]))
        return values[a][1]

    at = window.index(best)
    for direction in (-1, 1):
        i = at
        while 0 <= i + direction < len(window) and value(window[i + direction]) < value(window[i]):
            i += direction
        if i != at:
            break  # went downhill one way; for a unimodal ε the other way goes up
    frac = sorted(a for a in values if a != best)
    orders = tuple(float(a) for a in _INTEGER_ORDERS) + tuple(frac)
    rdp = np.concatenate((rdp_int, np.array([values[a][0] for a in frac])))
    return epsilon_from_rdp(rdp=rdp.tolist(), orders=orders, delta=delta)


# ---------------------------------------------------------------------- ε of an event


def epsilon_for(
    *,
    event: DpEvent,
    delta: float,
    accountant: Accountant,
    value_discretization_interval: float = PLD_VALUE_DISCRETIZATION,
) -> float:
    """ε (nats) at ``delta`` of one event (e.g. one job) by the chosen accountant.

    "rdp": the event's RDP curve on CALIBRATION_ORDERS (fractional orders near the best
    integer one, :func:`_rdp_epsilon_of`) + CKS conversion.
    "pld": a pessimistic PLD (non-adaptive composition of the event's parts — correct
    for one job whose parameters are fixed in advance) at
    ``value_discretization_interval`` (an upper bound at any interval; pass
    :func:`pld_value_discretization` to reproduce what calibration used): the fast PLD
    for DP-SGD trees (RDP where it is unavailable), dp_accounting for trees with pure
    leaves. For a pure event the result is at most its basic-composition ε.
    """
    check_deadline()  # every calibration's ε(σ) goes through here or _search_sigma
    d = _check_delta(delta)
    acc = _check_accountant(accountant)
    if not isinstance(event, DpEvent):
        raise ValueError(f"event must be a DpEvent, got {event!r}")
    if acc == "rdp":
        eps = _rdp_epsilon_of(event, d)
    else:
        eps = _pld_epsilon_of(event, d, value_discretization_interval)
    pure = event.pure_epsilon()
    # A pure event is (ε, 0)-DP by basic composition, hence (ε, δ)-DP for every δ;
    # on a finite order grid the RDP conversion can come out slightly above that.
    return eps if pure is None else min(eps, pure)


# ---------------------------------------------------------------------- calibration


class _Unreachable(ValueError):
    """No σ ≤ NOISE_MULTIPLIER_MAX meets the target (a ValueError for callers)."""


@dataclass(frozen=True)
class _Search:
    """Result of the σ search: σ, the ε evaluated there, and how many evaluations it took."""

    sigma: float
    epsilon: float
    evaluations: int


def _search_sigma(
    eps_of_sigma: Callable[[float], float],
    *,
    target: float,
    rel_tol: float,
    what: str,
    initial: float,
    slope: float,
) -> _Search:
    """Smallest σ in [NOISE_MULTIPLIER_MIN, NOISE_MULTIPLIER_MAX] (up to rel_tol, rounded
    towards more noise) with eps(σ) ≤ target, for eps non-increasing in σ.

    Guarded secant (regula falsi, Illinois variant) on g(σ) = log(eps(σ)/target) against
    log σ, started at ``initial`` with the slope guess ``slope`` = d log ε / d log σ:
    g is smooth and nearly linear there, so a good start needs ~4 evaluations where the
    bisection from σ = 1 needed 12–17. Guards: steps of at most ×8 while bracketing,
    a bisection whenever the bracket did not halve in two steps, and a closing shot at
    exactly hi·(1 − rel_tol). Result: eps(σ) ≤ target was evaluated at the returned σ,
    and eps(σ·(1 − rel_tol)) > target too (or σ = NOISE_MULTIPLIER_MIN). The sequence
    of evaluations is a deterministic function of the inputs, so is σ.
    """
    evaluations = 0
    seen: dict[float, float] = {}  # σ → ε(σ)
    seen_g: dict[float, float] = {}  # σ → log(ε(σ)/target)
    order: list[float] = []

    def evaluate(s: float) -> tuple[bool, float]:
        nonlocal evaluations
        if s not in seen:
            check_deadline()  # the API bounds a request's planning (deadline.py)
            evaluations += 1
            e = float(eps_of_sigma(s))
            if math.isnan(e):
                e = math.inf  # an unusable evaluation counts as insufficient
            seen[s] = e
            if e <= 0.0:
                seen_g[s] = -math.inf
            else:
                seen_g[s] = math.log(e / target) if math.isfinite(e) else math.inf
            order.append(s)
        return seen[s] <= target, seen_g[s]

    def done(s: float) -> _Search:
        return _Search(sigma=s, epsilon=seen[s], evaluations=evaluations)

    lo_s = NOISE_MULTIPLIER_MIN
    hi_s = NOISE_MULTIPLIER_MAX
    s = min(max(initial, NOISE_MULTIPLIER_MIN), NOISE_MULTIPLIER_MAX)
    ok, g = evaluate(s)
    lo: tuple[float, float] | None = None  # (σ, g) with eps > target
    hi: tuple[float, float] | None = None  # (σ, g) with eps ≤ target
    if ok:
        hi = (s, g)
    else:
        lo = (s, g)
    b = slope if math.isfinite(slope) and slope < -0.05 else -1.0
    prev: tuple[float, float] | None = None
    # Phase 1: bracket the threshold.
    while lo is None or hi is None:
        cur = hi if lo is None else lo
        assert cur is not None
        if prev is not None and math.isfinite(prev[1]) and math.isfinite(cur[1]):
            secant = (cur[1] - prev[1]) / (math.log(cur[0]) - math.log(prev[0]))
            if secant < -0.05:
                b = secant
        if lo is None:  # everything so far suffices: go down
            if cur[0] <= lo_s:
                return done(cur[0])
            step = -cur[1] / b if math.isfinite(cur[1]) else -math.log(8.0)
            factor = min(max(math.exp(step) * (1.0 - 2.0 * rel_tol), 1.0 / 8.0), 1.0 - rel_tol)
            s = max(cur[0] * factor, lo_s)
        else:  # nothing suffices yet: go up
            if cur[0] >= hi_s:
                raise _Unreachable(
                    f"cannot reach ε = {target:g} for {what}: it would need "
                    f"noise_multiplier > {NOISE_MULTIPLIER_MAX:g}"
                )
            step = -cur[1] / b if math.isfinite(cur[1]) else math.log(8.0)
            factor = max(min(math.exp(step) * (1.0 + 2.0 * rel_tol), 8.0), 1.0 + rel_tol)
            s = min(cur[0] * factor, hi_s)
        prev = cur
        ok, g = evaluate(s)
        if ok:
            hi = (s, g)
        else:
            lo = (s, g)
    # Phase 2: shrink [lo, hi] until lo ≥ hi·(1 − rel_tol).
    widths = [math.log(hi[0] / lo[0])]
    last_root = math.nan
    while lo[0] < hi[0] * (1.0 - rel_tol):
        closing = hi[0] * (1.0 - rel_tol)
        x_lo, x_hi = math.log(lo[0]), math.log(hi[0])
        width = x_hi - x_lo
        # secant through the two latest finite evaluations (both near the root soon)
        finite = [(math.log(p), seen_g[p]) for p in order if math.isfinite(seen_g[p])]
        root = x_lo + 0.5 * width
        if len(finite) >= 2 and finite[-1][1] != finite[-2][1]:
            (xa, ga), (xb, gb) = finite[-2], finite[-1]
            cand = xb - gb * (xb - xa) / (gb - ga)
            if (gb - ga) / (xb - xa) < 0.0 and math.isfinite(cand):
                root = cand
        root = min(max(root, x_lo + 0.01 * width), x_hi - 0.01 * width)
        if len(widths) >= 4 and widths[-1] > 0.5 * widths[-4]:
            s = math.exp(0.5 * (x_lo + x_hi))  # guard: bisect when the secant stalls
        elif x_hi <= root + 1.5 * rel_tol:
            s = closing  # hi is next to the root: the evaluation that can finish
        elif abs(root - last_root) <= rel_tol:
            # the estimate has settled: aim just above it, for a hi close enough to finish
            s = math.exp(min(root + 0.5 * rel_tol, x_hi - 0.01 * width))
        else:
            s = math.exp(root)  # a plain secant step
        last_root = root
        s = min(s, closing)
        ok, g = evaluate(s)
        if ok:
            hi = (s, g)
        else:
            lo = (s, g)
        widths.append(math.log(hi[0] / lo[0]))
    return done(hi[0])


def _smallest_sufficient_sigma(
    eps_of_sigma: Callable[[float], float],
    *,
    target: float,
    rel_tol: float,
    what: str,
    initial: float = 1.0,
    slope: float = -1.0,
) -> float:
    """Smallest σ (up to rel_tol, rounded towards more noise) with eps(σ) ≤ target,
    assuming eps is non-increasing in σ (more Gaussian noise is a post-processing).

    The result σ satisfies eps(σ) ≤ target and eps(σ·(1 − rel_tol)) > target (both
    evaluated), unless σ = NOISE_MULTIPLIER_MIN; ValueError if even
    NOISE_MULTIPLIER_MAX does not suffice. ``initial`` and ``slope`` (a guess of
    d log ε / d log σ) only change how fast it gets there. See :func:`_search_sigma`.
    """
    return _search_sigma(
        eps_of_sigma, target=target, rel_tol=rel_tol, what=what, initial=initial, slope=slope
    ).sigma


def _gdp_sigma(*, sampling_rate: float, steps: int, epsilon: float, delta: float) -> float:
    """A starting guess for σ from the central limit theorem of DP-SGD (speed only).

    T steps of the Poisson-subsampled Gaussian are ≈ μ-GDP with
    μ = q √(T (e^{1/σ²} − 1)) (Bu, Dong, Long & Su 2020, "Deep Learning with Gaussian
    Differential Privacy", Thm. 5; exact for q = 1 with μ = √T/σ), and μ-GDP is (ε, δ)-DP
    iff δ ≥ δ_μ(ε) (Dong, Roth & Su 2022, Cor. 2.13). We solve δ_μ(ε) = δ for μ (a
    monotone bisection on a closed form) and invert μ(σ).
    """
    log_delta = math.log(delta)
    eps_arr = np.array([epsilon])
    lo, hi = math.log(1e-8), math.log(1e4)
    for _ in range(48):  # δ_μ(ε) increases with μ
        mid = 0.5 * (lo + hi)
        if float(_log_gaussian_delta(eps_arr, math.exp(mid))[0]) > log_delta:
            hi = mid
        else:
            lo = mid
    mu = math.exp(0.5 * (lo + hi))
    if sampling_rate == 1.0:
        sigma = math.sqrt(steps) / mu
    else:
        sigma = 1.0 / math.sqrt(math.log1p(mu * mu / (sampling_rate * sampling_rate * steps)))
    return min(max(sigma, NOISE_MULTIPLIER_MIN), NOISE_MULTIPLIER_MAX)


@dataclass(frozen=True)
class NoiseCalibration:
    """A calibrated noise multiplier and what it was proven against.

    ``noise_multiplier``: σ (std of the noise per unit of clipping norm).
    ``accountant``: the accountant whose upper bound ``epsilon`` is: the requested one,
    or "rdp" when a PLD calibration fell back to RDP (``fell_back``).
    ``epsilon``: ε (nats) at the requested δ of DP-SGD with this σ by that accountant,
    ≤ the target: the *stated* guarantee of the job. (What the ledger charges is the
    event's RDP curve, a different and larger number for PLD-calibrated jobs.)
    ``value_discretization_interval``: the PLD grid used (None for RDP).
    ``evaluations``: how many ε(σ) the search evaluated (diagnostics).
    """

    noise_multiplier: float
    accountant: Accountant
    epsilon: float
    fell_back: bool
    value_discretization_interval: float | None
    evaluations: int


def calibrate(
    *,
    sampling_rate: float,
    steps: int,
    epsilon: float,
    delta: float,
    accountant: Accountant,
    rel_tol: float = 1e-3,
) -> NoiseCalibration:
    """Smallest noise multiplier σ such that DP-SGD with Poisson sampling at rate
    ``sampling_rate`` for ``steps`` steps is (ε, δ)-DP under ``accountant``.

    ε(σ) ≤ ``epsilon`` and ε(σ·(1 − rel_tol)) > ``epsilon`` (σ rounded towards more
    noise), both evaluated, with ε(·) the fast PLD at
    :func:`pld_value_discretization` ("pld") or :func:`_rdp_epsilon_of` ("rdp"); a PLD
    calibration that finds no σ the fast PLD can certify falls back to RDP (never to a
    guess), and raises ValueError when neither can. Never returns less than
    NOISE_MULTIPLIER_MIN. Results are cached per exact input (a pure function, so a
    cached answer is bit-identical to a fresh one).
    """
    event = PoissonSubsampledGaussianEvent(
        sampling_rate=sampling_rate, noise_multiplier=1.0, steps=steps
    )  # validates q and steps
    target = _check_epsilon(epsilon)
    d = _check_delta(delta)
    acc = _check_accountant(accountant)
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, int | float):
        raise ValueError(f"rel_tol must be a real number, got {rel_tol!r}")
    if not 0.0 < rel_tol < 0.5:
        raise ValueError(f"rel_tol must be in (0, 0.5), got {rel_tol!r}")
    return _calibrate_cached(event.sampling_rate, event.steps, target, d, acc, float(rel_tol))


@lru_cache(maxsize=512)
def _calibrate_cached(
    q: float, steps: int, target: float, delta: float, accountant: Accountant, rel_tol: float
) -> NoiseCalibration:
    what = f"q = {q:g}, steps = {steps}, δ = {delta:g} ({accountant})"
    start = _gdp_sigma(sampling_rate=q, steps=steps, epsilon=target, delta=delta)
    # d log ε / d log σ of the same approximation, for the first secant step
    nudged = _gdp_sigma(sampling_rate=q, steps=steps, epsilon=target * 1.05, delta=delta)
    slope = math.log(1.05) / math.log(nudged / start) if nudged != start else -1.0
    pld_result: NoiseCalibration | None = None
    if accountant == "pld":
        vdi = pld_value_discretization(epsilon=target, steps=steps)
        unavailable = False

        def pld_eps(sigma: float) -> float:
            nonlocal unavailable
            parts = _GaussianParts(gaussians=((q, sigma, steps),), slack_tau=0.0)
            try:
                return _fast_pld_epsilon(parts, delta, vdi)
            except _PldUnavailable:
                unavailable = True
                return math.inf  # not certified at this σ: counts as insufficient

        try:
            found = _search_sigma(
                pld_eps, target=target, rel_tol=rel_tol, what=what, initial=start, slope=slope
            )
            pld_result = NoiseCalibration(
                noise_multiplier=found.sigma,
                accountant="pld",
                epsilon=found.epsilon,
                fell_back=False,
                value_discretization_interval=vdi,
                evaluations=found.evaluations,
            )
        except _Unreachable:
            pass  # no σ ≤ NOISE_MULTIPLIER_MAX certified by the PLD: RDP decides
        if pld_result is not None and not unavailable:
            return pld_result
        # The PLD failed somewhere on the way, so its σ may be needlessly large: RDP too,
        # and the smaller σ wins (each is certified by its own upper bound).

    def rdp_eps(sigma: float) -> float:
        one = PoissonSubsampledGaussianEvent(sampling_rate=q, noise_multiplier=sigma, steps=steps)
        return _rdp_epsilon_of(one, delta)

    try:
        found = _search_sigma(
            rdp_eps, target=target, rel_tol=rel_tol, what=what, initial=start, slope=slope
        )
    except _Unreachable:
        if pld_result is not None:
            return pld_result
        raise  # fail closed: neither accountant certifies any σ ≤ NOISE_MULTIPLIER_MAX
    if pld_result is not None and pld_result.noise_multiplier <= found.sigma:
        return pld_result
    return NoiseCalibration(
        noise_multiplier=found.sigma,
        accountant="rdp",
        epsilon=found.epsilon,
        fell_back=accountant == "pld",
        value_discretization_interval=None,
        evaluations=found.evaluations,
    )


def calibrate_noise_multiplier(
    *,
    sampling_rate: float,
    steps: int,
    epsilon: float,
    delta: float,
    accountant: Accountant,
    rel_tol: float = 1e-3,
) -> float:
    """σ of :func:`calibrate` (same contract): the smallest noise multiplier such that
    DP-SGD with Poisson sampling at rate ``sampling_rate`` for ``steps`` steps is
    (ε, δ)-DP under ``accountant``, with ε(σ) ≤ ``epsilon`` and
    ε(σ·(1 − rel_tol)) > ``epsilon``. Raises ValueError on invalid input or when the
    target would need σ > NOISE_MULTIPLIER_MAX; never returns less than
    NOISE_MULTIPLIER_MIN.
    """
    return calibrate(
        sampling_rate=sampling_rate,
        steps=steps,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        rel_tol=rel_tol,
    ).noise_multiplier
