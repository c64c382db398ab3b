"""The hidden-iterate Langevin sampler's time per release (issue 24, speed): two copies of
``worker/`` and ``service/`` (e.g. ``git archive REV worker service | tar -x -C /tmp/base``;
the current one the working tree unless ``--current`` names another), alternately, in fresh
processes.

Adult (30,162 × 104, the schema's one-hot blocks as worker/data.py passes them), method
``expm`` with ``accounting: hidden`` and l2 = 300 (T = 1703 full-batch steps; ``--l2``), the
plan the service builds. Every round runs, for each ε and thread count, one release in the baseline
tree then one in the current tree, each in its own process (imports and data loading are
not timed), with the release's noise drawn under one fixed ChaCha20 key so that the two
trees' releases can be compared bit for bit (the sha256 of the released tensors). Wall and
CPU (process) seconds per release; the load average (1 min) before each round. One untimed
release per tree first: a tree's first process compiles its numba kernels (cached on disk
beside the modules), which a worker host pays once.

    .venv/bin/python benchmarks/hidden_langevin_speed.py --baseline /tmp/h24base
        [--current /tmp/h24cur] [--rounds 3] [--epsilons 1,0.01] [--threads 1,2] [--profile]
        [--warm-up-current] [--l2 300]

``--l2``: the plan's l2 (default 300: T = 1703; the product's default 30 gives T = 17023).

``--profile``: one cProfile of a release per (ε, threads) in the current tree, its top
functions by own time printed (cProfile sees the main thread only: at 2 threads the parts
computed on the pool's threads are missing from the split).

``--warm-up-current``: the current tree's processes run worker/kernel_warm_up.py's warm-up
(what a worker process does at start) before the timed release, its seconds reported apart
(``warm_up``); the baseline's do not. With ``--baseline .`` (the working tree twice) this
times one tree's release with and without numba's first calls in it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def release(
    tree: Path, epsilon: float, threads: int, profile: bool, warm: bool = False, l2: float = 300.0
) -> dict[str, object]:
    """One timed release in this process, with ``tree`` first on the import path (after
    worker/kernel_warm_up.py's warm-up, untimed, where ``warm``)."""
    sys.path.insert(0, str(tree))  # before any import of worker/ or service/
    import cProfile
    import hashlib
    import pstats

    import numpy as np
    import pandas as pd
    import torch
    from randomgen import ChaCha

    import worker.mechanisms.langevin_hidden as hidden
    from service.datasets.kinds import load_schema_yaml
    from service.datasets.tabular import TabularSchema, encode, validate_frame
    from service.methods.expm import row_norm_sq_bound
    from service.plans import build_plan
    from service.schemas import JobRequest
    from worker.mechanisms.base import TabularTrainingSet

    assert Path(hidden.__file__).is_relative_to(tree), hidden.__file__
    torch.set_num_threads(threads)
    schema = load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())
    assert isinstance(schema, TabularSchema)
    raw = pd.read_csv(ROOT / "examples/adult/adult.data.gz", **schema.read_csv_kwargs())
    table = encode(schema, validate_frame(schema, raw).frame)  # as benchmarks/expm_adult.py
    n, d = table.x.shape
    train = TabularTrainingSet(
        torch.from_numpy(table.x).float(),
        torch.from_numpy(table.y).float(),
        one_hot_blocks=schema.one_hot_blocks,
    )
    request = JobRequest.model_validate(
        {
            "dataset": "adult",
            "method": "expm",
            "epsilon": epsilon,
            "delta": 1e-5,
            "expm": {"accounting": "hidden", "l2": l2},
        }
    )
    plan = build_plan(
        request,
        n_rows=n,
        n_features=d,
        norm_sq_bound=row_norm_sq_bound(schema),
        max_rows=n + n // 20,
    )
    hidden.secure_rng = lambda: np.random.Generator(ChaCha(key=24, rounds=20))
    warm_up_s = None
    if warm:
        from worker.kernel_warm_up import warm_up

        warm_up_s = warm_up().seconds
    profiler = cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    out = hidden.run_langevin_plan(
        spec=request.model,
        mechanism=plan.mechanism,
        samples=1,
        data=train,
        device=torch.device("cpu"),
        progress=lambda a, b: None,
    )
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(14)
    digest = hashlib.sha256()
    for key, value in out.releases[0].items():
        digest.update(key.encode() + value.numpy().tobytes())
    return {
        "wall": wall,
        "cpu": cpu,
        "sha": digest.hexdigest()[:16],
        "steps": plan.mechanism["steps"],
        "warm_up": warm_up_s,
    }


