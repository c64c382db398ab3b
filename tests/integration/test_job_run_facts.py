"""What the worker records of a run, for the admin only (issue 26): the stage reached,
whether the private rows were read (a system fact, recorded before the first read) and a
failure category from the error's type. The analyst's job view is unchanged; the admin
sees them in the API, the dashboard and the CLI. Both databases."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from enclave.cli import app
from service.db import engine_for, transaction
from service.ledger.tables import FailureCategory, Job, JobStage, JobStatus
from service.migrate import downgrade, upgrade
from tests.conftest import auth
from tests.integration.test_dashboard import sign_in
from worker.data import ROWS_FILE, dataset_dir
from worker.mechanisms.guards import GuardFailed
from worker.runner import GENERIC_FAILURE, PLAN_FAILURE, Outcome, execute_job, failure_category

BODY = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 2.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}
RUN_FACTS = {"stage_reached", "data_read", "failure_category"}


def _submit(client: Any, keys: Any) -> str:
    r = client.post("/v1/jobs", json=BODY, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _facts(settings: Any, job_id: str) -> tuple[Any, Any, Any]:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, job_id)
        return job.stage_reached, job.data_read, job.failure_category


def _admin_view(client: Any, keys: Any, job_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/admin/jobs/{job_id}", headers=auth(keys.admin))
    assert r.status_code == 200, r.text
    return dict(r.json())


def _analyst_view_is_unchanged(client: Any, keys: Any, job_id: str) -> None:
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert not RUN_FACTS & set(job), job
    listed = client.get("/v1/jobs", headers=auth(keys.alice)).json()
    assert listed and all(not RUN_FACTS & set(j) for j in listed)


def test_a_new_job_is_queued_and_has_read_nothing(client: Any, keys: Any, settings: Any) -> None:
    job_id = _submit(client, keys)
    assert _facts(settings, job_id) == (JobStage.queued, False, None)
    view = _admin_view(client, keys, job_id)
    assert (view["stage_reached"], view["data_read"], view["failure_category"]) == (
        "queued",
        False,
        None,
    )
    _analyst_view_is_unchanged(client, keys, job_id)


def test_a_plan_mismatch_fails_before_the_data_is_read(
    client: Any, keys: Any, settings: Any
) -> None:
    job_id = _submit(client, keys)
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        plan = dict(s.get_one(Job, job_id).plan)
        plan["mechanism"] = {**plan["mechanism"], "noise_multiplier": 0.01}
        s.execute(update(Job).where(Job.id == job_id).values(plan=plan))
    assert execute_job(job_id, settings) == Outcome.failed
    assert _facts(settings, job_id) == (JobStage.queued, False, FailureCategory.plan_mismatch)
    view = _admin_view(client, keys, job_id)
    assert view["error"] == PLAN_FAILURE and view["data_read"] is False
    assert view["failure_category"] == "plan_mismatch" and view["stage_reached"] == "queued"
    _analyst_view_is_unchanged(client, keys, job_id)


def test_a_guard_failing_after_the_load_is_recorded_as_read(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import worker.runner as runner

    def guarded(**_: Any) -> Any:
        raise GuardFailed("a proof precondition failed on the rows")

    monkeypatch.setattr(runner, "run_mechanism", guarded)
    job_id = _submit(client, keys)
    assert execute_job(job_id, settings) == Outcome.failed
    assert _facts(settings, job_id) == (JobStage.training, True, FailureCategory.guard_failed)
    view = _admin_view(client, keys, job_id)
    # The admin sees the category, never the guard's message (it may name a data value).
    assert view["error"] == GENERIC_FAILURE and "precondition" not in str(view)
    assert view["failure_category"] == "guard_failed" and view["data_read"] is True
    listed = client.get("/v1/admin/jobs", headers=auth(keys.admin)).json()
    assert [
        (j["id"], j["stage_reached"], j["data_read"], j["failure_category"]) for j in listed
    ] == [(job_id, "training", True, "guard_failed")]
    _analyst_view_is_unchanged(client, keys, job_id)

    # The dashboard: the facts in the job's row, and the system's data_read fact next to
    # the refund form's tick box, ticked for it.
    sign_in(client, keys.admin)
    page = client.get("/dashboard/jobs").text
    assert '<td class="stage">training</td><td>yes</td><td>guard_failed</td>' in page
    assert "The worker recorded that this job read private rows" in page
    assert 'name="override" value="true" checked>' in page

    # The CLI: the listing and the job's detail.
    env = {"COLUMNS": "250"}
    r = CliRunner().invoke(app, ["admin", "jobs"], env=env)
    assert r.exit_code == 0, r.output
    assert "training" in r.output and "guard_failed" in r.output and "yes" in r.output
    r = CliRunner().invoke(app, ["admin", "job", job_id], env=env)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert any("stage reached" in x and "training" in x for x in lines), r.output
    assert any("read private rows" in x and "yes" in x for x in lines), r.output
    assert any("failure category" in x and "guard_failed" in x for x in lines), r.output
    assert "precondition" not in r.output
    r = CliRunner().invoke(app, ["admin", "job", "no-such-job"], env=env)
    assert r.exit_code == 1 and "no job" in r.stderr


def test_a_released_job_reached_released(client: Any, keys: Any, settings: Any) -> None:
    job_id = _submit(client, keys)
    assert execute_job(job_id, settings) == Outcome.released
    assert _facts(settings, job_id) == (JobStage.released, True, None)
    view = _admin_view(client, keys, job_id)
    assert (view["stage_reached"], view["data_read"], view["failure_category"]) == (
        "released",
        True,
        None,
    )
    _analyst_view_is_unchanged(client, keys, job_id)
    sign_in(client, keys.admin)
    page = client.get("/dashboard/jobs").text
    assert '<td class="stage">released</td><td>yes</td><td></td>' in page


def test_a_missing_data_file_is_data_unavailable_and_unread(
    client: Any, keys: Any, settings: Any
) -> None:
    job_id = _submit(client, keys)
    (dataset_dir(settings.resolved_data_dir, "toy") / ROWS_FILE).unlink()
    assert execute_job(job_id, settings) == Outcome.failed
    assert _facts(settings, job_id) == (
        JobStage.planned,
        False,
        FailureCategory.data_unavailable,
    )
    sign_in(client, keys.admin)
    page = client.get("/dashboard/jobs").text
    assert '<td class="stage">planned</td><td>no</td><td>data_unavailable</td>' in page


def test_a_job_given_up_is_worker_lost(client: Any, keys: Any, settings: Any) -> None:
    job_id = _submit(client, keys)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(update(Job).where(Job.id == job_id).values(attempts=settings.max_attempts))
    assert execute_job(job_id, settings) == Outcome.skipped
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, job_id)
        assert job.status == JobStatus.failed
        assert job.failure_category == FailureCategory.worker_lost and job.data_read is False


@pytest.mark.parametrize(
    ("exc", "read", "category"),
    [
        (GuardFailed("x"), True, FailureCategory.guard_failed),
        (MemoryError(), True, FailureCategory.resource_limit),
        (FileNotFoundError("x"), False, FailureCategory.data_unavailable),
        (FileNotFoundError("x"), True, FailureCategory.internal_error),
        (ValueError("encoded features left [0, 1]"), True, FailureCategory.internal_error),
    ],
)
def test_the_category_comes_from_the_error_type(
    exc: BaseException, read: bool, category: FailureCategory
) -> None:
    assert failure_category(exc, data_read=read) == category


def test_the_migration_records_what_existing_jobs_show(
    client: Any, keys: Any, settings: Any
) -> None:
    released, queued = _submit(client, keys), _submit(client, keys)
    assert execute_job(released, settings) == Outcome.released
    url = settings.resolved_database_url
    engine_for.cache_clear()
    downgrade(url, "0006")
    upgrade(url)
    engine_for.cache_clear()
    assert _facts(settings, released) == (JobStage.released, True, None)
    assert _facts(settings, queued) == (JobStage.queued, False, None)
