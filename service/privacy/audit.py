"""Empirical privacy audits: a statistical *lower* bound on ε from a threshold test.

An audit runs a mechanism many times on two neighbouring datasets (world 0 and world 1,
differing by one row), computes a scalar statistic of each release, and guesses "world 1"
when the statistic lies on world 1's side of a threshold t ("above": S > t; "below":
S < t). Call a run of world 0 with that guess a false positive and a run of world 1
without it a false negative.

Hypothesis-testing view of DP (Wasserman & Zhou 2010; Kairouz, Oh & Viswanath 2015,
"The composition theorem for differential privacy", Thm 2.1): if the mechanism is
(ε, δ)-DP, every test satisfies both

    FPR + e^ε · FNR ≥ 1 − δ    and    e^ε · FPR + FNR ≥ 1 − δ,

so ε ≥ log((1 − δ − FNR)/FPR) and ε ≥ log((1 − δ − FPR)/FNR). The rates are unknown; we
replace them by one-sided Clopper–Pearson upper bounds FPR_u, FNR_u (Clopper & Pearson
1934), each at level α/(2m) where m is the number of thresholds the confidence is
corrected for. With probability ≥ 1 − α (union bound over the 2m estimates) every
FPR ≤ FPR_u and FNR ≤ FNR_u; on that event both inequalities, for every candidate, give

    ε ≥ ε_lb = max(0, log((1 − δ − FNR_u)/FPR_u), log((1 − δ − FPR_u)/FNR_u)),

(a direction whose numerator is ≤ 0 contributes 0). This is the estimator of Jagielski,
Ullman & Oprea 2020 ("Auditing Differentially Private Machine Learning: How Private is
Private SGD?") and Nasr et al. 2021 ("Adversary Instantiation: Lower Bounds for
Differentially Private Machine Learning"). Taking the maximum over the two directions
needs no further correction: both directions use the same two estimates.

Choosing the threshold must not overfit the runs that measure it. Two rules are offered:

* :func:`scan_bound`: a fixed, small set of candidate thresholds chosen before the runs
  (e.g. from public plan values); the confidence is Bonferroni-corrected over the
  candidates (and over both orientations if both are scanned).
* :func:`split_bound`: the threshold and the orientation are chosen on a *selection*
  part of the runs (the first ``selection_fraction`` of each world), and the bound is
  computed on the remaining, held-out runs, which are independent of that choice, so no
  correction is needed (m = 1).

Units: ε in nats; δ a probability; confidence = 1 − α, the probability (over the runs)
that the reported ε_lb is ≤ the true ε of any (ε, δ)-DP mechanism that produced them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from scipy import stats

__all__ = [
    "EpsilonLowerBound",
    "Orientation",
    "ProportionInterval",
    "ThresholdRule",
    "clopper_pearson_interval",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "probability_bound_reaches",
    "scan_bound",
    "split_bound",
    "threshold_bound",
]

Orientation = Literal["above", "below"]
ThresholdRule = Literal["fixed", "bonferroni_scan", "split"]


# ------------------------------------------------------------------ Clopper–Pearson


@dataclass(frozen=True)
class ProportionInterval:
    """A two-sided Clopper–Pearson interval for a binomial proportion."""

    lower: float
    upper: float
    successes: int
    trials: int
    confidence: float


def _check_count(successes: int, trials: int) -> None:
    for name, v in (("successes", successes), ("trials", trials)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")


def _check_level(name: str, value: float) -> float:
    v = float(value)
    if not (math.isfinite(v) and 0.0 < v < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return v


def _cp_upper(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """One-sided upper bound: P(p ≤ U(K)) ≥ 1 − alpha. U = Beta⁻¹(1 − α; k + 1, n − k),
    U = 1 at k = n (Clopper & Pearson 1934)."""
    k = np.asarray(successes, dtype=float)
    safe_b = np.where(k < trials, trials - k, 1.0)
    q = stats.beta.ppf(1.0 - alpha, k + 1.0, safe_b)
    return np.where(k >= trials, 1.0, q)


def _cp_lower(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """One-sided lower bound: P(p ≥ L(K)) ≥ 1 − alpha. L = Beta⁻¹(α; k, n − k + 1),
    L = 0 at k = 0."""
    k = np.asarray(successes, dtype=float)
    safe_a = np.where(k > 0, k, 1.0)
    q = stats.beta.ppf(alpha, safe_a, trials - k + 1.0)
    return np.where(k <= 0, 0.0, q)


def clopper_pearson_upper(*, successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 − alpha) Clopper–Pearson upper confidence bound on a proportion."""
    _check_count(successes, trials)
    return float(_cp_upper(np.asarray(successes), trials, _check_level("alpha", alpha)))


