"""Accepted work is never lost: a job whose message could not be sent (broker down) is
kept, charged and queued, and the sweeper sends it once the broker is back."""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from sqlalchemy import insert, select, update

from service.config import Settings
from service.db import engine_for, transaction
from service.jobs import jobs_to_resend, recovery_deadline_s, sweep
from service.ledger.tables import Analyst, Dataset, Job, JobStatus
from service.queue import Waiting, waiting_in_broker
from tests.conftest import REDIS_TEST_DB, REDIS_URL, auth

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_job_accepted_while_broker_down_is_sent_later(
    client: Any, keys: Any, settings: Any
) -> None:
    body = {"dataset": "toy", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-5}
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    client.app.state.settings = down
    t = time.monotonic()
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202 and time.monotonic() - t < 30
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        job = s.scalars(select(Job)).one()
        assert job.status == "queued" and job.enqueued_at is None
    assert jobs_to_resend(engine, down) == [job.id]

    queue = f"enclave.test.{uuid.uuid4().hex}"
    prefix = f"enclave-test-{uuid.uuid4().hex}:"
    broker = f"{REDIS_URL}/{REDIS_TEST_DB}"
    up = settings.model_copy(
        update={"broker_url": broker, "queue": queue, "broker_key_prefix": prefix}
    )
    r_ = redis.Redis.from_url(broker)
    try:
        assert sweep(engine, up) == 1
        assert r_.llen(prefix + queue) == 1  # the message is in the Redis queue
        with transaction(engine) as s:
            assert s.get_one(Job, job.id).enqueued_at is not None
        assert jobs_to_resend(engine, up) == []
    finally:
        # Only this test's keys (kombu wrote every one of them under the prefix).
        for key in r_.scan_iter(match=f"{prefix}*"):
            r_.delete(key)
        assert not list(r_.scan_iter(match=f"*{queue}*"))


# --- Issue: bounded re-sends (a backlog must not grow the queue) and the recovery deadline.
# Every clock below is injected (``now=``); nothing here waits or depends on speed.

T0 = datetime(2030, 1, 1, tzinfo=UTC)
BACKLOG = 880  # the reported backlog: 880 queued jobs ...
WINDOW_S = 210.0  # ... over 3.5 min of sweeps


def _insert_jobs(settings: Any, n: int, **values: Any) -> list[str]:
    """n job rows straight into the ledger (no plan, no charge: only the sweeper reads
    them here), all created at T0 unless ``values`` says otherwise."""
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        analyst_id = s.scalars(select(Analyst.id)).first()
        dataset_id = s.scalars(select(Dataset.id)).first()
    ids = [str(uuid.uuid4()) for _ in range(n)]
    row = {
        "analyst_id": analyst_id,
        "dataset_id": dataset_id,
        "request_hash": "0" * 64,
        "request": {},
        "plan": {},
        "status": JobStatus.queued,
        "created_at": T0,
        "enqueued_at": T0,
    } | values
    with transaction(engine) as s:
        s.execute(insert(Job), [{"id": job_id, **row} for job_id in ids])
    return ids


class _Sends:
    """Stands in for the broker's send (service.jobs.send_run_job): counts per job."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()

    def __call__(self, settings: Any, job_id: str) -> None:
        self.count[job_id] += 1


def _sweeps(engine: Any, settings: Any, broker: Any, until_s: float) -> None:
    """The sweeper's loop on an injected clock: a sweep every sweep_interval_s after T0."""
    t = settings.sweep_interval_s
    while t <= until_s:
        sweep(engine, settings, now=T0 + timedelta(seconds=t), broker=broker)
        t += settings.sweep_interval_s


