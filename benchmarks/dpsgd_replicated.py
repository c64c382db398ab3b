"""DP-SGD training time against stock Opacus as the data grows (issue 25): Adult replicated
1×, 4× and 16× (30k → 480k rows), logistic regression, in one run.

For each replication r the plan is the one the service builds for n = r·30162 rows at
ε = 1, δ = 1e-5, batch 256, 3 epochs (q = 256/n, T = 3·⌈n/256⌉, σ from the plan), lr 1,
clip 1, and three runs train on the same rows:

* ``product``: worker.mechanisms.dpsgd.run_dpsgd as a job runs it (Poisson sampling by
  geometric gaps: O(q·n) a step);
* ``product, coins``: the same, with the sampler's blocks replaced by the previous
  implementation (one exact Bernoulli(q) coin per row and step, O(n) a step), for the
  before/after of the sampler alone;
* ``opacus``: stock Opacus ``make_private`` with Poisson sampling, as in dpsgd_speed.py.

Each is timed after one warm-up at 1×, median of ``--repeats`` interleaved repeats. Run:

    .venv/bin/python benchmarks/dpsgd_replicated.py [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

from service.modelspec import LogisticSpec  # noqa: E402
from service.plans import build_plan  # noqa: E402
from service.schemas import DpsgdOptions, JobRequest  # noqa: E402
from worker.mechanisms import dpsgd  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.models import build_module  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def coin_blocks(self: dpsgd.PoissonSampler, n: int, steps: int) -> Iterator[dpsgd.SampledBlock]:
    """The sampler before issue 25's change: a coin per (step, row), 2^22 coins a call."""
    per_block = max(1, (1 << 22) // max(n, 1))
    for start in range(0, steps, per_block):
        k = min(per_block, steps - start)
        hits = np.flatnonzero(self.coins(n * k))
        ends = np.searchsorted(hits, np.arange(1, k + 1) * n)
        sizes = np.diff(ends, prepend=0)
        rows = hits - np.repeat(np.arange(k) * n, sizes)
        yield dpsgd.SampledBlock(rows=rows, sizes=sizes.tolist())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load_adult()
    base_x, base_y = data.x_train.float(), data.y_train.float()
    spec = LogisticSpec()
    gap_blocks = dpsgd.PoissonSampler.blocks
    rows_out = []
    for scale in args.scales:
        x, y = base_x.repeat(scale, 1), base_y.repeat(scale)
        n, d = x.shape
        request = JobRequest(
            dataset="adult",
            method="dpsgd",
            epsilon=1.0,
            delta=1e-5,
            dpsgd=DpsgdOptions(batch_size=256, epochs=3, learning_rate=1.0, max_grad_norm=1.0),
        )
        m = build_plan(request, n_rows=n, n_features=d).mechanism
        q, steps, sigma = m["sampling_rate"], m["steps"], m["noise_multiplier"]
        train = TabularTrainingSet(x, y)

        def product(m: dict = m, train: TabularTrainingSet = train) -> None:
            dpsgd.run_dpsgd(
                spec=spec,
                mechanism=m,
                samples=1,
                data=train,
                device=torch.device("cpu"),
                progress=lambda a, b: None,
            )

        def product_coins(m: dict = m, train: TabularTrainingSet = train) -> None:
            dpsgd.PoissonSampler.blocks = coin_blocks  # type: ignore[method-assign]
            try:
                product(m, train)
            finally:
                dpsgd.PoissonSampler.blocks = gap_blocks  # type: ignore[method-assign]

        def opacus(
            x: torch.Tensor = x,
            y: torch.Tensor = y,
            q: float = q,
            steps: int = steps,
            sigma: float = sigma,
            n: int = n,
            d: int = d,
        ) -> None:
            from opacus import PrivacyEngine
            from torch.utils.data import DataLoader, TensorDataset

            module = build_module(spec, d)
            batch = round(q * n)
            loader = DataLoader(TensorDataset(x, y), batch_size=batch)
            opt = torch.optim.SGD(module.parameters(), lr=1.0 / batch)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module, opt, loader = PrivacyEngine(accountant="rdp").make_private(
                    module=module,
                    optimizer=opt,
                    data_loader=loader,
                    noise_multiplier=sigma,
                    max_grad_norm=1.0,
                    loss_reduction="sum",
                    poisson_sampling=True,
                )
            loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")
            done = 0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the backward-hook notice, every step
                while done < steps:
                    for xb, yb in loader:
                        opt.zero_grad(set_to_none=True)
                        loss_fn(module(xb), yb).backward()
                        opt.step()
                        done += 1
                        if done == steps:
                            break

        runs: dict[str, Callable[[], None]] = {
            "product": product,
            "product, coins (before)": product_coins,
            "opacus": opacus,
        }
        if scale == args.scales[0]:
            for fn in runs.values():  # warm-up: imports, allocator
                fn()
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.repeats):
            for name, fn in runs.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows_out.append((scale, n, q, steps, med, times))
        print(scale, n, steps, {k: round(v, 3) for k, v in med.items()}, flush=True)
    command = ".venv/bin/python benchmarks/dpsgd_replicated.py " + shlex.join(sys.argv[1:])
    lines = [
        "# DP-SGD training time as Adult is replicated: the product vs stock Opacus",
        "",
        f"Command: `{command}`. Machine: {platform.machine()}, "
        f"{torch.get_num_threads()} torch thread(s), CPU, torch {torch.__version__}.",
        "Logistic regression, plan for (ε, δ) = (1, 1e-5), batch 256, 3 epochs, C = 1, "
        f"lr = 1 at each n. Median of {args.repeats} interleaved repeats (min–max in "
        "brackets). 'coins (before)' is the product with the previous O(n)-per-step sampler.",
        "",
        "| replication | n | q | T | product s | product, coins (before) s | opacus s "
        "| product ÷ opacus | before ÷ opacus |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scale, n, q, steps, med, times in rows_out:

        def cell(name: str, med: dict = med, times: dict = times) -> str:
            return f"{med[name]:.3f} ({min(times[name]):.3f}–{max(times[name]):.3f})"

        lines.append(
            f"| {scale}× | {n} | {q:.4g} | {steps} | {cell('product')} | "
            f"{cell('product, coins (before)')} | {cell('opacus')} | "
            f"{med['product'] / med['opacus']:.3f} | "
            f"{med['product, coins (before)'] / med['opacus']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (RESULTS / "dpsgd_replicated.md").write_text(text)
        print(f"wrote {RESULTS / 'dpsgd_replicated.md'}")


if __name__ == "__main__":
    main()