def clopper_pearson_lower(*, successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 − alpha) Clopper–Pearson lower confidence bound on a proportion."""
    _check_count(successes, trials)
    return float(_cp_lower(np.asarray(successes), trials, _check_level("alpha", alpha)))


def clopper_pearson_interval(
    *, successes: int, trials: int, confidence: float
) -> ProportionInterval:
    """Two-sided interval: each side at level (1 − confidence)/2 (Clopper & Pearson 1934)."""
    _check_count(successes, trials)
    alpha = 1.0 - _check_level("confidence", confidence)
    return ProportionInterval(
        lower=float(_cp_lower(np.asarray(successes), trials, alpha / 2)),
        upper=float(_cp_upper(np.asarray(successes), trials, alpha / 2)),
        successes=int(successes),
        trials=int(trials),
        confidence=float(confidence),
    )


# ------------------------------------------------------------------ the ε lower bound


@dataclass(frozen=True)
class EpsilonLowerBound:
    """The result of one audit.

    ``epsilon`` (nats, ≥ 0) is a lower bound on the ε of every (ε, δ)-DP mechanism that
    could have produced these runs, valid with probability ≥ ``confidence`` over the runs.
    ``hits_world*`` count the runs whose statistic lay on world 1's side of ``threshold``
    (S > t for orientation "above", S < t for "below") among the ``runs_world*`` runs that
    measured the bound; ``selection_runs_world*`` runs (rule "split") only chose the
    threshold. ``comparisons`` is the Bonferroni factor m (thresholds × orientations).
    """

    epsilon: float
    threshold: float
    orientation: Orientation
    hits_world0: int
    runs_world0: int
    hits_world1: int
    runs_world1: int
    fpr_upper: float
    fnr_upper: float
    delta: float
    confidence: float
    comparisons: int
    rule: ThresholdRule
    selection_runs_world0: int = 0
    selection_runs_world1: int = 0


def _check_comparisons(comparisons: int) -> None:
    if isinstance(comparisons, bool) or not isinstance(comparisons, int) or comparisons < 1:
        raise ValueError(f"comparisons must be an int >= 1, got {comparisons!r}")


def _check_delta(delta: float) -> float:
    d = float(delta)
    if not (math.isfinite(d) and 0.0 <= d < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return d


def _epsilon_from_uppers(fpr_u: np.ndarray, fnr_u: np.ndarray, delta: float) -> np.ndarray:
    """max(0, log((1−δ−FNR_u)/FPR_u), log((1−δ−FPR_u)/FNR_u)) elementwise (Kairouz et al.
    2015, Thm 2.1). FPR_u, FNR_u > 0 always (a CP upper bound is positive)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr_u, 0.0) / fpr_u)
        b = np.log(np.maximum(1.0 - delta - fpr_u, 0.0) / fnr_u)
    return np.maximum(np.maximum(a, b), 0.0)


def epsilon_lower_bound(
    *,
    hits_world0: int,
    runs_world0: int,
    hits_world1: int,
    runs_world1: int,
    delta: float,
    confidence: float = 0.95,
    comparisons: int = 1,
    threshold: float = math.nan,
    orientation: Orientation = "above",
    rule: ThresholdRule = "fixed",
) -> EpsilonLowerBound:
    """ε_lb from the counts of one threshold test (see the module docstring).

    ``hits_world0``: world-0 runs the test flagged as world 1 (false positives);
    ``hits_world1``: world-1 runs it flagged (true positives). For an "above" test these
    are the counts of runs whose statistic exceeds the threshold. ``comparisons`` (m ≥ 1)
    is how many such tests the caller maximises over; each rate is then bounded at level
    α/(2m), α = 1 − confidence, so the maximum keeps the stated confidence.
    """
    _check_count(hits_world0, runs_world0)
    _check_count(hits_world1, runs_world1)
    conf = _check_level("confidence", confidence)
    d = _check_delta(delta)
    _check_comparisons(comparisons)
    if orientation not in ("above", "below"):
        raise ValueError(f"orientation must be 'above' or 'below', got {orientation!r}")
    alpha_each = (1.0 - conf) / (2 * comparisons)
    fpr_u = float(_cp_upper(np.asarray(hits_world0), runs_world0, alpha_each))
    fnr_u = float(_cp_upper(np.asarray(runs_world1 - hits_world1), runs_world1, alpha_each))
    eps = float(_epsilon_from_uppers(np.asarray(fpr_u), np.asarray(fnr_u), d))
    return EpsilonLowerBound(
        epsilon=eps,
        threshold=float(threshold),
        orientation=orientation,
        hits_world0=int(hits_world0),
        runs_world0=int(runs_world0),
        hits_world1=int(hits_world1),
        runs_world1=int(runs_world1),
        fpr_upper=fpr_u,
        fnr_upper=fnr_u,
        delta=d,
        confidence=conf,
        comparisons=int(comparisons),
        rule=rule,
    )


