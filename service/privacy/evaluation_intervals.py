"""Confidence intervals of the private evaluation's released metrics
(service/privacy/evaluation.py releases them; split from it, issue 23: one idea per module).

Confidence intervals: each covers the *population* value with probability ≥ the stated
level over both the holdout draw (rows i.i.d. from the population) and the DP noise.
Each metric's interval is pointwise (not simultaneous across metrics or cells).

* :func:`proportion_interval` (accuracy, confusion cells) inverts the exact law of the
  released count (binomial plus the known integer noise): sampling and noise are treated
  together, and the coverage is the level up to the count's discreteness.
* :func:`bounded_mean_interval` (log loss) inverts a bound on the tail of the released sum
  that also treats sampling and noise together: the row sum is replaced by its worst case
  in the convex order (a binomial on the range's two ends), so it holds for any
  population and is conservative for a spread-out one such as log losses.
* :func:`auc_interval` (binary) bounds 2U's sampling and noise together in the same way
  (a U-statistic lies below a binomial of min(n₊, n₋) trials in the convex order,
  Hoeffding 1963 §5), with the noisy class count in a box at part of α (Berger & Boos
  1994); the calibration error's upper end likewise (the empirical ECE lies above a mean
  of n values in [−1, 1]). Both hold for any population, so they remain conservative.
* The calibration error's lower end and the macro AUC (K ≥ 3) are still union bounds
  over the noise exceeding its (1 − α_n) quantile t (so the noiseless statistic lies
  within t of the released one) and a sampling bound at level α_s that is monotone in the
  statistic (so widening by t keeps it valid): McDiarmid's bounded differences, and for
  the calibration error a bias bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy import optimize, special, stats

from service.privacy.evaluation import (
    ECE_GRID,
    EvaluationPlan,
    NoiseKind,
    count_at_least,
    noise_tail,
    positive_number,
)

__all__ = [
    "Interval",
    "auc_interval",
    "bounded_mean_interval",
    "calibration_error_interval",
    "proportion_interval",
]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Interval:
    """A confidence interval [lower, upper] in the metric's units at ``confidence``."""

    lower: float
    upper: float
    confidence: float


def _split_alpha(confidence: float, parts: int) -> float:
    return (1.0 - confidence) / parts


# Numerical error allowed for in the exact proportion interval (absolute, on a tail
# probability): the worker's samplers' laws differ from the ideal ones by ≤ 1e-12 relative
# per pmf value plus < e^-800 of removed tail (worker/noise.py), the noise window drops
# < 1e-20, and scipy's bdtr and ndtr are *assumed* accurate to 1e-13 relative (an
# assumption, not a proof; weights summing to ≤ 1 keep the total below 1e-11).
_TAIL_ERROR: Final[float] = 1e-11
# Noise values beyond ±J are dropped, J with P(|N| > J) < 1e-20: discrete Laplace
# 2r^{J+1}/(1 + r) ≤ 2e^{−(J+1)/b} < 1e-20 for J ≥ 46.8·b (ln(2e20) = 46.74); rounded
# Gaussian P(|N| > J) = P(|σZ| ≥ J + ½) = 2Φ(−(J + ½)/σ) < 1e-20 for J ≥ 9.4σ
# (2Φ(−9.4) = 5.5e-21).
_LAPLACE_WINDOW: Final[float] = 46.8
_GAUSSIAN_WINDOW: Final[float] = 9.4


def _noise_cdf(noise: NoiseKind, scale: float, k: FloatArray) -> FloatArray:
    """P(N ≤ k) for the worker's integer noise N at integers k.

    Discrete Laplace p(j) = (1 − r)/(1 + r)·r^|j|, r = e^{−1/b}: summing the geometric tails,
    P(N ≤ k) = 1 − r^{k+1}/(1 + r) for k ≥ 0 and r^{−k}/(1 + r) for k < 0.
    Rounded Gaussian N = ⌊σZ + ½⌋: N ≤ k ⟺ σZ < k + ½, so P(N ≤ k) = Φ((k + ½)/σ).
    """
    if noise == "laplace":
        r = math.exp(-1.0 / scale)
        tail = np.exp(-(np.abs(k) + (k >= 0)) / scale) / (1.0 + r)
        return np.where(k >= 0, 1.0 - tail, tail)
    return np.asarray(special.ndtr((k + 0.5) / scale), dtype=np.float64)


