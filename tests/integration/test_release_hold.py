"""The public release time (service/release_hold.py) with the worker in-process, on real
databases: the tests' settings turn the hold off for speed; these turn it on with a small
quantum. What an analyst sees of a run (status, progress, finished_at, the weights'
Last-Modified) must be the same function of the public hold whatever the rows and
however fast the run went."""

from __future__ import annotations

import math
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
from sqlalchemy import update

from service.config import Settings
from service.datasets.tabular import parse_schema
from service.db import engine_for, transaction
from service.jobs import admin_job, as_utc, job_public
from service.ledger.tables import Dataset, Job, JobStage
from service.release_hold import public_progress
from tests.conftest import SMALL_SCHEMA, auth, write_toy_csv
from worker.mechanisms.guards import GuardFailed
from worker.registration import register_dataset
from worker.runner import GENERIC_FAILURE, Outcome, execute_job

# The hold's quantum here: D is one quantum (the factor makes every estimate smaller), long
# enough that a toy run on a loaded machine ends inside it.
# One quantum is the hold D (factor 1e-9): long enough that the toy runs (well under a
# second idle) finish inside it on a busy machine; the tests of overshoots and failures
# accept any later doubling (they assert the grid, not the machine's speed).
QUANTUM_S = 4.0
BODY = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 2.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def _held(settings: Settings, *, quantum_s: float = QUANTUM_S, factor: float = 1e-9) -> Settings:
    """``settings`` with the hold on (the tests' fixture turns it off); by default D is one
    quantum whatever the estimate (factor 1e-9)."""
    return settings.model_copy(
        update={
            "release_hold": True,
            "release_hold_quantum_s": quantum_s,
            "release_hold_factor": factor,
        }
    )


def _submit(client: Any, keys: Any, body: dict[str, Any]) -> str:
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _job(settings: Settings, job_id: str) -> Job:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, job_id)
        s.expunge(job)
        return job


def _since_start(job: Job, at: datetime | None) -> float:
    started = as_utc(job.started_at)
    assert started is not None and at is not None
    return (as_utc(at) - started).total_seconds()  # type: ignore[operator]


def _timed_run(job_id: str, settings: Settings) -> tuple[Outcome, float]:
    t = time.monotonic()
    outcome = execute_job(job_id, settings)
    return outcome, time.monotonic() - t


def test_rows_and_run_speed_do_not_show(client: Any, keys: Any, settings: Settings) -> None:
    """Two datasets with the same public facts (schema, noisy row count) but 400 and 4000
    private rows: the same plan, runs of different lengths (DP-SGD's Poisson batches are
    10× larger on the second), and the same analyst view at every moment after the start:
    held until started_at + D, finished_at exactly there, progress from wall time."""
    engine = engine_for(settings.resolved_database_url)
    register_dataset(
        engine,
        settings,
        schema=parse_schema({**SMALL_SCHEMA, "name": "toy_big"}),
        csv_path=write_toy_csv(settings.home / "big.csv", n=4000, seed=1),
        epsilon_total=10.0,
        delta_total=1e-5,
        allow_nominal=True,
    )
    with transaction(engine) as s:  # one public row count for both (the plans' only input)
        s.execute(update(Dataset).values(n_rows=1000))
    small = _submit(client, keys, BODY)
    big = _submit(client, keys, {**BODY, "dataset": "toy_big"})
    plans = [{**_job(settings, j).plan, "dataset": None} for j in (small, big)]
    assert plans[0] == plans[1]  # but for the dataset's name

    held = _held(settings)
    views: dict[str, list[tuple[Any, ...]]] = {}
    for job_id in (small, big):
        outcome, took = _timed_run(job_id, held)
        assert outcome == Outcome.released
        assert took >= QUANTUM_S - 0.05  # the worker waited for the release time
        job = _job(settings, job_id)
        assert _since_start(job, job.release_at) == QUANTUM_S
        assert _since_start(job, job.finished_at) == QUANTUM_S  # on the grid
        started = as_utc(job.started_at)
        assert started is not None
        seen = []
        for share in (0.0, 0.15, 0.45, 0.75, 0.995):  # the analyst polls while it runs
            x = share * QUANTUM_S
            job.status = "running"  # type: ignore[assignment]
            public = job_public(job, "d", now=started + timedelta(seconds=x))
            seen.append((public.progress_step, public.progress_total))
        job.status = "released"  # type: ignore[assignment]
        public = job_public(job, "d")
        seen.append((public.progress_step, public.progress_total, public.status))
        views[job_id] = seen
        r = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
        assert datetime.fromisoformat(r["finished_at"]) == as_utc(job.finished_at)
        assert datetime.fromisoformat(r["release_at"]) == as_utc(job.release_at)
        weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=auth(keys.alice))
        modified = parsedate_to_datetime(weights.headers["last-modified"])
        assert modified == as_utc(job.finished_at).replace(microsecond=0)  # type: ignore[union-attr]
    assert views[small] == views[big]
    total = views[small][-1][1]
    assert [v[0] for v in views[small]] == [
        0,
        int(total * 0.15),
        int(total * 0.45),
        int(total * 0.75),
        int(total * 0.995),
        total,
    ]


