"""A submission as the caller sees it: ``POST /v1/jobs`` end to end over HTTP, beside the
admission transaction and the raw row-lock transaction timed in the same run (issue 26).

The deployed shape: the API started as the product starts it (uvicorn, one process,
``enclave.processes.start_api``, its sweeper on) on a PostgreSQL ledger of its own (a fresh
database, dropped afterwards) with Redis as the broker (database ``--redis``'s number, under
a key prefix and queue of this run's own, deleted afterwards). Adult is registered (d = 104,
n ≈ 30,000, ``quote_latency.setup``) and one analyst key submits the JSON schema's example
request (DP-SGD, logistic regression, ε = 1, δ = 1e-6, 3 epochs, batch 256). No worker runs:
the jobs are admitted, charged and queued, never run.

1. **HTTP**: 1, 4, 16 and 64 concurrent clients (httpx, asyncio, one keep-alive connection
   each), each sending ``POST /v1/jobs`` in a loop for ``--seconds``: admitted jobs (202)
   per second of wall clock, and the client-side latency's p50 and p95. The per-key rate
   limit and the planning slots are raised for the run (the product's defaults, 100 a burst
   then 20/s, and 2 planning slots per key and 4 per process, would answer most of these
   requests 429: that is their purpose, not what is measured here). Also the API
   process's CPU time per admitted job (/proc) and the client's per request.
2. **Breakdown** of one submission, in rounds after the HTTP runs: each round sends one
   ``POST /v1/jobs`` and one ``GET /healthz`` (the round trip through the same middleware
   with no database and no key) over HTTP, sequentially, then calls each function the
   route calls once, directly, in this process, on the same ledger and broker:
   authentication (``service.api.deps.current_caller``: the key's lookup and its rate
   limit), planning (the route's ``_plan_for``: the dataset's row, the plan, the resource
   limits), the admission transaction (``ledger_admission.admission``: ``admit_job`` in a
   Core transaction, as the route runs it), the broker send (``service.jobs.enqueue``: the
   Celery message, then the job's ``enqueued_at``; every other round the message alone),
   and the whole route function (``create_job`` called as a plain function). Interleaved,
   so that every part meets the same moments of the machine's load. "The rest" is each
   round's HTTP time less its authentication and route function: the framework (routing,
   dependencies, thread-pool hand-offs, body parsing and validation, middleware, the
   access log line, serialisation), uvicorn, the loopback and the client.
3. **Anchors**, after the HTTP runs (so the API's sweeper never sees their unsent jobs):
   the admission transaction and the raw row-lock transaction
   (``ledger_admission.raw_row_lock``) at the same client counts (threads), ``--tx-seconds``
   each.

The client runs on the same machine as the server and the database (2 cores shared with
other users here): its own CPU is part of what is measured, and the load average is
printed with the results.

    .venv/bin/python benchmarks/submission_e2e.py [--seconds 6] [--tx-seconds 3] \\
        [--parts 200] [--pg URL] [--redis redis://127.0.0.1:6379/13]

Writes benchmarks/results/submission_e2e.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from ledger_admission import (  # noqa: E402
    admission,
    drop_db,
    fresh_db,
    pct,
    raw_row_lock,
    run_clients,
)
from quote_latency import setup  # noqa: E402

from enclave.processes import child_env, free_port, start_api, stop, wait_ready  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CLIENT_COUNTS = (1, 4, 16, 64)
# The JSON schema's example request (service/schemas/jobs.py, JobRequest).
BODY: dict[str, Any] = {
    "dataset": "adult",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-6,
    "model": {"kind": "logistic"},
    "dpsgd": {"epochs": 3, "batch_size": 256},
}


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used (Linux: /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Load:
    clients: int
    wall_s: float
    server_cpu_s: float = 0.0  # the API process's CPU during the run
    client_cpu_s: float = 0.0  # this process's
    lat: list[float] = field(default_factory=list)  # every request's, any status
    status: Counter[int] = field(default_factory=Counter)

    @property
    def admitted_per_s(self) -> float:
        return self.status[202] / self.wall_s


async def http_load(base: str, key: str, clients: int, seconds: float) -> Load:
    """``clients`` callers, each submitting in a loop for ``seconds`` on its own
    connection; the wall clock runs until the last answer."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=300
    ) as client:
        # Open every connection before the clock starts.
        await asyncio.gather(*(client.get("/healthz") for _ in range(clients)))
        load = Load(clients, 0.0)
        start = time.perf_counter()
        stop_at = start + seconds

        async def caller() -> None:
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                r = await client.post("/v1/jobs", json=BODY)
                load.lat.append(time.perf_counter() - t)
                load.status[r.status_code] += 1

        await asyncio.gather(*(caller() for _ in range(clients)))
        load.wall_s = time.perf_counter() - start
    return load


