"""Rényi-DP formulas: curves for the mechanisms we run and the RDP → (ε, δ) conversion.

Conventions: ε and RDP values in nats; δ a probability; an order α is a float > 1.
The neighbouring relation throughout is add-or-remove one record (the relation
under which the subsampled-Gaussian analysis of DP-SGD holds); every pure
mechanism composed with it must be ε-DP under the same relation.

A mechanism M is (α, ρ)-RDP if D_α(M(D) ‖ M(D')) ≤ ρ for all neighbours D, D'
in both orders (Mironov 2017, "Rényi Differential Privacy", CSF 2017), where
D_α(P ‖ Q) = 1/(α−1) · log E_Q[(dP/dQ)^α]. RDP composes additively, also under
adaptive choice of mechanisms (Mironov 2017, Prop. 1); the ledger relies on the
stronger filter version of that fact (filters.py).

Every function returns a valid *upper bound* on the true RDP (or, for the
conversion, on the true ε): rounding is always towards more privacy loss.

Why one module (over 500 lines): about 390 lines are the subsampled Gaussian's series
(integer and fractional orders, the cached constants and the table of integer orders that
planning's speed needs, issue 26), each step argued an upper bound; they share the order
validation, the parameter checks and that one rounding rule with the pure-ε curves and the
conversion, and tests/unit/privacy/test_calibrate_exact.py pins their private steps bit for
bit against the code they replaced. A split would separate the checks from the series they
guard, not two ideas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import special

from service.privacy.exact_sum import fsum_rows, fsum_rows_signed

__all__ = [
    "IntegerOrderTable",
    "bounded_range_rdp",
    "epsilon_from_rdp",
    "epsilon_from_rdp_on_checked_orders",
    "gaussian_rdp",
    "integer_order_table",
    "randomized_response_rdp",
    "subsampled_gaussian_rdp",
    "subsampled_gaussian_rdp_integer_orders",
    "subsampled_gaussian_rdp_on_table",
    "validate_orders",
    "warm_tables",
]


def validate_orders(orders: Sequence[float]) -> tuple[float, ...]:
    """Return ``orders`` as a tuple of floats; raise ValueError unless all are finite and > 1."""
    floats = type(orders) is tuple and all(type(a) is float for a in orders)
    if floats and orders in _VALID_ORDERS:
        return orders  # type: ignore[return-value]  # a tuple of floats, as below
    out: list[float] = []
    for a in orders:
        if isinstance(a, bool) or not isinstance(a, int | float | np.integer | np.floating):
            raise ValueError(f"Rényi order must be a real number, got {a!r}")
        af = float(a)
        if not math.isfinite(af) or af <= 1.0:
            raise ValueError(f"Rényi orders must be finite and > 1, got {a!r}")
        out.append(af)
    if not out:
        raise ValueError("at least one Rényi order is required")
    valid = tuple(out)
    if floats and len(_VALID_ORDERS) < 1024:
        _VALID_ORDERS.add(valid)
    return valid


_VALID_ORDERS: set[tuple[float, ...]] = set()
"""Tuples of floats :func:`validate_orders` accepted (it returns such a tuple as it is),
so that a second call does not check them again (speed only: planning validates the same
few grids thousands of times per selection quote). Only tuples of exact ``float`` are
looked up (equal floats are the same numbers; NaN, never equal, is never found). Bounded."""


def _check_epsilon(epsilon: float) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float | np.floating):
        raise ValueError(f"epsilon must be a real number, got {epsilon!r}")
    e = float(epsilon)
    if not math.isfinite(e) or e < 0.0:
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    return e


# --------------------------------------------------------------------------- pure ε-DP


def _log_cosh(x: float) -> float:
    """log cosh(x), accurate for tiny and huge |x|."""
    x = abs(x)
    if x < 20.0:
        # cosh x = 1 + 2 sinh²(x/2): no cancellation for small x (log cosh x ≈ x²/2).
        return math.log1p(2.0 * math.sinh(0.5 * x) ** 2)
    return x + math.log1p(math.exp(-2.0 * x)) - math.log(2.0)


def randomized_response_rdp(*, epsilon: float, orders: Sequence[float]) -> np.ndarray:
    """RDP curve valid for *every* ε-DP mechanism: that of binary randomized response.

    Exact form, with p = e^ε / (1 + e^ε) (binary RR with flip probability 1 − p):

        D_α = 1/(α−1) · log( p^α (1−p)^(1−α) + (1−p)^α p^(1−α) )
            = 1/(α−1) · [ log cosh((α − ½)ε) − log cosh(ε/2) ]

    (the second line follows by factoring e^{ε/2} out of both numerator terms and of
    1 + e^ε; it is what we evaluate, because it is stable for ε → 0 and ε → ∞).

    Why it is valid for any ε-DP mechanism M: for each pair of neighbours, the pair
    of output distributions (M(D), M(D')) is a post-processing (one randomised map
    applied to both) of the pair of RR output distributions (Kairouz, Oh & Viswanath
    2015, "The Composition Theorem for Differential Privacy": every (ε, δ)-DP pair
    is a post-processing of the (ε, δ) randomized-response pair; here δ = 0),
    and Rényi divergence satisfies the data-processing inequality (van Erven &
    Harremoës 2014, "Rényi Divergence and Kullback-Leibler Divergence").

    We also take the minimum with two bounds that this curve already satisfies
    mathematically, as guards against floating-point drift:
    D_α ≤ D_∞ = ε (D_α is non-decreasing in α; van Erven & Harremoës 2014) and
    D_α ≤ α ε²/2 (Bun & Steinke 2016,
    "Concentrated Differential Privacy", Prop. 3.3: ε-DP ⇒ ½ε²-zCDP).

    Limits: D_α → ε as α → ∞ and D_α ≈ α ε²/2 as ε → 0.
    """
    eps = _check_epsilon(epsilon)
    alphas = validate_orders(orders)
    if eps == 0.0:
        return np.zeros(len(alphas))
    lc_half = _log_cosh(0.5 * eps)
    out = np.empty(len(alphas))
    for n, a in enumerate(alphas):
        d = (_log_cosh((a - 0.5) * eps) - lc_half) / (a - 1.0)
        out[n] = max(0.0, min(d, eps, 0.5 * a * eps * eps))
    return out


def bounded_range_rdp(*, epsilon: float, orders: Sequence[float]) -> np.ndarray:
    """RDP bound α ε²/8 of an ε-bounded-range (ε-BR) mechanism.

    M is ε-BR (Durfee & Rogers 2019, "Practical Differentially Private Top-k
    Selection with Pay-what-you-get Composition", NeurIPS 2019) if for all neighbours
    D, D' the privacy loss L(y) = log(P(y)/Q(y)), P = M(D), Q = M(D'), takes values
    in an interval of length ε. Cesar & Rogers 2021 ("Bounding, Concentrating, and
    Truncating: Unifying Privacy Loss Composition for Data Analytics", ALT 2021,
    arXiv:2004.07223) show that ε-BR implies ε²/8-zCDP, i.e. D_α ≤ α ε²/8 for
    all α > 1. Self-contained proof of the statement we use:

        Let f(t) = log E_Q[e^{tL}]. Then f(0) = 0 and f(1) = log E_Q[dP/dQ] = 0,
        and f''(t) is the variance of L under the tilted law ∝ e^{tL} Q, which is
        ≤ ε²/4 because L lives in an interval of length ε (Popoviciu). Hence
        h(t) = ε² t(t−1)/8 − f(t) is convex with h(0) = h(1) = 0, so h(α) ≥ 0
        for α ≥ 1, i.e. (α−1) D_α(P‖Q) = f(α) ≤ α(α−1) ε²/8. The same holds for
        D_α(Q‖P) (the loss −L has the same range).

    The exponential mechanism sampling θ ∝ exp(ε u(D, θ) / (2Δu)) with
    Δu = sup |u(D, θ) − u(D', θ)| is ε-BR (the ratio of likelihood ratios at θ and
    θ' is at most exp(ε/(2Δu) · 2Δu)); so is the monotone-utility variant
    θ ∝ exp(ε u / Δu) (McSherry & Talwar 2007), since then u(D, ·) − u(D', ·) has
    one sign and its range is ≤ Δu (Durfee & Rogers 2019 introduce BR for exactly
    this reason). ε-BR also implies ε-DP (E_Q[e^L] = 1 forces 0 into the range
    of L, so |L| ≤ ε).

    This bound alone is *not* valid for arbitrary ε-DP mechanisms; callers take
    the minimum with :func:`randomized_response_rdp`.
    """
    eps = _check_epsilon(epsilon)
    alphas = np.asarray(validate_orders(orders))
    return alphas * (eps * eps / 8.0)


# --------------------------------------------------------------- (subsampled) Gaussian


def gaussian_rdp(*, noise_multiplier: float, orders: Sequence[float]) -> np.ndarray:
    """RDP of the Gaussian mechanism with L2 sensitivity 1 and noise std σ:
    D_α = α / (2σ²) (Mironov 2017, Gaussian mechanism). Exact."""
    sigma = _check_sigma(noise_multiplier)
    alphas = np.asarray(validate_orders(orders))
    return alphas / (2.0 * sigma * sigma)


def _check_sigma(noise_multiplier: float) -> float:
    if isinstance(noise_multiplier, bool) or not isinstance(
        noise_multiplier, int | float | np.floating
    ):
        raise ValueError(f"noise_multiplier must be a real number, got {noise_multiplier!r}")
    s = float(noise_multiplier)
    if not math.isfinite(s) or s <= 0.0:
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    return s


def _check_q(sampling_rate: float) -> float:
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, int | float | np.floating):
        raise ValueError(f"sampling_rate must be a real number, got {sampling_rate!r}")
    q = float(sampling_rate)
    if not (0.0 < q <= 1.0):
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
    return q


def _log_abs_binom(a: float, k: np.ndarray) -> np.ndarray:
    """log |C(a, k)| for real a ≥ 0 and integer k ≥ 0 (gammaln is log|Γ|)."""
    return special.gammaln(a + 1.0) - special.gammaln(k + 1.0) - special.gammaln(a - k + 1.0)


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    """log A_α for integer α (Mironov, Talwar & Zhang 2019, Sec. 3; the binomial expansion):

    A_α = Σ_{k=0}^{α} C(α, k) (1−q)^{α−k} q^k exp((k² − k) / (2σ²)).
    """
    return _log_a_ints(q, sigma, (alpha,))[0]


def _log_a_ints(q: float, sigma: float, alphas: tuple[int, ...]) -> list[float]:
    """:func:`_log_a_int` at each of ``alphas``, the same floats, in one pass (issue 26: a
    curve's 18 integer orders were 18 passes of ~10 numpy calls each).

    The terms of all orders are one flat array, each entry computed by the expression
    :func:`_log_a_int` used on its own order (elementwise, so the same float at any
    position); then :func:`_logsumexp`'s steps per order: the maximum (exact), the count
    of maximal terms (exact), e^{a − max} elementwise, the sum of each order's entries by
    ``np.sum`` of that contiguous slice (the call :func:`_logsumexp` makes on an array of
    the same length and values: the same pairwise sum), and the same scalar last step.
    The sign of a zero maximum cannot matter (x − (±0) = x for x ≠ 0, masked entries are
    −∞, and +0 + (±0) = +0 in the last step); a non-finite result goes to scipy with the
    order's terms, as in :func:`_logsumexp`."""
    flat = _flat_integer_terms(alphas)
    log_terms = (
        flat.log_binom
        + flat.k * math.log(q)
        + flat.rest * math.log1p(-q)
        + flat.kk / (2.0 * sigma * sigma)
    )
    a_max = np.maximum.reduceat(log_terms, flat.starts)
    at_max = np.repeat(a_max, flat.lengths)
    mask = log_terms == at_max
    counts = np.add.reduceat(mask.astype(np.float64), flat.starts).tolist()
    shifted = np.where(mask, -np.inf, log_terms)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        e = np.exp(shifted - at_max)
    out: list[float] = []
    for start, stop, top, m in zip(
        flat.starts.tolist(), flat.stops, a_max.tolist(), counts, strict=True
    ):
        total = np.asarray(np.sum(e[start:stop], axis=(0,), keepdims=True, dtype=np.float64))
        s = float(total[0])
        s = s if s == 0 else s / m
        value = math.log1p(s) + math.log(m) + top
        if not math.isfinite(value):
            value = float(special.logsumexp(log_terms[start:stop]))
        out.append(value)
    return out


@dataclass(frozen=True)
class _FlatIntegerTerms:
    """:func:`_integer_terms` of several orders, concatenated (the same floats), with each
    order's segment: entries ``starts[i]`` to ``stops[i]`` (exclusive)."""

    k: np.ndarray
    log_binom: np.ndarray
    rest: np.ndarray
    kk: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    stops: list[int]


@lru_cache(maxsize=64)
def _flat_integer_terms(alphas: tuple[int, ...]) -> _FlatIntegerTerms:
    parts = [_integer_terms(a) for a in alphas]
    lengths = np.array([len(p[0]) for p in parts], dtype=np.int64)
    stops = np.cumsum(lengths)
    k, log_binom, rest, kk = (np.concatenate([p[i] for p in parts]) for i in range(4))
    out = _FlatIntegerTerms(
        k=k,
        log_binom=log_binom,
        rest=rest,
        kk=kk,
        starts=stops - lengths,
        lengths=lengths,
        stops=stops.tolist(),
    )
    for a in (out.k, out.log_binom, out.rest, out.kk, out.starts, out.lengths):
        a.setflags(write=False)
    return out


@lru_cache(maxsize=512)
def _integer_terms(alpha: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The parts of :func:`_log_a_int`'s terms that depend on α only: k = 0 … α,
    log C(α, k), α − k and k² − k, each by the expression the sum used inline (the same
    floats), cached (the gamma functions were a third of an integer order's time)."""
    k = np.arange(alpha + 1, dtype=np.float64)
    parts = (k, _log_abs_binom(float(alpha), k), alpha - k, k * k - k)
    for a in parts:
        a.setflags(write=False)
    return parts


def _logsumexp(a: np.ndarray) -> float:
    """``float(scipy.special.logsumexp(a))`` for a finite 1-D float64 array, bit for bit,
    without scipy's per-call overhead (array-API dispatch, ~0.1 ms: it was most of the
    time of an integer order). The same operations in the same order as scipy 1.17's
    ``_logsumexp``: the maximal terms are taken out of the sum (their count m), the rest
    summed as e^{a − max} by numpy's sum of the whole array (the taken-out entries as
    e^{−∞} = 0), then log1p(s/m) + log m + max. A non-finite result is left to scipy
    (its special cases). ``tests/unit/privacy/test_calibrate_exact.py`` compares the two.

    One deliberate difference: the last step's log1p and log are the C library's scalar
    ``math.log1p``/``math.log``, not numpy's ufuncs, which on CPUs with AVX-512 run Intel's
    SVML kernels whose last bits differ from the C library's (measured: three of the pinned
    selection plans changed between an AMD EPYC without AVX-512 and an AVX-512 Xeon). A plan
    must not depend on the CPU that planned it; scipy's value is then within an ulp or two,
    and equal on CPUs without AVX-512 (``tests/unit/test_plan_cpu_independence.py``)."""
    a_max = np.max(a, axis=(0,), keepdims=True)
    mask = a == a_max
    m = np.sum(mask.astype(a.dtype), axis=(0,), keepdims=True, dtype=a.dtype)
    shifted = np.where(mask, -np.inf, a)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.sum(np.exp(shifted - a_max), axis=(0,), keepdims=True, dtype=a.dtype)
        s = np.where(s == 0, s, s / m)
    value = math.log1p(float(s[0])) + math.log(float(m[0])) + float(a_max[0])
    if not math.isfinite(value):
        return float(special.logsumexp(a))
    return value


# Beyond this many series terms a fractional order falls back to the log-convex
# interpolation between ⌊α⌋ and ⌈α⌉ (see _log_a_interpolated).
_MAX_FRAC_TERMS = 1 << 14


def _log_a_interpolated(q: float, sigma: float, alpha: float) -> float:
    """An upper bound on log A_α for fractional α from the two neighbouring integer orders.

    log A_α = log E_{μ0}[e^{αL}], L = log(μ/μ0), is the cumulant generating function
    of L, hence convex in α (Hölder: with α = (1−t)k + t(k+1), t ∈ (0, 1),
    E[e^{αL}] = E[(e^{kL})^{1−t} (e^{(k+1)L})^t] ≤ E[e^{kL}]^{1−t} E[e^{(k+1)L}]^t;
    this is the convexity of (α−1)·D_α in α, van Erven & Harremoës 2014, "Rényi
    Divergence and Kullback-Leibler Divergence"). So with k = ⌊α⌋ and log A_1 = 0
    (A_1 = ∫ μ = 1):

        log A_α ≤ (1 − t) log A_k + t log A_{k+1},   t = α − k.

    The result is a bound on log A_α *at α itself*, so the caller divides by α − 1
    as for every other branch. It is never looser than the monotonicity fallback
    D_α ≤ D_⌈α⌉ (D_α is non-decreasing in α, same reference): log A_α vanishes at
    α = 1 and is convex, so log A_k ≤ (k−1)/k · log A_{k+1} and the chord above
    stays below (α−1)/k · log A_{k+1} = (α−1) D_{k+1}; for 1 < α < 2 the two
    coincide. (Before this fix the fallback returned log A_⌈α⌉ and the caller
    divided it by α − 1 instead of ⌈α⌉ − 1: a valid but needlessly large charge,
    4× at α = 1.25 and 20× at α = 1.05.)
    """
    k = math.floor(alpha)
    t = alpha - k  # exact (Sterbenz): k ≤ α < k + 1 ≤ 2k
    log_lo = 0.0 if k == 1 else _log_a_int(q, sigma, k)
    log_hi = _log_a_int(q, sigma, k + 1)
    # log A ≥ 0 at every order ≥ 1 (Jensen); the relative slack covers the three
    # roundings of the weighted sum.
    return ((1.0 - t) * log_lo + t * log_hi) * (1.0 + 2.0**-40)


@dataclass(frozen=True)
class _FracSeriesConstants:
    """The parts of :func:`_log_a_frac`'s first n terms that depend on (α, n) only (not on
    q, σ), each computed by the expression the series used inline (the same floats)."""

    i: np.ndarray  # 0 … n − 1
    j: np.ndarray  # α − i
    ii: np.ndarray  # i·i − i
    jj: np.ndarray  # j·j − j
    log_coef: np.ndarray  # log |C(α, i)| = log Γ(α+1) − log Γ(i+1) − log Γ(j+1)
    sign: np.ndarray  # sign of C(α, i) = sign of Γ(α − i + 1) for α > 0
    base: np.ndarray  # |log Γ(α+1)| + |log Γ(i+1)| + |log Γ(j+1)| + 8 (rounding bound)
    tail_binom: float  # log |C(α − 1, n − 1)| (the tail bound)


@lru_cache(maxsize=512)
def _frac_series_constants(alpha: float, n: int) -> _FracSeriesConstants:
    """The first n entries of α's table (:func:`_table`), the same floats as a table built
    for n itself: every array is elementwise in i = 0 … n − 1 (each entry a function of its
    own i and α), so a longer table's first n entries are the n-term table. The gamma
    functions of the terms were half of a fractional order's time; an order of a large σ
    (z0 in the thousands, n up to ``_MAX_FRAC_TERMS``) recomputed ~10⁴ of them per call
    (issue 26). Remembered per (α, n): views of the table, and the tail's binomial."""
    table = _small_table(alpha) if n <= _SMALL_TABLE else _large_table(alpha, _capacity(n))
    out = _FracSeriesConstants(
        i=table.i[:n],
        j=table.j[:n],
        ii=table.ii[:n],
        jj=table.jj[:n],
        log_coef=table.log_coef[:n],
        sign=table.sign[:n],
        base=table.base[:n],
        tail_binom=float(_log_abs_binom(alpha - 1.0, np.array([n - 1.0]))[0]),
    )
    return out


_SMALL_TABLE = 1024
"""Terms of the tables kept for every order asked (≤ 256 orders: ~15 MB); longer ones
(up to ``_MAX_FRAC_TERMS``) for the last 16 orders that needed them (~15 MB)."""


def _capacity(n: int) -> int:
    """The power of two ≥ n a large table is built for (so a few sizes serve every n)."""
    return min(1 << (n - 1).bit_length(), _MAX_FRAC_TERMS)


@lru_cache(maxsize=256)
def _small_table(alpha: float) -> _FracSeriesConstants:
    return _table(alpha, _SMALL_TABLE)


@lru_cache(maxsize=16)
def _large_table(alpha: float, capacity: int) -> _FracSeriesConstants:
    return _table(alpha, capacity)


def _table(alpha: float, n: int) -> _FracSeriesConstants:
    """The (α, n)-only parts of the series' first n terms, each by the expression the
    series used inline."""
    gl_alpha = float(special.gammaln(alpha + 1.0))
    i = np.arange(n, dtype=np.float64)
    j = alpha - i
    gl_i = special.gammaln(i + 1.0)
    gl_j = special.gammaln(j + 1.0)
    out = _FracSeriesConstants(
        i=i,
        j=j,
        ii=i * i - i,
        jj=j * j - j,
        log_coef=gl_alpha - gl_i - gl_j,
        sign=special.gammasgn(j + 1.0),
        base=abs(gl_alpha) + np.abs(gl_i) + np.abs(gl_j) + 8.0,
        tail_binom=float(_log_abs_binom(alpha - 1.0, np.array([n - 1.0]))[0]),
    )
    for a in (out.i, out.j, out.ii, out.jj, out.log_coef, out.sign, out.base):
        a.setflags(write=False)
    return out


def _log_a_frac(q: float, sigma: float, alpha: float) -> float:
    """An upper bound on log A_α for fractional α (Mironov, Talwar & Zhang 2019, Sec. 3.3).

    With z0 = σ² log(1/q − 1) + ½ (the point where q μ1 = (1−q) μ0), MTZ split
    A_α = ∫ μ0 ((1−q) + q μ1/μ0)^α at z0 and expand each half binomially:

        A_α = Σ_i C(α,i) [ q^i (1−q)^{α−i} e^{(i²−i)/(2σ²)} Φ((z0 − i)/σ)
                         + q^j (1−q)^i e^{(j²−j)/(2σ²)} Φ((j − z0)/σ) ],  j = α − i.

    Both expansions converge absolutely, so the signed series equals A_α
    (dominated convergence). For i > ⌈α⌉ the coefficients C(α,i) alternate in
    sign; summing |C(α,i)| instead (what dp_accounting 0.4+ does) is also an upper
    bound but a loose one for small α or large σ (5–10 % at α ≤ 1.25 and several
    times too large for σ ≈ 40), so we sum the signed series and add explicit
    bounds for the two things that could make it too small:

    * Truncation. Take n > max(⌈α⌉, z0, α − z0). For i ≥ n the Gaussian tail bound
      Φ(−x) ≤ e^{−x²/2} · min(½, 1/(x√(2π))), x > 0 (Chernoff / Mills ratio), with
      x = (i − z0)/σ in the first part and x = (z0 − j)/σ = (i − α + z0)/σ in the
      second, turns the i-th term into at most |C(α,i)| (1−q)^α e^{−z0²/(2σ²)} c_n
      with c_n = min(½, σ/((n − z0)√(2π))) + min(½, σ/((n − α + z0)√(2π)))
      (the exponents collapse because 2z0 − 1 = 2σ² log((1−q)/q)). For i ≥ ⌈α⌉
      the signs of (−1)^i C(α,i) agree, so Σ_{i≥n} |C(α,i)| =
      |Σ_{i<n} (−1)^i C(α,i)| = |C(α−1, n−1)| (telescoping Pascal's rule and
      Σ_i (−1)^i C(α,i) = (1−1)^α = 0). Hence
      |tail| ≤ (1−q)^α e^{−z0²/(2σ²)} c_n |C(α−1, n−1)|.
    * Rounding. Each term is exp of a sum of logs; its relative error is at most
      (Σ |summands| + 8) · 16 · 2⁻⁵² (a generous first-order bound), and the sum
      itself is exactly rounded (math.fsum). We add Σ_i |term_i| · that bound.

    The result is min(signed + rounding bound, Σ |terms|) + tail bound, an upper
    bound in every case; n doubles until the tail bound is below 1e-10·(α−1) of
    the total. If more than ``_MAX_FRAC_TERMS`` terms would be needed (z0 huge:
    σ ≳ 60 with q ≈ 1 %, σ ≳ 50 with q ≈ 0.1 %), we return the log-convex
    interpolation of :func:`_log_a_interpolated` instead: like every branch here,
    an upper bound on log A_α at α itself (never on log A at another order), so
    the caller's division by α − 1 is right in all cases.
    """
    return _log_a_fracs(q, sigma, (alpha,))[0]


def _log_a_fracs(q: float, sigma: float, alphas: tuple[float, ...]) -> list[float]:
    """:func:`_log_a_frac` at each of ``alphas``, the same floats (issue 26: one order's
    series was ~30 numpy calls on 256 entries and six Python lists for ``math.fsum``).

    The orders whose series has the same number of terms n are computed together, one row
    each in 2-D arrays: every entry by the operations a single order's series applies to
    it (elementwise: the same float in any row or position; the parts that depend on i
    alone are computed once, as the same 1-D array broadcast), each row's maximum exactly,
    and the six exact sums of every row by :func:`~service.privacy.exact_sum.fsum_rows`
    (``math.fsum``'s floats, see there; the signed ones with the absolute ones, by
    :func:`~service.privacy.exact_sum.fsum_rows_signed`). The scalar steps per row are the
    single order's.
    An order whose tail bound asks for more terms continues at 2n with the others that
    do; an order past ``_MAX_FRAC_TERMS`` takes the interpolation, as before."""
    z0 = sigma * sigma * (math.log1p(-q) - math.log(q)) + 0.5
    out = [0.0] * len(alphas)
    todo: dict[int, list[int]] = {}  # n → positions in alphas
    for r, alpha in enumerate(alphas):
        n_min = max(math.ceil(alpha), math.ceil(z0), math.ceil(alpha - z0)) + 1
        if n_min > _MAX_FRAC_TERMS:
            out[r] = _log_a_interpolated(q, sigma, alpha)
        else:
            todo.setdefault(max(n_min, 256), []).append(r)
    log_q, log_1mq = math.log(q), math.log1p(-q)
    two_s2 = 2.0 * sigma * sigma
    mills = sigma / math.sqrt(2.0 * math.pi)
    while todo:
        n = min(todo)
        rows = todo.pop(n)
        group = tuple(alphas[r] for r in rows)
        c = _stacked_constants(group, n)
        i, j = c.i, c.j  # i: 1-D (every row's), j: one row per order
        parts0: tuple[np.ndarray, ...] = (
            i * log_q,
            j * log_1mq,
            c.ii / two_s2,
            special.log_ndtr((z0 - i) / sigma),
        )
        parts1: tuple[np.ndarray, ...] = (
            j * log_q,
            i * log_1mq,
            c.jj / two_s2,
            special.log_ndtr((j - z0) / sigma),
        )
        log_t0 = c.log_coef + sum(parts0)
        log_t1 = c.log_coef + sum(parts1)

        m = [
            float(max(a, b))
            for a, b in zip(
                np.max(log_t0, axis=1).tolist(), np.max(log_t1, axis=1).tolist(), strict=True
            )
        ]
        shift = np.array(m)[:, None]
        t0 = np.exp(log_t0 - shift)
        t1 = np.exp(log_t1 - shift)
        # Past the last column with a non-zero term (a large σ: most of the n terms
        # underflow) the six sums only add zeros, 0 times a sign ±1 or a finite rounding
        # bound: those columns are left out, with the bounds' parts (speed only). Where a
        # sign or a bound could be ±inf or NaN there (0·inf = NaN: an order within ~1e-13
        # of an integer meets a pole of Γ; σ below ~1e-50 overflows i²/(2σ²) and the
        # arguments of log Φ), every column is kept: the sums are then what they were.
        base, sign, width = c.base, c.sign, n
        # (A non-zero term in the last column keeps every column: nothing to look for.)
        last_alive = bool(t0[:, -1].any()) or bool(t1[:, -1].any())
        if not last_alive and c.finite and _bounded_parts(n + max(group), z0, sigma):
            alive = np.flatnonzero(np.any(t0 != 0.0, axis=0) | np.any(t1 != 0.0, axis=0))
            width = int(alive[-1]) + 1 if len(alive) else 0
        if width < n:
            t0, t1, base, sign = t0[:, :width], t1[:, :width], base[:, :width], sign[:, :width]
            parts0 = tuple(p[..., :width] for p in parts0)
            parts1 = tuple(p[..., :width] for p in parts1)
        rel0 = (base + sum(np.abs(p) for p in parts0)) * (16.0 * 2.0**-52)
        rel1 = (base + sum(np.abs(p) for p in parts1)) * (16.0 * 2.0**-52)
        # The six sums: of sign·t0, sign·t1, t0, t1, t0·rel0, t1·rel1. Signs all ±1 (the
        # usual case): the signed ones from the same splitting as t0's and t1's
        # (fsum_rows_signed: the same floats, a third less to split); otherwise, or where
        # the splitting is not used, each row by fsum_rows as before.
        paired = None
        if c.unit_signs:
            paired = fsum_rows_signed(
                np.concatenate((t0, t1, t0 * rel0, t1 * rel1)), np.concatenate((sign, sign))
            )
        if paired is None:
            sums = fsum_rows(np.concatenate((sign * t0, sign * t1, t0, t1, t0 * rel0, t1 * rel1)))
        else:
            sums = paired[1] + paired[0]  # signed rows first, as above
        k = len(rows)
        for row, (r, alpha) in enumerate(zip(rows, group, strict=True)):
            signed = sums[row] + sums[k + row]
            absolute = sums[2 * k + row] + sums[3 * k + row]
            rounding = sums[4 * k + row] + sums[5 * k + row]
            # 2**-40 relative slack covers the rounding of the three fsum results themselves.
            partial = min(signed + rounding + absolute * 2.0**-40, absolute * (1.0 + 2.0**-40))

            c_n = min(0.5, mills / (n - z0)) + min(0.5, mills / (n - alpha + z0))
            tail_const = alpha * log_1mq - z0 * z0 / two_s2
            log_tail = tail_const + math.log(c_n) + c.tail_binom[row]
            total = m[row] + math.log(partial + math.exp(min(log_tail - m[row], 700.0)))
            stop_gap = math.log(1e-10 * (alpha - 1.0))
            # The tail bound is included, so even at the cap the result is an upper bound.
            if log_tail < total + stop_gap or n >= _MAX_FRAC_TERMS:
                out[r] = total
            else:
                todo.setdefault(min(2 * n, _MAX_FRAC_TERMS), []).append(r)
    return out


def _bounded_parts(span: float, z0: float, sigma: float) -> bool:
    """The σ-dependent parts of the series' terms are finite and below 1e100 in magnitude
    for every i < n and |j| ≤ ``span`` = n + α: i·log q, j·log(1 − q) (|log| ≤ 745 for
    0 < q < 1), i² − i and j² − j over 2σ², and log Φ of (z0 − i)/σ and (j − z0)/σ
    (|log Φ(x)| ≤ x²/2 + |x| + 1 for x < 0, by the Mills ratio; 0 ≥ log Φ(x) > −1 for
    x ≥ 0). So every
    rounding bound (their sum of magnitudes with a finite table part, times 16·2^-52) is
    finite."""
    two_s2 = 2.0 * sigma * sigma
    reach = (span + abs(z0)) / sigma
    return two_s2 > 0.0 and span * span / two_s2 < 1e100 and reach < 1e40


@dataclass(frozen=True)
class _StackedConstants:
    """:class:`_FracSeriesConstants` of several orders at one n: the parts that depend on
    i alone once (1-D), the others one row per order (2-D, the same floats)."""

    i: np.ndarray
    ii: np.ndarray
    j: np.ndarray
    jj: np.ndarray
    log_coef: np.ndarray
    sign: np.ndarray
    base: np.ndarray
    tail_binom: list[float]
    finite: bool  # every sign and table bound finite (the columns' parts)
    unit_signs: bool  # every sign +1.0 or −1.0 (no pole of Γ: no 0, NaN)


def _stacked_constants(alphas: tuple[float, ...], n: int) -> _StackedConstants:
    """Cached per (orders, n) up to n = 1024 (a curve's fractional orders, the few orders
    of a calibration step; bounded), computed from :func:`_frac_series_constants`. Longer
    series (a large σ: n follows z0, so it is new for each σ) take the first n columns of
    the orders' stacked tables at the capacity of n (the same floats, elementwise in i;
    the 2-D columns are a view: the series only adds and multiplies them, into new
    arrays)."""
    if n <= _SMALL_TABLE:
        return _cached_stack(alphas, n)
    full = _large_stack(alphas, _capacity(n))
    return _StackedConstants(
        i=full.i[:n],
        ii=full.ii[:n],
        j=full.j[:, :n],
        jj=full.jj[:, :n],
        log_coef=full.log_coef[:, :n],
        sign=full.sign[:, :n],
        base=full.base[:, :n],
        tail_binom=[_frac_series_constants(a, n).tail_binom for a in alphas],
        finite=full.finite,  # of all its columns: of the first n too
        unit_signs=full.unit_signs,
    )


@lru_cache(maxsize=128)
def _cached_stack(alphas: tuple[float, ...], n: int) -> _StackedConstants:
    return _stack(alphas, n)


@lru_cache(maxsize=4)
def _large_stack(alphas: tuple[float, ...], capacity: int) -> _StackedConstants:
    return _stack(alphas, capacity)


def _stack(alphas: tuple[float, ...], n: int) -> _StackedConstants:
    each = [_frac_series_constants(a, n) for a in alphas]
    out = _StackedConstants(
        i=each[0].i,
        ii=each[0].ii,
        j=np.stack([c.j for c in each]),
        jj=np.stack([c.jj for c in each]),
        log_coef=np.stack([c.log_coef for c in each]),
        sign=np.stack([c.sign for c in each]),
        base=np.stack([c.base for c in each]),
        tail_binom=[c.tail_binom for c in each],
        finite=all(bool(np.isfinite(c.base).all() and np.isfinite(c.sign).all()) for c in each),
        unit_signs=all(bool((np.abs(c.sign) == 1.0).all()) for c in each),
    )
    for a in (out.j, out.jj, out.log_coef, out.sign, out.base):
        a.setflags(write=False)
    return out


@lru_cache(maxsize=4096)
def _subsampled_gaussian_curve(
    q: float, sigma: float, alphas: tuple[float, ...]
) -> tuple[float, ...]:
    """One step's RDP at each of ``alphas`` (checked), remembered per exact (q, σ, orders):
    a plan's curve is asked for several times (the plan, the workflow's ε, the summary).
    The integer orders' series are computed in one pass (:func:`_log_a_ints`), the
    fractional ones' in another (:func:`_log_a_fracs`): each value is the float its
    order's own series gives, whatever the other orders asked with it."""
    if q == 1.0:
        return tuple(alpha / (2.0 * sigma * sigma) for alpha in alphas)
    ints = sorted({a for a in alphas if a.is_integer()})
    fracs = tuple(sorted({a for a in alphas if not a.is_integer()}))
    log_a: dict[float, float] = {}
    if ints:
        log_a.update(zip(ints, _log_a_ints(q, sigma, tuple(int(a) for a in ints)), strict=True))
    if fracs:
        log_a.update(zip(fracs, _log_a_fracs(q, sigma, fracs), strict=True))
    return tuple(_rdp_of_log_a(sigma, alpha, log_a[alpha]) for alpha in alphas)


def _rdp_of_log_a(sigma: float, alpha: float, log_a: float) -> float:
    gauss = alpha / (2.0 * sigma * sigma)
    rdp = log_a / (alpha - 1.0)
    if math.isnan(rdp):
        return math.inf
    # Subsampling never hurts: by joint quasi-convexity of D_α (van Erven & Harremoës
    # 2014), D_α((1−q)μ0 + qμ1 ‖ μ0) ≤ max(0, D_α(μ1 ‖ μ0)) = α/(2σ²), and likewise
    # in the other direction. Mathematically redundant; a guard against drift.
    return max(0.0, min(rdp, gauss))


def subsampled_gaussian_rdp(
    *, sampling_rate: float, noise_multiplier: float, orders: Sequence[float]
) -> np.ndarray:
    """RDP of one step of the Poisson-subsampled Gaussian mechanism (one DP-SGD step).

    Each record is included independently with probability q = ``sampling_rate``;
    the sum of the included (L2-clipped to norm 1) contributions gets N(0, σ²I)
    noise, σ = ``noise_multiplier``. Under add/remove-one the worst case reduces to
    the 1-D pair μ0 = N(0, σ²), μ = (1−q)μ0 + qN(1, σ²), and the RDP at order α is
    (1/(α−1)) log A_α with A_α = E_{μ0}[(μ/μ0)^α] (Mironov, Talwar & Zhang 2019,
    "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
    arXiv:1908.10530, Sec. 3; they also show the other direction D_α(μ0 ‖ μ) is
    never larger, so A_α is the worst case). Integer orders use the exact finite
    sum, fractional orders the MTZ series with a rigorous tail bound (or, when that
    series would be too long, the log-convex interpolation between the neighbouring
    integer orders); q = 1 gives the exact Gaussian α/(2σ²). Steps compose
    additively: multiply by the count.
    """
    q = _check_q(sampling_rate)
    sigma = _check_sigma(noise_multiplier)
    alphas = validate_orders(orders)
    return np.array(_subsampled_gaussian_curve(q, sigma, alphas))


def warm_tables(curves: Sequence[float], series: Sequence[float] = ()) -> None:
    """Build now the order-only tables that :func:`subsampled_gaussian_rdp` and
    :func:`epsilon_from_rdp` build on first use (the API's start-up, service/app.py
    ``warm_up``), by the same functions, so the same floats: for the grid ``curves``
    (curves asked whole: the ledger's) the integer orders' terms and their concatenation,
    the fractional orders' tables, stacked, and the conversion's constants; for the
    fractional orders of ``series`` (asked one or a few at a time: calibration's) each
    order's table.
    Speed only: a quote that needs a table nobody built yet builds it then."""
    grid = validate_orders(curves)
    for a in (*grid, *(validate_orders(series) if series else ())):
        if not a.is_integer():
            _frac_series_constants(a, 256)
    ints = tuple(sorted({int(a) for a in grid if a.is_integer()}))
    if ints:
        _flat_integer_terms(ints)
    fracs = tuple(sorted({a for a in grid if not a.is_integer()}))
    if fracs:
        _cached_stack(fracs, 256)
    _cks_terms(grid)


@dataclass(frozen=True)
class IntegerOrderTable:
    """The parts of the integer-order sums that depend on the orders only (not on q, σ),
    flattened: one entry per (order α, k ∈ 0..α), segments starting at ``starts``."""

    alphas: np.ndarray
    k: np.ndarray
    rest: np.ndarray  # α − k
    log_binom: np.ndarray  # log C(α, k)
    kk: np.ndarray  # k·k − k (the series' expression, computed once)
    starts: np.ndarray
    lengths: np.ndarray
    max_log_binom_abs: np.ndarray  # per order: bound on |log α!| + |log k!| + |log (α−k)!|


@lru_cache(maxsize=16)
def _integer_order_table(orders: tuple[int, ...]) -> IntegerOrderTable:
    alphas = np.asarray(orders, dtype=np.float64)
    lengths = np.asarray(orders, dtype=np.int64) + 1
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    k = np.concatenate([np.arange(a + 1, dtype=np.float64) for a in orders])
    alpha_flat = np.repeat(alphas, lengths)
    rest = alpha_flat - k
    log_fact = special.gammaln(np.arange(max(orders) + 2, dtype=np.float64) + 1.0)
    log_binom = (
        log_fact[alpha_flat.astype(np.int64)]
        - log_fact[k.astype(np.int64)]
        - log_fact[rest.astype(np.int64)]
    )
    # log k! + log (α−k)! ≤ log α!, so the three magnitudes sum to at most 2·log α!.
    return IntegerOrderTable(
        alphas=alphas,
        k=k,
        rest=rest,
        log_binom=log_binom,
        kk=k * k - k,
        starts=starts,
        lengths=lengths,
        max_log_binom_abs=2.0 * log_fact[np.asarray(orders, dtype=np.int64)],
    )


def subsampled_gaussian_rdp_integer_orders(
    *, sampling_rate: float, noise_multiplier: float, orders: Sequence[int]
) -> np.ndarray:
    """One-step RDP of the Poisson-subsampled Gaussian at many *integer* orders at once.

    The same exact finite sum as :func:`subsampled_gaussian_rdp` uses for an integer
    order α (Mironov, Talwar & Zhang 2019, Sec. 3):

        A_α = Σ_{k=0}^{α} C(α, k) (1−q)^{α−k} q^k exp((k² − k) / (2σ²)),   D_α = log A_α / (α−1),

    evaluated for all orders in one vectorised pass over a flat array of all (α, k)
    terms (segment-wise log-sum-exp) instead of one scipy call per order: calibration
    (calibrate.py) evaluates ~70 integer orders per candidate σ. The values agree with
    :func:`subsampled_gaussian_rdp` to ~1e-12 relative (more where D_α is tiny) and are
    never below them, but they are not bit-identical, so the ledger keeps using that
    function (the audit recomputes stored curves and compares); this one is for
    calibration, where any upper bound is sound.

    Upper bound in floating point: each log-term is a sum of four numbers, so its
    absolute rounding error is below (Σ |summands| + 8)·16·2⁻⁵² (as in
    :func:`_log_a_frac`), bounded per order in closed form (each summand is largest at
    k = 0 or k = α); the sum of the exponentials of the shifted terms has relative error
    below (α + 2)·2⁻⁵². Both are added, as an absolute slack on log A_α, before the
    division by α − 1; then the minimum with the unsubsampled α/(2σ²) (subsampling never
    hurts, see :func:`_rdp_of_log_a`). q = 1 gives α/(2σ²) exactly.
    """
    q = _check_q(sampling_rate)
    sigma = _check_sigma(noise_multiplier)
    alphas_f = validate_orders(orders)
    if any(not a.is_integer() for a in alphas_f):
        raise ValueError(f"orders must be integers, got {orders!r}")
    table = _integer_order_table(tuple(int(a) for a in alphas_f))
    return subsampled_gaussian_rdp_on_table(q=q, sigma=sigma, table=table)


def integer_order_table(orders: tuple[int, ...]) -> IntegerOrderTable:
    """The cached order-only parts of :func:`subsampled_gaussian_rdp_integer_orders` for
    integer ``orders`` (each > 1; not checked here: a caller's own fixed grid), for
    :func:`subsampled_gaussian_rdp_on_table`."""
    return _integer_order_table(orders)


def subsampled_gaussian_rdp_on_table(
    *, q: float, sigma: float, table: IntegerOrderTable
) -> np.ndarray:
    """:func:`subsampled_gaussian_rdp_integer_orders` on the orders of ``table``, for a
    caller that evaluates one fixed grid many times (calibration: every ε(σ) of every σ
    search) and has checked q ∈ (0, 1] and σ > 0 (finite floats) itself: the same
    operations, without re-checking the ~155 orders each time (a tenth of a step)."""
    alphas = table.alphas
    two_s2 = 2.0 * sigma * sigma
    gauss = alphas / two_s2
    if q == 1.0:
        return gauss
    log_q, log_1mq = math.log(q), math.log1p(-q)
    k = table.k
    log_terms = table.log_binom + k * log_q + table.rest * log_1mq + table.kk / two_s2
    m = np.maximum.reduceat(log_terms, table.starts)
    total = np.add.reduceat(np.exp(log_terms - np.repeat(m, table.lengths)), table.starts)
    magnitude = (
        table.max_log_binom_abs
        + alphas * (abs(log_q) + abs(log_1mq))
        + (alphas * alphas - alphas) / two_s2
        + 8.0
    )
    slack = magnitude * (16.0 * 2.0**-52) + (alphas + 2.0) * 2.0**-52
    log_a = m + np.log(total) + slack
    rdp = np.maximum(log_a, 0.0) / (alphas - 1.0)
    return np.minimum(rdp, gauss)


# ---------------------------------------------------------------------- conversion


def epsilon_from_rdp(
    *, rdp: Sequence[float] | np.ndarray, orders: Sequence[float], delta: float
) -> float:
    """Smallest ε over the given orders for which an RDP curve implies (ε, δ)-DP.

    Uses the conversion of Canonne, Kamath & Steinke 2020 ("The Discrete Gaussian
    for Differential Privacy", arXiv:2004.00010v4, Prop. 12), also Asoodeh et al.
    2020 (arXiv:2001.05990, Eq. 20) and Balle et al. 2020 ("Hypothesis Testing
    Interpretations and Rényi Differential Privacy", AISTATS): if
    D_α(P ‖ Q) ≤ ρ then P is (ε, δ)-indistinguishable from Q with

        ε = ρ + log((α−1)/α) − (log δ + log α)/(α − 1).

    It is a statement about one pair of distributions, so it applies to any
    mechanism (or filtered interaction) whose output pairs satisfy the RDP bound.
    The result is the minimum over orders, clipped at 0; +inf entries of ``rdp``
    (orders with no finite bound) are skipped, and if all are +inf so is ε.

    One more valid case (as in dp_accounting): KL(P ‖ Q) ≤ D_α(P ‖ Q) ≤ ρ and the
    Bretagnolle–Huber inequality TV(P, Q) ≤ √(1 − e^{−KL}) give (0, δ)-DP as soon
    as δ² ≥ 1 − e^{−ρ}, so such an order yields ε = 0.
    """
    return epsilon_from_rdp_on_checked_orders(rdp=rdp, alphas=validate_orders(orders), delta=delta)


def epsilon_from_rdp_on_checked_orders(
    *, rdp: Sequence[float] | np.ndarray, alphas: tuple[float, ...], delta: float
) -> float:
    """:func:`epsilon_from_rdp` for orders already checked by :func:`validate_orders`
    (``alphas``: floats, finite, > 1), the same floats; for callers that convert many
    curves on one grid of their own (calibration), where checking the grid again was a
    fifth of the conversion's time."""
    values = [float(r) for r in rdp]
    if len(values) != len(alphas):
        raise ValueError(f"rdp has {len(values)} entries but orders has {len(alphas)}")
    if isinstance(delta, bool) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not values:
        return math.inf  # no order: no bound
    r = np.array(values, dtype=np.float64)
    if not bool((r >= 0.0).all()):  # a NaN (never >= 0) or a negative value
        raise ValueError("rdp values must be >= 0 and not NaN")
    delta = float(delta)
    # The loop this replaces (issue 26: ~80 orders per calibration step, in Python): for each
    # order with finite r, in order, return 0.0 if δ² + expm1(−r) ≥ 0, else
    # ε_α = r + log1p(−1/α) − (log δ + log α)/(α − 1); the result max(0, min ε_α).
    # δ² + expm1(−r) ≥ 0 needs 1 − e^{−r} ≤ δ², i.e. r ≤ r* = −log(1 − δ²); for r > 2r*
    # (δ² ≤ 1/2) it fails by at least δ²(1 − δ²) ≥ δ²/2, far beyond any rounding: only the
    # orders below that are checked, by the expression itself, in order (none where the
    # smallest r is above it, the usual case: then nothing is looked up).
    d2 = delta * delta
    bound = 2.0 * -math.log1p(-d2) if d2 <= 0.5 else math.inf
    if float(r.min()) <= bound:
        for i in np.flatnonzero(np.isfinite(r) & (r <= bound)).tolist():
            if d2 + math.expm1(-values[i]) >= 0.0:
                return 0.0
    log1p_inv, log_alpha, alpha_m1 = _cks_terms(alphas)
    # the same IEEE operations per order as the loop's expression (elementwise), then the
    # exact minimum over the finite r (all of them unless the largest is +inf); ±0 cannot
    # matter (max with +0.0 below).
    eps = r + log1p_inv - (math.log(delta) + log_alpha) / alpha_m1
    if float(r.max()) < math.inf:
        best = float(np.min(eps))
    else:
        finite = np.isfinite(r)
        best = float(np.min(eps[finite])) if bool(finite.any()) else math.inf
    return max(0.0, best)


@lru_cache(maxsize=512)
def _cks_terms(alphas: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log1p(−1/α), log α and α − 1 of each order, by the C library's math functions as
    the conversion's loop computed them (public constants of the grid, cached)."""
    out = (
        np.array([math.log1p(-1.0 / a) for a in alphas]),
        np.array([math.log(a) for a in alphas]),
        np.array([a - 1.0 for a in alphas]),
    )
    for a in out:
        a.setflags(write=False)
    return out
