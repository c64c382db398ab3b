"""service.privacy.lira_stats against brute force and known values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from service.privacy.audit import clopper_pearson_lower, clopper_pearson_upper
from service.privacy.lira_stats import (
    auc,
    fit_gaussians,
    lira_ceiling,
    logit_confidence,
    low_fpr_bound,
    offline_scores,
    online_scores,
    threshold_at_fpr,
    tpr_at_fpr,
)


def test_logit_confidence_is_the_logit_of_the_true_label_probability() -> None:
    z = np.array([-3.0, -0.5, 0.0, 2.0, 7.0])
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    p = np.where(y == 1, 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(z)))
    np.testing.assert_allclose(logit_confidence(z, y), np.log(p / (1 - p)), atol=1e-12)
    with pytest.raises(ValueError, match="0 or 1"):
        logit_confidence(z, np.full(5, 0.5))


def test_online_score_is_the_gaussian_log_likelihood_ratio() -> None:
    # Two known Gaussians per example: IN N(2, 1), OUT N(0, 0.5²) (per-example variance).
    rng = np.random.default_rng(0)
    member = np.zeros((400, 3), dtype=bool)
    member[:200] = True
    phi = np.where(member, rng.normal(2.0, 1.0, member.shape), rng.normal(0.0, 0.5, member.shape))
    fit = fit_gaussians(phi, member, fixed_variance=False)
    np.testing.assert_allclose(fit.mu_in, 2.0, atol=0.2)
    np.testing.assert_allclose(fit.sd_out, 0.5, atol=0.06)
    x = np.array([-1.0, 0.7, 3.0])
    expect = stats.norm.logpdf(x, fit.mu_in, fit.sd_in) - stats.norm.logpdf(
        x, fit.mu_out, fit.sd_out
    )
    np.testing.assert_allclose(online_scores(fit, x), expect, rtol=1e-12)

    # By hand for the third example: log N(3; μ, σ) = −log σ − ½log 2π − (3 − μ)²/(2σ²).
    def lp(v: float, mu: float, sd: float) -> float:
        return -math.log(sd) - 0.5 * math.log(2 * math.pi) - (v - mu) ** 2 / (2 * sd * sd)

    i = 2
    hand = lp(3.0, fit.mu_in[i], fit.sd_in[i]) - lp(3.0, fit.mu_out[i], fit.sd_out[i])
    assert online_scores(fit, x)[i] == pytest.approx(hand, rel=1e-12)
    np.testing.assert_allclose(
        offline_scores(fit, x), np.log1p(-stats.norm.sf(x, fit.mu_out, fit.sd_out)), rtol=1e-10
    )


def test_fixed_variance_pools_the_residuals_and_missing_sides_are_shifted() -> None:
    phi = np.array([[1.0, 5.0, 0.0], [3.0, 7.0, 0.5], [0.0, 4.0, 2.0], [2.0, 6.0, 4.0]])
    member = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]], dtype=bool)
    fit = fit_gaussians(phi, member)  # 4 models < 64: global variance
    assert fit.fixed_variance
    # IN residuals: ±1, ±1 around means 2 and 6: 4 values, 2 means -> sd = sqrt(4/2).
    np.testing.assert_allclose(fit.sd_in, math.sqrt(2.0))
    # OUT: example 0: 0, 2 (mean 1), example 1: 4, 6 (5), example 2: 0, .5, 2, 4 (1.625).
    resid = [1, 1, 1, 1] + [x - 1.625 for x in (0.0, 0.5, 2.0, 4.0)]
    np.testing.assert_allclose(fit.sd_out, math.sqrt(sum(r * r for r in resid) / (8 - 3)))
    # Example 2 was never IN: its mean is OUT's plus the mean gap of the others (1 and 1).
    assert fit.mu_in[2] == pytest.approx(1.625 + 1.0)
    assert list(fit.n_in) == [2, 2, 0]


def _brute_tpr(s: np.ndarray, m: np.ndarray, fpr: float) -> float:
    """The largest TPR over every threshold (each score, and −inf) whose FP ≤ ⌊fpr·N⌋."""
    neg = int((~m).sum())
    best = 0.0
    for t in np.concatenate([s, [-np.inf]]):
        if (s[~m] > t).sum() <= math.floor(fpr * neg):
            best = max(best, float((s[m] > t).mean()))
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tpr_at_fpr_is_the_best_threshold_within_the_fpr(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = rng.random(600) < 0.5
    s = np.round(rng.normal(m * 1.0, 1.0), 1)  # rounded: ties
    for fpr in (0.0, 0.001, 0.01, 0.1, 0.5, 1.0):
        tpr, achieved = tpr_at_fpr(s, m, fpr)
        assert tpr == pytest.approx(_brute_tpr(s, m, fpr))
        assert achieved <= fpr + 1e-12
    assert threshold_at_fpr(s, m, 1.0) == -math.inf


def test_tpr_of_two_known_gaussians_and_auc() -> None:
    # Non-members N(0, 1), members N(2, 1): TPR at FPR f is Φ(2 − z_{1−f}), AUC Φ(2/√2).
    rng = np.random.default_rng(3)
    n = 400_000
    m = np.arange(n) < n // 2
    s = rng.normal(np.where(m, 2.0, 0.0), 1.0)
    for fpr in (0.001, 0.01):
        tpr, _ = tpr_at_fpr(s, m, fpr)
        assert tpr == pytest.approx(stats.norm.cdf(2.0 - stats.norm.ppf(1 - fpr)), abs=0.01)
    assert auc(s, m) == pytest.approx(stats.norm.cdf(2.0 / math.sqrt(2.0)), abs=0.003)


def test_auc_counts_pairs_with_ties_as_half() -> None:
    rng = np.random.default_rng(4)
    m = rng.random(200) < 0.4
    s = rng.integers(0, 5, 200).astype(float)
    pos, neg = s[m], s[~m]
    brute = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert auc(s, m) == pytest.approx(brute, rel=1e-12)


def test_low_fpr_bound_is_log_of_cp_tpr_over_cp_fpr_on_the_held_out_counts() -> None:
    sel_m = np.array([True] * 10 + [False] * 100)
    sel_s = np.concatenate([np.full(10, 5.0), np.arange(100.0) / 100])  # t = 0.98 at 1 %
    m = np.array([True] * 200 + [False] * 300)
    s = np.concatenate([np.full(150, 3.0), np.zeros(50), np.full(2, 1.0), np.zeros(298)])
    b = low_fpr_bound(
        select_scores=sel_s,
        select_members=sel_m,
        scores=s,
        members=m,
        fpr=0.01,
        delta=1e-5,
        comparisons=2,
    )
    assert b.threshold == pytest.approx(0.98)
    assert (b.hits_world1, b.runs_world1, b.hits_world0, b.runs_world0) == (150, 200, 2, 300)
    a = 0.05 / 4  # two rates per test, two tests
    tpr_lo = clopper_pearson_lower(successes=150, trials=200, alpha=a)
    fpr_hi = clopper_pearson_upper(successes=2, trials=300, alpha=a)
    assert b.epsilon == pytest.approx(math.log((tpr_lo - 1e-5) / fpr_hi), rel=1e-12)
    # A perfect test reaches the ceiling, and the ceiling grows with the counts.
    perfect = low_fpr_bound(
        select_scores=sel_s,
        select_members=sel_m,
        scores=np.where(m, 3.0, 0.0),
        members=m,
        fpr=0.01,
        delta=1e-5,
        comparisons=2,
    )
    ceiling = lira_ceiling(members=200, non_members=300, delta=1e-5, comparisons=2)
    assert perfect.epsilon == pytest.approx(ceiling)
    assert b.epsilon < ceiling < lira_ceiling(members=2000, non_members=3000, delta=1e-5)
    # Chance scores show nothing.
    rng = np.random.default_rng(5)
    null = low_fpr_bound(
        select_scores=rng.normal(size=1000),
        select_members=rng.random(1000) < 0.5,
        scores=rng.normal(size=5000),
        members=rng.random(5000) < 0.5,
        fpr=0.01,
        delta=1e-5,
    )
    assert null.epsilon == 0.0


def test_refusals() -> None:
    with pytest.raises(ValueError, match="both members and non-members"):
        auc(np.zeros(3), np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="finite"):
        tpr_at_fpr(np.array([np.nan, 1.0]), np.array([True, False]), 0.01)
    with pytest.raises(ValueError, match="one shape"):
        fit_gaussians(np.zeros((3, 2)), np.zeros((3, 3), dtype=bool))
    with pytest.raises(ValueError, match="too few shadow"):
        fit_gaussians(np.zeros((2, 2)), np.array([[True, True], [True, True]]))
