"""DP-SGD training time against stock Opacus and the same loop without privacy, in one run.

Same configuration for all three (Adult, logistic regression, public-schema encoding):
the plan the service builds for ε = 1, δ = 1e-5, batch 256, 3 epochs (q = 256/n, T steps,
σ from the plan), learning rate 1, clip 1.

* ``product``: worker.mechanisms.dpsgd.run_dpsgd (own Poisson sampler, Linear per-example
  gradients, integer grid, rounded-Gaussian noise), exactly as a job runs it.
* ``opacus``: stock Opacus 1.6 ``PrivacyEngine.make_private`` with Poisson sampling, the
  same q (its DataLoader uses 1/len(loader): batch_size is set so that equals the plan's q
  as closely as Opacus allows), σ, C, steps, SGD with sum-reduced loss and lr/B.
* ``nonprivate``: the same minibatch loop (uniform random batches of 256) with plain SGD.

Each is timed in-process after one warm-up run, ``--repeats`` times; the table reports the
median and the ratios product/opacus and product/nonprivate from the same run, plus the
holdout AUC of one model of each (a sanity check that the runs trained). Run:

    .venv/bin/python benchmarks/dpsgd_speed.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

from service.modelspec import LogisticSpec  # noqa: E402
from service.plans import build_plan  # noqa: E402
from service.schemas import DpsgdOptions, JobRequest  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.dpsgd import run_dpsgd  # noqa: E402
from worker.models import build_module  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def auc(weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    from sklearn.metrics import roc_auc_score

    scores = x.float() @ weights["linear.weight"].flatten() + weights["linear.bias"]
    return float(roc_auc_score(y.numpy(), scores.detach().numpy()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load_adult()
    x, y = data.x_train.float(), data.y_train.float()
    n, d = x.shape
    request = JobRequest(
        dataset="adult",
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        dpsgd=DpsgdOptions(batch_size=256, epochs=3, learning_rate=1.0, max_grad_norm=1.0),
    )
    plan = build_plan(request, n_rows=n, n_features=d)
    m = plan.mechanism
    q, steps, sigma = m["sampling_rate"], m["steps"], m["noise_multiplier"]
    spec = LogisticSpec()
    train = TabularTrainingSet(x, y)

    def product() -> dict[str, torch.Tensor]:
        out = run_dpsgd(
            spec=spec,
            mechanism=m,
            samples=1,
            data=train,
            device=torch.device("cpu"),
            progress=lambda a, b: None,
        )
        return out.releases[0]

    def opacus() -> dict[str, torch.Tensor]:
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        module = build_module(spec, d)
        batch = round(q * n)  # Opacus: q = 1/len(loader) = 1/ceil(n/batch)
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
        while done < steps:
            for xb, yb in loader:
                opt.zero_grad(set_to_none=True)
                loss_fn(module(xb), yb).backward()
                opt.step()
                done += 1
                if done == steps:
                    break
        inner = module._module
        return {k: v.detach().clone() for k, v in inner.state_dict().items()}

    def nonprivate() -> dict[str, torch.Tensor]:
        module = build_module(spec, d)
        opt = torch.optim.SGD(module.parameters(), lr=1.0 / 256)
        loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")
        for _ in range(steps):
            idx = torch.randint(0, n, (256,))
            opt.zero_grad(set_to_none=True)
            loss_fn(module(x[idx]), y[idx]).backward()
            opt.step()
        return {k: v.detach().clone() for k, v in module.state_dict().items()}

    runs: dict[str, Callable[[], dict[str, torch.Tensor]]] = {
        "product": product,
        "opacus": opacus,
        "nonprivate": nonprivate,
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    aucs: dict[str, float] = {}
    for name, fn in runs.items():  # warm-up (imports, allocator), AUC of that model
        aucs[name] = auc(fn(), data.x_test, data.y_test)
    for _ in range(args.repeats):  # interleaved: drift hits all three alike
        for name, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    command = ".venv/bin/python benchmarks/dpsgd_speed.py " + shlex.join(sys.argv[1:])
    lines = [
        "# DP-SGD training time: the product vs stock Opacus vs no privacy (one run)",
        "",
        f"Command: `{command}`. Machine: {platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, CPU, torch {torch.__version__}.",
        f"Adult logistic regression, n = {n}, d = {d}; plan for (ε, δ) = (1, 1e-5): "
        f"q = {q:.6g}, T = {steps}, σ = {sigma:.5g}, C = 1, lr = 1, expected batch 256. "
        f"Median of {args.repeats} interleaved repeats after a warm-up; AUC on adult.test "
        "of the warm-up model.",
        "",
        "| run | median s | min s | max s | ratio to opacus | ratio to non-private | AUC |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in runs:
        lines.append(
            f"| {name} | {med[name]:.3f} | {min(times[name]):.3f} | {max(times[name]):.3f} | "
            f"{med[name] / med['opacus']:.3f} | {med[name] / med['nonprivate']:.3f} | "
            f"{aucs[name]:.4f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (RESULTS / "dpsgd_speed.md").write_text(text)
        print(f"wrote {RESULTS / 'dpsgd_speed.md'}")
    assert math.isfinite(med["product"])


if __name__ == "__main__":
    main()
