"""Red-team measurement for issue 19 (B): how long after a worker is killed mid-job does
the job run again, with the product's default timeouts?

The claim: "worker kill -> 137 s to recover with the defaults" (old defaults: heartbeat
timeout 120 s + sweep interval 15 s).

What this does, on real processes (the API under uvicorn with its sweeper thread, Celery
workers with the solo pool, exactly the command lines of ``enclave.processes``, which
tests/e2e/stack.py also uses), per run:

1. A fresh PostgreSQL database on 127.0.0.1:5432 (dropped afterwards) as the ledger; the
   toy dataset (--rows, 20,000 rows) and analysts of ``tests.conftest.bootstrap``; the broker on
   the real Redis ``redis://127.0.0.1:6379/15`` under a queue name and key prefix of this
   run's own (its keys are deleted afterwards, never FLUSHDB).
2. ENCLAVE_HEARTBEAT_TIMEOUT_S and ENCLAVE_SWEEP_INTERVAL_S are NOT set (removed from the
   environment): the API and the workers run on the tree's defaults (service/config.py).
3. Worker "victim" starts; one DP-SGD job (--epochs 60 of --rows 20,000, batch 20: 60,000
   steps, long enough on this machine to be killed mid-run) is submitted;
   once the job is running and has reported progress (its heartbeat beating), the victim
   is SIGKILLed and a fresh worker "rescuer" is started at once.
4. Measured from the kill (wall clock): when the sweeper sent the job again (its
   ``enqueued_at`` moved past the kill), and when the rescuer claimed it (``attempts``
   went from 1 to 2 with status running): the recovery time. Then it waits (bounded) for
   the release.

tests/e2e/stack.py is not imported: its ``running_stack`` always sets both timeouts (and
a 1 s sweep), and it is being edited; this script starts the same processes itself.

    cd /work/main && .venv/bin/python benchmarks/worker_kill_recovery.py --runs 3
    cd /tmp/old   && /work/main/.venv/bin/python /work/main/benchmarks/worker_kill_recovery.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(os.getcwd()).resolve()
sys.path.insert(0, str(ROOT))

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
JOB = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 5, "batch_size": 20},
}


def one_run(redis_url: str, release_wait_s: float, epochs: int, rows: int) -> dict[str, object]:
    import httpx
    import redis
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from enclave.processes import child_env, free_port, start_api, start_worker, stop, wait_ready
    from service.config import get_settings
    from service.db import engine_for, transaction
    from service.jobs import as_utc
    from service.ledger.tables import Job
    from service.migrate import upgrade
    from tests.conftest import auth, bootstrap

    tag = f"rt19b-{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix=tag))
    dbname = tag.replace("-", "_")
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{dbname}"'))
    url = make_url(PG).set(database=dbname).render_as_string(hide_password=False)
    env_vars = {
        "ENCLAVE_HOME": str(tmp / "home"),
        "ENCLAVE_DATABASE_URL": url,
        "ENCLAVE_BROKER_URL": redis_url,
        "ENCLAVE_QUEUE": f"{tag}.jobs",
        "ENCLAVE_BROKER_KEY_PREFIX": f"{tag}:",
        "ENCLAVE_DEVICE": "cpu",
    }
    os.environ.update(env_vars)
    for var in ("ENCLAVE_HEARTBEAT_TIMEOUT_S", "ENCLAVE_SWEEP_INTERVAL_S"):
        os.environ.pop(var, None)
    get_settings.cache_clear()
    settings = get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    upgrade(url)
    engine = engine_for(url)
    keys = bootstrap(settings, n=rows, epsilon=10.0)
    env = child_env({**env_vars, "PYTHONPATH": str(ROOT)})
    for var in ("ENCLAVE_HEARTBEAT_TIMEOUT_S", "ENCLAVE_SWEEP_INTERVAL_S"):
        env.pop(var, None)
    procs: list = []
    r = redis.Redis.from_url(redis_url)
    out: dict[str, object] = {
        "heartbeat_timeout_s": settings.heartbeat_timeout_s,
        "sweep_interval_s": settings.sweep_interval_s,
    }

    def job_row(job_id: str) -> tuple[str, int, datetime | None, datetime | None]:
        with transaction(engine) as s:
            j = s.get_one(Job, job_id)
            return str(j.status), int(j.attempts), as_utc(j.enqueued_at), as_utc(j.heartbeat_at)

    def wait_log(name: str, text_: str, timeout: float = 300) -> None:
        log = tmp / f"worker-{name}.log"
        deadline = time.monotonic() + timeout
        while not log.exists() or text_ not in log.read_text():
            assert time.monotonic() < deadline, f"{name}: {text_!r} not in log"
            time.sleep(0.2)

    try:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        procs.append(start_api(env, port, log=tmp / "api.log", cwd=ROOT))
        wait_ready(base, timeout=300)
        victim = start_worker(env, log=tmp / "worker-victim.log", name=f"victim-{tag}")
        procs.append(victim)
        wait_log("victim", " ready.")
        with httpx.Client(base_url=base, headers=auth(keys.alice), timeout=60) as c:
            body = {**JOB, "dpsgd": {**JOB["dpsgd"], "epochs": epochs}}  # type: ignore[dict-item]
            resp = c.post("/v1/jobs", json=body)
            assert resp.status_code == 202, resp.text
            job_id = resp.json()["id"]
            deadline = time.monotonic() + 300
            while True:
                j = c.get(f"/v1/jobs/{job_id}").json()
                if j["status"] == "running" and (j["progress_step"] or 0) > 0:
                    break
                assert j["status"] in ("queued", "running"), j
                assert time.monotonic() < deadline, j
                time.sleep(0.1)
            step_at_kill = j["progress_step"], j["progress_total"]
            beat_before = job_row(job_id)[3]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            killed = time.monotonic()
            killed_wall = datetime.now(UTC)
            rescuer = start_worker(env, log=tmp / "worker-rescuer.log", name=f"rescuer-{tag}")
            procs.append(rescuer)
            print(f"  killed victim at step {step_at_kill[0]}/{step_at_kill[1]}; rescuer started")
            resent = ready = None
            while True:
                status, attempts, enq, _ = job_row(job_id)
                now = time.monotonic()
                rlog = tmp / "worker-rescuer.log"
                if ready is None and rlog.exists() and " ready." in rlog.read_text():
                    ready = now - killed
                if resent is None and enq is not None and enq > killed_wall:
                    resent = (enq - killed_wall).total_seconds()
                if attempts >= 2 and status == "running":
                    reclaimed = now - killed
                    break
                if status in ("released", "failed"):
                    reclaimed = now - killed
                    break
                assert now - killed < 600, (status, attempts)
                time.sleep(0.1)
            out.update(
                step_at_kill=f"{step_at_kill[0]}/{step_at_kill[1]}",
                last_beat_before_kill_s=round((killed_wall - beat_before).total_seconds(), 1)
                if beat_before
                else None,
                rescuer_ready_s=round(ready, 1) if ready is not None else None,
                resent_s=round(resent, 1) if resent is not None else None,
                reclaimed_s=round(reclaimed, 1),
                status_at_reclaim=status,
                attempts=attempts,
            )
            deadline = time.monotonic() + release_wait_s
            while time.monotonic() < deadline:
                j = c.get(f"/v1/jobs/{job_id}").json()
                if j["status"] in ("released", "failed"):
                    break
                time.sleep(0.5)
            out["final_status"] = j["status"]
            out["released_s"] = (
                round(time.monotonic() - killed, 1) if j["status"] == "released" else None
            )
    finally:
        stop(*procs)
        engine.dispose()
        engine_for.cache_clear()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
        admin.dispose()
        deleted = sum(r.delete(k) for k in r.scan_iter(match=f"{tag}*", count=1000))
        deleted += sum(r.delete(k) for k in r.scan_iter(match=f"_kombu*{tag}*", count=1000))
        out["redis_keys_deleted"] = deleted
        out["logs"] = str(tmp)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    ap.add_argument("--release-wait", type=float, default=120.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--epochs", type=int, default=60, help="batch 20")
    ap.add_argument("--rows", type=int, default=20000, help="of the toy dataset")
    args = ap.parse_args()
    import service

    tree = str(Path(service.__file__).resolve().parents[1])
    print(f"tree: {tree}")
    results = []
    for i in range(args.runs):
        res = one_run(args.redis, args.release_wait, args.epochs, args.rows)
        results.append(res)
        print(f"RUN {i + 1}: " + json.dumps(res), flush=True)
    rec = [float(r["reclaimed_s"]) for r in results]  # type: ignore[arg-type]
    print(
        f"RESULT tree={tree} heartbeat_timeout_s={results[0]['heartbeat_timeout_s']} "
        f"sweep_interval_s={results[0]['sweep_interval_s']}: kill -> running again under the "
        f"new worker: {', '.join(f'{x:.1f}' for x in rec)} s"
    )
    if args.json:
        args.json.write_text(json.dumps({"tree": tree, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
