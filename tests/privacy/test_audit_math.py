"""The audit's statistics: Clopper–Pearson bounds and the ε lower bound of a threshold test,
checked against closed forms, scipy's independent exact interval, and exact binomial sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from service.privacy.audit import (
    clopper_pearson_interval,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_bound,
    probability_bound_reaches,
    scan_bound,
    split_bound,
    threshold_bound,
)

# ------------------------------------------------------------------ Clopper–Pearson


@pytest.mark.parametrize("n", [1, 7, 100, 1000])
@pytest.mark.parametrize("alpha", [0.025, 0.05, 1e-6])
def test_extreme_counts_have_closed_forms(n: int, alpha: float) -> None:
    """k = 0: U = 1 − α^{1/n} (solve (1 − p)^n = α); k = n: L = α^{1/n}."""
    assert clopper_pearson_upper(successes=0, trials=n, alpha=alpha) == pytest.approx(
        1 - alpha ** (1 / n), rel=1e-10
    )
    assert clopper_pearson_lower(successes=n, trials=n, alpha=alpha) == pytest.approx(
        alpha ** (1 / n), rel=1e-10
    )
    assert clopper_pearson_upper(successes=n, trials=n, alpha=alpha) == 1.0
    assert clopper_pearson_lower(successes=0, trials=n, alpha=alpha) == 0.0


def test_golden_interval_5_of_20() -> None:
    """The textbook exact 95% interval for 5/20 is (0.0866, 0.4910)."""
    ci = clopper_pearson_interval(successes=5, trials=20, confidence=0.95)
    assert (round(ci.lower, 4), round(ci.upper, 4)) == (0.0866, 0.4910)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (1, 10), (5, 20), (37, 400), (399, 400), (50, 50)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.999])
def test_two_sided_interval_matches_scipy_binomtest(k: int, n: int, confidence: float) -> None:
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    ci = clopper_pearson_interval(successes=k, trials=n, confidence=confidence)
    assert ci.lower == pytest.approx(ref.low, abs=1e-12)
    assert ci.upper == pytest.approx(ref.high, abs=1e-12)


@pytest.mark.parametrize("n", [5, 30, 200])
def test_upper_bound_covers_every_proportion(n: int) -> None:
    """Exact coverage, summed over the binomial law: P_p(p ≤ U(K)) ≥ 1 − α for all p."""
    alpha = 0.05
    uppers = np.array(
        [clopper_pearson_upper(successes=k, trials=n, alpha=alpha) for k in range(n + 1)]
    )
    for p in np.linspace(0.0, 1.0, 401):
        coverage = stats.binom.pmf(np.arange(n + 1), n, p)[uppers >= p].sum()
        assert coverage >= 1 - alpha - 1e-12, (p, coverage)


def test_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        clopper_pearson_upper(successes=11, trials=10, alpha=0.05)
    with pytest.raises(ValueError):
        clopper_pearson_upper(successes=-1, trials=10, alpha=0.05)
    with pytest.raises(ValueError):
        clopper_pearson_upper(successes=0, trials=0, alpha=0.05)
    with pytest.raises(ValueError):
        clopper_pearson_upper(successes=1, trials=10, alpha=1.0)
    with pytest.raises(ValueError):
        clopper_pearson_interval(successes=1, trials=10, confidence=0.0)


# ------------------------------------------------------------------ ε lower bound


def test_perfect_separation_closed_form() -> None:
    """FPR = FNR = 0 observed: both rates bounded by u = 1 − (α/2)^{1/n}, so
    ε_lb = log((1 − δ − u)/u); 1000 runs per world at 95% give 5.6006."""
    n, delta = 1000, 0.0
    u = 1 - 0.025 ** (1 / n)
    r = epsilon_lower_bound(
        hits_world0=0, runs_world0=n, hits_world1=n, runs_world1=n, delta=delta, confidence=0.95
    )
    assert r.fpr_upper == pytest.approx(u, rel=1e-12)
    assert r.fnr_upper == pytest.approx(u, rel=1e-12)
    assert r.epsilon == pytest.approx(math.log((1 - delta - u) / u), rel=1e-12)
    assert r.epsilon == pytest.approx(5.6006, abs=1e-4)


def test_zero_false_positives_with_some_misses() -> None:
    """FPR = 0, FNR = 0.5 observed: the dominant direction is log((1 − δ − FNR_u)/FPR_u)
    with FNR_u the scipy beta quantile Beta⁻¹(1 − α/2; 201, 200)."""
    n, delta = 400, 1e-5
    fpr_u = 1 - 0.025 ** (1 / n)
    fnr_u = stats.beta.ppf(0.975, 201, 200)
    r = epsilon_lower_bound(
        hits_world0=0, runs_world0=n, hits_world1=200, runs_world1=n, delta=delta
    )
    expected = max(math.log((1 - delta - fnr_u) / fpr_u), math.log((1 - delta - fpr_u) / fnr_u))
    assert r.epsilon == pytest.approx(expected, rel=1e-12)
    assert r.epsilon == pytest.approx(math.log((1 - delta - fnr_u) / fpr_u), rel=1e-12)


@pytest.mark.parametrize("k", [0, 10, 90, 200])
def test_symmetric_counts_give_equal_directions(k: int) -> None:
    """hits0 = k, hits1 = n − k: FPR_u = FNR_u = u, both directions equal log((1 − δ − u)/u)."""
    n = 400
    r = epsilon_lower_bound(
        hits_world0=k, runs_world0=n, hits_world1=n - k, runs_world1=n, delta=1e-5
    )
    assert r.fpr_upper == pytest.approx(r.fnr_upper, rel=1e-12)
    u = r.fpr_upper
    assert r.epsilon == pytest.approx(max(0.0, math.log((1 - 1e-5 - u) / u)), rel=1e-12)


@pytest.mark.parametrize(("a", "b"), [(0, 37), (5, 120), (60, 61)])
def test_exchanging_the_two_error_rates_leaves_the_bound_unchanged(a: int, b: int) -> None:
    """(FPR, FNR) = (a, b)/n and (b, a)/n give the same ε_lb: DP constrains both orders."""
    n = 400

    def eps(fp: int, fn: int) -> float:
        return epsilon_lower_bound(
            hits_world0=fp, runs_world0=n, hits_world1=n - fn, runs_world1=n, delta=1e-5
        ).epsilon

    assert eps(a, b) > 0 and eps(a, b) == pytest.approx(eps(b, a), rel=1e-12)


def test_indistinguishable_worlds_give_zero() -> None:
    r = epsilon_lower_bound(
        hits_world0=200, runs_world0=400, hits_world1=200, runs_world1=400, delta=1e-5
    )
    assert r.epsilon == 0.0


def test_more_confidence_more_comparisons_or_more_delta_give_less() -> None:
    def eps(*, delta: float, confidence: float = 0.95, comparisons: int = 1) -> float:
        return epsilon_lower_bound(
            hits_world0=3,
            runs_world0=300,
            hits_world1=250,
            runs_world1=300,
            delta=delta,
            confidence=confidence,
            comparisons=comparisons,
        ).epsilon

    base = eps(delta=1e-5)
    assert 0 < eps(delta=1e-5, confidence=0.999) < base
    assert 0 < eps(delta=1e-5, comparisons=10) < base
    assert eps(delta=0.5) < base
    assert eps(delta=0.99) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=300),
    a=st.floats(min_value=0, max_value=1),
    b=st.floats(min_value=0, max_value=1),
)
def test_bound_is_nonnegative_and_monotone_in_the_counts(n: int, a: float, b: float) -> None:
    """More true positives or fewer false positives never lower the bound (both directions
    grow as either error rate falls)."""
    h0, h1 = round(a * n), round(b * n)

    def eps(x0: int, x1: int) -> float:
        return epsilon_lower_bound(
            hits_world0=x0, runs_world0=n, hits_world1=x1, runs_world1=n, delta=1e-5
        ).epsilon

    e = eps(h0, h1)
    assert e >= 0.0
    if h1 < n:
        assert eps(h0, h1 + 1) >= e - 1e-12
    if h0 > 0:
        assert eps(h0 - 1, h1) >= e - 1e-12


@pytest.mark.parametrize("eps_true", [0.5, 1.0, 2.0])
def test_bound_exceeds_true_epsilon_of_randomized_response_at_most_alpha(eps_true: float) -> None:
    """Randomized response is exactly ε-DP (δ = 0) and its output is a binary statistic:
    P(report 1) = 1/(1 + e^ε) in world 0 and e^ε/(1 + e^ε) in world 1. The exact probability
    (a binomial sum) that ε_lb exceeds the true ε must be ≤ α = 0.05."""
    p1 = math.exp(eps_true) / (1 + math.exp(eps_true))
    for n in (20, 100, 500):
        p = probability_bound_reaches(
            epsilon=eps_true * (1 + 1e-9),
            rate_world0=1 - p1,
            rate_world1=p1,
            runs_world0=n,
            runs_world1=n,
            delta=0.0,
            confidence=0.95,
        )
        assert p <= 0.05, (n, p)


def test_probability_bound_reaches_equals_a_brute_force_sum() -> None:
    n0, n1, r0, r1, eps = 9, 12, 0.2, 0.7, 0.4
    brute = 0.0
    for k0 in range(n0 + 1):
        for k1 in range(n1 + 1):
            b = epsilon_lower_bound(
                hits_world0=k0, runs_world0=n0, hits_world1=k1, runs_world1=n1, delta=1e-5
            ).epsilon
            if b >= eps:
                brute += stats.binom.pmf(k0, n0, r0) * stats.binom.pmf(k1, n1, r1)
    got = probability_bound_reaches(
        epsilon=eps, rate_world0=r0, rate_world1=r1, runs_world0=n0, runs_world1=n1, delta=1e-5
    )
    assert got == pytest.approx(brute, rel=1e-10, abs=1e-15)


# ------------------------------------------------------------------ threshold rules


def test_fixed_threshold_counts_strictly_above() -> None:
    r = threshold_bound(
        stats_world0=[0.0, 1.0, 2.0, 3.0], stats_world1=[2.0, 3.0, 4.0, 5.0], threshold=2.0, delta=0
    )
    assert (r.hits_world0, r.hits_world1) == (1, 3)
    assert r.rule == "fixed" and r.comparisons == 1
    below = threshold_bound(
        stats_world0=[0.0, 1.0, 2.0, 3.0],
        stats_world1=[2.0, 3.0, 4.0, 5.0],
        threshold=2.0,
        delta=0,
        orientation="below",
    )
    assert (below.hits_world0, below.hits_world1) == (2, 0)


def test_scan_is_the_bonferroni_corrected_maximum() -> None:
    rng = np.random.default_rng(1)
    s0, s1 = rng.normal(0, 1, 300), rng.normal(1.5, 1, 300)
    ts = [0.0, 0.5, 1.0, 1.5, 2.0]
    r = scan_bound(stats_world0=s0, stats_world1=s1, thresholds=ts, delta=1e-5)
    by_hand = max(
        epsilon_lower_bound(
            hits_world0=int((s0 > t).sum()),
            runs_world0=300,
            hits_world1=int((s1 > t).sum()),
            runs_world1=300,
            delta=1e-5,
            comparisons=len(ts),
        ).epsilon
        for t in ts
    )
    assert r.epsilon == pytest.approx(by_hand, rel=1e-12)
    assert r.comparisons == 5 and r.rule == "bonferroni_scan" and r.threshold in ts
    both = scan_bound(
        stats_world0=s0, stats_world1=s1, thresholds=ts, delta=1e-5, orientations=("above", "below")
    )
    assert both.comparisons == 10 and both.epsilon <= r.epsilon
    single = scan_bound(stats_world0=s0, stats_world1=s1, thresholds=[1.0], delta=1e-5)
    fixed = threshold_bound(stats_world0=s0, stats_world1=s1, threshold=1.0, delta=1e-5)
    assert single.epsilon == fixed.epsilon


def test_split_measures_only_the_held_out_runs() -> None:
    """The selection half separates the worlds perfectly, the held-out half not at all:
    a rule that reused the selection runs would report a large ε; the split reports 0."""
    sel0, sel1 = np.linspace(0, 1, 50), np.linspace(2, 3, 50)
    held = np.linspace(0, 3, 50)
    r = split_bound(
        stats_world0=np.concatenate([sel0, held]),
        stats_world1=np.concatenate([sel1, held]),
        delta=1e-5,
    )
    assert (r.selection_runs_world0, r.selection_runs_world1) == (50, 50)
    assert (r.runs_world0, r.runs_world1) == (50, 50)
    assert 1.0 < r.threshold < 2.0 and r.orientation == "above"
    assert r.hits_world0 == r.hits_world1
    assert r.epsilon == 0.0 and r.rule == "split" and r.comparisons == 1


def test_split_picks_the_orientation_on_the_selection_runs() -> None:
    """World 1 below world 0: the split flips the test and finds the separation."""
    s0 = np.concatenate([np.linspace(2, 3, 60), np.linspace(2, 3, 60)])
    s1 = np.concatenate([np.linspace(0, 1, 60), np.linspace(0, 1, 60)])
    r = split_bound(stats_world0=s0, stats_world1=s1, delta=1e-5)
    assert r.orientation == "below" and (r.hits_world0, r.hits_world1) == (0, 60)
    assert r.epsilon == pytest.approx(
        epsilon_lower_bound(
            hits_world0=0, runs_world0=60, hits_world1=60, runs_world1=60, delta=1e-5
        ).epsilon
    )


def test_split_breaks_ties_by_the_observed_separation() -> None:
    """Five selection runs cannot give ε_lb > 0 at 95% even when perfectly separated; the
    chosen threshold is then the one with the largest TPR − FPR, not the first candidate."""
    s0 = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.0, 0.1, 0.2, 0.3, 0.4])
    s1 = s0 + 1.0
    r = split_bound(stats_world0=s0, stats_world1=s1, delta=1e-5)
    assert 0.4 < r.threshold < 1.0 and r.orientation == "above"
    assert (r.hits_world0, r.hits_world1) == (0, 5)


def test_threshold_rules_reject_bad_input() -> None:
    with pytest.raises(ValueError):
        split_bound(stats_world0=[1.0], stats_world1=[2.0], delta=0)
    with pytest.raises(ValueError):
        split_bound(stats_world0=[1.0, math.nan], stats_world1=[2.0, 3.0], delta=0)
    with pytest.raises(ValueError):
        scan_bound(stats_world0=[1.0], stats_world1=[2.0], thresholds=[], delta=0)
    with pytest.raises(ValueError):
        threshold_bound(stats_world0=[1.0], stats_world1=[2.0], threshold=0.0, delta=1.0)
    with pytest.raises(ValueError):
        epsilon_lower_bound(
            hits_world0=1, runs_world0=2, hits_world1=1, runs_world1=2, delta=0, comparisons=0
        )