def timed(fn: Callable[[], Any], into: list[float]) -> Any:
    t = time.perf_counter()
    out = fn()
    into.append(time.perf_counter() - t)
    return out


# The breakdown's rows, in the order they are printed.
HTTP_POST = "POST /v1/jobs over HTTP"
HTTP_FLOOR = "GET /healthz over HTTP"
AUTH = "authentication"
PLANNING = "planning"
ADMISSION = "admission transaction"
ENQUEUE = "broker send (enqueue)"
MESSAGE = "broker send: the message alone"
ROUTE = "route function (create_job)"
REST = "the rest: HTTP less authentication and route function"


def breakdown(base: str, key: str, n: int, admitted: list[str]) -> dict[str, list[float]]:
    """``n`` rounds, each one sequential ``POST /v1/jobs`` and ``GET /healthz`` over HTTP
    and, in this process, each part of a submission once (the API idle meanwhile): every
    part meets the same moments of the machine's load. The broker send alternates between
    ``enqueue`` and its message alone (then the UPDATE, untimed), each on the job the
    round's admission created. "The rest" is each round's HTTP time less its
    authentication and route function. The ids of the jobs the rounds' admissions created
    go to ``admitted``."""
    from fastapi import Response
    from fastapi.security import HTTPAuthorizationCredentials
    from sqlalchemy import func, select, update
    from starlette.requests import Request

    from service.api.deps import current_caller
    from service.api.routes.jobs import _plan_for, create_job
    from service.config import get_settings
    from service.db import make_engine
    from service.jobs import enqueue
    from service.ledger.tables import Job
    from service.limits import Limiter
    from service.queue import send_run_job
    from service.schemas import JobRequest

    get_settings.cache_clear()
    settings = get_settings()
    engine = make_engine(settings.resolved_database_url)
    limiter = Limiter.from_settings(settings)
    # Used only to refuse a missing or invalid key; this key is valid.
    request = Request({"type": "http", "headers": [], "client": ("127.0.0.1", 0)})
    creds = HTTPAuthorizationCredentials(scheme="Bearer", credentials=key)
    body = JobRequest.model_validate(BODY)
    caller = current_caller(request, engine, limiter, creds)
    planned = _plan_for(engine, settings, body)
    admit = admission(
        engine,
        analyst_id=caller.id,
        dataset_id=planned.dataset_id,
        request=body,
        plan=planned.plan,
    )
    unsent = (
        select(Job.id).where(Job.enqueued_at.is_(None)).order_by(Job.created_at.desc()).limit(1)
    )
    out: dict[str, list[float]] = {
        k: [] for k in (HTTP_POST, HTTP_FLOOR, AUTH, PLANNING, ADMISSION, ENQUEUE, MESSAGE, ROUTE)
    }
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=300) as http:
        http.get("/healthz")
        for i in range(n):
            r = timed(lambda: http.post("/v1/jobs", json=BODY), out[HTTP_POST])
            assert r.status_code == 202, r.text
            timed(lambda: http.get("/healthz"), out[HTTP_FLOOR]).raise_for_status()
            timed(lambda: current_caller(request, engine, limiter, creds), out[AUTH])
            timed(lambda: _plan_for(engine, settings, body), out[PLANNING])
            timed(lambda: admit(0), out[ADMISSION])
            with engine.connect() as c:
                job_id = c.scalars(unsent).one()
            admitted.append(job_id)
            if i % 2 == 0:
                timed(partial(enqueue, engine, settings, job_id), out[ENQUEUE])
            else:
                timed(partial(send_run_job, settings, job_id), out[MESSAGE])
                with engine.begin() as c:
                    c.execute(update(Job).where(Job.id == job_id).values(enqueued_at=func.now()))
            timed(
                lambda: create_job(body, caller, engine, settings, Response(), None, None),
                out[ROUTE],
            )
    engine.dispose()
    out[REST] = [h - a - r for h, a, r in zip(out[HTTP_POST], out[AUTH], out[ROUTE], strict=True)]
    return out


