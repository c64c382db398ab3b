"""The worker's job runner in-process, on real databases: claim, plan check, release
compare-and-set, generic failures."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import func, select, update

from service.db import engine_for, transaction
from service.ledger.tables import Job, JobStatus, LedgerEntry, Release
from service.releases import ASYMPTOTIC_STATEMENT
from tests.conftest import auth
from worker.data import ROWS_FILE, dataset_dir
from worker.runner import GENERIC_FAILURE, PLAN_FAILURE, Outcome, execute_job

BODY = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 2.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def _submit(client: Any, keys: Any, body: dict | None = None) -> str:
    r = client.post("/v1/jobs", json=body or BODY, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_run_releases_once(client: Any, keys: Any, settings: Any) -> None:
    job_id = _submit(client, keys)
    assert execute_job(job_id, settings) == Outcome.released
    assert execute_job(job_id, settings) == Outcome.skipped  # a duplicate message
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    steps = job["plan"]["mechanism"]["steps"]
    assert job["status"] == "released" and job["progress_step"] == job["progress_total"] == steps
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["privacy"]["guarantee"] == "proven"
    assert card["preprocessing"]["feature_names"] == ["a", "b", "c=x", "c=y", "c=z"]
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalar(select(func.count()).select_from(Release)) == 1
        n_release = s.scalar(
            select(func.count()).select_from(LedgerEntry).where(LedgerEntry.kind == "release")
        )
        assert n_release == 1


def test_failure_message_is_generic(client: Any, keys: Any, settings: Any) -> None:
    job_id = _submit(client, keys)
    (dataset_dir(settings.resolved_data_dir, "toy") / ROWS_FILE).unlink()
    assert execute_job(job_id, settings) == Outcome.failed
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "failed" and job["error"] == GENERIC_FAILURE
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.get_one(Job, job_id).data_touched is False  # the file was never opened


def test_plan_that_cannot_be_reproduced_is_refused_before_data(
    client: Any, keys: Any, settings: Any
) -> None:
    job_id = _submit(client, keys)
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        job = s.get_one(Job, job_id)
        plan = dict(job.plan)
        plan["mechanism"] = {**plan["mechanism"], "noise_multiplier": 0.01}
        s.execute(update(Job).where(Job.id == job_id).values(plan=plan))
    assert execute_job(job_id, settings) == Outcome.failed
    with transaction(engine) as s:
        job = s.get_one(Job, job_id)
        assert job.error == PLAN_FAILURE and job.data_touched is False


def test_stale_run_is_not_released(client: Any, keys: Any, settings: Any) -> None:
    """If another run took the job over, this run's result is discarded."""
    import worker.runner as runner

    job_id = _submit(client, keys)
    engine = engine_for(settings.resolved_database_url)
    original = runner.run_mechanism

    def hijacked(**kwargs: Any) -> Any:
        out = original(**kwargs)
        with transaction(engine) as s:  # another worker claims the job meanwhile
            s.execute(update(Job).where(Job.id == job_id).values(run_token="someone-else"))
        return out

    runner.run_mechanism = hijacked  # type: ignore[assignment]
    try:
        assert execute_job(job_id, settings) == Outcome.superseded
    finally:
        runner.run_mechanism = original  # type: ignore[assignment]
    with transaction(engine) as s:
        assert s.get_one(Job, job_id).status == JobStatus.running
        assert s.scalar(select(func.count()).select_from(Release)) == 0


def test_ensemble_of_k_models(client: Any, keys: Any, settings: Any) -> None:
    job_id = _submit(client, keys, {**BODY, "samples": 2})
    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["samples"] == 2 and card["privacy"]["epsilon"] == 4.0
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=auth(keys.alice)).content
    from service.releases import load_release

    rel = load_release(weights, card)
    assert (
        set(rel.sample_weights(0))
        == set(rel.sample_weights(1))
        == {
            "linear.weight",
            "linear.bias",
        }
    )


def test_decaying_noise_schedule_job_runs_and_states_its_schedule(
    client: Any, keys: Any, settings: Any
) -> None:
    body = {
        **BODY,
        "dpsgd": {
            **BODY["dpsgd"],
            "epochs": 2,
            "noise_schedule": "exponential",
            "noise_decay": 0.8,
        },
    }
    job_id = _submit(client, keys, body)
    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    sigmas = card["mechanism"]["noise_multipliers"]
    assert len(sigmas) == 2 and sigmas[1] < sigmas[0]
    assert card["privacy"]["guarantee"] == "proven"


