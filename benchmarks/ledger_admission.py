"""Admission throughput and latency on PostgreSQL, next to a raw single-row-lock
transaction issued directly to the same database in the same run; and quote latency as
the ledger grows.

    .venv/bin/python benchmarks/ledger_admission.py [--seconds 5] [--pg URL]

Writes benchmarks/results/ledger_admission.md and ledger_admission.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sqlalchemy import Engine, create_engine, func, insert, select, text
from sqlalchemy.engine import make_url

from service.db import make_engine, transaction
from service.ledger.admission import BudgetExceeded, admit_job
from service.ledger.charges import charge_for
from service.ledger.datasets import new_dataset
from service.ledger.filter_view import cap_filter, dataset_filter, evaluate
from service.ledger.tables import Analyst, AnalystCap, Dataset, EntryKind, LedgerEntry, Role
from service.migrate import upgrade
from service.plans import build_plan
from service.schemas import JobRequest, PrivacyPlan

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT_COUNTS = (1, 16, 64)


def fresh_db(pg: str) -> tuple[str, str]:
    name = f"enclave_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(pg).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    return name, url


def drop_db(pg: str, name: str) -> None:
    admin = create_engine(pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def run_clients(fn, clients: int, seconds: float) -> list[float]:  # type: ignore[no-untyped-def]
    """Each client calls fn() in a loop for `seconds`; returns all latencies (s)."""
    stop = time.monotonic() + seconds
    lat: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def loop(i: int) -> None:
        mine = []
        barrier.wait()
        while time.monotonic() < stop:
            t = time.perf_counter()
            fn(i)
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(loop, range(clients)))
    return lat


def admission(
    engine: Engine, *, analyst_id: int, dataset_id: int, request: JobRequest, plan: PrivacyPlan
) -> Callable[[int], None]:
    """One admission of ``plan``, as the API admits (service/api/routes/jobs.py): a Core
    connection's transaction."""

    def admit(_: int) -> None:
        try:
            with engine.begin() as c:
                admit_job(
                    c,
                    analyst_id=analyst_id,
                    dataset_id=dataset_id,
                    request=request,
                    plan=plan,
                    idempotency_key=None,
                )
        except BudgetExceeded:
            raise SystemExit("the benchmark budget ran out; lower epsilon") from None

    return admit


