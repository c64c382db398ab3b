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
  running process, so every quote plans and calibrates anew; a selection's requests
  differ in their workflow ε only, so its per-training ε's search reads the steps
  the earlier ones share (the doubling start) from service.selection.kinds' memo;
- new inputs: never-seen requests that also differ in a planning input (a selection's
  fitness ε), so no step of the search was planned before: a request of a kind and
  shape nobody asked before;
- repeat: one request repeated, answered from the calibration caches.

With ``--baseline`` the fresh processes alternate between the two trees too.

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
    def body(i: int, new_inputs: bool = False) -> tuple[str, dict[str, Any]]:
        i += 500 if new_inputs else 0  # distinct batch sizes: new inputs anyway
        return "/v1/quote", {
            "method": "dpsgd",
            "epsilon": 0.5 + 0.0137 * i,
            "delta": 1e-5,
            "dpsgd": {**options, "batch_size": 64 + 3 * i},
        }

    return body


def _method(method: str, delta: float, options: dict[str, Any]) -> Body:
    def body(i: int, new_inputs: bool = False) -> tuple[str, dict[str, Any]]:
        i += 500 if new_inputs else 0  # distinct ε: a new plan anyway
        return "/v1/quote", {
            "method": method,
            "epsilon": 0.5 + 0.0137 * i,
            "delta": delta,
            **options,
        }

    return body


def _selection(kind: str, epsilon: float, options: dict[str, Any]) -> Body:
    def body(i: int, new_inputs: bool = False) -> tuple[str, dict[str, Any]]:
        fitness = {"fitness_epsilon": 0.1 + 0.0011 * (i + 1)} if new_inputs else {}
        return "/v1/selections/quote", {
            "kind": kind,
            "epsilon": epsilon + 0.0137 * i,
            "delta": 1e-6,
            **fitness,
            **options,
        }

    return body


Body = Callable[..., tuple[str, dict[str, Any]]]  # (i, new_inputs=False)

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


def fresh_first(
    env: dict[str, str], home: Path, key: str, body: Body, i: int, tree: Path | None = None
) -> float:
    """The first quote of a freshly started API process (request ``i`` of the family),
    serving this tree or ``tree``."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if tree is None:
        proc = start_api(child_env(env), port, log=home / "api.log")
    else:
        tree_env = child_env({**env, "PYTHONPATH": str(tree)})
        proc = start_api(tree_env, port, log=home / "api-baseline.log", cwd=tree)
    try:
        wait_ready(base)
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=300) as c:
            return timed(c, body(i), DATASET)
    finally:
        stop(proc)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cells(row: dict[str, Any]) -> dict[str, str]:
    """The table's cells of one family: 'this / baseline' where a baseline ran."""

    def both(key: str, f: Callable[[list[float]], float]) -> str:
        old = row.get(f"{key}_old") or []
        mine = f"{1e3 * f(row[key]):.0f}"
        return f"{mine} / {1e3 * f(old):.0f}" if old else mine

    def firsts(key: str) -> str:
        return ", ".join(f"{1e3 * x:.0f}" for x in row[key])

    fresh = firsts("fresh") + (f" / {firsts('fresh_old')}" if row.get("fresh_old") else "")
    return {
        "fresh": fresh,
        "cold p50": both("cold", statistics.median),
        "cold max": both("cold", max),
        "new p50": both("new", statistics.median),
        "new max": both("new", max),
        "warm p50": both("warm", statistics.median),
        "warm max": both("warm", max),
    }


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
    load_before = _load()
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
        # Fresh processes first: request 1000 + r of each family is never asked again
        # (2000 + r to the baseline's processes, started in turn with this tree's).
        tree = None if args.baseline is None else args.baseline.resolve()
        fresh: dict[str, list[float]] = {}
        fresh_old: dict[str, list[float]] = {}
        for label, body in families:
            for r in range(args.fresh):
                fresh.setdefault(label, []).append(fresh_first(env, home, key, body, 1000 + r))
                if tree is not None:
                    old_first = fresh_first(env, home, key, body, 2000 + r, tree)
                    fresh_old.setdefault(label, []).append(old_first)
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
            timed(baseline, FAMILIES[0][1](3000), DATASET)
        wait_ready(base)
        with httpx.Client(base_url=base, headers=headers, timeout=300) as client:
            timed(client, FAMILIES[0][1](3000), DATASET)  # the process's first quote
            for label, body in families:
                cold: list[float] = []
                cold_old: list[float] = []
                for i in range(args.cold):  # request i to each process, in turn
                    cold.append(timed(client, body(i), DATASET))
                    if baseline is not None:
                        cold_old.append(timed(baseline, body(i), DATASET))
                new: list[float] = []
                new_old: list[float] = []
                for i in range(args.cold):
                    new.append(timed(client, body(i, new_inputs=True), DATASET))
                    if baseline is not None:
                        new_old.append(timed(baseline, body(i, new_inputs=True), DATASET))
                same = body(0)  # asked above: cached
                warm = [timed(client, same, DATASET) for _ in range(args.warm)]
                warm_old = (
                    [timed(baseline, same, DATASET) for _ in range(args.warm)]
                    if baseline is not None
                    else []
                )
                rows.append(
                    {
                        "what": label,
                        "fresh": fresh.get(label, []),
                        "fresh_old": fresh_old.get(label, []),
                        "cold": cold,
                        "cold_old": cold_old,
                        "new": new,
                        "new_old": new_old,
                        "warm": warm,
                        "warm_old": warm_old,
                    }
                )
                print(label, _cells(rows[-1]), flush=True)
        if baseline is not None:
            baseline.close()
    finally:
        stop(proc, old)
        drop_db(args.pg, db)

    cmd = "python " + shlex.join(["benchmarks/quote_latency.py", *sys.argv[1:]])
    columns = ["fresh process, first quote", "never-seen p50", "never-seen max"]
    columns += ["new inputs p50", "new inputs max", "repeat p50", "repeat max"]
    lines = [
        "# Quote latency over HTTP: fresh process, never-seen, new inputs, repeated "
        "(PostgreSQL, one API process)",
        "",
        f"Command: `{cmd}`. Load average before / after the run: {load_before} / "
        f"{_load()} (`uptime`; 2 cores shared with other jobs: noisy). Adult registered "
        "(d = 104); one sequential client. Milliseconds, client side"
        + (
            f"; each cell `this tree / baseline` (baseline: {args.baseline}, served by "
            "processes of its own on the same ledger, every request sent to both in turn)."
            if args.baseline
            else "."
        ),
        "",
        "| family | " + " | ".join(columns) + " |",
        "|---|---|" + "---:|" * (len(columns) - 1),
    ]
    for r in rows:
        lines.append(f"| {r['what']} | " + " | ".join(_cells(r).values()) + " |")
    lines += [
        "",
        f"Fresh: the first quote of a newly started API process ({args.fresh} processes per "
        f"family, each value one process). Never-seen: {args.cold} distinct requests per "
        "family in one running process (a selection's differ in their workflow ε only, so "
        "its per-training ε's search reads the steps they share from the memo of "
        "service.selection.kinds). New inputs: as many requests that also differ in a "
        "planning input (a selection's fitness ε), so nothing of their search was "
        f"planned before. Repeat: one request asked {args.warm} times, from the caches.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quote_latency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
