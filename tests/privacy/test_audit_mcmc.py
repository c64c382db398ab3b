"""Empirical privacy audit of the asymptotic ExpM sampler (method ``expm``, ``mcmc``).

The canary distinguisher of tests/privacy/canary.py (D: 99 rows whose features avoid the
canary's 64 columns; D' = D plus the canary, ones on those columns, label 1; statistic: the
released weights' sum over the canary's columns) on the worker's real
:func:`run_expm_mcmc`, with the plan built as the service builds it. The label is
asymptotic because no proof covers the finite chain; this audit is the empirical check that
the short run the test affords does not reveal the canary beyond the claimed ε (the
Clopper–Pearson lower bound, service/privacy/audit.py, must stay below it). The second test
shows the audit has teeth: the same chains on a target 10⁴ times sharper than the plan's
(a sampler not at the temperature it was charged for) give a bound far above the claim.
"""

from __future__ import annotations

import pytest

from tests.privacy.canary import CLAIMED_EPSILON, canary_bound, canary_plan
from worker.mechanisms.mcmc import run_expm_mcmc

OPTIONS = {"sampler": "mcmc", "chains": 2, "steps": 20, "warmup": 20, "leapfrog_steps": 8}


@pytest.mark.slow
def test_canary_is_not_revealed_by_the_mcmc_release() -> None:
    plan = canary_plan(OPTIONS)
    assert plan.guarantee == "asymptotic"
    assert canary_bound(run_expm_mcmc, plan.mechanism) < CLAIMED_EPSILON


@pytest.mark.slow
def test_the_audit_catches_a_sampler_at_the_wrong_temperature() -> None:
    mechanism = dict(canary_plan(OPTIONS).mechanism)
    mechanism["inverse_temperature"] *= 1e4
    assert canary_bound(run_expm_mcmc, mechanism) > 2 * CLAIMED_EPSILON