@pytest.mark.parametrize(
    ("engine", "model"),
    [("exact", "logistic"), ("ghost", "logistic"), ("ghost", "mlp"), ("jl", "mlp")],
)
def test_each_gradient_engine_job_runs_and_its_card_states_the_engine(
    client: Any, keys: Any, settings: Any, engine: str, model: str
) -> None:
    options = {**BODY["dpsgd"], "engine": engine}
    if engine == "jl":
        options["jl_projections"] = 20
    body = {**BODY, "model": {"kind": model}, "dpsgd": options}
    job_id = _submit(client, keys, body)
    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["mechanism"]["engine"] == engine
    assert card["privacy"]["guarantee"] == "proven"
    if engine == "jl":
        mech = card["mechanism"]
        assert mech["noise_multiplier"] == pytest.approx(
            mech["jl_kappa"] * mech["charged_noise_multiplier"]
        )
        assert (
            card["privacy"]["event"]["events"][0]["noise_multiplier"]
            == (mech["charged_noise_multiplier"])
        )


def test_unsupported_engine_is_refused_at_quote_and_charges_nothing(
    client: Any, keys: Any, settings: Any
) -> None:
    def entries() -> int:
        with transaction(engine_for(settings.resolved_database_url)) as s:
            return int(s.scalar(select(func.count()).select_from(LedgerEntry)) or 0)

    before = entries()
    body = {**BODY, "dpsgd": {**BODY["dpsgd"], "engine": "jl", "jl_projections": 1}}
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "projection" in r.json()["detail"]
    r = client.post(
        "/v1/jobs",
        json={**BODY, "dpsgd": {**BODY["dpsgd"], "engine": "jl"}},
        headers=auth(keys.alice),
    )
    assert r.status_code == 422, r.text
    assert entries() == before


def _db_down() -> Exception:
    from sqlalchemy.exc import OperationalError

    return OperationalError("SELECT 1", {}, Exception("connection refused"))