def _old_rule_sends(settings: Any, n: int, until_s: float) -> int:
    """What the sweeper did before: every sweep, re-send each queued job whose last send
    is older than requeue_after_s, whether or not its message is still queued."""
    sends = 0
    last = 0.0
    t = settings.sweep_interval_s
    while t <= until_s:
        if last < t - settings.requeue_after_s:
            sends += 1
            last = t
        t += settings.sweep_interval_s
    return n * (1 + sends)  # the first send, then the re-sends


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_backlog_is_not_sent_again_and_again(
    keys: Any, settings: Any, monkeypatch: Any, record_property: Any
) -> None:
    """880 queued jobs whose messages wait in the broker, 3.5 min of sweeps (defaults).
    Before: every job re-sent every ~45-60 s (N x K). Now: on a broker that shows its queue
    (Redis), none is re-sent; where the broker cannot tell, the re-sends back off."""
    engine = engine_for(settings.resolved_database_url)
    ids = _insert_jobs(settings, BACKLOG)
    old = _old_rule_sends(settings, BACKLOG, WINDOW_S)
    assert old >= 4 * BACKLOG  # ~N x K: 4,400 with a sweep every 10 s (was 3,520 at 15 s)

    sends = _Sends()
    monkeypatch.setattr("service.jobs.send_run_job", sends)
    everything_waiting = lambda asked: Waiting(frozenset(asked), complete=True)  # noqa: E731
    _sweeps(engine, settings, everything_waiting, WINDOW_S)
    with_look = BACKLOG + sum(sends.count.values())
    assert with_look == BACKLOG  # the first sends only
    record_property("backlog_sends_old", old)
    record_property("backlog_sends_redis_look", with_look)

    # A broker that cannot be read (None): the wait doubles, from requeue_after_s. Over a
    # window W a job is sent at most 2 + log2(W / requeue_after_s) times.
    sends.count.clear()
    with transaction(engine) as s:
        s.execute(update(Job).values(enqueued_at=T0))
    _sweeps(engine, settings, lambda asked: None, WINDOW_S)
    blind = BACKLOG + sum(sends.count.values())
    bound = 2 + math.log2(WINDOW_S / settings.requeue_after_s)
    assert max(sends.count.values()) + 1 <= bound
    assert blind < old
    record_property("backlog_sends_blind", blind)
    # Over a long backlog the difference is the point: 10 h of sweeps.
    sends.count.clear()
    few = ids[:20]
    with transaction(engine) as s:
        s.execute(update(Job).values(enqueued_at=T0))
        s.execute(update(Job).where(Job.id.not_in(few)).values(status=JobStatus.released))
    _sweeps(engine, settings, lambda asked: None, 10 * 3600.0)
    per_job = max(sends.count.values())
    cap = settings.requeue_backoff_max_s
    # Doubling from 45 s reaches the 30 min cap after ~6 re-sends, then one per cap.
    assert per_job <= 2 + math.log2(cap / settings.requeue_after_s) + 10 * 3600.0 / cap
    assert _old_rule_sends(settings, 1, 10 * 3600.0) - 1 > 25 * per_job


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_lost_message_is_still_sent_again(keys: Any, settings: Any, monkeypatch: Any) -> None:
    """Accepted work is never lost: a queued job whose message the broker lost is re-sent,
    whether the broker shows its queue (a complete look that does not find it), shows only
    part of it, or cannot be read."""
    engine = engine_for(settings.resolved_database_url)
    sends = _Sends()
    monkeypatch.setattr("service.jobs.send_run_job", sends)
    first = T0 + timedelta(seconds=settings.requeue_after_s + settings.sweep_interval_s)

    lost = Waiting(frozenset(), complete=True)
    (job,) = _insert_jobs(settings, 1)
    assert sweep(engine, settings, now=first, broker=lambda asked: lost) == 1
    # Sent again: now its message waits, so the next sweeps leave it alone ...
    waiting = lambda asked: Waiting(frozenset(asked), complete=True)  # noqa: E731
    later = first + timedelta(seconds=10 * settings.requeue_after_s)
    assert sweep(engine, settings, now=later, broker=waiting) == 0
    # ... and if that message is lost too, it is sent once more.
    assert sweep(engine, settings, now=later, broker=lambda asked: lost) == 1
    assert sends.count[job] == 2
    with transaction(engine) as s:
        s.execute(update(Job).where(Job.id == job).values(status=JobStatus.released))

    partial_look = Waiting(frozenset(), complete=False)  # queue longer than the scan
    for look in (lambda asked: partial_look, lambda asked: None):
        (job,) = _insert_jobs(settings, 1)
        assert sweep(engine, settings, now=first, broker=look) == 1
        # Backoff: the next re-send after the job's age at this send (at least 45 s).
        assert jobs_to_resend(engine, settings, first + timedelta(seconds=30), look) == []
        age = first - T0  # the job's age at that send
        assert jobs_to_resend(engine, settings, first + age, look) == [job]
        with transaction(engine) as s:
            s.execute(update(Job).where(Job.id == job).values(status=JobStatus.released))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_killed_workers_job_is_sent_again_within_60_s(keys: Any, settings: Any) -> None:
    """The defaults (and docker-compose.yml, which names them) send a killed worker's job
    again within 60 s, whatever the sweeper's phase: was 120 s + 15 s (measured 137 s)."""
    defaults = Settings.model_construct(
        **{
            name: field.get_default(call_default_factory=True)
            for name, field in Settings.model_fields.items()
        }
    )
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = compose["x-common-env"]
    deployed = defaults.model_copy(
        update={
            "heartbeat_timeout_s": float(env["ENCLAVE_HEARTBEAT_TIMEOUT_S"]),
            "sweep_interval_s": float(env["ENCLAVE_SWEEP_INTERVAL_S"]),
        }
    )
    for cfg in (defaults, deployed):
        assert recovery_deadline_s(cfg) <= 60
        # The worker beats every min(5 s, timeout / 4) (worker/runner.py): a busy, alive
        # worker would have to miss several beats in a row to be taken for dead.
        beat_s = max(0.2, min(5.0, cfg.heartbeat_timeout_s / 4))
        assert cfg.heartbeat_timeout_s >= 4 * beat_s and cfg.heartbeat_timeout_s >= 30
    assert recovery_deadline_s(defaults) == 40 + 10

    # The same on the ledger, with the sweeper at every phase: a worker killed at T0 right
    # after its heartbeat; the first sweep that sends its job again is within the deadline.
    cfg = settings.model_copy(
        update={
            "heartbeat_timeout_s": defaults.heartbeat_timeout_s,
            "sweep_interval_s": defaults.sweep_interval_s,
        }
    )
    engine = engine_for(settings.resolved_database_url)
    (job,) = _insert_jobs(
        settings,
        1,
        status=JobStatus.running,
        enqueued_at=T0 - timedelta(seconds=1),
        started_at=T0,
        heartbeat_at=T0,
    )
    for phase in (0.0, 0.5, 3.0, 9.99):
        t = phase
        while job not in jobs_to_resend(engine, cfg, T0 + timedelta(seconds=t), lambda a: None):
            t += cfg.sweep_interval_s
        assert t <= recovery_deadline_s(cfg) <= 60


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_sweeper_reads_the_redis_queue(keys: Any, settings: Any) -> None:
    """On a real Redis: a job whose message waits in the queue is not sent again however
    old it is; once the message is lost (the list emptied, as by a restart without
    persistence) it is sent again, once."""
    queue = f"enclave.test.{uuid.uuid4().hex}"
    prefix = f"enclave-test-{uuid.uuid4().hex}:"
    broker = f"{REDIS_URL}/{REDIS_TEST_DB}"
    cfg = settings.model_copy(
        update={"broker_url": broker, "queue": queue, "broker_key_prefix": prefix}
    )
    engine = engine_for(settings.resolved_database_url)
    jobs = _insert_jobs(settings, 3, enqueued_at=None)
    r_ = redis.Redis.from_url(broker)
    try:
        assert sweep(engine, cfg, now=T0) == 3  # never sent: sent now
        assert r_.llen(prefix + queue) == 3
        look = waiting_in_broker(cfg, [*jobs, "not-a-job"])
        assert look == Waiting(frozenset(jobs), complete=True)
        much_later = T0 + timedelta(hours=5)
        assert sweep(engine, cfg, now=much_later) == 0
        assert r_.llen(prefix + queue) == 3
        r_.delete(prefix + queue)  # the broker loses them
        assert sweep(engine, cfg, now=much_later) == 3
        assert sweep(engine, cfg, now=much_later + timedelta(hours=1)) == 0
        assert r_.llen(prefix + queue) == 3
    finally:
        for key in r_.scan_iter(match=f"{prefix}*"):
            r_.delete(key)
