"""Many clients race to spend one budget: the ledger never overspends.

Three levels: 64 threads calling admission directly (each with its own connection); 64
HTTP clients against a real API server process (uvicorn, 2 worker processes), on SQLite
and on PostgreSQL; and a load test, 64 clients submitting until the budget is spent,
against two API processes on PostgreSQL and Redis, which prints admissions/s and p99.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import func, select

from enclave.processes import child_env, free_port, start_api, stop, wait_ready
from service.db import engine_for, transaction
from service.ledger.admission import BudgetExceeded, admit_job
from service.ledger.audit import check_totals, verify_all
from service.ledger.charges import charge_for
from service.ledger.filter_view import Filter, cap_filter, dataset_filter, evaluate
from service.ledger.spending import cost_entries
from service.ledger.tables import Analyst, AnalystCap, Dataset, Job, LedgerEntry
from service.plans import plan_for_dataset
from service.schemas import JobRequest
from tests.conftest import REDIS_TEST_DB, REDIS_URL, auth

pytestmark = pytest.mark.slow

CLIENTS = 64


def _max_admissible(ds_filter: Any, charge: Any) -> int:
    """How many identical charges a sequential ledger would admit."""
    k, f = 0, ds_filter
    while True:
        ev = evaluate(f, None, charge)
        if not ev.admitted:
            return k
        f, k = ev.dataset_after, k + 1


def test_direct_admission_race(settings: Any, keys: Any) -> None:
    engine = engine_for(settings.resolved_database_url)
    request = JobRequest(
        dataset="toy",
        method="dpsgd",
        epsilon=2.0,
        delta=1e-5,
        dpsgd={"epochs": 1, "batch_size": 50},
    )
    with transaction(engine) as s:
        ds = s.scalars(select(Dataset)).one()
        alice = s.scalars(select(Analyst).where(Analyst.name == "alice")).one()
        plan = plan_for_dataset(request, n_rows=ds.n_rows, public_schema=ds.public_schema)
        expected = _max_admissible(dataset_filter(ds), charge_for(plan))
    assert 1 <= expected < CLIENTS  # the race is meaningful
    barrier = threading.Barrier(CLIENTS)
    outcomes: list[str] = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            with transaction(engine) as s:
                admit_job(
                    s,
                    analyst_id=alice.id,
                    dataset_id=ds.id,
                    request=request,
                    plan=plan,
                    idempotency_key=f"race-{i}",
                )
            outcomes.append("ok")
        except BudgetExceeded:
            outcomes.append("refused")

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(one, range(CLIENTS)))
    assert outcomes.count("ok") == expected
    assert outcomes.count("refused") == CLIENTS - expected
    with transaction(engine) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == expected
        ds = s.scalars(select(Dataset)).one()
        # Every refusal was justified: one more charge does not fit now.
        assert not evaluate(dataset_filter(ds), None, charge_for(plan)).admitted
        assert check_totals(s) == []
        assert all(r.ok for r in verify_all(s))


def test_http_race_with_idempotency(settings: Any, keys: Any, tmp_path: Path) -> None:
    port = free_port()
    env = child_env(
        {
            "ENCLAVE_HOME": str(settings.home),
            "ENCLAVE_DATABASE_URL": settings.resolved_database_url,
            "ENCLAVE_BROKER_URL": settings.resolved_broker_url,
            "ENCLAVE_SWEEP_INTERVAL_S": "3600",
        }
    )
    workers = 1 if settings.resolved_database_url.startswith("sqlite") else 2
    proc = start_api(env, port, log=tmp_path / "api.log", workers=workers)
    base = f"http://127.0.0.1:{port}"
    body = {
        "dataset": "toy",
        "method": "dpsgd",
        "epsilon": 2.0,
        "delta": 1e-5,
        "dpsgd": {"epochs": 1, "batch_size": 50},
    }
    try:
        wait_ready(base)
        barrier = threading.Barrier(CLIENTS)

        def one(i: int) -> tuple[int, str | None]:
            # Clients 0..15 all send the same Idempotency-Key: it is charged at most once.
            key = "shared" if i < 16 else f"own-{i}"
            who = keys.alice if i % 2 == 0 or i < 16 else keys.bob
            with httpx.Client(base_url=base, timeout=120) as c:
                barrier.wait()
                r = c.post("/v1/jobs", json=body, headers={**auth(who), "Idempotency-Key": key})
                assert r.status_code in (200, 202, 409), r.text
                return r.status_code, r.json().get("id")

        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(one, range(CLIENTS)))
    finally:
        stop(proc)
    assert all(code < 500 for code, _ in results)
    shared_ids = {
        jid
        for (code, jid), i in zip(results, range(CLIENTS), strict=True)
        if i < 16 and code in (200, 202)
    }
    assert len(shared_ids) <= 1
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        jobs = s.scalar(select(func.count()).select_from(Job))
        charges = s.scalar(
            select(func.count())
            .select_from(LedgerEntry)
            .where(LedgerEntry.kind == "charge", LedgerEntry.job_id.is_not(None))
        )
        assert jobs == charges
        ds = s.scalars(select(Dataset)).one()
        plan = plan_for_dataset(
            JobRequest.model_validate(body), n_rows=ds.n_rows, public_schema=ds.public_schema
        )
        assert not evaluate(dataset_filter(ds), None, charge_for(plan)).admitted
        assert check_totals(s) == []
        assert all(r.ok for r in verify_all(s))
    admitted = {jid for code, jid in results if code in (200, 202)}
    assert len(admitted) == jobs


def _every_prefix_holds(budget: Filter, entries: list[LedgerEntry]) -> int:
    """Recompute the filter from the entries, in ledger order: after every one of them
    some Rényi order is still within its budget (no prefix overspent). Returns the count."""
    limit = budget.budget_rdp_micro()
    spent = [0] * len(limit)
    for n, e in enumerate(entries, 1):
        spent = [a + b for a, b in zip(spent, e.rdp_micro, strict=True)]
        assert any(v <= b for v, b in zip(spent, limit, strict=True)), f"overspent at entry {n}"
    return len(entries)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_load_two_api_processes(settings: Any, keys: Any, tmp_path: Path) -> None:
    """64 clients submit jobs through two API processes until the budget is spent (or 40 s
    pass). Alice draws on the dataset's budget, Bob also on a cap of his own; a few
    Idempotency-Keys are raced and replayed."""
    queue = f"enclave.test.{uuid.uuid4().hex}"
    prefix = f"enclave-test-{uuid.uuid4().hex}:"
    broker = f"{REDIS_URL}/{REDIS_TEST_DB}"
    env = child_env(
        {
            "ENCLAVE_HOME": str(settings.home),
            "ENCLAVE_DATABASE_URL": settings.resolved_database_url,
            "ENCLAVE_BROKER_URL": broker,
            "ENCLAVE_QUEUE": queue,
            "ENCLAVE_BROKER_KEY_PREFIX": prefix,
            "ENCLAVE_SWEEP_INTERVAL_S": "3600",
        }
    )
    ports = [free_port(), free_port()]
    procs = [start_api(env, p, log=tmp_path / f"api-{p}.log") for p in ports]
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    body = {
        "dataset": "toy",
        "method": "dpsgd",
        "epsilon": 0.5,
        "delta": 1e-6,
        "dpsgd": {"epochs": 1, "batch_size": 50},
    }
    lock = threading.Lock()
    latencies: list[float] = []
    answers: dict[tuple[str, str], set[str]] = defaultdict(set)  # (analyst, key) -> job ids
    codes: list[int] = []
    try:
        for base in bases:
            wait_ready(base)
        cap = httpx.put(f"{bases[0]}/v1/admin/datasets/toy/caps/bob",
                        json={"epsilon": 3.0, "delta": 1e-5}, headers=auth(keys.admin))  # fmt: skip
        assert cap.status_code == 200, cap.text
        barrier = threading.Barrier(CLIENTS)
        deadline = time.monotonic() + 40

        def client(i: int) -> None:
            who, key = ("alice", keys.alice) if i % 2 == 0 else ("bob", keys.bob)
            mine: list[tuple[float, int, str, str | None]] = []
            with httpx.Client(base_url=bases[i % 2], timeout=60) as c:
                barrier.wait()
                n = 0
                while time.monotonic() < deadline:
                    # The first request of clients 0-15 shares one key per analyst; every
                    # third request replays the previous key.
                    idem = "shared" if n == 0 and i < 16 else f"c{i}-{n - (n % 3 == 2)}"
                    t = time.perf_counter()
                    r = c.post(
                        "/v1/jobs", json=body, headers={**auth(key), "Idempotency-Key": idem}
                    )
                    mine.append((time.perf_counter() - t, r.status_code, idem, r.json().get("id")))
                    n += 1
                    if r.status_code == 409:
                        break
            with lock:
                for dt, code, idem, jid in mine:
                    latencies.append(dt)
                    codes.append(code)
                    if code in (200, 202):
                        answers[(who, idem)].add(jid)

        t0 = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(client, range(CLIENTS)))
        elapsed = time.monotonic() - t0
    finally:
        stop(*procs)
        r_ = redis.Redis.from_url(broker)
        for k in r_.scan_iter(match=f"{prefix}*"):
            r_.delete(k)
    assert set(codes) <= {200, 202, 409}, sorted(set(codes))
    assert codes.count(409) == CLIENTS  # every client ran until refused: the budget is spent
    assert all(len(ids) == 1 for ids in answers.values())  # a key always names one job
    admitted = codes.count(202)
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        jobs = s.scalars(select(Job)).all()
        assert len(jobs) == admitted == len({j for ids in answers.values() for j in ids})
        per_key = defaultdict(int)
        for j in jobs:
            per_key[(j.analyst_id, j.idempotency_key)] += 1
        assert max(per_key.values()) == 1  # no duplicated idempotency key
        ds = s.scalars(select(Dataset)).one()
        bob = s.scalars(select(Analyst).where(Analyst.name == "bob")).one()
        bob_cap = s.get_one(AnalystCap, (bob.id, ds.id))
        checked = _every_prefix_holds(dataset_filter(ds), cost_entries(s, dataset_id=ds.id))
        _every_prefix_holds(
            cap_filter(bob_cap), cost_entries(s, dataset_id=ds.id, analyst_id=bob.id)
        )
        # The refusals were justified: one more charge fits neither filter now.
        plan = plan_for_dataset(
            JobRequest.model_validate(body), n_rows=ds.n_rows, public_schema=ds.public_schema
        )
        assert not evaluate(dataset_filter(ds), None, charge_for(plan)).admitted
        assert check_totals(s) == []
        assert all(r.ok for r in verify_all(s))
    p99 = sorted(latencies)[int(0.99 * (len(latencies) - 1))]
    print(
        f"\nload: {CLIENTS} clients, 2 API processes, PostgreSQL + Redis: {admitted} admitted "
        f"of {len(codes)} submissions in {elapsed:.1f} s = {admitted / elapsed:.1f} admissions/s; "
        f"submit p50 {1e3 * sorted(latencies)[len(latencies) // 2]:.0f} ms, "
        f"p99 {1e3 * p99:.0f} ms; {checked} ledger prefixes checked"
    )
    assert elapsed < 45
