"""One DP-SGD epoch with worker/noise.py at a baseline revision against the current tree
(issue 25, noise speed): MLP [256] on Adult with the plan of benchmarks/dpsgd_widths.py,
1 torch thread, rounds interleaved (order alternating), medians. Only the module-level
`rounded_gaussian` used by worker/mechanisms/dpsgd.py is swapped; the draws are the same
bits either way (benchmarks/noise_speed.py checks that), so both epochs do the same work.

    .venv/bin/python benchmarks/noise_epoch_ab.py [--baseline a1d8f0c] [--rounds 5]
        [--width 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import dpsgd_widths  # noqa: E402
import noise_speed  # noqa: E402

from worker import noise  # noqa: E402
from worker.mechanisms import dpsgd  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="a1d8f0c")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    baseline = noise_speed.load_baseline(args.baseline)
    data = dpsgd_widths.load_adult()
    x, y = data.x_train.float(), data.y_train.float()
    n, d = x.shape
    spec = dpsgd_widths.spec_for(args.width)
    plan = dpsgd_widths.plan_for(spec, n, d)
    product = dpsgd_widths.make_runs(spec, plan, x, y)["product"]
    product()  # warm-up
    samplers = {args.baseline: baseline.rounded_gaussian, "current": noise.rounded_gaussian}
    times: dict[str, list[float]] = {name: [] for name in samplers}
    for r in range(args.rounds):
        names = list(samplers) if r % 2 == 0 else list(reversed(samplers))
        for name in names:
            dpsgd.rounded_gaussian = samplers[name]  # type: ignore[attr-defined]
            start = time.perf_counter()
            product()
            times[name].append(time.perf_counter() - start)
    dpsgd.rounded_gaussian = noise.rounded_gaussian  # type: ignore[attr-defined]
    print(f"Command: .venv/bin/python {' '.join(sys.argv)}")
    print(
        "Load average (1/5/15 min) at start {:.2f} / {:.2f} / {:.2f}, at end {:.2f} / {:.2f}"
        " / {:.2f}".format(*load_start, *os.getloadavg())
    )
    for name, values in times.items():
        rounded = ", ".join(f"{v:.3f}" for v in values)
        print(f"{name}: median {statistics.median(values):.3f} s per epoch ({rounded})")


if __name__ == "__main__":
    main()
