"""The Poisson gap sampler alone at 16× Adult's DP-SGD plan (issue 25, speed): the current
bound products (low bits from a table) against the per-bit loop they replaced, in one
process, interleaved, CPU seconds (these 2-core machines are shared; CPU time moves less
with the load than wall time).

The plan is the one dpsgd_replicated.py uses at 16× (n = 482,592, batch 256, 3 epochs:
q = 256/n, T = 5,658). Each round draws every step's batch with ``PoissonSampler.blocks``
from a ChaCha20 generator under a fixed key, once with each implementation; the sampled
rows must be identical (the bounds are the same floats, so the same gaps are drawn).

    .venv/bin/python benchmarks/poisson_gaps_speed.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
from randomgen import ChaCha

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker.mechanisms import dpsgd  # noqa: E402


def per_bit_bounds(
    self: dpsgd.PoissonSampler, k: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The bound products before issue 25's speed change: a pass per bit of the largest k."""
    lo, hi = np.ones(k.size), np.ones(k.size)
    for i in range(int(k.max(initial=0)).bit_length()):
        bit = ((k >> i) & 1).astype(np.bool_)
        lo *= np.where(bit, self._pow_lo[i], 1.0)
        hi *= np.where(bit, self._pow_hi[i], 1.0)
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = 16 * 30162
    q, steps = 256 / n, 3 * -(-n // 256)
    table_bounds = dpsgd.PoissonSampler._power_bounds
    variants = {"per-bit loop (before)": per_bit_bounds, "low-bit table (now)": table_bounds}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    digests: dict[str, set[str]] = {k: set() for k in variants}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for name, bounds in variants.items():
            dpsgd.PoissonSampler._power_bounds = bounds  # type: ignore[method-assign]
            rng = np.random.Generator(ChaCha(key=1000 + r, rounds=20))
            sampler = dpsgd.PoissonSampler(sampling_rate=q, rng=rng)
            h = hashlib.sha256()
            c0 = time.process_time()
            for block in sampler.blocks(n, steps):
                h.update(block.rows.tobytes())
            cpu[name].append(time.process_time() - c0)
            digests[name].add(f"{r}:{h.hexdigest()}")
        load.append(os.getloadavg()[0])
    dpsgd.PoissonSampler._power_bounds = table_bounds  # type: ignore[method-assign]
    before, now = (cpu[k] for k in variants)
    same = digests["per-bit loop (before)"] == digests["low-bit table (now)"]
    print(
        f"Command: `.venv/bin/python benchmarks/poisson_gaps_speed.py {shlex.join(sys.argv[1:])}`"
        f"; n = {n}, q = {q:.4g}, T = {steps}; load average (1 min) "
        + ", ".join(f"{v:.2f}" for v in load)
    )
    print(f"sampled rows identical in every round: {same}")
    print("| bound products | CPU s (median) | min–max |\n|---|---:|---:|")
    for name in variants:
        v = cpu[name]
        print(f"| {name} | {statistics.median(v):.3f} | {min(v):.3f}–{max(v):.3f} |")
    ratio = statistics.median(a / b for a, b in zip(now, before, strict=True))
    print(f"now ÷ before, median of per-round ratios: {ratio:.3f}")


if __name__ == "__main__":
    main()