def _noise_pmf(noise: NoiseKind, scale: float, j: FloatArray) -> FloatArray:
    """P(N = j), computed on the side of the lower tail (the law is symmetric), so that far
    values keep their relative accuracy."""
    low = -np.abs(j)
    return _noise_cdf(noise, scale, low) - _noise_cdf(noise, scale, low - 1.0)


def _upper_limit(x: int, n: int, noise: NoiseKind, scale: float, tail: float) -> float:
    """The largest π with P_π(C + N ≤ x) ≥ ``tail`` (1 if none is below), C ~ Bin(n, π).

    P_π(C + N ≤ x) = Σ_j P(N = j)·P_π(C ≤ x − j) = P(N ≤ x − n) + Σ_{x−n < j ≤ x} P(N = j)·
    bdtr(x − j; n, π) (terms with j ≤ x − n have P(C ≤ x − j) = 1, those with j > x have 0),
    over |j| ≤ J (``_LAPLACE_WINDOW``, ``_GAUSSIAN_WINDOW``). It decreases in π; its root at
    the target is found by Brent's method and then stepped outward until the computed
    probability is at most ``tail`` less the error allowance.
    """
    target = tail * (1.0 - 1e-6) - _TAIL_ERROR
    width = _LAPLACE_WINDOW if noise == "laplace" else _GAUSSIAN_WINDOW
    reach = math.ceil(width * scale)
    j = np.arange(max(x - n + 1, -reach), min(x, reach) + 1, dtype=np.float64)
    weights = _noise_pmf(noise, scale, j)
    counts = x - j
    floor = float(_noise_cdf(noise, scale, np.array([float(x - n)]))[0])

    def excess(p: float) -> float:
        return floor + float(np.dot(weights, special.bdtr(counts, n, p))) - target

    if excess(1.0) > 0.0:
        return 1.0
    if excess(0.0) <= 0.0:
        return 0.0
    root = float(optimize.brentq(excess, 0.0, 1.0, xtol=1e-13))
    step = 1e-13
    while root < 1.0 and excess(root) > 0.0:
        root += step
        step *= 2.0
    return min(root, 1.0)


def proportion_interval(
    *, noisy_count: int, trials: int, noise: NoiseKind, scale: float, confidence: float
) -> Interval:
    """Interval for a population proportion π from a noisy binomial count X = C + N,
    C ~ Bin(n, π), N the worker's integer noise (accuracy; a confusion cell; a class's
    prevalence): the Clopper–Pearson construction (Clopper & Pearson 1934) applied to the
    exact law of X, i.e. the sampling and the noise together.

    X is stochastically increasing in π (C is, and N is independent of C), so
    P_π(X ≤ x) decreases in π and the upper end π_U(x) = sup{π : P_π(X ≤ x) ≥ α/2} misses
    with probability ≤ α/2 (pivoting a discrete cdf, Casella & Berger 2002, §9.2.3);
    N is symmetric, so n − X = (n − C) + (−N) has the same form with 1 − π and the lower end
    is 1 − π_U(n − x). Together they cover π with probability ≥ 1 − α for every π; the
    release's discreteness is the only slack. Awan & Slavković 2018 ("Differentially
    private uniformly most powerful tests for binomial data", NeurIPS) likewise test and
    bound π from the law of a binomial count plus its (Tulap) noise.

    Numerics: P_π(X ≤ x) is an exact sum (:func:`_upper_limit`) computed in float64;
    each end is solved at α/2·(1 − 1e-6) − 1e-11 (``_TAIL_ERROR``) and put on the outer side
    of the root, so the errors allowed for cannot make it too short. Levels with
    α/2 ≤ 1e-10 get [0, 1] (the float tails are not trusted that far out).
    """
    n = count_at_least("trials", trials, low=1)
    s = positive_number("scale", scale)
    if noise not in ("laplace", "gaussian"):
        raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
    tail = (1.0 - confidence) / 2.0
    if tail <= 1e-10:
        return Interval(0.0, 1.0, confidence)
    x = int(noisy_count)
    upper = _upper_limit(x, n, noise, s, tail)
    lower = 1.0 - _upper_limit(n - x, n, noise, s, tail)
    return Interval(max(0.0, lower), upper, confidence)


