"""Empirical privacy audit of the proven ExpM sampler (method ``expm``, ``langevin``).

A canary distinguisher on the worker's real :func:`run_expm_langevin`, with the plan built
exactly as the service builds it from public values (the public row count and the schema's
norm bound). D: 99 rows with uniform features outside the canary's columns; D' = D plus a
canary (ones on ``CANARY_COLUMNS`` columns that no row of D touches, label 1). Statistic:
the released weights' projection on the canary's columns. Each step moves it by at most
(lr/n̂)·√64 against noise (lr/n̂)·σ·√B, so a correct mechanism shifts it by about
√T·8/(σ·√73) ≈ 0.2 noise standard deviations at ε = 1; the Clopper–Pearson lower bound
(threshold chosen on a held-out split, service/privacy/audit.py) must stay below the
claimed ε. The second test shows the audit has teeth: the same runs with the plan's noise
multiplier divided by 100 (a sampler that does not add the noise it was charged for) give a
bound far above the claim.
"""

from __future__ import annotations

import pytest

from tests.privacy.canary import CLAIMED_EPSILON, canary_bound, canary_plan
from worker.mechanisms.langevin import run_expm_langevin

STEPS = 10
OPTIONS = {"steps": STEPS, "learning_rate": 1.0, "l2": 1.0}


@pytest.mark.slow
def test_canary_is_not_revealed_by_the_langevin_release() -> None:
    plan = canary_plan(OPTIONS)
    assert plan.guarantee == "proven" and plan.mechanism["steps"] == STEPS
    assert canary_bound(run_expm_langevin, plan.mechanism) < CLAIMED_EPSILON


@pytest.mark.slow
def test_the_audit_catches_a_sampler_with_too_little_noise() -> None:
    mechanism = dict(canary_plan(OPTIONS).mechanism)
    mechanism["noise_multiplier"] /= 100.0
    assert canary_bound(run_expm_langevin, mechanism) > 2 * CLAIMED_EPSILON
