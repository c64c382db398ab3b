"""Quote planning CPU, in-process, this tree against a baseline tree: the same requests as
benchmarks/quote_latency.py (its FAMILIES: never-seen requests 0-7 and their new-inputs
twins), each through the API app in-process (FastAPI TestClient, PostgreSQL ledger with
Adult registered, warm-up on), timed as the CPU time (``time.thread_time``) of the
request's synchronous work in the thread pool: the handler with its planning, the ledger
reads and the quote's views. CPU time, not wall time: on a loaded machine it moves far
less than a latency (an A/B of planning changes; the HTTP round trip is
quote_latency.py's). Each round runs one fresh process per tree, in turn.

    .venv/bin/python benchmarks/quote_cpu.py --baseline DIR [--rounds 3] [--only LABEL]

``--baseline DIR``: another source tree (``git archive <commit> | tar -x -C DIR``).
Prints a Markdown table: per family, the mean over the 8 requests in each round
(this / baseline, ms) and the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def measure(pg: str, only: str, tree: Path, out: Path) -> None:
    """One process serving ``tree``: every family's never-seen and new-inputs quotes, CPU
    ms, to ``out``."""
    sys.path[:0] = [str(tree), str(tree / "benchmarks")]  # the tree's modules first
    import quote_latency as ql
    from ledger_admission import drop_db, fresh_db

    db, url = fresh_db(pg)
    home = Path(tempfile.mkdtemp(prefix="enclave-quote-cpu-"))
    os.environ.update(
        {
            "ENCLAVE_HOME": str(home),
            "ENCLAVE_DATABASE_URL": url,
            "ENCLAVE_BROKER_URL": f"sqla+sqlite:///{home / 'broker.sqlite'}",
            "ENCLAVE_DEVICE": "cpu",
            "ENCLAVE_RATE_LIMIT_BURST": "100000",
            "ENCLAVE_PLANNING_PER_KEY": "1000",
            "ENCLAVE_PLANNING_GLOBAL": "1000",
        }
    )
    result: dict[str, dict[str, list[float]]] = {}
    try:
        key = ql.setup(url, home)
        import fastapi.routing
        from fastapi.testclient import TestClient

        from service.app import create_app
        from service.config import get_settings

        get_settings.cache_clear()
        spent: list[float] = []
        pool = fastapi.routing.run_in_threadpool

        async def timed_pool(func: Any, *args: Any, **kwargs: Any) -> Any:
            def run(*a: Any, **k: Any) -> Any:
                t = time.thread_time()
                try:
                    return func(*a, **k)
                finally:
                    spent.append(time.thread_time() - t)

            return await pool(run, *args, **kwargs)

        fastapi.routing.run_in_threadpool = timed_pool  # type: ignore[assignment]
        app = create_app(get_settings(), run_sweeper=False)
        with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:

            def cpu_ms(request: tuple[str, dict[str, Any]]) -> float:
                path, payload = request
                spent.clear()
                r = client.post(path, json={"dataset": ql.DATASET, **payload})
                if r.status_code != 200:
                    raise SystemExit(f"quote refused: {r.status_code} {r.text}")
                return 1e3 * sum(spent)

            cpu_ms(ql.FAMILIES[0][1](3000))  # the process's first quote
            for label, body in ql.FAMILIES:
                if only in label:
                    result[label] = {
                        "cold": [cpu_ms(body(i)) for i in range(8)],
                        "new": [cpu_ms(body(i, new_inputs=True)) for i in range(8)],
                    }
    finally:
        drop_db(pg, db)
    out.write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        measure(args.pg, args.only, args.tree, args.child)
        return
    if args.baseline is None:
        ap.error("--baseline DIR is required")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    trees = {"this": ROOT, "baseline": args.baseline.resolve()}
    runs: dict[str, list[dict[str, dict[str, list[float]]]]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, tree in trees.items():
                out = Path(tmp) / f"{name}-{r}.json"
                cmd = [sys.executable, __file__, "--pg", args.pg, "--only", args.only]
                cmd += ["--tree", str(tree), "--child", str(out)]
                subprocess.run(cmd, check=True, cwd=tree)
                runs[name].append(json.loads(out.read_text()))
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"Command: `python benchmarks/quote_cpu.py {' '.join(sys.argv[1:])}`. Load before / "
        f"after: {load_before} / {load_after}. CPU ms per quote (mean of requests 0-7), "
        "each round `this / baseline`, then the median of the rounds' ratios.\n"
    )
    print("| family | never-seen | ratio | new inputs | ratio |")
    print("|---|---|---:|---|---:|")
    for label in runs["this"][0]:
        cells = []
        for kind in ("cold", "new"):
            mine = [statistics.mean(run[label][kind]) for run in runs["this"]]
            base = [statistics.mean(run[label][kind]) for run in runs["baseline"]]
            cells.append(", ".join(f"{a:.0f} / {b:.0f}" for a, b in zip(mine, base, strict=True)))
            ratios = [a / b for a, b in zip(mine, base, strict=True)]
            cells.append(f"{statistics.median(ratios):.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