def _excess_over(noise: NoiseKind, scale: float, a: FloatArray) -> FloatArray:
    """An upper bound on E(N − a)_+ for the worker's noise N at real thresholds a.

    Discrete Laplace (exact): for a ≥ 0, with m = ⌊a⌋ + 1 the first integer above a and
    C = (1 − r)/(1 + r), Σ_{k≥m}(k − a)·C r^k = C r^m((m − a)/(1 − r) + r/(1 − r)²) (the
    geometric series and Σ_j j r^j = r/(1 − r)²); for a < 0, E(N − a)_+ = −a + E(N + a)_+
    since (x)_+ = x + (−x)_+, E N = 0 and −N has the law of N.
    Rounded Gaussian N = ⌊σZ + ½⌋ ≤ σZ + ½, so (N − a)_+ ≤ (σZ − a')_+ with a' = a − ½, and
    E(σZ − a')_+ = σφ(a'/σ) − a'Φ(−a'/σ) (the normal's partial expectation).
    """
    if noise == "laplace":
        r = math.exp(-1.0 / scale)
        one_minus_r = -math.expm1(-1.0 / scale)
        c = one_minus_r / (1.0 + r)
        pos = np.abs(a)
        m = np.floor(pos) + 1.0
        right = c * np.exp(-m / scale) * ((m - pos) / one_minus_r + r / one_minus_r**2)
        return np.asarray(np.where(a >= 0, right, pos + right), dtype=np.float64)
    z = (a - 0.5) / scale
    out = scale * (np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) - z * special.ndtr(-z))
    return np.asarray(np.maximum(out, 0.0), dtype=np.float64)


def _binomial_pmf(c: FloatArray, n: int, p: float) -> FloatArray:
    """Bin(c; n, p) from log-gamma (0 < p < 1; p = 0 or 1 exactly): each log term is within a
    few ulp of its magnitude ≤ n·ln(n) + n, so for n ≤ 10⁷ the pmf is within 1e-7 relative,
    which the relative margin 1e-6 of the targets absorbs. Larger n use scipy's binom.pmf
    (Boost's, assumed accurate to 1e-13 relative like bdtr)."""
    if p <= 0.0 or p >= 1.0:
        return np.asarray(c == (0.0 if p <= 0.0 else float(n)), dtype=np.float64)
    if n > 10**7:
        return np.asarray(stats.binom.pmf(c, n, p), dtype=np.float64)
    log_pmf = (
        special.gammaln(n + 1.0)
        - special.gammaln(c + 1.0)
        - special.gammaln(n - c + 1.0)
        + c * math.log(p)
        + (n - c) * math.log1p(-p)
    )
    return np.asarray(np.exp(log_pmf), dtype=np.float64)


