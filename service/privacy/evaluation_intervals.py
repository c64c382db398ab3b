"""Confidence intervals of the private evaluation's released metrics
(service/privacy/evaluation.py releases them; split from it, issue 23: one idea per module).

Confidence intervals (:func:`proportion_interval`, :func:`bounded_mean_interval`,
:func:`calibration_error_interval`, :func:`auc_interval`):
each interval covers the *population* value with probability ≥ the stated level over
both the holdout draw (rows i.i.d. from the population) and the DP noise, by a union bound
over: the noise exceeding its (1 − α_n) quantile t (so the noiseless statistic lies
within t of the released one), and a sampling interval at level α_s that is monotone in
the statistic (so widening by t in statistic units keeps it valid). α is split equally
between the events used (two, or three for AUC, which also bounds its private class
counts). Each metric's interval is pointwise (not simultaneous across metrics or cells).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from service.privacy.audit import clopper_pearson_lower, clopper_pearson_upper
from service.privacy.evaluation import (
    ECE_GRID,
    AucStage,
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


@dataclass(frozen=True)
class Interval:
    """A confidence interval [lower, upper] in the metric's units at ``confidence``."""

    lower: float
    upper: float
    confidence: float


def _split_alpha(confidence: float, parts: int) -> float:
    return (1.0 - confidence) / parts


def proportion_interval(
    *, noisy_count: int, trials: int, noise: NoiseKind, scale: float, confidence: float
) -> Interval:
    """Interval for a population proportion π from a noisy binomial count C̃ = C + N,
    C ~ Bin(n, π) (accuracy; a confusion cell; a class's prevalence).

    With t = :func:`noise_tail` at α/2, C ∈ [C̃ − t, C̃ + t] except with probability α/2;
    the two-sided Clopper–Pearson interval at level α/2 (Clopper & Pearson 1934), whose
    ends increase with the count, evaluated at max(0, C̃ − t) and min(n, C̃ + t), then
    misses π with probability ≤ α/2 + α/2 (union bound).
    """
    n = count_at_least("trials", trials, low=1)
    a = _split_alpha(confidence, 2)
    t = noise_tail(noise=noise, scale=scale, probability=a)
    lo_count = min(max(noisy_count - t, 0), n)
    hi_count = min(max(noisy_count + t, 0), n)
    lo = clopper_pearson_lower(successes=lo_count, trials=n, alpha=a / 2) if lo_count > 0 else 0.0
    hi = clopper_pearson_upper(successes=hi_count, trials=n, alpha=a / 2) if hi_count < n else 1.0
    return Interval(lo, hi, confidence)


def _kl_bernoulli(a: float, b: float) -> float:
    """kl(a‖b) = a ln(a/b) + (1 − a) ln((1 − a)/(1 − b)) for a ∈ [0, 1], b ∈ (0, 1)."""
    out = 0.0
    if a > 0.0:
        out += a * math.log(a / b)
    if a < 1.0:
        out += (1.0 - a) * math.log((1.0 - a) / (1.0 - b))
    return out


