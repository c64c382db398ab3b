"""Many clients race to spend one budget: the ledger never overspends.

Two levels: 64 threads calling admission directly (each with its own connection), and 64
HTTP clients against a real API server process (uvicorn, 2 worker processes), on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from enclave.processes import child_env, free_port, start_api, stop, wait_ready
from service.db import engine_for, transaction
from service.ledger.admission import (
    BudgetExceeded,
    admit_job,
    charge_for,
    dataset_filter,
    evaluate,
)
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import Analyst, Dataset, Job, LedgerEntry
from service.plans import plan_for_dataset
from service.schemas import JobRequest
from tests.conftest import auth

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