def _mean_lower(s: float, n: int, top: float, noise: NoiseKind, scale: float, tail: float) -> float:
    """A μ excluded from below, the largest found: a μ with a v < s such that
    E(top·Bin(n, μ) + N − v)_+/(s − v) ≤ ``tail`` less the error allowance (0 if μ = 0 is
    not excluded). That ratio bounds P_μ(S + N ≥ s) from above for any S below
    top·Bin(n, μ) in the convex order, e.g. a sum of n independent values in [0, ``top``]
    of mean top·μ (:func:`bounded_mean_interval`) or a scaled AUC (:func:`auc_interval`);
    ``s`` and ``top`` may be real (N stays the worker's integer noise), and,
    for a fixed v, increases with μ, so the v found at the returned μ excludes every
    smaller μ as well. The binomial is summed over a window |c − nμ| ≤ 10 + 8√(nμ(1 − μ))
    and each side outside it is charged its mass times its largest term (the terms increase
    with c, so that is the window's edge below it and c = n above it): any window gives a
    valid bound, this one a tight one. Found to about 1e-8 in μ."""
    target = tail * (1.0 - 1e-6) - _TAIL_ERROR
    spread_noise = 2.0 * scale * scale if noise == "laplace" else scale * scale + 0.25

    def span_of(mu: float) -> float:
        return 10.0 * math.sqrt(top * top * n * mu * (1.0 - mu) + spread_noise) + 1.0

    def certified(mu: float) -> float:
        half = 10.0 + 8.0 * math.sqrt(n * mu * (1.0 - mu))
        lo = max(0, math.floor(n * mu - half))
        hi = min(n, math.ceil(n * mu + half))
        c = np.arange(lo, hi + 1, dtype=np.float64)
        weights = _binomial_pmf(c, n, mu)
        below = float(special.bdtr(lo - 1, n, mu)) if lo > 0 else 0.0
        above = float(special.bdtrc(hi, n, mu)) if hi < n else 0.0
        span = abs(s - top * n * mu) + span_of(mu)

        def bound(d: FloatArray) -> FloatArray:
            v = float(s) - d[:, None]
            inside = _excess_over(noise, scale, v - top * c) @ weights
            edge = np.array([top * (lo - 1.0), top * float(n)])
            ends = _excess_over(noise, scale, v - edge)
            return np.asarray((inside + ends @ np.array([below, above])) / d, dtype=np.float64)

        # Any d = s − v > 0 gives a valid bound: a log grid over (1e-9, 1]·span, then a finer
        # one around its best point.
        coarse = span * np.logspace(-9.0, 0.0, 25)
        values = bound(coarse)
        k = int(np.argmin(values))
        fine = coarse[max(k - 1, 0)] * np.logspace(0.0, 0.75, 16)
        return float(min(values.min(), bound(fine).min()))

    if certified(0.0) > target:
        return 0.0
    if certified(1.0) <= target:
        return 1.0
    # Bracket near the released mean (the root lies below it), else the whole of [0, 1].
    guess = min(max(s / (n * top), 0.0), 1.0)
    a, b = 0.0, 1.0
    if certified(guess) > target:
        b = guess
        floor = max(guess - 3.0 * (span_of(guess) / (n * top)), 0.0)
        if floor > 0.0 and certified(floor) <= target:
            a = floor
    root = float(optimize.brentq(lambda mu: certified(mu) - target, a, b, xtol=1e-8))
    step = 1e-9
    while root > 0.0 and certified(root) > target:
        root -= step
        step *= 2.0
    return max(root, 0.0)