def ms(xs: list[float], p: float | None = None) -> float:
    return 1e3 * (statistics.median(xs) if p is None else pct(xs, p))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--seconds", type=float, default=6.0, help="per HTTP client count")
    ap.add_argument("--tx-seconds", type=float, default=3.0, help="per anchor and count")
    ap.add_argument("--parts", type=int, default=200, help="repeats of each timed part")
    args = ap.parse_args()

    load_before = os.getloadavg()
    tag = f"bench_submit_{os.getpid()}"
    prefix = f"{tag}:"
    broker = redis.Redis.from_url(args.redis)
    db, url = fresh_db(args.pg)
    home = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    env = {
        "ENCLAVE_HOME": str(home),
        "ENCLAVE_DATABASE_URL": url,
        "ENCLAVE_BROKER_URL": args.redis,
        "ENCLAVE_BROKER_KEY_PREFIX": prefix,
        "ENCLAVE_QUEUE": tag,
        "ENCLAVE_DEVICE": "cpu",
        "ENCLAVE_RATE_LIMIT_BURST": "1000000",
        "ENCLAVE_PLANNING_PER_KEY": "1000",
        "ENCLAVE_PLANNING_GLOBAL": "1000",
    }
    os.environ.update(env)
    loads: list[Load] = []
    anchors: list[dict[str, Any]] = []
    proc = None
    queued = distinct = 0
    admitted: list[str] = []  # the breakdown's admitted jobs
    twice: Counter[str | None] = Counter()  # the jobs with more than one message
    try:
        key = setup(url, home)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_api(child_env(env), port, log=home / "api.log")
        wait_ready(base)
        # One submission first: the process's first plan fills its calibration cache (the
        # cold plan is benchmarks/quote_latency.py's subject), and the broker connects.
        r = httpx.post(
            f"{base}/v1/jobs", json=BODY, headers={"Authorization": f"Bearer {key}"}, timeout=300
        )
        if r.status_code != 202:
            raise SystemExit(f"submission refused: {r.status_code} {r.text}")
        for clients in CLIENT_COUNTS:
            server0, client0 = cpu_s(proc.pid), time.process_time()
            load = asyncio.run(http_load(base, key, clients, args.seconds))
            load.server_cpu_s = cpu_s(proc.pid) - server0
            load.client_cpu_s = time.process_time() - client0
            loads.append(load)
            print(
                f"HTTP {clients} clients: {load.admitted_per_s:.1f}/s, p50 {ms(load.lat):.1f} "
                f"p95 {ms(load.lat, 95):.1f} ms, status {dict(load.status)}",
                flush=True,
            )
        parts = breakdown(base, key, args.parts, admitted)
        for name, lat in parts.items():
            print(f"{name}: p50 {ms(lat):.2f} ms", flush=True)
        stop(proc)
        proc = None

        # The anchors: ledger_admission's two transactions, the admission on this run's
        # dataset and plan.
        from sqlalchemy import text

        from service.api.routes.jobs import _plan_for
        from service.config import get_settings
        from service.db import make_engine
        from service.schemas import JobRequest

        settings = get_settings()
        engine = make_engine(url, pool_size=CLIENT_COUNTS[-1], max_overflow=0)
        body = JobRequest.model_validate(BODY)
        planned = _plan_for(engine, settings, body)
        with engine.connect() as c:
            analyst_id = c.execute(text("SELECT id FROM analysts WHERE name = 'bench'")).scalar()
        assert isinstance(analyst_id, int)
        admit = admission(
            engine,
            analyst_id=analyst_id,
            dataset_id=planned.dataset_id,
            request=body,
            plan=planned.plan,
        )
        raw, raw_tx = raw_row_lock(url, pool_size=CLIENT_COUNTS[-1])
        for clients in CLIENT_COUNTS:
            for what, fn in (("admission transaction", admit), ("raw row-lock tx", raw_tx)):
                lat = run_clients(fn, clients, args.tx_seconds)
                engine.dispose()
                raw.dispose()
                anchors.append(
                    {"what": what, "clients": clients, "tps": len(lat) / args.tx_seconds}
                )
                print(f"{what} {clients} clients: {anchors[-1]['tps']:.0f}/s", flush=True)
        engine.dispose()
        raw.dispose()
        from service.queue import _job_id_of

        messages = cast(list[bytes], broker.lrange(prefix + tag, 0, -1))
        queued = len(messages)
        ids = Counter(_job_id_of(m) for m in messages)
        distinct = len(ids)
        twice = Counter({j: n for j, n in ids.items() if n > 1})
    finally:
        stop(proc)
        drop_db(args.pg, db)
        shutil.rmtree(home, ignore_errors=True)  # its private-data copy of Adult
        keys = list(broker.scan_iter(match=f"{prefix}*"))
        if keys:
            broker.delete(*keys)
        left = len(list(broker.scan_iter(match=f"{prefix}*")))
        print(f"removed {len(keys)} Redis keys under {prefix!r} ({left} left)", flush=True)
    load_after = os.getloadavg()

    cmd = "python " + shlex.join(["benchmarks/submission_e2e.py", *sys.argv[1:]])
    raw_by = {a["clients"]: a["tps"] for a in anchors if a["what"] == "raw row-lock tx"}
    adm_by = {a["clients"]: a["tps"] for a in anchors if a["what"] == "admission transaction"}
    lines = [
        "# A submission end to end: POST /v1/jobs over HTTP beside the transactions",
        "",
        f"Command: `{cmd}`. PostgreSQL ledger, Redis broker, one uvicorn process as "
        "`enclave api` runs it, no worker (jobs queue). This machine: "
        f"{os.cpu_count()} cores shared with other users; load average (1, 5, 15 min) "
        f"{' / '.join(f'{x:.2f}' for x in load_before)} before the run, "
        f"{' / '.join(f'{x:.2f}' for x in load_after)} after. The client runs on the same "
        "cores as the server and the database.",
        "",
        "Request: the JSON schema's example (DP-SGD, logistic regression, ε = 1, δ = 1e-6, "
        "3 epochs, batch 256) on Adult (d = 104), one analyst key, its plan's calibration "
        "cached after the first submission. Per-key rate limit and planning slots raised "
        "for the run.",
        "",
        "| clients | HTTP admitted/s | HTTP p50 ms | HTTP p95 ms | other statuses | "
        "API CPU ms/job | client CPU ms/request | admission tx/s | raw row-lock tx/s | "
        "HTTP ÷ raw | HTTP ÷ admission |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for load in loads:
        n = load.clients
        others = {code: k for code, k in load.status.items() if code != 202}
        lines.append(
            f"| {n} | {load.admitted_per_s:.1f} | {ms(load.lat):.1f} | "
            f"{ms(load.lat, 95):.1f} | {others or '–'} | "
            f"{1e3 * load.server_cpu_s / max(1, load.status[202]):.1f} | "
            f"{1e3 * load.client_cpu_s / len(load.lat):.1f} | {adm_by[n]:.0f} | {raw_by[n]:.0f} | "
            f"{load.admitted_per_s / raw_by[n]:.3f} | {load.admitted_per_s / adm_by[n]:.3f} |"
        )
    lines += [
        "",
        f"HTTP: {args.seconds:g} s per client count, admitted jobs (202) over the wall clock "
        "until the last answer; latency of every request, client side. Transactions: "
        f"{args.tx_seconds:g} s each (threads, benchmarks/ledger_admission.py's "
        "`admission` and `raw_row_lock`), after the HTTP runs, the API stopped. CPU: the "
        "API process's user + system time (/proc) per admitted job, and this (client) "
        "process's per request, during each HTTP run.",
        "",
        "## One submission, part by part (sequential rounds, the API otherwise idle)",
        "",
        "| part | n | p50 ms | p95 ms |",
        "|---|---:|---:|---:|",
    ]
    for name, lat in parts.items():
        lines.append(f"| {name} | {len(lat)} | {ms(lat):.2f} | {ms(lat, 95):.2f} |")
    named = sum(ms(parts[k]) for k in (AUTH, PLANNING, ADMISSION, ENQUEUE))
    sent = 1 + sum(load.status[202] for load in loads) + 3 * args.parts
    http_ms = ms(parts[HTTP_POST])
    lines += [
        "",
        f"Each of the {args.parts} rounds: one `POST /v1/jobs` and one `GET /healthz` over "
        "HTTP (a sequential client), then each part once in this process, called directly "
        "on the same ledger and broker. Of the HTTP p50 "
        f"({http_ms:.2f} ms), authentication, planning, admission and broker send add up to "
        f"{named:.2f} ms ({100 * named / http_ms:.0f} %); the route function also builds "
        "the job's public view. The rest (framework: routing, dependencies and their "
        "thread-pool hand-offs, body parsing and validation, middleware, the access log "
        "line, serialisation; uvicorn; the loopback; the client) is the median of each "
        "round's difference. `GET /healthz` is the HTTP round trip through the same "
        "middleware with no database and no key.",
        "",
        f"Messages queued at the end: {queued}, for {distinct} distinct jobs; jobs sent: "
        f"{sent} (the warm-up, the admitted HTTP submissions, the breakdown's sends and "
        f"route calls; no worker ran). Jobs with two messages: {len(twice)}, "
        f"{len(set(twice) & set(admitted))} of them from the breakdown's admission part. "
        "The API's sweeper (every 10 s) sends every queued job whose send is not recorded "
        "yet, and a submission records its send (`enqueued_at`) only after its message: a "
        "sweep in that window of milliseconds sends the job again (harmless: a worker's "
        "claim runs a job once). The queue, the database and the run's home folder were "
        "deleted after the run.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "submission_e2e.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