def test_transient_ledger_errors_at_release_are_retried_not_failed(
    client: Any, keys: Any, settings: Any, monkeypatch: Any
) -> None:
    """Issue 11: a database error at the final heartbeat or at the release transaction went
    to the generic failure branch (failed for good, charge kept). Now the final heartbeat is
    skipped and the release retried."""
    import worker.runner as runner

    job_id = _submit(client, keys)
    calls = {"n": 0}
    original = runner.record_release

    def flaky(*a: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise _db_down()
        return original(*a, **kw)

    def beat_down(self: Any) -> None:
        raise _db_down()

    monkeypatch.setattr(runner, "record_release", flaky)
    monkeypatch.setattr(runner, "RELEASE_RETRY_DELAYS_S", (0.01, 0.01, 0.01))
    monkeypatch.setattr(runner.Heartbeat, "beat", beat_down)
    assert execute_job(job_id, settings) == Outcome.released
    assert calls["n"] == 3
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "released"


def test_ledger_down_through_the_release_defers_the_job_for_the_sweeper(
    client: Any, keys: Any, settings: Any, monkeypatch: Any
) -> None:
    from datetime import UTC, datetime, timedelta

    import worker.runner as runner
    from service.jobs import jobs_to_resend

    job_id = _submit(client, keys)

    def down(*a: Any, **kw: Any) -> Any:
        raise _db_down()

    monkeypatch.setattr(runner, "record_release", down)
    monkeypatch.setattr(runner, "RELEASE_RETRY_DELAYS_S", (0.01,))
    assert execute_job(job_id, settings) == Outcome.deferred
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        job = s.get_one(Job, job_id)
        assert job.status == JobStatus.running and job.error is None  # not failed
    later = datetime.now(UTC) + timedelta(seconds=settings.heartbeat_timeout_s + 1)
    assert job_id in jobs_to_resend(engine, settings, now=later)


def test_a_lost_message_is_resent_after_requeue_after_s(
    client: Any, keys: Any, settings: Any
) -> None:
    """Issue 11: a queued job whose message was lost waited 10 × the heartbeat timeout
    (measured 1,196 s); now requeue_after_s (default 45 s)."""
    from datetime import UTC, datetime, timedelta

    from service.jobs import jobs_to_resend

    job_id = _submit(client, keys)
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        s.execute(update(Job).where(Job.id == job_id).values(enqueued_at=datetime.now(UTC)))
    assert jobs_to_resend(engine, settings) == []  # just sent: give the worker a chance
    later = datetime.now(UTC) + timedelta(seconds=settings.requeue_after_s + 1)
    assert jobs_to_resend(engine, settings, now=later) == [job_id]
    assert settings.requeue_after_s <= 60


def test_worker_runs_under_a_hard_time_limit(settings: Any, monkeypatch: Any) -> None:
    """Issue 11: the worker has a hard time limit per job run (and a soft one just before),
    from ENCLAVE_JOB_TIME_LIMIT_S. (Checked on the worker's Celery configuration; a run
    past it is killed by Celery, which this test does not exercise end to end.)"""
    from service.config import get_settings
    from worker.celery_app import make_celery

    monkeypatch.setenv("ENCLAVE_JOB_TIME_LIMIT_S", "120")
    get_settings.cache_clear()
    worker_app = make_celery()
    assert worker_app.conf.task_time_limit == 120
    assert 0 < worker_app.conf.task_soft_time_limit < 120


def test_worker_keeps_running_jobs_through_a_broker_connection_loss() -> None:
    """Issue 11: the worker pins Celery's connection-loss behaviour (Celery 6 flips the
    default): running late-ack jobs are not terminated when the broker connection drops;
    the claim skips the redelivered message (test_run_releases_once) and the broker-restart
    fault test sees the busy job released after one attempt."""
    from worker.celery_app import make_celery

    conf = make_celery().conf
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is False
    assert conf.task_acks_late is True and conf.task_reject_on_worker_lost is True


def test_proven_expm_langevin_job_runs_and_states_its_guarantee(
    client: Any, keys: Any, settings: Any
) -> None:
    """The regularised ExpM through the API and the worker: quoted and charged as the
    full-batch Gaussian composition, released with a proven label."""
    body = {
        "dataset": "toy",
        "method": "expm",
        "epsilon": 1.0,
        "delta": 1e-5,
        "expm": {"steps": 40},
    }
    quote = client.post("/v1/quote", json=body, headers=auth(keys.alice))
    assert quote.status_code == 200, quote.text
    assert quote.json()["plan"]["guarantee"] == "proven"
    job_id = _submit(client, keys, body)
    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "released" and job["progress_step"] == 40
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["privacy"]["guarantee"] == "proven"
    assert card["privacy"]["event"]["events"][0]["sampling_rate"] == 1.0
    assert card["mechanism"]["method"] == "expm" and card["mechanism"]["sampler"] == "langevin"
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=auth(keys.alice))
    assert weights.status_code == 200 and len(weights.content) > 0


def test_asymptotic_expm_mcmc_job_runs_and_states_its_guarantee(
    client: Any, keys: Any, settings: Any, caplog: Any
) -> None:
    """The MCMC sampler through the API and the worker: charged as the exact target's
    Gaussian-DP, released with the asymptotic label and statement; the dataset's guarantee
    turns asymptotic once it ran; its diagnostics reach the enclave log, not the API."""
    body = {
        "dataset": "toy",
        "method": "expm",
        "epsilon": 1.0,
        "delta": 1e-5,
        "samples": 2,
        "expm": {"sampler": "mcmc", "chains": 4, "steps": 20, "warmup": 20},
    }
    quote = client.post("/v1/quote", json=body, headers=auth(keys.alice)).json()
    assert quote["plan"]["guarantee"] == "asymptotic"
    assert quote["dataset_before"]["guarantee"] == "proven"
    assert quote["dataset_after"]["guarantee"] == "asymptotic"
    job_id = _submit(client, keys, body)
    caplog.set_level(logging.INFO, logger="enclave.worker")
    assert execute_job(job_id, settings) == Outcome.released
    assert "rhat_max" in caplog.text  # the enclave log has the diagnostics
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "released" and job["guarantee"] == "asymptotic"
    assert job["progress_step"] == job["progress_total"] == 40
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["privacy"]["guarantee"] == "asymptotic"
    assert card["privacy"]["statement"] == ASYMPTOTIC_STATEMENT
    assert card["mechanism"]["sampler"] == "mcmc" and card["samples"] == 2
    event = card["privacy"]["event"]["event"]  # two samples: the one-draw event, twice
    assert event["sampling_rate"] == 1.0 and event["steps"] == 1
    for text in (str(card), str(job)):
        assert "rhat" not in text and "acceptance" not in text and "ess_bulk" not in text
    listed = client.get("/v1/datasets", headers=auth(keys.alice)).json()[0]["budget"]
    assert listed["guarantee"] == "asymptotic"