def bounded_mean_interval(
    *,
    noisy_sum: int,
    trials: int,
    unit: float,
    width: float,
    noise: NoiseKind,
    scale: float,
    confidence: float,
) -> Interval:
    """Interval for the population mean μ of a per-row value in [0, ``width``] released as
    a noisy integer sum (grid ``unit`` per integer, G = width/unit grid points; the clipped
    log loss): sampling and noise bounded together, each side at α/2.

    Sampling, for any population of the range: every value q ∈ [0, G] of mean Gm lies
    below G·Bernoulli(m) in the convex order (f(q) ≤ (1 − q/G)f(0) + (q/G)f(G) for convex
    f), and applying this to one row at a time (E f(x + rest) is convex in x) gives
    E f(S) ≤ E f(G·Bin(n, m)) for the row sum S (the convexity step of Hoeffding 1963's
    proof of his Thm 1, for any convex f as in Bentkus 2004, "On Hoeffding's inequalities",
    Ann. Probab. 32, 1650–1673). Bentkus's tail bound, Markov's inequality on (S − v)_+,
    is P(S ≥ s) ≤ inf_v E(S − v)_+/(s − v); here the DP noise N is added inside (it is
    independent of the rows, so the convex-order step holds conditionally on it):
    P_m(S + N ≥ s) ≤ inf_{v<s} E(G·Bin(n, m) + N − v)_+/(s − v), E(·)_+ of the noise in
    closed form (:func:`_excess_over`). m is excluded from below when this is ≤ α/2 at the
    released s (:func:`_mean_lower`), and from above by the mirror image (values G − q,
    noise −N ~ N). The bound is tightest for rows at the range's two ends (simulated
    coverage 0.96–0.97 at a nominal 0.90) and looser for values spread inside it, as log
    losses are (0.95–1.00 in benchmarks/results/private_evaluation.md).
    Grid: each row is rounded to the grid before the sum, which moves μ by ≤ unit/2.
    """
    n = count_at_least("trials", trials, low=1)
    w = positive_number("width", width)
    s = positive_number("scale", scale)
    top = round(w / positive_number("unit", unit))
    if top < 1:
        raise ValueError(f"width {width!r} must span at least one unit {unit!r}")
    tail = (1.0 - confidence) / 2.0
    if tail <= 1e-10:
        return Interval(0.0, w, confidence)
    low_m = _mean_lower(int(noisy_sum), n, top, noise, s, tail)
    high_m = 1.0 - _mean_lower(n * top - int(noisy_sum), n, top, noise, s, tail)
    lower = w * min(low_m, high_m) - unit / 2.0
    upper = w * high_m + unit / 2.0
    return Interval(max(0.0, lower), min(w, upper), confidence)


def calibration_error_interval(
    *, noisy_total: int, trials: int, bins: int, noise: NoiseKind, scale: float, confidence: float
) -> Interval:
    """Interval for the population binned calibration error
    ECE = Σ_b |E[(O − C)·1{C ∈ b}]| (O the outcome, C the confidence, fixed public bins)
    from the noisy integer T̃ = T + N, T = Σ_b |Σ_{i∈b} q_i| (q_i = (o_i − c_i) on the grid
    G, in [−G, G]), f = T/(G n) the empirical ECE; each side at α/2.

    Lower end (f's bias):
    * Sampling: f changes by ≤ 2/n when one row changes, so McDiarmid 1989 gives
      P(|f − E f| ≥ s) ≤ 2exp(−n s²/2), s = √(2 ln(2/(α/2))/n).
    * Bias: |E S_b/n| ≤ E|S_b/n| (Jensen), so ECE ≤ E f, and
      E f − ECE ≤ Σ_b √Var(S_b/n) ≤ Σ_b √(E[w_b²]/n) ≤ √(B/n) (Cauchy–Schwarz, Σ_b E[w_b²]
      = E[(O − C)²] ≤ 1), with w_b = (O − C)1{C ∈ b}.
    * Noise: t/(G n) at α/2 (two-sided, so α/4 below, as is McDiarmid's share).

    Upper end, sampling and noise together: with σ_b the sign of the population's
    E[Σ_{i∈b} q_i], T ≥ Σ_b σ_b Σ_{i∈b} q_i = Σ_i σ_{b(i)} q_i, a sum of n independent
    values in [−G, G] of mean G·μ_q, μ_q ≥ ECE − 1/(2G) (the grid moves each row by ≤ ½).
    So X = 2nG − Σ_i(σ_{b(i)} q_i + G) − N ≥ nG − T̃ is a sum of n values in [0, 2G] of
    mean 2G·ν, ν = (1 − μ_q)/2, plus noise −N ~ N, and :func:`_mean_lower` (Hoeffding
    1963's convex-order step and Bentkus 2004's tail bound, as in
    :func:`bounded_mean_interval`) at s = nG − T̃ ≤ X gives ν_L with P(ν < ν_L) ≤ α/2
    (its bound decreases in s); hence ECE ≤ 1 − 2ν_L + 1/(2G). Its sampling spread is the
    worst case of a mean of n values in [−1, 1], √(1/n) (McDiarmid's upper term, used
    before, was √(2 ln(4/α)/n) plus the noise's quantile).
    """
    n = count_at_least("trials", trials, low=1)
    s_noise = positive_number("scale", scale)
    a = _split_alpha(confidence, 2)
    t = noise_tail(noise=noise, scale=s_noise, probability=a)
    s = math.sqrt(2.0 * math.log(2.0 / a) / n)
    f = noisy_total / (ECE_GRID * n)
    noise_width = t / (ECE_GRID * n) + 1.0 / (2.0 * ECE_GRID)
    lower = f - noise_width - s - math.sqrt(bins / n)
    nu_low = _mean_lower(
        float(n * ECE_GRID - int(noisy_total)), n, 2.0 * ECE_GRID, noise, s_noise, a
    )
    upper = 1.0 - 2.0 * nu_low + 1.0 / (2.0 * ECE_GRID)
    return Interval(max(0.0, lower), min(1.0, max(upper, lower)), confidence)


