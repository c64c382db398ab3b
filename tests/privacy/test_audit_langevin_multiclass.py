"""Empirical privacy audit of the proven ExpM sampler for K = 3 classes (multinomial
logistic regression, method ``expm``, sampler ``langevin``; issue 20).

The binary audit's canary distinguisher (tests/privacy/canary.py) with a 3-class target:
D's 99 rows carry labels drawn from the 3 classes, the canary (ones on the canary columns,
which no row of D touches) has label 1, and the statistic is the sum of class 1's released
weights over the canary's columns. The plan is built as the service builds it for a schema
declaring 3 classes (K·(d + 1) parameters, sensitivity 2^(a+c)·√(2B)). The
Clopper–Pearson lower bound on ε must stay below the claimed ε; the second test shows the
audit has teeth on this statistic: the plan's noise multiplier divided by 100 gives a bound
far above the claim.
"""

from __future__ import annotations

import pytest

from tests.privacy.canary import CLAIMED_EPSILON, canary_bound, canary_plan
from worker.mechanisms.langevin import run_expm_langevin

CLASSES = 3
STEPS = 10
OPTIONS = {"steps": STEPS, "learning_rate": 1.0, "l2": 1.0}


@pytest.mark.slow
def test_canary_is_not_revealed_by_the_k_class_langevin_release() -> None:
    plan = canary_plan(OPTIONS, classes=CLASSES)
    assert plan.guarantee == "proven" and plan.mechanism["classes"] == CLASSES
    assert plan.mechanism["parameters"] == CLASSES * (64 + 8 + 1)
    assert canary_bound(run_expm_langevin, plan.mechanism, classes=CLASSES) < CLAIMED_EPSILON


@pytest.mark.slow
def test_the_audit_catches_a_k_class_sampler_with_too_little_noise() -> None:
    mechanism = dict(canary_plan(OPTIONS, classes=CLASSES).mechanism)
    mechanism["noise_multiplier"] /= 100.0
    bound = canary_bound(run_expm_langevin, mechanism, classes=CLASSES)
    assert bound > 2 * CLAIMED_EPSILON