def test_asymptotic_methods_need_the_admins_permission(client: Any, keys: Any) -> None:
    body = {
        "dataset": "toy",
        "method": "expm",
        "epsilon": 1.0,
        "delta": 1e-5,
        "expm": {"sampler": "mcmc"},
    }
    admin = auth(keys.admin)
    client.put("/v1/admin/datasets/toy/nominal", json={"allow_nominal": False}, headers=admin)
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 403 and r.json()["type"] == "/problems/nominal-not-allowed"
    assert "asymptotic guarantee" in r.json()["detail"]
    q = client.post("/v1/quote", json=body, headers=auth(keys.alice)).json()
    assert q["admitted"] is False and "asymptotic" in q["reason"]
    # The proven sampler of the same method needs no permission.
    proven = {**body, "expm": {"steps": 5}}
    assert client.post("/v1/quote", json=proven, headers=auth(keys.alice)).json()["admitted"]


def test_expm_refuses_what_its_proof_does_not_cover(client: Any, keys: Any) -> None:
    for body, words in (
        ({**BODY, "method": "expm", "dpsgd": None, "model": {"kind": "mlp"}}, "logistic"),
        ({**BODY, "method": "expm", "dpsgd": None, "delta": 0}, "delta > 0"),
        ({**BODY, "method": "expm"}, "dpsgd options given for method expm"),
    ):
        r = client.post("/v1/quote", json=body, headers=auth(keys.alice))
        assert r.status_code == 422 and words in r.json()["detail"], r.text


def test_expm_plans_beyond_the_job_time_limit_are_refused_before_any_charge(
    client: Any, keys: Any, settings: Any, monkeypatch: Any
) -> None:
    """Issue 13: a request the proven sampler cannot serve within the work limit is a 4xx
    saying why, at quote time and at submission, and nothing is charged."""
    monkeypatch.setattr(settings, "job_time_limit_s", 0.01)
    body = {
        "dataset": "toy",
        "method": "expm",
        "epsilon": 1.0,
        "delta": 1e-5,
        "expm": {"steps": 20000},
    }
    before = client.get("/v1/datasets", headers=auth(keys.alice)).json()
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=body, headers=auth(keys.alice))
        assert r.status_code == 422 and "worker time" in r.json()["detail"], r.text
    assert client.get("/v1/datasets", headers=auth(keys.alice)).json() == before
    small = {**body, "expm": {"steps": 10}}
    assert client.post("/v1/quote", json=small, headers=auth(keys.alice)).status_code == 200


def test_progress_total_is_the_plans_from_submission_to_release(
    client: Any, keys: Any, settings: Any
) -> None:
    """A queued job reads "step 0 of T" (T from its plan), and the worker's mechanism
    counts the same T: k samples of DP-SGD or Langevin count k·steps, expm_nf one flow."""
    cases = [
        ({**BODY, "samples": 2}, lambda plan: 2 * plan["mechanism"]["steps"]),
        ({**BODY, "method": "expm", "dpsgd": None, "expm": {"steps": 30}}, lambda _: 30),
        (
            {**BODY, "method": "expm_nf", "delta": 0, "dpsgd": None,
             "expm_nf": {"steps": 20, "n_samples_per_step": 8, "batch_size": 64}},
            lambda _: 20,
        ),
    ]  # fmt: skip
    for body, expected in cases:
        job_id = _submit(client, keys, body)
        job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
        total = expected(job["plan"])
        assert (job["status"], job["progress_step"], job["progress_total"]) == ("queued", 0, total)
        assert execute_job(job_id, settings) == Outcome.released
        job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
        assert job["progress_step"] == job["progress_total"] == total, body["method"]