def _auc_range(twice_u: int, t: int, lo: int, hi: int, n: int) -> tuple[float, float]:
    """The range of U/(n₊n₋) over 2U ∈ [ũ − t, ũ + t] and n₊ ∈ [lo, hi] (1 ≤ lo ≤ hi ≤
    n − 1, n₋ = n − n₊): n₊(n − n₊) is concave in n₊, so its minimum over the interval is
    at an end and its maximum at the point nearest n/2."""
    lowest = min(lo * (n - lo), hi * (n - hi))
    mid = min(max(n / 2.0, lo), hi)
    highest = mid * (n - mid)
    a = (twice_u - t) / (2.0 * (highest if twice_u - t >= 0 else lowest))
    b = (twice_u + t) / (2.0 * (lowest if twice_u + t >= 0 else highest))
    return a, b


AUC_COUNT_ALPHA: Final[float] = 0.25
"""The part of α the binary AUC interval spends on its box for the positive count n₊; the
rest goes, half a side, to the joint tail bound of 2U's sampling and noise. A public
constant (fixed before any release), chosen on benchmarks/private_evaluation.py's
population: the box's width enters the ratio U/(n₊n₋) quadratically, the tail bound's level
only logarithmically."""


def _binary_auc_interval(
    *,
    twice_u: int,
    count: int,
    n: int,
    noise: NoiseKind,
    scale: float,
    count_scale: float,
    confidence: float,
) -> Interval:
    """Binary AUC A from the noisy ũ = 2U + N and ñ₊ = n₊ + N' (:func:`auc_interval`):

    * Counts (Berger & Boos 1994, "P values maximized over a confidence set for the nuisance
      parameter", JASA 89, 1012–1016: a test maximised over a confidence set for the
      nuisance parameter, plus that set's level): |N'| ≤ τ (:func:`noise_tail` at
      γ = AUC_COUNT_ALPHA·α), so n₊ = m lies in [lo, hi] = [ñ₊ − τ, ñ₊ + τ] ∩ [1, n − 1]; on
      it D_m = 2m(n − m) lies in [D_lo, D_hi] and k_m = min(m, n − m) ≥ k = min(lo, n − hi).
    * Sampling, conditional on the labels with n₊ = m: the holdout's AUC Â = U/(m(n − m))
      is a two-sample U-statistic of the kernel h ∈ {0, ½, 1} with mean A. Hoeffding 1963
      (§5, his representation of a U-statistic as an average of means of independent
      terms) writes Â = E[V | data], V the mean of h over k pairs of distinct positives and
      negatives chosen at random (any k ≤ k_m: every pair is equally likely), whose k terms
      are independent with mean A; so E f(Â) ≤ E f(V) for convex f (Jensen), and
      E f(V) ≤ E f(Bin(k, A)/k) (values in [0, 1] below the Bernoulli of their mean in the
      convex order, the step of Hoeffding 1963's Thm 1 used in
      :func:`bounded_mean_interval`). Its variance A(1 − A)/k is, up to k = min(n₊, n₋),
      the largest an AUC estimate can have (Birnbaum & Klose 1957, "Bounds for the
      variance of the Mann–Whitney statistic", Ann. Math. Statist. 28, 933–945); McDiarmid's
      bound, used before, has the variance of 1/(1/n₊ + 1/n₋) ≈ k/2 pairs.
    * Noise, jointly with the sampling: T = ũ/D_m = Â + N/D_m. For m in the box,
      D_lo·T = D_lo·Â + (D_lo/D_m)·N lies below (D_lo/k)·Bin(k, A) + N in the convex order
      (λN ≤_cx N for λ ∈ [0, 1] as E N = 0: f(λx) ≤ λf(x) + (1 − λ)f(0) and f(0) ≤ E f(N);
      sums of independent terms keep the order, Shaked & Shanthikumar 2007, "Stochastic
      Orders", Thm 3.A.12), so :func:`_mean_lower` (Bentkus 2004's bound
      P(X ≥ s) ≤ inf_v E(X − v)_+/(s − v) on that dominating law) excludes A from below at
      level β = (α − γ)/2 when D_lo·x ≥ that bound's quantile, x = ũ/D_hi (ũ ≥ 0; ũ/D_lo
      else) being ≤ T's observed value for every m in the box. Above, the mirror image
      (1 − Â has the same form with mean 1 − A, −N ~ N) at x' = ũ/D_lo (ũ/D_hi if ũ < 0).
      A miss needs the box to miss (≤ γ) or one of the two tests to reject the true A
      (≤ β each, conditionally on the labels), so coverage ≥ 1 − α for every labelling
      with both classes present (one class empty: no AUC, probability (1 − p₊)ⁿ + p₊ⁿ).
    """
    alpha = 1.0 - confidence
    gamma = alpha * AUC_COUNT_ALPHA
    beta = (alpha - gamma) / 2.0
    if beta <= 1e-10 or n < 2:
        return Interval(0.0, 1.0, confidence)
    tau = noise_tail(noise=noise, scale=count_scale, probability=gamma)
    lo, hi = max(1, count - tau), min(n - 1, count + tau)
    if lo > hi:
        return Interval(0.0, 1.0, confidence)
    d_lo = 2.0 * min(lo * (n - lo), hi * (n - hi))
    mid = min(max(n // 2, lo), hi)
    d_hi = 2.0 * mid * (n - mid)
    pairs = min(lo, n - hi)
    top = d_lo / pairs
    x_low = twice_u / (d_hi if twice_u >= 0 else d_lo)
    x_high = twice_u / (d_lo if twice_u >= 0 else d_hi)
    lower = _mean_lower(d_lo * x_low, pairs, top, noise, scale, beta)
    upper = 1.0 - _mean_lower(d_lo * (1.0 - x_high), pairs, top, noise, scale, beta)
    return Interval(max(0.0, lower), min(1.0, max(upper, lower)), confidence)


def auc_interval(
    *, plan: EvaluationPlan, noisy_twice_u: Sequence[int], noisy_counts: Sequence[int]
) -> Interval:
    """Interval for the AUC from the noisy 2U (binary; K ≥ 3: each class's 2U_k) and the
    noisy class counts (binary: n₊; K ≥ 3: each n_k).

    Binary: :func:`_binary_auc_interval` (sampling and 2U's noise bounded together, the
    count by a box at AUC_COUNT_ALPHA·α). K ≥ 3: three events at α/3 each (union bound,
    conservative):

    * 2U's noise: |N| ≤ t per coordinate (:func:`noise_tail` at α/3, K ≥ 3 at α/(3K)), so
      2U ∈ [ũ − t, ũ + t];
    * the counts' noise: |N'| ≤ τ likewise, so n₊ ∈ [ñ₊ − τ, ñ₊ + τ] ∩ [1, n − 1]; the
      holdout's AUC Â = U/(n₊n₋) then lies in the range of that ratio over both boxes
      (:func:`_auc_range`);
    * sampling, conditional on the labels: the scores of the positives and of the
      negatives are independent samples, and Â is a U-statistic whose mean is the
      population AUC (binary) with bounded differences 1/n₊ (a positive) and 1/n₋ (a
      negative), so McDiarmid 1989 gives P(|Â − A| ≥ s) ≤ 2exp(−2s²/(1/n₊ + 1/n₋))
      (Agarwal et al. 2005, "Generalization bounds for the area under the ROC curve",
      JMLR, use the same bound), s evaluated at the box's smallest n₊ and n₋.
    For K ≥ 3 the macro AUC is the mean of the K one-vs-rest ranges; a row of class a has
    bounded difference c_a = (1/K)(1/n_a + Σ_{k≠a} 1/(n − n_k)) and s² = ln(2/α')·Σ_a n_a
    c_a²/2 (each factor at the box's worst end); there the mean is the macro AUC *with the
    holdout's class mix* as the weights of each one-vs-rest negative class (sklearn's
    definition on the holdout), which differs from the population's mix: the interval
    covers that label-conditional value, not the population macro AUC.
    A box with no n₊ in [1, n − 1] (a class may be empty) gives [0, 1]. Coverage measured
    in benchmarks/results/private_evaluation.md (conservative: the three events rarely
    fail together).
    """
    entry = plan.metric("auc")
    assert entry.count_scale is not None
    if plan.classes == 2 and len(noisy_twice_u) == 1 and len(noisy_counts) == 1:
        return _binary_auc_interval(
            twice_u=int(noisy_twice_u[0]),
            count=int(noisy_counts[0]),
            n=plan.n,
            noise=plan.noise,
            scale=entry.scale,
            count_scale=entry.count_scale,
            confidence=plan.confidence,
        )
    a = _split_alpha(plan.confidence, 3)
    k = plan.classes
    n = plan.n
    per = a if k == 2 else a / k
    t = noise_tail(noise=plan.noise, scale=entry.scale, probability=per)
    tau = noise_tail(noise=plan.noise, scale=entry.count_scale, probability=per)
    boxes = [(max(1, c - tau), min(n - 1, c + tau)) for c in noisy_counts]
    if len(noisy_counts) != len(noisy_twice_u) or any(lo > hi for lo, hi in boxes):
        return Interval(0.0, 1.0, plan.confidence)
    ranges = [
        _auc_range(int(u), t, lo, hi, n) for u, (lo, hi) in zip(noisy_twice_u, boxes, strict=True)
    ]
    low = sum(r[0] for r in ranges) / len(ranges)
    high = sum(r[1] for r in ranges) / len(ranges)
    if k == 2:
        lo, hi = boxes[0]
        var = 1.0 / lo + 1.0 / (n - hi)
    else:
        inv_rest = [1.0 / (n - hi) for _, hi in boxes]
        var = sum(
            hi * ((1.0 / lo + sum(inv_rest) - inv_rest[c]) / k) ** 2
            for c, (lo, hi) in enumerate(boxes)
        )
    s = math.sqrt(math.log(2.0 / a) * var / 2.0)
    return Interval(max(0.0, low - s), min(1.0, high + s), plan.confidence)
