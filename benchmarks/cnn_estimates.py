"""Issue 20: the CNN DP-SGD time estimate against the exact engine's measured time per step.

Each case plans a real DP-SGD request for a CNN (service.plans.plan_for_dataset, the plan's
expected batch and one epoch) on an image set of its shape: the bundled digits (8×8×1) or a
generated set (benchmarks/digits_data.generated_sets, 28×28×1 or 32×32×3, ``rows`` images so
that the epoch is a few steps), runs the worker's mechanism on it (run_mechanism, the proven
exact engine worker/mechanisms/exact_conv.py) and divides the wall time by the plan's steps.
Beside it: the plan's estimate per step (service.methods.dpsgd.dpsgd_training_seconds over
the steps), the model's terms per row (multiply-adds of one exact pass,
modelspec.cnn_row_macs; floats held, cnn_row_floats; parameters) and the estimate ÷ the
slowest measured step. The estimate is linear in the steps, so the per-step figures compare
directly with whole jobs of any number of epochs.

    .venv/bin/python benchmarks/cnn_estimates.py [--repeats 2] [--threads 2] [--label quiet]

Appends a section (the command, the load, the estimate's constants and the table) to
benchmarks/results/cnn_estimates.md and the run's cases and per-step times to
cnn_estimates.json unless --no-write; the constants' comment in service/methods/dpsgd.py cites
them. tests/unit/test_cnn_estimate.py keeps the estimate above every case's slowest step in
the JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from digits_data import DigitsSet, generated_sets, load_digits_set  # noqa: E402

from service.methods import dpsgd  # noqa: E402
from service.methods.dpsgd import dpsgd_training_seconds  # noqa: E402
from service.modelspec import (  # noqa: E402
    CnnSpec,
    cnn_parameter_count,
    cnn_row_floats,
    cnn_row_macs,
)
from service.plans import plan_for_dataset  # noqa: E402
from service.schemas import JobRequest, PrivacyPlan  # noqa: E402
from worker.mechanisms.registry import run_mechanism  # noqa: E402
from worker.noise import rounded_gaussian  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cnn_estimates.md"
FIGURES = RESULTS.with_suffix(".json")  # every run's cases and figures (the test reads it)
TWO = [
    {"channels": 16, "kernel": 3, "padding": 1, "pool": "avg2"},
    {"channels": 32, "kernel": 3, "padding": 1, "pool": "avg2"},
]
THREE = [*TWO, {"channels": 64, "kernel": 3, "padding": 1, "pool": "avg2"}]
WIDE = [
    {"channels": 32, "kernel": 3, "padding": 1, "pool": "none"},
    {"channels": 32, "kernel": 3, "padding": 1, "pool": "avg2"},
    {"channels": 64, "kernel": 3, "padding": 1, "pool": "avg2"},
]

# Multiply-add heavy: 7×7 kernels on 64 channels (≈ 69 MACs per float held, the others 10-38)
HEAVY = [
    {"channels": 64, "kernel": 7, "padding": 3, "pool": "avg2"},
    {"channels": 64, "kernel": 7, "padding": 3, "pool": "avg2"},
]


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, int, int] | None  # (H, W, C) of a generated set; None: the digits
    conv: list[dict[str, Any]]
    batch: int
    rows: int  # training images (the digits: all 1,797)


CASES = [
    Case("digits 8×8×1, 2 conv, B=89", None, TWO, 89, 1797),
    Case("digits 8×8×1, 3 conv, B=256", None, THREE, 256, 1797),
    Case("28×28×1, 2 conv, B=64", (28, 28, 1), TWO, 64, 640),
    Case("28×28×1, 2 conv, B=256", (28, 28, 1), TWO, 256, 2560),
    Case("28×28×1, 3 conv, B=128", (28, 28, 1), THREE, 128, 1280),
    Case("32×32×3, 2 conv, B=256", (32, 32, 3), TWO, 256, 2560),
    Case("32×32×3, 3 conv, B=128", (32, 32, 3), THREE, 128, 1280),
    Case("32×32×3, 3 conv 32/32/64 (first unpooled), B=64", (32, 32, 3), WIDE, 64, 640),
    Case("32×32×3, 2 conv 64/64 7×7, B=32", (32, 32, 3), HEAVY, 32, 320),
]


def _images(case: Case) -> DigitsSet:
    if case.shape is None:
        return load_digits_set()
    return generated_sets(case.rows, 1, case.shape)[0]


def _model() -> str:
    """The CNN estimate's constants at this run (service.methods.dpsgd)."""
    names = [n for n in dir(dpsgd) if n.startswith("DPSGD_CNN_") or n == "DPSGD_STEP_OVERHEAD_S"]
    return ", ".join(f"{n} = {getattr(dpsgd, n):g}" for n in sorted(names))


