"""Quote latency over HTTP, cold and warm, against a running API process on PostgreSQL.

The deployed shape: uvicorn (one process) on a PostgreSQL ledger of its own, with the
bundled Adult dataset registered (d = 104 features, n ≈ 30,000). One client sends
``POST /v1/quote`` requests one after another:

- cold: distinct DP-SGD requests (each its own ε and batch size), so every quote
  calibrates its noise multiplier from scratch (the API process starts with an empty
  calibration cache and no request repeats), for each accountant (rdp, pld) and the
  decaying noise schedule;
- warm: one request repeated, answered from the calibration cache.

p50 and p99 of the client-side latency (the whole HTTP round trip). The per-key and global
planning limits are raised for the run (the sequential client never meets them anyway).

    .venv/bin/python benchmarks/quote_latency.py [--cold 40] [--warm 200] [--pg URL]

Writes benchmarks/results/quote_latency.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from ledger_admission import drop_db, fresh_db, pct  # noqa: E402

from enclave.processes import child_env, free_port, start_api, stop, wait_ready  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def setup(url: str, home: Path) -> str:
    """Register Adult and create an analyst in the ledger at `url`; returns the key."""
    from service.auth import hash_api_key, new_api_key
    from service.config import get_settings
    from service.datasets.kinds import load_schema_yaml
    from service.db import make_engine, transaction
    from service.ledger.tables import Analyst, Role
    from worker.registration import register_dataset

    get_settings.cache_clear()
    settings = get_settings()
    engine = make_engine(url)
    schema = load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())
    register_dataset(
        engine,
        settings,
        schema=schema,
        csv_path=ROOT / "examples/adult/adult.data.gz",
        epsilon_total=1e4,
        delta_total=1e-5,
        allow_nominal=True,
    )
    key = new_api_key()
    with transaction(engine) as s:
        s.add(Analyst(name="bench", key_hash=hash_api_key(key), role=Role.analyst))
    engine.dispose()
    return key


# (label, DP-SGD options): the accountants, and the decaying noise schedule (one RDP or
# PLD curve per epoch), the most expensive calibration a quote can ask for.
FAMILIES = [
    ("rdp", {"epochs": 3, "accountant": "rdp"}),
    ("pld", {"epochs": 3, "accountant": "pld"}),
    (
        "pld, exponential schedule",
        {"epochs": 5, "accountant": "pld", "noise_schedule": "exponential", "noise_decay": 0.8},
    ),
]


def body(*, epsilon: float, batch: int, options: dict, name: str) -> dict:
    return {
        "dataset": name,
        "method": "dpsgd",
        "epsilon": epsilon,
        "delta": 1e-5,
        "dpsgd": {**options, "batch_size": batch},
    }


def timed(client: httpx.Client, payload: dict) -> float:
    t = time.perf_counter()
    r = client.post("/v1/quote", json=payload)
    took = time.perf_counter() - t
    if r.status_code != 200:
        raise SystemExit(f"quote refused: {r.status_code} {r.text}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--cold", type=int, default=40, help="distinct quotes per accountant")
    ap.add_argument("--warm", type=int, default=200, help="repeats of one quote")
    args = ap.parse_args()
    db, url = fresh_db(args.pg)
    home = Path(tempfile.mkdtemp(prefix="enclave-quote-bench-"))
    env = {
        "ENCLAVE_HOME": str(home),
        "ENCLAVE_DATABASE_URL": url,
        "ENCLAVE_BROKER_URL": f"sqla+sqlite:///{home / 'broker.sqlite'}",
        "ENCLAVE_DEVICE": "cpu",
        "ENCLAVE_RATE_LIMIT_BURST": "100000",
        "ENCLAVE_PLANNING_PER_KEY": "1000",
        "ENCLAVE_PLANNING_GLOBAL": "1000",
    }
    os.environ.update(env)
    rows: list[dict] = []
    proc = None
    try:
        key = setup(url, home)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_api(child_env(env), port, log=home / "api.log")
        wait_ready(base)
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=300) as client:
            name = client.get("/v1/datasets").json()[0]["name"]
            for label, options in FAMILIES:
                # Distinct (ε, batch): no two cold quotes share a calibration.
                lat = [
                    timed(
                        client,
                        body(
                            epsilon=0.5 + 0.0137 * i,
                            batch=64 + 3 * i,
                            options=options,
                            name=name,
                        ),
                    )
                    for i in range(args.cold)
                ]
                rows.append({"what": f"cold, {label}", "lat": lat})
                print(rows[-1]["what"], statistics.median(lat), flush=True)
                same = body(epsilon=1.0, batch=256, options=options, name=name)
                timed(client, same)  # fills the cache
                lat = [timed(client, same) for _ in range(args.warm)]
                rows.append({"what": f"warm, {label}", "lat": lat})
                print(rows[-1]["what"], statistics.median(lat), flush=True)
    finally:
        stop(proc)
        drop_db(args.pg, db)

    cmd = "python " + " ".join(["benchmarks/quote_latency.py", *sys.argv[1:]])
    lines = [
        "# Quote latency over HTTP, cold and warm (PostgreSQL, one API process)",
        "",
        f"Command: `{cmd}`. This machine: 2 cores shared with other jobs (noisy). "
        "Adult registered (d = 104); DP-SGD quotes; one sequential client.",
        "",
        "| quotes | n | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lat = r["lat"]
        lines.append(
            f"| {r['what']} | {len(lat)} | {1e3 * statistics.median(lat):.1f} | "
            f"{1e3 * pct(lat, 99):.1f} | {1e3 * max(lat):.1f} |"
        )
    lines += [
        "",
        "Cold: every request has its own (ε, batch size), so its noise multiplier is "
        "calibrated from scratch (the process started with an empty cache). Warm: one "
        "request repeated, its calibration cached. With few cold requests p99 is close "
        "to the maximum.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quote_latency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