def test_progress_while_held_is_wall_time(client: Any, keys: Any, settings: Settings) -> None:
    """Polled over the API while the worker holds a finished run: status 'running' (the
    admin sees stage 'releasing'), progress from elapsed time against D, never the run's
    own counter (which the admin's view keeps)."""
    job_id = _submit(client, keys, BODY)
    out: list[Outcome] = []
    worker = threading.Thread(target=lambda: out.append(execute_job(job_id, _held(settings))))
    worker.start()
    try:
        polls = []
        while worker.is_alive():
            before = datetime.now(UTC)
            r = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
            polls.append((before, datetime.now(UTC), r))
            time.sleep(0.05)
    finally:
        worker.join()
    assert out == [Outcome.released]
    job = _job(settings, job_id)
    started, release_at = as_utc(job.started_at), as_utc(job.release_at)
    total = polls[-1][2]["progress_total"]
    held_polls = 0
    for before, after, r in polls:
        if r["status"] != "running":
            continue
        lo, hi = (
            public_progress(
                status="running", started=started, release_at=release_at, total=total, now=t
            )
            for t in (before, after)
        )
        assert lo <= r["progress_step"] <= hi
        held_polls += 1
    assert held_polls > 3
    admin = admin_job(job, "toy")
    assert admin.progress_step == admin.progress_total  # the run's own counter, complete
    assert job.stage_reached == JobStage.released


def test_overshoot_releases_at_the_next_doubling(
    client: Any, keys: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run slower than D (here slowed on purpose) is released at 2·D, not when it ends."""
    import worker.runner as runner

    real = runner.run_mechanism

    ended: list[datetime] = []

    def slow(**kwargs: Any) -> Any:
        time.sleep(QUANTUM_S * 1.2)
        out = real(**kwargs)
        ended.append(datetime.now(UTC))
        return out

    monkeypatch.setattr(runner, "run_mechanism", slow)
    job_id = _submit(client, keys, BODY)
    outcome, took = _timed_run(job_id, _held(settings))
    assert outcome == Outcome.released and took >= 2 * QUANTUM_S - 0.05
    job = _job(settings, job_id)
    _assert_on_a_later_doubling(job, ended[0], at_least=2 * QUANTUM_S)


def _assert_on_a_later_doubling(job: Job, run_end: datetime, *, at_least: float) -> None:
    """finished_at is started_at + D·2^j (D = one quantum here), not before the run's end
    nor before ``at_least``; which j depends on how fast the machine ran the job."""
    since = _since_start(job, job.finished_at)
    assert since >= at_least and since >= _since_start(job, run_end)
    doublings = since / QUANTUM_S
    assert doublings == 2.0 ** round(math.log2(doublings))


def test_failure_after_reading_rows_is_held(
    client: Any, keys: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guard that fails on the rows fails the job at the release time, not at once; the
    analyst sees progress 0 and the generic message."""
    import worker.runner as runner

    ended: list[datetime] = []

    def guard(**kwargs: Any) -> Any:
        ended.append(datetime.now(UTC))
        raise GuardFailed("a guard failed on the rows")

    monkeypatch.setattr(runner, "run_mechanism", guard)
    job_id = _submit(client, keys, BODY)
    outcome, took = _timed_run(job_id, _held(settings))
    assert outcome == Outcome.failed and took >= QUANTUM_S - 0.05
    job = _job(settings, job_id)
    assert job.data_read is True
    _assert_on_a_later_doubling(job, ended[0], at_least=QUANTUM_S)
    r = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert r["status"] == "failed" and r["error"] == GENERIC_FAILURE
    assert r["progress_step"] == 0


def test_failure_before_any_row_is_not_held(client: Any, keys: Any, settings: Settings) -> None:
    """A failure before the first read depends on public facts only: not held."""
    from worker.data import ROWS_FILE, dataset_dir

    job_id = _submit(client, keys, BODY)
    (dataset_dir(settings.resolved_data_dir, "toy") / ROWS_FILE).unlink()
    outcome, took = _timed_run(job_id, _held(settings))
    assert outcome == Outcome.failed and took < QUANTUM_S
    assert _job(settings, job_id).data_read is False
