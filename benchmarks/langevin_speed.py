"""The proven Langevin sampler's time per release against an earlier revision of its module,
in one process, interleaved (issue 25, speed).

Adult (30,162 × 104), method ``expm`` at ε = 1, δ = 1e-5 with the service's plan (T = 300
full-batch steps); each release through ``run_expm_langevin`` as a job runs it. The
baseline is ``worker/mechanisms/langevin.py`` as committed at ``--baseline`` (loaded from
git under another module name; everything it imports is the working tree's), the current
one is the working tree's. Every round runs, at 1 then 2 torch threads, the baseline then
the current sampler, after one untimed warm-up of each; the table gives medians of wall and
CPU (process) seconds and the median of the per-round ratios. CPU seconds are printed
because these 2-core machines are shared: wall time moves with the other sessions' load,
CPU time much less. Before the rounds, the releases of both under three fixed ChaCha20 keys
are compared bit for bit (a speed change must not change the release).

    .venv/bin/python benchmarks/langevin_speed.py [--baseline bf711ea] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from randomgen import ChaCha

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

import worker.mechanisms.langevin as current  # noqa: E402
from service.datasets.kinds import load_schema_yaml  # noqa: E402
from service.methods.expm import row_norm_sq_bound  # noqa: E402
from service.plans import build_plan  # noqa: E402
from service.schemas import JobRequest  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.noise import secure_rng  # noqa: E402


def _baseline(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:worker/mechanisms/langevin.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(f"/tmp/langevin_baseline_{rev}.py")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("langevin_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["langevin_baseline"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="bf711ea")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    data = load_adult()
    schema = load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())
    n, d = data.x_train.shape
    train = TabularTrainingSet(data.x_train.float(), data.y_train.float())
    request = JobRequest.model_validate(
        {"dataset": "adult", "method": "expm", "epsilon": 1.0, "delta": 1e-5, "expm": {}}
    )
    plan = build_plan(request, n_rows=n, n_features=d, norm_sq_bound=row_norm_sq_bound(schema))
    modules = {"baseline": _baseline(args.baseline), "current": current}

    def release(module: ModuleType) -> dict[str, torch.Tensor]:
        out = module.run_expm_langevin(
            spec=request.model,
            mechanism=plan.mechanism,
            samples=1,
            data=train,
            device=torch.device("cpu"),
            progress=lambda a, b: None,
        )
        return dict(out.releases[0])

    digests = {}
    for name, module in modules.items():
        h = hashlib.sha256()
        for key in (1, 2, 3):
            module.secure_rng = lambda key=key: np.random.Generator(ChaCha(key=key, rounds=20))
            torch.set_num_threads(1 + key % 2)
            for k, v in release(module).items():
                h.update(k.encode() + v.numpy().tobytes())
        digests[name] = h.hexdigest()
        module.secure_rng = secure_rng  # the timed releases draw fresh OS keys again
    same = digests["baseline"] == digests["current"]
    print("release sha256 (keys 1-3):", digests, "identical" if same else "DIFFERENT", flush=True)
    wall: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for module in modules.values():
            release(module)
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for name, module in modules.items():
                t0, c0 = time.perf_counter(), time.process_time()
                release(module)
                wall.setdefault((name, threads), []).append(time.perf_counter() - t0)
                cpu.setdefault((name, threads), []).append(time.process_time() - c0)
        load.append(os.getloadavg()[0])
        print(f"round {r + 1}:", {f"{k[0]} {k[1]}t": round(v[-1], 3) for k, v in wall.items()})
    command = ".venv/bin/python benchmarks/langevin_speed.py " + shlex.join(sys.argv[1:])
    lines = [
        f"Command: `{command}`; {platform.machine()}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs; load average (1 min) at the start and after each round: "
        + ", ".join(f"{v:.2f}" for v in load),
        f"Releases under 3 fixed keys: sha256 {'identical' if same else 'DIFFERENT'} "
        f"(baseline {digests['baseline'][:16]}…, current {digests['current'][:16]}…).",
        "",
        "| threads | baseline wall s | current wall s | current ÷ baseline (median of rounds) "
        "| baseline CPU s | current CPU s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for threads in (1, 2):
        b, c = wall[("baseline", threads)], wall[("current", threads)]
        ratio = statistics.median(x / y for x, y in zip(c, b, strict=True))
        lines.append(
            f"| {threads} | {statistics.median(b):.3f} ({min(b):.3f}–{max(b):.3f}) | "
            f"{statistics.median(c):.3f} ({min(c):.3f}–{max(c):.3f}) | {ratio:.3f} | "
            f"{statistics.median(cpu[('baseline', threads)]):.3f} | "
            f"{statistics.median(cpu[('current', threads)]):.3f} |"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