def _as_statistics(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(values, dtype=float).reshape(-1)
    if a.size < 1:
        raise ValueError(f"{name} is empty")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} holds a non-finite statistic")
    return a


def _hits(values: np.ndarray, threshold: float, orientation: Orientation) -> int:
    return int(
        np.count_nonzero(values > threshold if orientation == "above" else values < threshold)
    )


def _bound_of_test(
    s0: np.ndarray,
    s1: np.ndarray,
    threshold: float,
    orientation: Orientation,
    **kw: Any,
) -> EpsilonLowerBound:
    """ε_lb of the test "statistic {orientation} threshold" on the two worlds' runs."""
    return epsilon_lower_bound(
        hits_world0=_hits(s0, threshold, orientation),
        runs_world0=s0.size,
        hits_world1=_hits(s1, threshold, orientation),
        runs_world1=s1.size,
        threshold=threshold,
        orientation=orientation,
        **kw,
    )


def threshold_bound(
    *,
    stats_world0: Sequence[float] | np.ndarray,
    stats_world1: Sequence[float] | np.ndarray,
    threshold: float,
    delta: float,
    confidence: float = 0.95,
    orientation: Orientation = "above",
) -> EpsilonLowerBound:
    """ε_lb of one threshold fixed before the runs (no correction)."""
    s0 = _as_statistics("stats_world0", stats_world0)
    s1 = _as_statistics("stats_world1", stats_world1)
    return _bound_of_test(
        s0, s1, threshold, orientation, delta=delta, confidence=confidence, rule="fixed"
    )


def scan_bound(
    *,
    stats_world0: Sequence[float] | np.ndarray,
    stats_world1: Sequence[float] | np.ndarray,
    thresholds: Sequence[float],
    delta: float,
    confidence: float = 0.95,
    orientations: Sequence[Orientation] = ("above",),
) -> EpsilonLowerBound:
    """The best of a fixed set of candidate tests, Bonferroni-corrected.

    ``thresholds`` and ``orientations`` must be fixed before the runs are seen (e.g. from
    public plan values). Each of the m = len(thresholds)·len(orientations) tests bounds its
    two rates at level α/(2m); with probability ≥ 1 − α all 2m bounds hold at once, so the
    maximum over the tests is a valid ε_lb at the stated confidence.
    """
    s0 = _as_statistics("stats_world0", stats_world0)
    s1 = _as_statistics("stats_world1", stats_world1)
    ts = [float(t) for t in thresholds]
    if not ts or not all(math.isfinite(t) for t in ts):
        raise ValueError("thresholds must be a non-empty sequence of finite numbers")
    ors = list(dict.fromkeys(orientations))
    if not ors or any(o not in ("above", "below") for o in ors):
        raise ValueError(
            f"orientations must be a non-empty subset of above/below, got {orientations!r}"
        )
    m = len(ts) * len(ors)
    best: EpsilonLowerBound | None = None
    for o in ors:
        for t in ts:
            r = _bound_of_test(
                s0,
                s1,
                t,
                o,
                delta=delta,
                confidence=confidence,
                comparisons=m,
                rule="bonferroni_scan",
            )
            if best is None or r.epsilon > best.epsilon:
                best = r
    assert best is not None
    return best