def run(
    tree: Path,
    epsilon: float,
    threads: int,
    profile: bool = False,
    warm: bool = False,
    l2: float = 300.0,
) -> dict[str, object]:
    args = [sys.executable, __file__, "--one", str(tree), str(epsilon), str(threads), str(l2)]
    done = subprocess.run(
        [*args, *(["--profile"] if profile else []), *(["--warm"] if warm else [])],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
    )
    if profile:
        print(done.stderr, flush=True)
    if done.returncode:
        raise SystemExit(done.stderr)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _seconds(result: dict[str, object], key: str) -> float:
    return float(str(result[key]))


def _spread(values: list[float]) -> str:
    """median (min–max), seconds."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        tree, eps, threads = Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
        flags = "--profile" in sys.argv, "--warm" in sys.argv
        print(json.dumps(release(tree, eps, threads, *flags, l2=float(sys.argv[5]))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--current", type=Path, default=ROOT, help="default: the working tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epsilons", default="1,0.01")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--warm-up-current", action="store_true", help="module docstring")
    ap.add_argument("--l2", type=float, default=300.0, help="the plan's l2 (T follows)")
    args = ap.parse_args()
    warm = {"baseline": False, "current": args.warm_up_current}
    epsilons = [float(e) for e in args.epsilons.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    trees = {"baseline": args.baseline.resolve(), "current": args.current.resolve()}
    if args.profile:
        for eps in epsilons:
            for threads in thread_counts:
                print(f"== profile: current tree, ε = {eps:g}, {threads} thread(s)", flush=True)
                run(trees["current"], eps, threads, True, warm["current"], args.l2)
    for name, tree in trees.items():  # untimed: fills numba's on-disk cache of each tree
        out = run(tree, epsilons[0], 1, warm=warm[name], l2=args.l2)
        print(f"warm-up {name}: {out}", flush=True)
    results: dict[tuple[str, float, int], list[dict[str, object]]] = {}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for eps in epsilons:
            for threads in thread_counts:
                for name, tree in trees.items():
                    out = run(tree, eps, threads, warm=warm[name], l2=args.l2)
                    results.setdefault((name, eps, threads), []).append(out)
                    print(f"round {r + 1} {name} ε={eps:g} {threads}t: {out}", flush=True)
    loads.append(os.getloadavg()[0])
    command = ".venv/bin/python benchmarks/hidden_langevin_speed.py " + shlex.join(sys.argv[1:])
    lines = [
        f"Command: `{command}`; {os.cpu_count()} CPUs; load average (1 min) before each "
        "round and at the end: " + ", ".join(f"{v:.2f}" for v in loads),
        "",
        "| ε | threads | baseline wall s | current wall s | current ÷ baseline "
        "(median of rounds) | baseline CPU s | current CPU s | releases equal |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for eps in epsilons:
        for threads in thread_counts:
            base, cur = results[("baseline", eps, threads)], results[("current", eps, threads)]
            wall_ratio = statistics.median(
                _seconds(c, "wall") / _seconds(b, "wall") for c, b in zip(cur, base, strict=True)
            )
            digests = {o["sha"] for o in base + cur}
            cells = [
                f"{eps:g}",
                str(threads),
                _spread([_seconds(o, "wall") for o in base]),
                _spread([_seconds(o, "wall") for o in cur]),
                f"{wall_ratio:.3f}",
                f"{statistics.median(_seconds(o, 'cpu') for o in base):.2f}",
                f"{statistics.median(_seconds(o, 'cpu') for o in cur):.2f}",
                f"{'yes' if len(digests) == 1 else 'NO'} ({cur[0]['sha']})",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    warm_ups = [float(str(o["warm_up"])) for v in results.values() for o in v if o["warm_up"]]
    if warm_ups:
        lines.append(f"\nThe warm-up before the current release, s: {_spread(warm_ups)}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