def _kl_bound(x: float, level: float, *, upper: bool) -> float:
    """The q beyond x (above if ``upper``) where kl(x‖q) reaches ``level``, by bisection:
    the end of Hoeffding's KL interval for a mean of [0, 1] values. Bisection stops on an
    interval of 1e-12, returned on the outer side."""
    x = min(max(x, 0.0), 1.0)
    lo, hi = (x, 1.0) if upper else (0.0, x)
    if upper and (x >= 1.0 or _kl_bernoulli(x, 1.0 - 1e-15) <= level):
        return 1.0
    if not upper and (x <= 0.0 or _kl_bernoulli(x, 1e-15) <= level):
        return 0.0
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        inside = _kl_bernoulli(x, mid) <= level
        if inside == upper:
            lo = mid
        else:
            hi = mid
    return hi if upper else lo


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
    a noisy integer sum (grid ``unit`` per integer; the clipped log loss).

    Sampling: Hoeffding 1963, Thm 1 (the Kullback–Leibler form, which is the binomial
    Chernoff bound and holds for any values in [0, 1]): P(X̄ − μ ≥ s) ≤ exp(−n·kl(μ + s‖μ))
    and the mirror inequality, so with each side at α/4 the set of μ with
    n·kl(x̄‖μ/width) ≤ ln(4/α) covers μ; its ends increase with x̄. Much tighter than the
    range-only Hoeffding bound when μ is small against ``width`` (log loss ≈ 0.5 against
    −ln p_min ≈ 9.2). Noise: x̄ lies within t·unit/n of the released mean (t at α/2).
    Grid: each row is rounded to the grid before the sum, which moves μ by ≤ unit/2.
    """
    n = count_at_least("trials", trials, low=1)
    w = positive_number("width", width)
    a = _split_alpha(confidence, 2)
    t = noise_tail(noise=noise, scale=scale, probability=a)
    level = math.log(4.0 / a) / n
    low_mean = (noisy_sum - t) * unit / n
    high_mean = (noisy_sum + t) * unit / n
    lower = w * _kl_bound(low_mean / w, level, upper=False) - unit / 2.0
    upper = w * _kl_bound(high_mean / w, level, upper=True) + unit / 2.0
    return Interval(max(0.0, lower), min(w, upper), confidence)


def calibration_error_interval(
    *, noisy_total: int, trials: int, bins: int, noise: NoiseKind, scale: float, confidence: float
) -> Interval:
    """Interval for the population binned calibration error
    ECE = Σ_b |E[(O − C)·1{C ∈ b}]| (O the outcome, C the confidence, fixed public bins)
    from the noisy integer T̃ = T + N, f = T/(G n) the empirical ECE.

    * Sampling: f changes by ≤ 2/n when one row changes, so McDiarmid 1989 gives
      P(|f − E f| ≥ s) ≤ 2exp(−n s²/2), s = √(2 ln(2/(α/2))/n).
    * Bias: |E S_b/n| ≤ E|S_b/n| (Jensen), so ECE ≤ E f, and
      E f − ECE ≤ Σ_b √Var(S_b/n) ≤ Σ_b √(E[w_b²]/n) ≤ √(B/n) (Cauchy–Schwarz, Σ_b E[w_b²]
      = E[(O − C)²] ≤ 1), with w_b = (O − C)1{C ∈ b}.
    * Noise: t/(G n) at α/2; the grid moves ECE by ≤ 1/(2G).
    """
    n = count_at_least("trials", trials, low=1)
    a = _split_alpha(confidence, 2)
    t = noise_tail(noise=noise, scale=scale, probability=a)
    s = math.sqrt(2.0 * math.log(2.0 / a) / n)
    f = noisy_total / (ECE_GRID * n)
    noise_width = t / (ECE_GRID * n) + 1.0 / (2.0 * ECE_GRID)
    lower = f - noise_width - s - math.sqrt(bins / n)
    upper = f + noise_width + s
    return Interval(max(0.0, lower), min(1.0, upper), confidence)


def auc_interval(
    *,
    plan: EvaluationPlan,
    stage: AucStage,
    noisy_stat: int,
    noisy_counts: Sequence[int],
) -> Interval:
    """Interval for the AUC from the noisy grid value, three events at α/3 each:

    * noise: |N| ≤ t (t = :func:`noise_tail`), so the noiseless grid value is within t;
    * counts: the class counts lie within τ' of the noisy counts (τ' at α/3, per count
      α/(3K) for K ≥ 3), which bounds n₁, n₀ (or n_k) from below for the width below;
    * sampling, conditional on the labels: the scores of the positives and of the
      negatives are independent samples, and the empirical AUC is a U-statistic whose
      mean is the population AUC (binary) with bounded differences 1/n₁ (a positive) and
      1/n₀ (a negative), so McDiarmid 1989 gives
      P(|Â − A| ≥ s) ≤ 2exp(−2s²/(1/n₁ + 1/n₀)) (Agarwal et al. 2005, "Generalization
      bounds for the area under the ROC curve", JMLR, use the same bound).
    For K ≥ 3 a row of class a has bounded difference c_a = (1/K)(1/n_a + Σ_{k≠a}
    1/(n − n_k)) and s² = ln(2/α')·Σ_a n_a c_a²/2; there the mean is the macro AUC *with
    the holdout's class mix* as the weights of each one-vs-rest negative class (sklearn's
    definition on the holdout), which differs from the population's mix: the interval
    covers that label-conditional value, not the population macro AUC.
    The grid rounding adds unit/2.
    """
    entry = plan.metric("auc")
    assert entry.count_scale is not None
    a = _split_alpha(plan.confidence, 3)
    if not stage.released:
        return Interval(0.0, 1.0, plan.confidence)
    k = plan.classes
    t = noise_tail(noise=plan.noise, scale=entry.scale, probability=a)
    per = a if k == 2 else a / k
    tau = noise_tail(noise=plan.noise, scale=entry.count_scale, probability=per)
    n = plan.n
    if k == 2:
        p_lo, q_lo = noisy_counts[0] - tau, n - noisy_counts[0] - tau
        if min(p_lo, q_lo) < 1:
            return Interval(0.0, 1.0, plan.confidence)
        var = 1.0 / p_lo + 1.0 / q_lo
    else:
        lo = [c - tau for c in noisy_counts]
        rest = [n - c - tau for c in noisy_counts]
        if min(lo + rest) < 1:
            return Interval(0.0, 1.0, plan.confidence)
        hi = [min(n, c + tau) for c in noisy_counts]
        inv_rest = sum(1.0 / r for r in rest)
        var = sum(h * ((1.0 / m + inv_rest) / k) ** 2 for h, m in zip(hi, lo, strict=True))
    s = math.sqrt(math.log(2.0 / a) * var / 2.0)
    unit = float(stage.unit)
    centre = noisy_stat * unit
    half = s + t * unit + unit / 2.0
    return Interval(max(0.0, centre - half), min(1.0, centre + half), plan.confidence)
