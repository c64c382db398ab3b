"""Accepted work survives an upgrade that changes a default rule (service.plans.
resolve_defaults): jobs admitted with their defaults left out run, through the in-process
worker, with the plan they were charged for after every rule they used has changed; the
analyst still sees the request as sent, an Idempotency-Key retry still finds its job; and
the worker's plan check still refuses a tampered plan or a tampered admitted request."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from service.db import engine_for, transaction
from service.ledger.tables import Dataset, FailureCategory, Job
from service.plans import PlanError, plan_for_dataset
from service.schemas import JobRequest, PrivacyPlan
from tests.conftest import auth
from worker.runner import PLAN_FAILURE, Outcome, execute_job

DPSGD = {"dataset": "toy", "method": "dpsgd", "epsilon": 2.0, "delta": 1e-5}
LANGEVIN = {"dataset": "toy", "method": "expm", "epsilon": 2.0, "delta": 1e-5}
AUTO = {"dataset": "toy", "method": "auto", "epsilon": 2.0, "delta": 1e-5}
BODIES = {"dpsgd": DPSGD, "langevin": LANGEVIN, "auto": AUTO}


def _submit(client: Any, keys: Any, body: dict[str, Any], key: str) -> dict[str, Any]:
    r = client.post("/v1/jobs", json=body, headers={**auth(keys.alice), "Idempotency-Key": key})
    assert r.status_code == 202, r.text
    return dict(r.json())


def _row(settings: Any, job_id: str) -> Job:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, job_id)
        s.expunge(job)
        return job


def _change_every_default_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an upgrade between admission and run may do (cf. commit 2938917)."""
    import service.methods.auto as auto
    import service.methods.dpsgd as dpsgd
    import service.methods.expm as expm

    monkeypatch.setattr(dpsgd, "LOGISTIC_DEFAULTS", (8, 6))
    monkeypatch.setattr(expm, "LANGEVIN_REACH_DIVISOR", 25.0)
    monkeypatch.setattr(auto, "LANGEVIN_MIN_SCALE", 1.0)  # auto's choice flips to expm