def _run(images: DigitsSet, request: JobRequest, plan: PrivacyPlan) -> float:
    """Seconds of one run of ``plan`` (the worker's mechanism, its whole epoch)."""
    t = time.perf_counter()
    run_mechanism(
        plan=plan,
        spec=request.model,
        data=images.data,
        device=torch.device("cpu"),
        progress=lambda *_: None,
    )
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the worker: cores)")
    ap.add_argument("--only", default="", help="run only cases whose name contains this")
    ap.add_argument("--label", default="", help="a word for the section's heading")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rounded_gaussian(np.random.default_rng(0), scale=1e3, size=1000)  # numba's cache, once
    todo = []
    for case in CASES:
        if args.only not in case.name:
            continue
        images = _images(case)
        request = JobRequest.model_validate(
            {
                "dataset": images.public["name"],
                "method": "dpsgd",
                "epsilon": 1.0,
                "delta": 1e-5,
                "model": {"kind": "cnn", "conv": case.conv},
                "dpsgd": {"epochs": 1, "batch_size": case.batch},
            }
        )
        plan = plan_for_dataset(request, n_rows=len(images.labels), public_schema=images.public)
        todo.append((case, images, request, plan))
    # A process's first run pays one-time costs (imports inside the engine, numba and torch
    # first calls; ~0.2 s per step over a 21-step run here): one untimed run first, so that
    # the figures are per step. A job's fixed costs are not the per-step model's.
    warm = todo[0]
    _run(*warm[1:])
    times: dict[str, list[float]] = {case.name: [] for case, *_ in todo}
    loads = [os.getloadavg()[0]]
    start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for _ in range(args.repeats):
        for case, images, request, plan in todo:
            per_step = _run(images, request, plan) / int(plan.mechanism["steps"])
            times[case.name].append(per_step)
            loads.append(os.getloadavg()[0])
            print(f"{case.name}: {per_step:.4f} s/step, load {loads[-1]:.1f}", flush=True)
    cmd = "python " + " ".join(["benchmarks/cnn_estimates.py", *sys.argv[1:]])
    lines = [
        f"## {start} UTC{', ' + args.label if args.label else ''}: load {min(loads):.1f}-"
        f"{max(loads):.1f}, {args.threads} torch thread(s)",
        "",
        f"Command: `{cmd}`. Machine: {platform.machine()}, {os.cpu_count()} cores, CPU, torch "
        f"{torch.__version__}; 1-minute load average {min(loads):.1f} to {max(loads):.1f} "
        f"during the run (before: {loads[0]:.1f}).",
        "",
        f"Estimate: {_model()}.",
        "",
        "| case | steps | MACs/row | floats/row | params | measured s/step (min–max) | "
        "B·MACs ÷ slowest step (GMAC/s) | estimate s/step | estimate ÷ slowest | "
        "estimate ÷ fastest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, _set, _request, plan in todo:
        spec = CnnSpec.model_validate(plan.model)
        steps = int(plan.mechanism["steps"])
        est = dpsgd_training_seconds(spec, plan.mechanism) / steps
        lo, hi = min(times[case.name]), max(times[case.name])
        rate = case.batch * cnn_row_macs(spec) / hi / 1e9
        lines.append(
            f"| {case.name} | {steps} | {cnn_row_macs(spec):,} | {cnn_row_floats(spec):,} | "
            f"{cnn_parameter_count(spec):,} | {lo:.4f}–{hi:.4f} | {rate:.2f} | {est:.4g} | "
            f"{est / hi:.1f} | {est / lo:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    run = {
        "start_utc": start,
        "command": cmd,
        "threads": args.threads,
        "load": [min(loads), max(loads)],
        "estimate": _model(),
        "cases": [
            {
                "name": case.name,
                "image": [case.shape[2], case.shape[0], case.shape[1]] if case.shape else [1, 8, 8],
                "conv": case.conv,
                "batch": case.batch,
                "rows": len(images.labels),
                "steps": int(plan.mechanism["steps"]),
                "seconds_per_step": times[case.name],
            }
            for case, images, _request, plan in todo
        ],
    }
    if not args.no_write:
        runs = json.loads(FIGURES.read_text()) if FIGURES.exists() else []
        FIGURES.write_text(json.dumps([*runs, run], indent=1, ensure_ascii=False) + "\n")
        if not RESULTS.exists():
            RESULTS.write_text(
                "# CNN DP-SGD: the time estimate against the exact engine's measured step\n\n"
                "Sections appended by benchmarks/cnn_estimates.py (its docstring says what "
                "each column is).\n\n"
            )
        with RESULTS.open("a") as out:
            out.write("\n" + text)


if __name__ == "__main__":
    main()
