"""The dashboard's home page on a large ledger (issue 26): time a signed-in admin's
``GET /dashboard`` cold (the first visit after the ledger was built: incremental
verification walks everything once and writes checkpoints) and warm (later visits:
only entries after the last checkpoint are walked), and the full walk of
``GET /dashboard/verify`` (the "verify the whole chain" button) once.

    .venv/bin/python benchmarks/ledger_home.py [--entries 100000] [--visits 5]
        [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test] [--append 100]
        [--no-write]

The ledger is built by a bulk insert (chained entries computed in Python, inserted in
batches) into a temporary SQLite file and, with ``--pg``, into a throwaway PostgreSQL
database of its own (created and dropped here). Its entries: the registration's budget
entry and noisy count charge, then DP-SGD charges of one analyst (who has a cap), a
release after every tenth charge, and a refund after every fiftieth (a real one, of the
charge just before it). ``--append N`` appends N more charges between two warm visits and
times the visit after it (the incremental walk of what is new).

Writes benchmarks/results/ledger_home.md (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert, select, text, update
from sqlalchemy.engine import make_url

from service.auth import hash_api_key, new_api_key
from service.config import get_settings
from service.db import engine_for, make_engine, transaction
from service.ledger.chain import fields_digest
from service.ledger.charges import charge_for
from service.ledger.datasets import new_dataset
from service.ledger.tables import Analyst, AnalystCap, Dataset, EntryKind, LedgerEntry, Role
from service.migrate import upgrade
from service.plans import build_plan
from service.privacy.orders import ORDERS
from service.schemas import JobRequest

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 5000


def _entry(prev: str, i: int, **fields: Any) -> dict[str, Any]:
    row = {
        "analyst_id": None,
        "job_id": None,
        "event": None,
        "epsilon_micro": 0,
        "rdp_micro": None,
        "delta": "0",
        "reason": None,
        **fields,
        # Distinct, increasing timestamps (the bulk insert is faster than the clock).
        "created_at": f"2026-01-01T00:00:00.{i % 1_000_000:06d}+00:00"
        if i < 1_000_000
        else f"2026-01-02T00:00:00.{i % 1_000_000:06d}+00:00",
        "prev_hash": prev,
    }
    row["hash"] = fields_digest(row)
    return row


def build_ledger(url: str, entries: int) -> str:
    """Fill the migrated, empty ledger at ``url`` with about ``entries`` chained entries;
    returns an admin API key."""
    engine = make_engine(url)
    admin_key = new_api_key()
    with transaction(engine) as s:
        ds = new_dataset(
            s,
            name="bench",
            public_schema={},
            noisy_n_rows=30000,
            count_epsilon=0.01,
            epsilon_total=1e6,
            delta_total=1e-5,
            allow_nominal=True,
        )
        admin = Analyst(name="admin", key_hash=hash_api_key(admin_key), role=Role.admin)
        alice = Analyst(name="alice", key_hash="a" * 64, role=Role.analyst)
        s.add_all([admin, alice])
        s.flush()
        s.add(
            AnalystCap(
                analyst_id=alice.id,
                dataset_id=ds.id,
                epsilon_cap_micro=10**12,
                delta_cap="0.00001",
                spent_epsilon_micro=0,
                spent_rdp_micro=[0] * len(ORDERS),
            )
        )
        ds_id, alice_id = ds.id, alice.id
        head = ds.head_hash
        ds_eps, ds_rdp = ds.spent_epsilon_micro, list(ds.spent_rdp_micro)
        first = s.scalar(select(LedgerEntry.id).order_by(LedgerEntry.id.desc())) or 0
    req = JobRequest.model_validate(
        {
            "dataset": "bench",
            "method": "dpsgd",
            "epsilon": 1.0,
            "delta": 1e-5,
            "dpsgd": {"epochs": 1, "batch_size": 50},
        }
    )
    charge = charge_for(build_plan(req, n_rows=30000, n_features=10))
    refund = charge.negated()
    cap_eps, cap_rdp = 0, [0] * len(ORDERS)
    rows: list[dict[str, Any]] = []
    i = first
    charges = 0
    last_job = ""
    prev_kind = EntryKind.charge  # the registration's noisy count
    with engine.begin() as conn:
        table = LedgerEntry.__table__
        while i < entries:
            i += 1
            after_charge = prev_kind == EntryKind.charge
            if after_charge and charges % 50 == 0:
                c, kind = refund, EntryKind.refund
                event: dict[str, Any] = {"refund_of": i - 1, "data_touched": False}
                job = last_job
            elif after_charge and charges % 10 == 0:
                row = _entry(
                    head,
                    i,
                    dataset_id=ds_id,
                    analyst_id=alice_id,
                    job_id=last_job,
                    kind=EntryKind.release,
                    event={"weights_sha256": "0" * 64},
                )
                rows.append(row)
                head, prev_kind = row["hash"], EntryKind.release
                continue
            else:
                c, kind, event = charge, EntryKind.charge, charge.event
                job = last_job = str(uuid.uuid4())
                charges += 1
            row = _entry(
                head,
                i,
                dataset_id=ds_id,
                analyst_id=alice_id,
                job_id=job,
                kind=kind,
                event=event,
                epsilon_micro=c.epsilon_micro,
                rdp_micro=c.rdp_micro,
                delta=c.delta,
            )
            rows.append(row)
            head, prev_kind = row["hash"], kind
            ds_eps += c.epsilon_micro
            cap_eps += c.epsilon_micro
            ds_rdp = [a + b for a, b in zip(ds_rdp, c.rdp_micro, strict=True)]
            cap_rdp = [a + b for a, b in zip(cap_rdp, c.rdp_micro, strict=True)]
            if len(rows) >= BATCH:
                conn.execute(insert(table), rows)
                rows = []
        if rows:
            conn.execute(insert(table), rows)
        conn.execute(
            update(Dataset)
            .where(Dataset.id == ds_id)
            .values(spent_epsilon_micro=ds_eps, spent_rdp_micro=ds_rdp, head_hash=head)
        )
        conn.execute(
            update(AnalystCap)
            .where(AnalystCap.analyst_id == alice_id)
            .values(spent_epsilon_micro=cap_eps, spent_rdp_micro=cap_rdp)
        )
    engine.dispose()
    return admin_key


def append_charges(url: str, n: int) -> None:
    """Append ``n`` charges the way admission does (chained on the locked head)."""
    from service.ledger.admission import admit_job

    engine = engine_for(url)
    req = JobRequest.model_validate(
        {
            "dataset": "bench",
            "method": "dpsgd",
            "epsilon": 1.0,
            "delta": 1e-5,
            "dpsgd": {"epochs": 1, "batch_size": 50},
        }
    )
    plan = build_plan(req, n_rows=30000, n_features=10)
    with transaction(engine) as s:
        ds_id = s.scalar(select(Dataset.id).where(Dataset.name == "bench"))
        alice = s.scalar(select(Analyst.id).where(Analyst.name == "alice"))
    assert ds_id is not None and alice is not None
    for _ in range(n):
        with engine.begin() as conn:
            admit_job(
                conn,
                analyst_id=alice,
                dataset_id=ds_id,
                request=req,
                plan=plan,
                idempotency_key=None,
            )


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure(url: str, entries: int, visits: int, append: int) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from service.app import create_app

    t_build, key = timed(lambda: build_ledger(url, entries))
    with transaction(engine_for(url)) as s:
        n = s.scalar(select(LedgerEntry.id).order_by(LedgerEntry.id.desc()))
    home = tempfile.mkdtemp(prefix="enclave-bench-home-")
    os.environ.update(
        ENCLAVE_HOME=home,
        ENCLAVE_DATABASE_URL=url,
        ENCLAVE_BROKER_URL=f"sqla+sqlite:///{home}/broker.sqlite",
        ENCLAVE_ADDRESS_RATE_LIMITS="false",
        ENCLAVE_RATE_LIMIT_BURST="100000",
    )
    get_settings.cache_clear()
    settings = get_settings()
    out: dict[str, Any] = {"entries": n, "build_s": t_build}
    with TestClient(create_app(settings, run_sweeper=False)) as client:
        r = client.post("/dashboard/login", data={"api_key": key}, follow_redirects=False)
        assert r.status_code == 303, r.text

        def visit(path: str = "/dashboard") -> str:
            page = client.get(path)
            assert page.status_code == 200, page.text
            return page.text

        out["cold_s"], page = timed(visit)
        assert "verified" in page and "MISMATCH" not in page, page
        warm = [timed(visit)[0] for _ in range(visits)]
        out["warm_s"] = warm
        if append:
            append_charges(url, append)
            out["appended"] = append
            out["after_append_s"], page = timed(visit)
            assert "MISMATCH" not in page
        if client.get("/dashboard/verify").status_code != 404:  # absent before issue 26
            out["full_s"], page = timed(lambda: visit("/dashboard/verify"))
            assert "MISMATCH" not in page
    get_settings.cache_clear()
    engine_for.cache_clear()
    return out


def fresh_pg(pg: str) -> tuple[str, str]:
    name = f"enclave_bench_home_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(pg).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    return name, url


def drop_pg(pg: str, name: str) -> None:
    engine_for.cache_clear()
    admin = create_engine(pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--visits", type=int, default=5)
    ap.add_argument("--append", type=int, default=100)
    ap.add_argument("--pg", default=None, help="PostgreSQL server URL (a database is made)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    results: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="enclave-bench-") as d:
        url = f"sqlite:///{Path(d) / 'ledger.sqlite'}"
        upgrade(url)
        results.append(("SQLite", measure(url, args.entries, args.visits, args.append)))
        print(results[-1], flush=True)
    if args.pg:
        name, url = fresh_pg(args.pg)
        try:
            results.append(("PostgreSQL", measure(url, args.entries, args.visits, args.append)))
            print(results[-1], flush=True)
        finally:
            drop_pg(args.pg, name)
    lines = [
        "| database | entries | cold (first visit) | warm median (min–max) | "
        f"after {args.append} new charges | full walk (/dashboard/verify) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for db, r in results:
        w = r["warm_s"]
        lines.append(
            f"| {db} | {r['entries']:,} | {ms(r['cold_s'])} | "
            f"{ms(statistics.median(w))} ({ms(min(w))}–{ms(max(w))}) | "
            f"{ms(r['after_append_s']) if 'after_append_s' in r else '–'} | "
            f"{ms(r['full_s']) if 'full_s' in r else '–'} |"
        )
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        cmd = "    .venv/bin/python " + " ".join(["benchmarks/ledger_home.py", *sys.argv[1:]])
        (RESULTS / "ledger_home.md").write_text(
            f"# Dashboard home page on a large ledger (issue 26)\n\n{cmd}\n\n{table}\n"
        )


if __name__ == "__main__":
    main()
