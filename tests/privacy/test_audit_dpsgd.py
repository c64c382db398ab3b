"""Empirical privacy audit of the worker's DP-SGD (the regression suite for its guarantee).

The distinguishers, their sizing and the argument are in :mod:`tests.privacy.harness`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from service.privacy.audit import probability_bound_reaches
from tests.privacy.harness import (
    CANARY_RUNS,
    CLAIMED_EPSILON,
    CONFIDENCE,
    DELTA,
    MAX_FALSE_FAILURE,
    ROW_COUNT_RUNS,
    SELECTION_FRACTION,
    canary_distinguisher,
    describe,
    live_run_dpsgd,
    plan_for,
    row_count_distinguisher,
    run_audit,
)


@pytest.mark.slow
def test_row_count_difference_is_not_revealed() -> None:
    d = row_count_distinguisher()
    plan = plan_for(d)
    assert plan.n_rows == d.public_n and (d.world0.n, d.world1.n) == (d.public_n - 1, d.public_n)
    outcome = run_audit(d, run_dpsgd=live_run_dpsgd())
    bound = outcome.bound(confidence=CONFIDENCE)
    assert bound.epsilon < CLAIMED_EPSILON, describe(outcome, bound)


@pytest.mark.slow
def test_canary_row_is_not_revealed() -> None:
    d = canary_distinguisher()
    plan = plan_for(d)
    assert plan.n_rows == d.public_n and plan.mechanism["sampling_rate"] == 1.0
    outcome = run_audit(d, run_dpsgd=live_run_dpsgd())
    bound = outcome.bound(confidence=CONFIDENCE)
    assert bound.epsilon < CLAIMED_EPSILON, describe(outcome, bound)


def _worst_false_failure(max_shift: float, runs: int) -> float:
    """sup over thresholds t and both orientations of P(ε_lb ≥ claimed ε) on ``runs``
    held-out runs per world, when world 0's statistic is N (any continuous law, written as
    a standard Gaussian) and world 1's is N + S with 0 ≤ S ≤ ``max_shift`` pointwise.

    ε_lb never decreases as world 1's hit count grows (test_audit_math), so for each test
    the worst law of world 1 is the one with the most hits: S = max_shift for "above",
    S = 0 for "below"."""
    worst = 0.0
    for t in np.linspace(-6.0, 8.0, 281):
        for a0, a1 in (
            (stats.norm.sf(t), stats.norm.sf(t - max_shift)),  # above t
            (stats.norm.cdf(t), stats.norm.cdf(t)),  # below t
        ):
            p = probability_bound_reaches(
                epsilon=CLAIMED_EPSILON,
                rate_world0=float(a0),
                rate_world1=float(a1),
                runs_world0=runs,
                runs_world1=runs,
                delta=DELTA,
                confidence=CONFIDENCE,
            )
            worst = max(worst, p)
    return worst


@pytest.mark.parametrize("which", ["row count", "canary"])
def test_design_false_failure_probability(which: str) -> None:
    """A correct mechanism fails an audit with probability ≤ 1e-6.

    The held-out counts are binomial given the chosen test, so P(fail) ≤ sup over tests of
    P(ε_lb ≥ ε | rates), summed exactly. Row count: under a correct mechanism the weights
    do not depend on the data at all, so both worlds have the same law (shift 0). Canary:
    world 0's projection is Gaussian noise with standard deviation s = σ·C·lr/(q·n̂);
    world 1 adds the canary's clipped contribution, between 0 and C·lr/(q·n̂) = s/σ
    pointwise (the rounded-Gaussian noise of the integer grid is treated as Gaussian).
    """
    if which == "row count":
        runs, shift = ROW_COUNT_RUNS, 0.0
    else:
        runs = CANARY_RUNS
        shift = 1.0 / float(plan_for(canary_distinguisher()).mechanism["noise_multiplier"])
    held_out = runs - math.ceil(SELECTION_FRACTION * runs)
    assert _worst_false_failure(shift, held_out) <= MAX_FALSE_FAILURE
