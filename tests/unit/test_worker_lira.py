"""worker/lira.py end to end on a tiny public pool (seconds): the structure of the result,
an obviously non-private release caught, a DP-SGD one not claimed above its ε."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from service.audits import LIRA_METHODS, AuditRefused, lira_audit_plan
from service.schemas.audits import AuditRequest
from worker.lira import (
    CONFIGURATIONS,
    PURE_METHODS,
    adult_pool,
    lira_plan,
    nonprivate_trainer,
    run_lira,
    run_lira_audit,
    run_lira_configuration,
)


@pytest.fixture(scope="module")
def pool():  # type: ignore[no-untyped-def]
    return adult_pool(50, seed=1)


def test_a_non_private_fit_is_caught(pool) -> None:  # type: ignore[no-untyped-def]
    # Newton's method, l2 = 0.01, on ~25 rows of 104 features: it memorises its rows.
    r = run_lira(pool=pool, train=nonprivate_trainer(l2=0.01), models=16, delta=1e-5, seed=0)
    assert r.models == 16 and r.pool == 50 and r.fixed_variance  # 15 shadows < 64
    assert [p.target_fpr for p in r.points] == [0.001, 0.01]
    assert r.auc > 0.7
    assert r.epsilon_lower_bound > 0.0
    assert r.epsilon_lower_bound <= r.ceiling
    for p in r.points:
        # Held-out counts: the odd targets' pairs, split into members and non-members.
        assert p.bound.runs_world0 + p.bound.runs_world1 == 8 * 50
        assert p.held_out_tpr.lower <= p.bound.hits_world1 / p.bound.runs_world1
        assert p.bound.hits_world1 / p.bound.runs_world1 <= p.held_out_tpr.upper
        assert p.bound.comparisons == 2
    assert r.one_run.canaries == 50 and r.one_run.epsilon <= r.one_run.ceiling


def test_dpsgd_at_eps_1_is_not_claimed_above_its_eps(pool) -> None:  # type: ignore[no-untyped-def]
    r = run_lira_configuration("dpsgd", epsilon=1.0, delta=1e-5, models=8, pool=pool, seed=0)
    assert r.plan["steps"] >= 1 and r.plan["noise_multiplier"] > 0
    assert r.delta == 1e-5
    assert r.epsilon_lower_bound < 1.0 <= r.ceiling
    assert r.one_run.epsilon < 1.0
    assert math.isfinite(r.auc)


def test_plans_are_the_apis(pool) -> None:  # type: ignore[no-untyped-def]
    assert set(CONFIGURATIONS) == {"dpsgd", "expm", "expm_mcmc", "expm_nf"}
    nf = lira_plan("expm_nf", epsilon=1.0, delta=1e-5, pool=pool)
    assert nf.method == "expm_nf" and nf.delta == 0.0  # a pure-ε method is asked with δ = 0
    mcmc = lira_plan("expm_mcmc", epsilon=1.0, delta=1e-5, pool=pool)
    assert mcmc.mechanism["sampler"] == "mcmc"
    with pytest.raises(ValueError, match="unknown configuration"):
        lira_plan("laplace", epsilon=1.0, delta=1e-5, pool=pool)
    with pytest.raises(ValidationError, match="epsilon"):  # the API's own request type
        lira_plan("dpsgd", epsilon=-1.0, delta=1e-5, pool=pool)
    with pytest.raises(ValueError, match="at least 4"):
        run_lira(pool=pool, train=nonprivate_trainer(), models=3, delta=1e-5)


@pytest.mark.parametrize("method", LIRA_METHODS)
def test_the_services_lira_audit_plan_is_the_one_the_worker_runs(method: str) -> None:
    """service.audits.lira_audit_plan (checked and stored before the run) is
    worker.lira.lira_plan for the configuration of the method's name (each training's)."""
    audit_pool = adult_pool(300)
    delta = 0.0 if method in PURE_METHODS else 1e-5
    assert CONFIGURATIONS[method][0] == method
    service = lira_audit_plan(method=method, epsilon=2.0, delta=delta, pool=300)
    worker = lira_plan(method, epsilon=2.0, delta=delta, pool=audit_pool)
    assert service.mechanism == worker.mechanism
    assert (service.epsilon, service.delta, service.model) == (
        worker.epsilon,
        worker.delta,
        worker.model,
    )


def test_a_lira_audit_refuses_what_the_service_refuses() -> None:
    """The worker checks the stored request again (model_construct: as a row could hold
    it, without the request type's own checks)."""
    base = {"method": "dpsgd", "epsilon": 1.0, "delta": 1e-5, "attack": "lira"}
    for changes, words in [
        ({"method": "selection"}, "cannot be audited by LiRA"),
        ({"shadow_models": 3}, "between 4"),
        ({"pool": 50}, "out of range"),
        ({"dataset": "icu"}, "pool of public adult"),
        ({"attack": "one_run"}, "not a LiRA audit"),
        ({"pool": None}, "not a LiRA audit"),
    ]:
        fields = {"shadow_models": 8, "pool": 200, **base, **changes}
        request = AuditRequest.model_construct(
            **AuditRequest.model_validate(base).model_dump() | fields
        )
        with pytest.raises(AuditRefused, match=words):
            run_lira_audit(request)
