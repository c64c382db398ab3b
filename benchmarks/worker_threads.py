"""Worker CPU threads (issue 25: "the worker runs at torch's default thread count with no
setting"): the DP-SGD and proven-ExpM mechanisms at 1 and 2 torch threads, each
configuration in its own process (ENCLAVE_WORKER_THREADS applies torch.set_num_threads
the same way), rounds interleaved, medians.

    .venv/bin/python benchmarks/worker_threads.py --rounds 3

Data: Adult-sized synthetic rows (30,162 × 104 encoded features, sparse as Adult's one-hot
columns). Results: benchmarks/results/worker_threads.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "dpsgd logistic (exact)": {"method": "dpsgd", "dpsgd": {"epochs": 3, "batch_size": 256}},
    "dpsgd mlp [64] (exact)": {
        "method": "dpsgd",
        "model": {"kind": "mlp", "hidden": [64]},
        "dpsgd": {"epochs": 1, "batch_size": 256},
    },
    "dpsgd mlp [256] (ghost)": {
        "method": "dpsgd",
        "model": {"kind": "mlp", "hidden": [256]},
        "dpsgd": {"epochs": 1, "batch_size": 256, "engine": "ghost"},
    },
    "expm langevin (300 steps)": {"method": "expm", "expm": {"sampler": "langevin"}},
}

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from worker.device import apply_threads
apply_threads(int(sys.argv[2]))
from service.plans import build_plan
from service.schemas import JobRequest
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.registry import run_mechanism
case = json.loads(sys.argv[3])
n, f = 30162, 104
g = torch.Generator().manual_seed(0)
x = (torch.rand(n, f, generator=g) < 0.12).float()
y = (torch.rand(n, generator=g) < 0.25).float()
request = JobRequest(dataset="a", epsilon=1.0, delta=1e-5, **case)
plan = build_plan(request, n_rows=n, n_features=f, norm_sq_bound=f + 1)
t = time.perf_counter()
run_mechanism(plan=plan, spec=request.model, data=TabularTrainingSet(x, y),
              device=torch.device("cpu"), progress=lambda a, b: None)
print(json.dumps({"seconds": time.perf_counter() - t, "threads": torch.get_num_threads()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, case in CASES.items():
            for threads in (1, 2):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(ROOT), str(threads), json.dumps(case)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                got = json.loads(out.stdout.strip().splitlines()[-1])
                assert got["threads"] == threads
                times.setdefault((name, threads), []).append(got["seconds"])
    print("| mechanism | 1 thread (s) | 2 threads (s) | 2 / 1 |")
    print("|---|---|---|---|")
    for name in CASES:
        one = statistics.median(times[(name, 1)])
        two = statistics.median(times[(name, 2)])
        print(f"| {name} | {one:.3f} | {two:.3f} | {two / one:.2f} |")


if __name__ == "__main__":
    main()
