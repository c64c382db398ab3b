"""Empirical privacy audit of the Langevin sampler charged by the hidden-iterate bound
(``expm.accounting = "hidden"``, issue 24): the same canary distinguisher as the
composition-charged sampler's (tests/privacy/canary.py: D of 99 rows, D' = D plus a canary
on columns no row of D touches; statistic: the released weights' sum over those columns)
on the worker's real lattice chain, with the plan the service builds (the schema's row cap
``max_rows`` = 100 rows, l2 30, the mixing steps of its defaults). The Clopper–Pearson
lower bound must stay below the claimed ε; with the plan's noise multiplier divided by 100
(a chain that adds less noise than it was charged for) the bound must exceed 2× the claim,
so the audit has teeth for this chain too.
"""

from __future__ import annotations

import pytest

from tests.privacy.canary import CLAIMED_EPSILON, N, canary_bound, canary_plan
from worker.mechanisms.langevin_hidden import run_langevin_plan

OPTIONS = {"accounting": "hidden"}


@pytest.mark.slow
def test_canary_is_not_revealed_by_the_hidden_iterate_release() -> None:
    plan = canary_plan(OPTIONS, max_rows=N)
    assert plan.guarantee == "proven" and plan.mechanism["accounting"] == "hidden"
    assert canary_bound(run_langevin_plan, plan.mechanism) < CLAIMED_EPSILON


@pytest.mark.slow
def test_the_audit_catches_a_hidden_chain_with_too_little_noise() -> None:
    mechanism = dict(canary_plan(OPTIONS, max_rows=N).mechanism)
    mechanism["noise_multiplier"] /= 100.0
    assert canary_bound(run_langevin_plan, mechanism) > 2 * CLAIMED_EPSILON
