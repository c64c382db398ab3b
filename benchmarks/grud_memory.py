"""Peak memory of the batched GRU-D utility for N sampled parameter vectors (CPU).

ExpM+NF evaluates the utility of all N flow samples in one ``torch.func.vmap`` over
``functional_call``; for a recurrent model the autograd graph keeps N·B·T hidden-state
activations, so memory grows linearly in N. This script measures it.

Each (N, mode) is measured in a fresh subprocess: the peak resident set size (Linux
VmHWM, reset through /proc/self/clear_refs after setup and a warm-up pass with N = 1)
minus the resident size just before the measured pass; glibc's mmap threshold is fixed so
that freed tensors leave the resident set. ``tracemalloc`` is not used: it only sees
Python's allocator, not torch's tensor memory.

    .venv/bin/python benchmarks/grud_memory.py            # N ∈ {1, 4, 16, 64, 256}
    .venv/bin/python benchmarks/grud_memory.py --quick    # N ∈ {1, 8, 32}
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(n: int, batch: int, hours: int, hidden: int, backward: bool) -> dict[str, float]:
    """Run in the child process: one warm-up pass, reset the peak, one measured pass."""
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT))
    from service.modelspec import GrudSpec
    from worker.mechanisms.expm_nf import squared_error_utility
    from worker.models import build_batched
    from worker.synthetic_icu import generate_icu

    torch.set_num_threads(2)
    series = generate_icu(batch, hours=hours, rng=np.random.default_rng(0))
    x = torch.tensor(series.packed())
    y = torch.tensor(series.labels)
    model = build_batched(
        GrudSpec(hidden=hidden), series.schema.n_vars, public_means=series.schema.scaled_means
    )

    def step(count: int) -> None:
        theta = (0.1 * torch.randn(count, model.n_params)).requires_grad_(backward)
        if backward:
            squared_error_utility(model, theta, x, y, l2=1.0).sum().backward()
        else:
            with torch.no_grad():
                squared_error_utility(model, theta, x, y, l2=1.0)

    step(1)  # warm-up with N = 1: one-time allocations (vmap plumbing, thread pools)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    step(n)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    return {
        "N": n,
        "backward": backward,
        "P": model.n_params,
        "peak_delta_mib": (peak - before) / 1024,
        "rss_before_mib": before / 1024,
        "seconds": seconds,
    }


def _child_env() -> dict[str, str]:
    """A fixed glibc mmap threshold: large tensors are mmapped and unmapped when freed, so
    RSS tracks live tensor memory (the dynamic threshold would let freed blocks linger)."""
    import os

    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="GRU-D batched-utility peak memory")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ns", type=int, nargs="+", default=None)
    parser.add_argument("--batch", type=int, default=64, help="data minibatch B")
    parser.add_argument("--hours", type=int, default=48, help="time steps T")
    parser.add_argument("--hidden", type=int, default=16, help="GRU-D hidden units H")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, metavar=("N", "BACKWARD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = measure(
            int(args.child[0]), args.batch, args.hours, args.hidden, args.child[1] == "1"
        )
        print(json.dumps(result))
        return
    ns = args.ns or ([1, 8, 32] if args.quick else [1, 4, 16, 64, 256])
    command = ".venv/bin/python benchmarks/grud_memory.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    print(f"$ {command}", flush=True)
    rows: list[dict[str, float]] = []
    for backward in (False, True):
        for n in ns:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    str(n),
                    "1" if backward else "0",
                    "--batch",
                    str(args.batch),
                    "--hours",
                    str(args.hours),
                    "--hidden",
                    str(args.hidden),
                ],
                check=True,
                capture_output=True,
                text=True,
                env=_child_env(),
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"N={n:4d} {'fwd+bwd' if backward else 'forward'}: peak +"
                f"{row['peak_delta_mib']:.1f} MiB, {row['seconds']:.2f} s",
                flush=True,
            )

    args.out.mkdir(parents=True, exist_ok=True)
    p = int(rows[0]["P"])
    lines = [
        "# GRU-D batched utility: peak memory vs number of parameter samples N (CPU)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.platform()}, 2 torch threads.  ",
        f"Setting: synthetic ICU minibatch B = {args.batch} series × T = {args.hours} h × "
        f"V = 8 variables, GRU-D hidden H = {args.hidden} (P = {p} parameters); the utility "
        "−Σ(σ(f(x; θ)) − y)² − λ‖θ‖² for N parameter vectors in one vmap over "
        "functional_call. Peak = VmHWM − VmRSS around one pass (after an N = 1 "
        "warm-up), fresh process per row, glibc mmap threshold fixed at 128 KiB.",
        "",
        "| N | forward only: peak (MiB) | s | forward + backward: peak (MiB) | s | "
        "MiB per sample (fwd+bwd) |",
        "|---|---|---|---|---|---|",
    ]
    for n in ns:
        f = next(r for r in rows if r["N"] == n and not r["backward"])
        b = next(r for r in rows if r["N"] == n and r["backward"])
        lines.append(
            f"| {n} | {f['peak_delta_mib']:.1f} | {f['seconds']:.2f} | "
            f"{b['peak_delta_mib']:.1f} | {b['seconds']:.2f} | {b['peak_delta_mib'] / n:.2f} |"
        )
    lines.append("")
    text = "\n".join(lines)
    (args.out / "grud_memory.md").write_text(text)
    (args.out / "grud_memory.json").write_text(
        json.dumps({"command": command, "rows": rows}, indent=1)
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for backward, label in ((False, "forward only"), (True, "forward + backward")):
        pts = [(r["N"], max(r["peak_delta_mib"], 0.1)) for r in rows if r["backward"] == backward]
        ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (parameter samples per utility evaluation)")
    ax.set_ylabel("peak RSS increase (MiB)")
    ax.set_title(f"GRU-D utility, B={args.batch}, T={args.hours}, H={args.hidden}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "grud_memory.png", dpi=120)
    print(text)


if __name__ == "__main__":
    main()