def raw_row_lock(url: str, *, pool_size: int) -> tuple[Engine, Callable[[int], None]]:
    """The raw equivalent of admission: one transaction that locks the budget row, updates
    the running total and appends one row, with no ORM and no privacy math. Creates its two
    tables in the database at ``url``; returns its engine and the transaction."""
    raw = create_engine(url, pool_size=pool_size, max_overflow=0)
    with raw.begin() as c:
        c.execute(text("CREATE TABLE raw_budget (id int primary key, spent bigint)"))
        c.execute(text("CREATE TABLE raw_entries (id bigserial primary key, amount bigint)"))
        c.execute(text("INSERT INTO raw_budget VALUES (1, 0)"))

    def raw_tx(_: int) -> None:
        with raw.begin() as c:
            c.execute(text("SELECT spent FROM raw_budget WHERE id = 1 FOR UPDATE")).scalar()
            c.execute(text("UPDATE raw_budget SET spent = spent + 1 WHERE id = 1"))
            c.execute(text("INSERT INTO raw_entries (amount) VALUES (1)"))

    return raw, raw_tx


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    name, url = fresh_db(args.pg)
    rows: list[dict] = []
    try:
        engine = make_engine(url, pool_size=CLIENT_COUNTS[-1], max_overflow=0)
        with transaction(engine) as s:
            ds = new_dataset(
                s,
                name="bench",
                public_schema={},
                noisy_n_rows=30000,
                count_epsilon=0.01,
                epsilon_total=1e4,
                delta_total=1e-5,
                allow_nominal=True,
            )
            a = Analyst(name="a", key_hash="0" * 64, role=Role.analyst)
            s.add(a)
            s.flush()
            ds_id, a_id = ds.id, a.id
        req = JobRequest(dataset="bench", method="expm_nf", epsilon=1e-6)
        plan = build_plan(req, n_rows=30000, n_features=104)

        admit = admission(engine, analyst_id=a_id, dataset_id=ds_id, request=req, plan=plan)

        def admit_reloading(_: int) -> None:
            # The API's transaction before issue 11's change: it loaded the analyst's and
            # the dataset's rows before admission (which then locked the dataset again).
            # Kept as a reference line, measured in the same run.
            with transaction(engine) as s:
                s.get_one(Analyst, a_id)
                s.get_one(Dataset, ds_id)
                admit_job(
                    s,
                    analyst_id=a_id,
                    dataset_id=ds_id,
                    request=req,
                    plan=plan,
                    idempotency_key=None,
                )

        raw, raw_tx = raw_row_lock(url, pool_size=CLIENT_COUNTS[-1])

        for clients in CLIENT_COUNTS:
            for label, fn in (
                ("admission", admit),
                ("admission, rows loaded first", admit_reloading),
                ("raw row-lock tx", raw_tx),
            ):
                lat = run_clients(fn, clients, args.seconds)
                # Close the pools between runs: both together would exceed max_connections.
                engine.dispose()
                raw.dispose()
                rows.append(
                    {
                        "what": label,
                        "clients": clients,
                        "n": len(lat),
                        "tps": len(lat) / args.seconds,
                        "p50_ms": 1e3 * statistics.median(lat),
                        "p99_ms": 1e3 * pct(lat, 99),
                    }
                )
                print(rows[-1], flush=True)

        # Quote latency as the ledger grows (the quote reads the running totals: O(1)),
        # on a dataset of its own whose entry count we control.
        quote_rows = []
        target = [10, 1_000, 100_000]
        with transaction(engine) as s:
            ds_id = new_dataset(
                s,
                name="quote",
                public_schema={},
                noisy_n_rows=30000,
                count_epsilon=0.01,
                epsilon_total=1e4,
                delta_total=1e-5,
                allow_nominal=True,
            ).id
        have = 2  # the registration entry and the noisy-count charge
        for n in target:
            if have < n:
                batch = [
                    {
                        "dataset_id": ds_id,
                        "kind": EntryKind.release,
                        "epsilon_micro": 0,
                        "delta": "0",
                        "created_at": "2026-01-01T00:00:00",
                        "prev_hash": "0" * 64,
                        "hash": uuid.uuid4().hex + uuid.uuid4().hex,
                    }
                    for _ in range(n - have)
                ]
                with transaction(engine) as s:
                    for i in range(0, len(batch), 10_000):
                        s.execute(insert(LedgerEntry), batch[i : i + 10_000])
                have = n

            def quote_once() -> None:
                with transaction(engine) as s:
                    d = s.get_one(Dataset, ds_id)
                    cap = s.get(AnalystCap, (a_id, ds_id))
                    ev = evaluate(
                        dataset_filter(d), cap_filter(cap) if cap else None, charge_for(plan)
                    )
                    ev.dataset_before.view()
                    if ev.dataset_after:
                        ev.dataset_after.view()

            lat = []
            for _ in range(200):
                t = time.perf_counter()
                quote_once()
                lat.append(time.perf_counter() - t)
            with transaction(engine) as s:
                total = s.scalar(
                    select(func.count())
                    .select_from(LedgerEntry)
                    .where(LedgerEntry.dataset_id == ds_id)
                )
            quote_rows.append(
                {
                    "entries": total,
                    "p50_ms": 1e3 * statistics.median(lat),
                    "p99_ms": 1e3 * pct(lat, 99),
                    "last_id": total,
                }
            )
            print(quote_rows[-1], flush=True)
        engine.dispose()
        raw.dispose()
    finally:
        drop_db(args.pg, name)

    cmd = "python " + " ".join(sys.argv)
    RESULTS.mkdir(exist_ok=True)
    lines = [
        "# Ledger admission benchmark (PostgreSQL, this machine: 2 cores)",
        "",
        f"Command: `{cmd}`",
        "",
        "| what | clients | transactions | per second | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['what']} | {r['clients']} | {r['n']} | {r['tps']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} |"
        )
    lines += ["", "Ratio (admission ÷ raw row-lock transaction, throughput):", ""]
    for c in CLIENT_COUNTS:
        by = {r["what"]: r["tps"] for r in rows if r["clients"] == c}
        raw_tps = by["raw row-lock tx"]
        lines.append(
            f"- {c} clients: {by['admission'] / raw_tps:.2f} "
            f"(rows loaded first: {by['admission, rows loaded first'] / raw_tps:.2f})"
        )
    lines += [
        "",
        "Quote latency against the number of ledger entries:",
        "",
        "| entries | p50 ms | p99 ms |",
        "|---:|---:|---:|",
    ]
    for q in quote_rows:
        lines.append(f"| {q['entries']} | {q['p50_ms']:.2f} | {q['p99_ms']:.2f} |")
    (RESULTS / "ledger_admission.md").write_text("\n".join(lines) + "\n")

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for what in ("admission", "admission, rows loaded first", "raw row-lock tx"):
        rs = [r for r in rows if r["what"] == what]
        ax[0].plot([r["clients"] for r in rs], [r["tps"] for r in rs], "o-", label=what)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("concurrent clients")
    ax[0].set_ylabel("transactions / s")
    ax[0].legend()
    ax[0].set_title("Admission vs raw row-lock transaction")
    ax[1].plot(
        [q["entries"] for q in quote_rows], [q["p50_ms"] for q in quote_rows], "o-", label="p50"
    )
    ax[1].plot(
        [q["entries"] for q in quote_rows], [q["p99_ms"] for q in quote_rows], "s--", label="p99"
    )
    ax[1].set_xscale("log")
    ax[1].set_xlabel("ledger entries")
    ax[1].set_ylabel("quote latency (ms)")
    ax[1].legend()
    ax[1].set_title("Quote latency vs ledger size")
    fig.tight_layout()
    fig.savefig(RESULTS / "ledger_admission.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