def _best_split_threshold(
    s0: np.ndarray, s1: np.ndarray, *, delta: float, confidence: float
) -> tuple[float, Orientation]:
    """The (threshold, orientation) maximising ε_lb on the selection runs; ties (e.g. all
    zero) go to the larger observed TPR − FPR. Candidates: the midpoints between
    consecutive distinct pooled values, in both orientations."""
    pooled = np.unique(np.concatenate([s0, s1]))
    if pooled.size < 2:
        return float(pooled[0]), "above"
    cand = (pooled[:-1] + pooled[1:]) / 2.0
    above0 = s0.size - np.searchsorted(np.sort(s0), cand, side="right")
    above1 = s1.size - np.searchsorted(np.sort(s1), cand, side="right")
    # No value equals a midpoint of distinct neighbours, so "below" = runs − "above".
    alpha_each = (1.0 - confidence) / 2
    best: tuple[float, float, float, Orientation] = (-1.0, -2.0, float(cand[0]), "above")
    orientation: Orientation
    for orientation, h0, h1 in (
        ("above", above0, above1),
        ("below", s0.size - above0, s1.size - above1),
    ):
        fpr_u = _cp_upper(h0, s0.size, alpha_each)
        fnr_u = _cp_upper(s1.size - h1, s1.size, alpha_each)
        eps = _epsilon_from_uppers(fpr_u, fnr_u, delta)
        youden = h1 / s1.size - h0 / s0.size
        i = int(np.lexsort((-youden, -eps))[0])  # max ε_lb, then max TPR − FPR
        if (float(eps[i]), float(youden[i])) > best[:2]:
            best = (float(eps[i]), float(youden[i]), float(cand[i]), orientation)
    return best[2], best[3]


def split_bound(
    *,
    stats_world0: Sequence[float] | np.ndarray,
    stats_world1: Sequence[float] | np.ndarray,
    delta: float,
    confidence: float = 0.95,
    selection_fraction: float = 0.5,
) -> EpsilonLowerBound:
    """Choose the test on held-in runs, measure it on held-out runs.

    The first ⌈selection_fraction · runs⌉ statistics of each world (in run order: the runs
    must be independent and identically distributed within a world, which the order of
    execution does not change) choose the threshold and orientation that maximise ε_lb on
    them; the rest measure ε_lb for that single test. The held-out runs are independent of
    the choice, so the confidence needs no correction (comparisons = 1).
    """
    s0 = _as_statistics("stats_world0", stats_world0)
    s1 = _as_statistics("stats_world1", stats_world1)
    f = float(selection_fraction)
    if not (math.isfinite(f) and 0.0 < f < 1.0):
        raise ValueError(f"selection_fraction must be in (0, 1), got {selection_fraction!r}")
    k0, k1 = math.ceil(f * s0.size), math.ceil(f * s1.size)
    if k0 >= s0.size or k1 >= s1.size:
        raise ValueError("too few runs to hold any out: need at least 2 per world")
    conf = _check_level("confidence", confidence)
    d = _check_delta(delta)
    t, o = _best_split_threshold(s0[:k0], s1[:k1], delta=d, confidence=conf)
    e0, e1 = s0[k0:], s1[k1:]
    r = _bound_of_test(e0, e1, t, o, delta=d, confidence=conf, rule="split")
    return replace(r, selection_runs_world0=k0, selection_runs_world1=k1)


# ------------------------------------------------------------------ design check


def probability_bound_reaches(
    *,
    epsilon: float,
    rate_world0: float,
    rate_world1: float,
    runs_world0: int,
    runs_world1: int,
    delta: float,
    confidence: float = 0.95,
    comparisons: int = 1,
) -> float:
    """P(ε_lb ≥ epsilon) for one test whose true hit rates are ``rate_world0`` (its FPR)
    and ``rate_world1`` (its TPR): an exact sum over the two binomial counts.

    Used to size an audit: with the rates of a correctly implemented mechanism this is the
    probability of a false failure; with the rates of a broken one, the power.
    """
    if not math.isfinite(float(epsilon)):
        raise ValueError(f"epsilon must be finite, got {epsilon!r}")
    for name, p in (("rate_world0", rate_world0), ("rate_world1", rate_world1)):
        if not (math.isfinite(float(p)) and 0.0 <= float(p) <= 1.0):
            raise ValueError(f"{name} must be in [0, 1], got {p!r}")
    _check_count(0, runs_world0)
    _check_count(0, runs_world1)
    conf = _check_level("confidence", confidence)
    d = _check_delta(delta)
    _check_comparisons(comparisons)
    alpha_each = (1.0 - conf) / (2 * comparisons)
    k0 = np.arange(runs_world0 + 1)
    k1 = np.arange(runs_world1 + 1)
    fpr_u = _cp_upper(k0, runs_world0, alpha_each)[:, None]
    fnr_u = _cp_upper(runs_world1 - k1, runs_world1, alpha_each)[None, :]
    reaches = _epsilon_from_uppers(fpr_u, fnr_u, d) >= float(epsilon)
    p0 = stats.binom.pmf(k0, runs_world0, float(rate_world0))
    p1 = stats.binom.pmf(k1, runs_world1, float(rate_world1))
    return float(min(1.0, p0 @ reaches.astype(float) @ p1))
