"""Red-team measurement for issue 19 (A): does the sweeper grow a queued backlog?

The claim: "the sweeper re-sends every queued job every ~45-60 s whether or not its message
is still queued: 880 queued jobs became 5,017 messages in 3.5 min".

What this does, on the real components (no mocks of the ledger, the API, the broker):

1. A fresh SQLite ledger in a temporary folder; the toy dataset and analysts of
   ``tests.conftest.bootstrap`` (budget raised so every job fits).
2. ``--jobs`` (900) DP-SGD submissions through the API (FastAPI TestClient,
   POST /v1/jobs, the body of tests/integration/test_api.py), with the broker on the
   real Redis (``redis://127.0.0.1:6379/15``) under a queue name and key prefix of this run's
   own. No worker runs, so every job stays queued and each submission leaves one message.
3. The sweeper (``service.jobs.sweep``, the function the API's sweeper thread calls) run
   repeatedly with a simulated clock that advances by the tree's default
   ``sweep_interval_s`` until 3.5 minutes (210 s) of simulated time have passed. The
   broker look-up is the default one (no ``broker`` argument: on the new code the real
   LRANGE of the Redis queue).
4. LLEN of the Celery queue list (key = broker_key_prefix + queue) at the start and after
   each sweep, the number of sends, and the number of distinct jobs among the messages.
   Afterwards every Redis key under this run's prefix is deleted (never FLUSHDB).

The clock: where ``sweep`` takes ``now`` (new code) it is passed. The old code's ``sweep``
has no ``now`` (it and ``enqueue`` call ``datetime.now(UTC)`` in service/jobs.py), so there
``service.jobs.datetime`` is replaced by a subclass whose ``now()`` returns the simulated
clock: both the sweeper's "sent 45 s ago?" test and the ``enqueued_at`` it writes follow
the simulated time, exactly as if the sweeper had run for real for 3.5 minutes. The new
code gets the same patch too (harmless: it is handed ``now`` anyway), so both trees see the
same clock.

Run it from the tree to measure (its root goes first on sys.path):

    cd /work/main && .venv/bin/python benchmarks/sweeper_backlog.py
    cd /tmp/old   && /work/main/.venv/bin/python benchmarks/sweeper_backlog.py  # copy of this file
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, timedelta
from pathlib import Path

ROOT = Path(os.getcwd()).resolve()
sys.path.insert(0, str(ROOT))

BODY = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=900)
    ap.add_argument("--minutes", type=float, default=3.5)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    ap.add_argument("--json", type=Path, default=None, help="write the result here too")
    ap.add_argument(
        "--lose-at",
        type=float,
        default=None,
        help="control: DEL the queue list (every message lost, as a Redis restart without "
        "persistence) just before the sweep at this simulated second",
    )
    args = ap.parse_args()

    tag = f"rt19a-{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix=tag))
    os.environ.update(
        ENCLAVE_HOME=str(tmp / "home"),
        ENCLAVE_DATABASE_URL=f"sqlite:///{tmp / 'ledger.sqlite'}",
        ENCLAVE_BROKER_URL=args.redis,
        ENCLAVE_QUEUE=f"{tag}.jobs",
        ENCLAVE_BROKER_KEY_PREFIX=f"{tag}:",
        ENCLAVE_DEVICE="cpu",
        ENCLAVE_RATE_LIMIT_BURST="100000",
        ENCLAVE_RATE_LIMIT_PER_S="100000",
        ENCLAVE_PLANNING_PER_KEY="1000",
        ENCLAVE_PLANNING_GLOBAL="1000",
        ENCLAVE_ADDRESS_RATE_LIMITS="false",
    )
    for var in ("SWEEP_INTERVAL_S", "REQUEUE_AFTER_S", "HEARTBEAT_TIMEOUT_S"):
        os.environ.pop(f"ENCLAVE_{var}", None)

    import redis
    from fastapi.testclient import TestClient

    import service
    import service.jobs as jobs
    from service.app import create_app
    from service.config import get_settings
    from service.db import engine_for
    from service.migrate import upgrade
    from tests.conftest import auth, bootstrap

    print(f"tree: {Path(service.__file__).resolve().parents[1]}")
    get_settings.cache_clear()
    settings = get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    engine = engine_for(settings.resolved_database_url)
    keys = bootstrap(settings, epsilon=10.0 * args.jobs, delta=0.5)
    queue_key = settings.broker_key_prefix + settings.queue
    r = redis.Redis.from_url(args.redis)
    takes_now = "now" in inspect.signature(jobs.sweep).parameters
    print(
        f"defaults: sweep_interval_s={settings.sweep_interval_s} "
        f"requeue_after_s={settings.requeue_after_s} "
        f"heartbeat_timeout_s={settings.heartbeat_timeout_s}; sweep(now=...): {takes_now}"
    )
    print(f"queue key: {queue_key}")

    result: dict[str, object] = {"tree": str(Path(service.__file__).resolve().parents[1])}
    try:
        t_sub = time.monotonic()
        with TestClient(create_app(settings, run_sweeper=False)) as c:
            for i in range(args.jobs):
                resp = c.post("/v1/jobs", json=BODY, headers=auth(keys.alice))
                assert resp.status_code == 202, (i, resp.status_code, resp.text)
        submit_s = time.monotonic() - t_sub
        start_len = int(r.llen(queue_key))
        print(f"submitted {args.jobs} jobs in {submit_s:.1f} s; LLEN at start: {start_len}")

        real_datetime = jobs.datetime
        clock = {"now": real_datetime.now(UTC)}

        class SimDatetime(real_datetime):  # type: ignore[misc,valid-type]
            @classmethod
            def now(cls, tz=None):
                return clock["now"] if tz is not None else clock["now"].replace(tzinfo=None)

        jobs.datetime = SimDatetime  # type: ignore[misc]
        interval = settings.sweep_interval_s
        horizon = args.minutes * 60
        t0 = clock["now"]
        sends = 0
        rows = []
        t_real = time.monotonic()
        k = 0
        while (k + 1) * interval <= horizon + 1e-9:
            k += 1
            clock["now"] = t0 + timedelta(seconds=k * interval)
            if args.lose_at is not None and abs(k * interval - args.lose_at) < 1e-9:
                r.delete(queue_key)
                print(f"  t={k * interval:6.0f} s  queue list deleted (messages lost)")
            if takes_now:
                sent = jobs.sweep(engine, settings, now=clock["now"])
            else:
                sent = jobs.sweep(engine, settings)
            sends += sent
            length = int(r.llen(queue_key))
            rows.append({"t_s": k * interval, "sent": sent, "llen": length})
            print(f"  t={k * interval:6.0f} s  sent {sent:5d}  LLEN {length:6d}")
        jobs.datetime = real_datetime
        sweep_real_s = time.monotonic() - t_real
        end_len = int(r.llen(queue_key))
        distinct = len({jobs_id for raw in r.lrange(queue_key, 0, -1) if (jobs_id := _job_id(raw))})
        result.update(
            jobs=args.jobs,
            sweep_interval_s=interval,
            requeue_after_s=settings.requeue_after_s,
            sweeps=k,
            simulated_s=k * interval,
            llen_start=start_len,
            llen_end=end_len,
            sends=sends,
            distinct_jobs_in_queue=distinct,
            submit_real_s=round(submit_s, 1),
            sweeps_real_s=round(sweep_real_s, 1),
            per_sweep=rows,
            clock="sweep(now=...)" if takes_now else "service.jobs.datetime patched",
        )
        print(
            f"RESULT jobs={args.jobs} sweeps={k} (every {interval:g} s, {k * interval:g} s "
            f"simulated) LLEN {start_len} -> {end_len}, sends={sends}, "
            f"distinct jobs in queue={distinct}, sweeps took {sweep_real_s:.1f} s real"
        )
    finally:
        deleted = 0
        for key in r.scan_iter(match=f"{tag}*", count=1000):
            deleted += r.delete(key)
        for key in r.scan_iter(match=f"_kombu.binding.{tag}*", count=1000):
            deleted += r.delete(key)
        print(f"cleanup: deleted {deleted} Redis keys under {tag}")
        engine.dispose()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def _job_id(raw: bytes) -> str | None:
    import base64

    try:
        msg = json.loads(raw)
        body = msg["body"]
        if (msg.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        return str(json.loads(body)[0][0])
    except Exception:
        return None


if __name__ == "__main__":
    main()
