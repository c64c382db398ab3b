"""Quote latency over HTTP against a running API process on PostgreSQL: the first quote of
a fresh process, never-seen quotes in a running one, and repeats.

The deployed shape: uvicorn (one process) on a PostgreSQL ledger of its own, with the
bundled Adult dataset registered (d = 104 features, n ≈ 32,500). One client sends quotes
one after another (``POST /v1/quote``; selections ``POST /v1/selections/quote``), for
each family of :data:`FAMILIES`: DP-SGD (rdp, pld, pld with the decaying schedule), the
Langevin exponential mechanism, ExpM+NF, and the selection kinds (architecture RS and
PAAS, hyperparameters, features DP-CFS and PAFS; their per-training ε is calibrated to
the workflow's ε by the quote):

- fresh: the first quote a freshly started API process answers (readiness checked with
  /readyz only), one process per family and repeat;
- never-seen: distinct requests (each its own ε, and batch size for DP-SGD) in one
  running process, so every quote plans and calibrates from scratch (no cache hit);
- repeat: one request repeated, answered from the calibration caches.

p50 and max of the client-side latency (the whole HTTP round trip). The per-key and global
planning limits are raised for the run (the sequential client never meets them anyway).

    .venv/bin/python benchmarks/quote_latency.py [--fresh 2] [--cold 8] [--warm 50] [--pg URL]
        [--only LABEL] [--baseline DIR]

``--baseline DIR`` serves another source tree (an earlier commit) from a second API
process on the same ledger, and sends each never-seen request to both processes in turn,
so both see the same load: the before/after of a change on a busy machine.

Writes benchmarks/results/quote_latency.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from ledger_admission import drop_db, fresh_db  # noqa: E402

from enclave.processes import child_env, free_port, start_api, stop, wait_ready  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DATASET = "adult"  # examples/adult/schema.yaml


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


def _dpsgd(options: dict[str, Any]) -> Body:
    def body(i: int) -> tuple[str, dict[str, Any]]:
        return "/v1/quote", {
            "method": "dpsgd",
            "epsilon": 0.5 + 0.0137 * i,
            "delta": 1e-5,
            "dpsgd": {**options, "batch_size": 64 + 3 * i},
        }

    return body


def _method(method: str, delta: float, options: dict[str, Any]) -> Body:
    def body(i: int) -> tuple[str, dict[str, Any]]:
        return "/v1/quote", {
            "method": method,
            "epsilon": 0.5 + 0.0137 * i,
            "delta": delta,
            **options,
        }

    return body


def _selection(kind: str, epsilon: float, options: dict[str, Any]) -> Body:
    def body(i: int) -> tuple[str, dict[str, Any]]:
        return "/v1/selections/quote", {
            "kind": kind,
            "epsilon": epsilon + 0.0137 * i,
            "delta": 1e-6,
            **options,
        }

    return body


Body = Callable[[int], tuple[str, dict[str, Any]]]

# (label, request i of the family): request i ≠ request j for i ≠ j.
FAMILIES: list[tuple[str, Body]] = [
    ("dpsgd, rdp", _dpsgd({"epochs": 3, "accountant": "rdp"})),
    ("dpsgd, pld", _dpsgd({"epochs": 3, "accountant": "pld"})),
    (
        "dpsgd, pld, exponential schedule",
        _dpsgd(
            {"epochs": 5, "accountant": "pld", "noise_schedule": "exponential", "noise_decay": 0.8}
        ),
    ),
    ("expm (langevin)", _method("expm", 1e-5, {})),
    ("expm_nf", _method("expm_nf", 0.0, {})),
    (
        "selection: architecture rs",
        _selection(
            "architecture",
            3.0,
            {
                "space": {"depths": [1, 2], "widths": [8, 32]},
                "search": {"algorithm": "rs", "trainings": 4},
                "training": {"epochs": 2, "batch_size": 256},
            },
        ),
    ),
    ("selection: architecture paas", _selection("architecture", 2.0, {})),
    (
        "selection: hyperparameters",
        _selection("hyperparameters", 2.0, {"epochs": [2], "batch_sizes": [256]}),
    ),
    ("selection: features cfs_greedy", _selection("features", 1.0, {"max_selected": 5})),
    (
        "selection: features pafs",
        _selection("features", 3.0, {"method": "pafs", "ga": {"population": 4, "generations": 2}}),
    ),
]


def timed(client: httpx.Client, request: tuple[str, dict[str, Any]], name: str) -> float:
    path, payload = request
    t = time.perf_counter()
    r = client.post(path, json={"dataset": name, **payload})
    took = time.perf_counter() - t
    if r.status_code != 200:
        raise SystemExit(f"quote refused: {r.status_code} {r.text}")
    return took


def fresh_first(env: dict[str, str], home: Path, key: str, body: Body, i: int) -> float:
    """The first quote of a freshly started API process (request ``i`` of the family)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_api(child_env(env), port, log=home / "api.log")
    try:
        wait_ready(base)
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=300) as c:
            return timed(c, body(i), DATASET)
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--fresh", type=int, default=2, help="fresh processes per family")
    ap.add_argument("--cold", type=int, default=8, help="never-seen quotes per family")
    ap.add_argument("--warm", type=int, default=50, help="repeats of one quote")
    ap.add_argument("--only", default="", help="families whose label contains this")
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another source tree (e.g. `git archive <commit> | tar -x -C DIR`) served by a "
        "second API process on the same ledger; never-seen quotes alternate between the two",
    )
    args = ap.parse_args()
    families = [(label, body) for label, body in FAMILIES if args.only in label]
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
    rows: list[dict[str, Any]] = []
    proc = old = None
    try:
        key = setup(url, home)
        # Fresh processes first: request 1000 + r of each family is never asked again.
        fresh = {
            label: [fresh_first(env, home, key, body, 1000 + r) for r in range(args.fresh)]
            for label, body in families
        }
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_api(child_env(env), port, log=home / "api.log")
        headers = {"Authorization": f"Bearer {key}"}
        baseline: httpx.Client | None = None
        if args.baseline is not None:
            tree = args.baseline.resolve()
            old_port = free_port()
            old_env = child_env({**env, "PYTHONPATH": str(tree)})
            old = start_api(old_env, old_port, log=home / "api-baseline.log", cwd=tree)
            wait_ready(f"http://127.0.0.1:{old_port}")
            baseline = httpx.Client(
                base_url=f"http://127.0.0.1:{old_port}", headers=headers, timeout=300
            )
            timed(baseline, FAMILIES[0][1](2000), DATASET)
        wait_ready(base)
        with httpx.Client(base_url=base, headers=headers, timeout=300) as client:
            timed(client, FAMILIES[0][1](2000), DATASET)  # the process's first quote
            for label, body in families:
                cold: list[float] = []
                cold_old: list[float] = []
                for i in range(args.cold):  # request i to each process, in turn
                    cold.append(timed(client, body(i), DATASET))
                    if baseline is not None:
                        cold_old.append(timed(baseline, body(i), DATASET))
                same = body(0)  # asked above: cached
                warm = [timed(client, same, DATASET) for _ in range(args.warm)]
                rows.append(
                    {
                        "what": label,
                        "fresh": fresh[label],
                        "cold": cold,
                        "cold_old": cold_old,
                        "warm": warm,
                    }
                )
                print(
                    label,
                    [round(1e3 * x) for x in fresh[label]],
                    round(1e3 * statistics.median(cold)),
                    round(1e3 * statistics.median(cold_old)) if cold_old else "",
                    round(1e3 * statistics.median(warm)),
                    flush=True,
                )
        if baseline is not None:
            baseline.close()
    finally:
        stop(proc, old)
        drop_db(args.pg, db)

    cmd = "python " + shlex.join(["benchmarks/quote_latency.py", *sys.argv[1:]])
    lines = [
        "# Quote latency over HTTP: fresh process, never-seen, repeated (PostgreSQL, one API "
        "process)",
        "",
        f"Command: `{cmd}`. This machine: 2 cores shared with other jobs (noisy). "
        "Adult registered (d = 104); one sequential client. Milliseconds, client side.",
        "",
        "| family | fresh process, first quote | never-seen p50 | never-seen max "
        "| repeat p50 | repeat max |"
        + (" baseline never-seen p50 | baseline max |" if args.baseline else ""),
        "|---|---|---:|---:|---:|---:|" + ("---:|---:|" if args.baseline else ""),
    ]
    for r in rows:
        fresh_ms = ", ".join(f"{1e3 * x:.0f}" for x in r["fresh"])
        line = (
            f"| {r['what']} | {fresh_ms} | {1e3 * statistics.median(r['cold']):.1f} | "
            f"{1e3 * max(r['cold']):.1f} | {1e3 * statistics.median(r['warm']):.1f} | "
            f"{1e3 * max(r['warm']):.1f} |"
        )
        if r["cold_old"]:
            line += (
                f" {1e3 * statistics.median(r['cold_old']):.1f} | {1e3 * max(r['cold_old']):.1f} |"
            )
        lines.append(line)
    lines += [
        "",
        f"Fresh: the first quote of a newly started API process ({args.fresh} processes per "
        f"family, each value one process). Never-seen: {args.cold} distinct requests per "
        "family in one running process (each plans and calibrates from scratch; a "
        "selection's per-training ε is calibrated to its workflow ε). Repeat: one request "
        f"asked {args.warm} times, from the caches."
        + (
            f" Baseline: the tree {args.baseline} served by a second API process on the same "
            "ledger, each never-seen request sent to both processes in turn (same load)."
            if args.baseline
            else ""
        ),
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quote_latency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