def test_a_queued_job_runs_its_admitted_plan_after_a_default_changes(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = {name: _submit(client, keys, body, f"upgrade-{name}") for name, body in BODIES.items()}
    assert jobs["auto"]["plan"]["method"] == "dpsgd"  # 400 rows: auto chose DP-SGD
    for job in jobs.values():
        row = _row(settings, job["id"])
        assert row.resolved_request is not None  # defaults were left out: resolved, stored
    _change_every_default_rule(monkeypatch)
    for name, body in BODIES.items():
        job = jobs[name]
        row = _row(settings, job["id"])
        sent = JobRequest.model_validate(row.request)
        with transaction(engine_for(settings.resolved_database_url)) as s:
            ds = s.get_one(Dataset, row.dataset_id)
            n_rows, public_schema = ds.n_rows, ds.public_schema
        # The rule did change: the request as sent no longer gives the admitted plan...
        replanned = plan_for_dataset(sent, n_rows=n_rows, public_schema=public_schema)
        assert replanned != PrivacyPlan.model_validate(row.plan), name
        # ...and the job runs the plan it was charged for.
        assert execute_job(job["id"], settings) == Outcome.released, name
        view = client.get(f"/v1/jobs/{job['id']}", headers=auth(keys.alice)).json()
        assert view["status"] == "released"
        assert view["plan"] == job["plan"] and view["request"] == job["request"]
        assert view["request"] == {**view["request"], **body, "dpsgd": None, "expm": None}
        card = client.get(f"/v1/jobs/{job['id']}/release", headers=auth(keys.alice)).json()
        assert card["privacy"]["guarantee"] == "proven"
        # An Idempotency-Key retry of the same body (after the upgrade) finds the same job.
        r = client.post(
            "/v1/jobs",
            json=body,
            headers={**auth(keys.alice), "Idempotency-Key": f"upgrade-{name}"},
        )
        assert r.status_code == 200 and r.json()["id"] == job["id"], r.text


def _fails_the_plan_check(settings: Any, job_id: str, **stored: Any) -> None:
    """Store ``stored`` on the job's row (the tampering), run it: failed before the data."""
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(update(Job).where(Job.id == job_id).values(**stored))
    assert execute_job(job_id, settings) == Outcome.failed
    row = _row(settings, job_id)
    assert row.error == PLAN_FAILURE and row.data_touched is False
    assert row.failure_category == FailureCategory.plan_mismatch


def test_a_tampered_plan_still_fails_the_check(client: Any, keys: Any, settings: Any) -> None:
    job_id = _submit(client, keys, DPSGD, "tampered-plan")["id"]
    plan = dict(_row(settings, job_id).plan)
    plan["mechanism"] = {**plan["mechanism"], "noise_multiplier": 0.01}
    _fails_the_plan_check(settings, job_id, plan=plan)


@pytest.mark.parametrize(
    "tamper",
    [
        {"epsilon": 20.0},  # a value the analyst sent
        {"dpsgd": {"batch_size": 7}},  # a default, with the plan left as admitted
    ],
    ids=["sent-value", "default"],
)
def test_a_tampered_admitted_request_fails_the_check(
    client: Any, keys: Any, settings: Any, tamper: dict[str, Any]
) -> None:
    job_id = _submit(client, keys, DPSGD, f"tampered-request-{next(iter(tamper))}")["id"]
    resolved = dict(_row(settings, job_id).resolved_request or {})
    for key, value in tamper.items():
        resolved[key] = {**resolved[key], **value} if isinstance(value, dict) else value
    _fails_the_plan_check(settings, job_id, resolved_request=resolved)


SELECTIONS = {  # selections whose trainings leave DP-SGD's batch size and epochs to the rule
    "architecture": {
        "dataset": "toy",
        "kind": "architecture",
        "epsilon": 3.0,
        "delta": 1e-6,
        "space": {"depths": [1], "widths": [2, 4]},
        "search": {"algorithm": "rs", "trainings": 2},
    },
    "cfs-final": {
        "dataset": "toy",
        "kind": "features",
        "epsilon": 3.0,
        "delta": 1e-6,
        "method": "cfs_greedy",
        "numeric_bins": 4,
        "max_selected": 2,
        "final": {"model": {"kind": "logistic"}, "epsilon": 1.0, "delta": 1e-6},
    },
}


@pytest.mark.parametrize("name", list(SELECTIONS))
def test_a_queued_selection_runs_its_admitted_plan_after_a_default_changes(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    import service.methods.dpsgd as dpsgd

    r = client.post("/v1/selections", json=SELECTIONS[name], headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job = r.json()
    row = _row(settings, job["id"])
    assert row.resolved_request is not None  # the trainings' defaults were written out
    monkeypatch.setattr(dpsgd, "OTHER_MODEL_DEFAULTS", (2, 7))  # an upgrade's new rule
    monkeypatch.setattr(dpsgd, "LOGISTIC_DEFAULTS", (2, 7))
    from service.selection.api_bodies import plan_selection_job

    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.get_one(Dataset, row.dataset_id)
        n_rows, public_schema = ds.n_rows, ds.public_schema
    sent = JobRequest.model_validate(row.request)
    try:  # the rule did change: the request as stored plans otherwise, or not at all (its
        # per-training ε, calibrated under the old rule, may now exceed the workflow's ε)
        _, replanned = plan_selection_job(sent, n_rows=n_rows, public_schema=public_schema)
        assert replanned != PrivacyPlan.model_validate(row.plan)
    except PlanError as exc:
        assert "more than" in str(exc), exc
    assert execute_job(job["id"], settings) == Outcome.released
    view = client.get(f"/v1/jobs/{job['id']}", headers=auth(keys.alice)).json()
    assert view["plan"] == job["plan"] and view["request"] == job["request"]
