"""Accepted work is never lost: a job whose message could not be sent (broker down) is
kept, charged and queued, and the sweeper sends it once the broker is back."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis
from sqlalchemy import select

from service.db import engine_for, transaction
from service.jobs import jobs_to_resend, sweep
from service.ledger.tables import Job
from tests.conftest import REDIS_TEST_DB, REDIS_URL, auth


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
