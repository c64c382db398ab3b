"""Draws per second of `worker.noise.rounded_gaussian` (issue 25): the current sampler
against a baseline, A/B in the same process, rounds interleaved, medians.

The baseline is worker/noise.py as committed at ``--baseline REV`` (loaded from git into its
own module, timing only; worker/ieee_math.py is the current one, which the golden digests
show unchanged). The default REV is the sampler before issue 25's rewrite (2327475^: CKS
Algorithm 2 with the block t, CKS Algorithm 1 Bernoullis from `Generator.integers`, one
numpy pass per round of every rejection loop). Both sample the same law
P̃(k) ∝ q(k)·exp(−Γ̂(k)); the run checks that the current `_exponent` (Γ̂) agrees with the
baseline's within 2^-40 and prints the sample std/s. With a later baseline (any REV but the
default) the run first checks that both return the same draws and leave the generator at
the same position under fixed ChaCha20 keys (later speed-ups must not change a released bit).
Run (keep it short on a shared machine):

    .venv/bin/python benchmarks/noise_speed.py [--rounds 3] [--scales 1e5 1e6 1e7]
        [--sizes 10000 100000 1000000] [--draws 1000000] [--baseline REV]
        [--out benchmarks/results/noise_speed.md]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from randomgen import ChaCha

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker import noise  # noqa: E402

IntArray = npt.NDArray[np.int64]

BEFORE_REWRITE = "2327475^"  # worker/noise.py before issue 25's 4-6x rewrite


def check_exponent_identical(baseline: types.ModuleType, scales: list[float]) -> int:
    """Γ̂ from the current `_exponent` agrees with the baseline's: the integer parts
    exactly, the fractional parts within 2^-40 (933cfbb replaced numpy's exp/log in Γ̂ by
    worker/ieee_math.py's proven ones, so the bits moved on purpose; the law's bound is
    the module docstring's). Each module evaluates Γ̂ on its own plan of the same scale."""
    rng = np.random.default_rng(0)
    checked = 0
    for s in scales:
        plan, old_plan = noise._gaussian_plan(s), baseline._gaussian_plan(s)
        k = np.concatenate([rng.integers(0, plan.cap + 1, 200_000), np.arange(1000), [plan.cap]])
        for offset in (plan.offset, plan.offset + 0.37):
            a = baseline._exponent(old_plan, k, offset)
            b = noise._exponent(plan, k, offset)
            whole_a = a[0].astype(np.float64) + a[1].astype(np.float64) * 2.0**-53
            whole_b = b[0].astype(np.float64) + b[1].astype(np.float64) * 2.0**-53
            if np.abs(whole_a - whole_b).max() > 2.0**-40 * max(1.0, np.abs(whole_a).max()):
                raise SystemExit(f"exponent differs at scale {s}")
            checked += k.size
    return checked


def load_baseline(rev: str) -> types.ModuleType:
    """worker/noise.py as committed at ``rev``, as a module of its own (timing only)."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:worker/noise.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("noise_baseline")
    module.__file__ = f"{rev}:worker/noise.py"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def check_same_draws(baseline: types.ModuleType, scales: list[float], size: int) -> int:
    """Both samplers, each on a ChaCha20 generator with the same fixed key: the same draws
    and the same next raw word (SystemExit otherwise). Returns the number of draws compared."""
    for i, s in enumerate(scales):
        outs = []
        for module in (baseline, noise):
            rng = np.random.Generator(ChaCha(key=0xBE7C0000 + i, rounds=20))
            outs.append(
                (module.rounded_gaussian(rng, scale=s, size=size), rng.bit_generator.random_raw(1))
            )
        if not (np.array_equal(outs[0][0], outs[1][0]) and outs[0][1] == outs[1][1]):
            raise SystemExit(f"draws differ from the baseline at scale {s}")
    return size * len(scales)


@dataclass
class Cell:
    scale: float
    size: int
    previous: list[float]
    current: list[float]
    std_ratio: float = math.nan


def time_call(fn: Callable[[], IntArray]) -> tuple[float, IntArray]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scales", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--draws", type=int, default=1_000_000, help="draws per timing")
    parser.add_argument(
        "--baseline",
        default=BEFORE_REWRITE,
        help="git revision of worker/noise.py to time against (default: before 2327475)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    load_start = os.getloadavg()
    baseline = load_baseline(args.baseline)
    previous_fn: Callable[..., IntArray] = baseline.rounded_gaussian
    previous_name = f"worker/noise.py at {args.baseline}"
    same_draws = 0
    if args.baseline != BEFORE_REWRITE:  # a later baseline must give the very same draws
        same_draws = check_same_draws(baseline, args.scales, 200_000)
    checked = check_exponent_identical(baseline, args.scales)
    rng = noise.secure_rng()
    cells = {(s, n): Cell(s, n, [], []) for s in args.scales for n in args.sizes}
    for s in args.scales:  # warm the plans and tables
        noise.rounded_gaussian(rng, scale=s, size=100)
        previous_fn(rng, scale=s, size=100)
    for r in range(args.rounds):
        for (s, n), cell in cells.items():
            order = [("previous", previous_fn), ("current", noise.rounded_gaussian)]
            if r % 2:
                order.reverse()
            calls = max(1, args.draws // n)  # each timing covers ≥ --draws draws
            for name, fn in order:
                total = 0.0
                for _ in range(calls):
                    dt, x = time_call(functools.partial(fn, rng, scale=s, size=n))
                    total += dt
                getattr(cell, name).append(total / (calls * n))
                if name == "current":
                    cell.std_ratio = float(np.std(x)) / s

    lines = [
        "# rounded_gaussian draw speed: current vs previous sampler (issue 25)",
        "",
        "Command: `.venv/bin/python " + " ".join(shlex.quote(a) for a in sys.argv) + "`",
        "",
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}; generator ChaCha20 "
        "(`secure_rng`). Shared 2-core machine: medians of interleaved rounds "
        f"({args.rounds}), each timing {args.draws} draws in calls of `size` draws; the"
        " speed-up is the median of the per-round ratios (paired, same round).",
        f"Γ̂ (`_exponent`) within 2^-40 of the baseline's on {checked} (k, offset) pairs.",
        f"Previous = {previous_name}."
        + (
            f" Same draws and generator position as the current code on {same_draws} draws"
            " (fixed ChaCha20 keys, 200000 per scale)."
            if same_draws
            else ""
        ),
        "Load average (1/5/15 min) at start {:.2f} / {:.2f} / {:.2f}, at end {:.2f} / {:.2f}"
        " / {:.2f}.".format(*load_start, *os.getloadavg()),
        "",
        "| scale s | size | previous ns/draw | current ns/draw | speed-up | current Mdraws/s |"
        " std/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in cells.values():
        prev = statistics.median(cell.previous) * 1e9
        cur = statistics.median(cell.current) * 1e9
        ratio = statistics.median(p / c for p, c in zip(cell.previous, cell.current, strict=True))
        lines.append(
            f"| {cell.scale:g} | {cell.size} | {prev:.0f} | {cur:.0f} | {ratio:.1f}x |"
            f" {1e3 / cur:.2f} | {cell.std_ratio:.4f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
