"""Architecture selection for GRU-D on the synthetic ICU series: the standard workflow vs
the privacy-aware one at equal total ε (issue 10's benchmark on the time-series data).

* Data: ``worker.synthetic_icu.generate_icu`` (8 variables, 48 hourly steps, irregular
  observations), seeded: a training set and a separate test set.
* Standard workflow: train GRU-D of every hidden size in the space WITHOUT DP (Adam),
  pick the best validation AUC (a split of the training stays), then train the pick with
  the product's DP-SGD at the whole ε on all training stays. Its selection is NOT private.
* Privacy-aware workflow: the ``architecture`` selection job as the worker runs it
  (``run_architecture_selection`` with a ``model: grud`` space): random search over the
  same hidden sizes, each candidate DP-SGD-trained on the training part and scored by its
  noisy validation accuracy; the per-training ε is calibrated so that the whole plan's
  (ε, δ) equals the target. Guarantee: the whole workflow.
* Reported: median test AUC over the repeats and wall time per workflow.

    .venv/bin/python benchmarks/selection_grud.py [--repeats 3] [--stays 1500]

Writes benchmarks/results/selection_grud.md and selection_grud.png.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.modelspec import GrudSpec  # noqa: E402
from service.plans import build_plan  # noqa: E402
from service.schemas import DpsgdOptions, JobRequest  # noqa: E402
from service.selection.plans import (  # noqa: E402
    ArchitectureRequest,
    SelectionBudget,
    architecture_plan,
    with_total_epsilon,
    workflow_epsilon,
)
from service.selection.search_space import ArchitectureSearch, ArchitectureSpace  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.dpsgd import run_dpsgd  # noqa: E402
from worker.mechanisms.model_selection import run_architecture_selection  # noqa: E402
from worker.models import build_module  # noqa: E402
from worker.synthetic_icu import generate_icu  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DELTA = 1e-5
WIDTHS = [4, 8, 16, 32]
OPTIONS = DpsgdOptions(epochs=2, batch_size=50, learning_rate=2.0)
EPSILONS = [1.0, 4.0]


def series_set(n: int, seed: int) -> TabularTrainingSet:
    s = generate_icu(n, hours=48, rng=np.random.default_rng(seed))
    return TabularTrainingSet(
        torch.tensor(s.packed()), torch.tensor(s.labels).float(), tuple(s.schema.scaled_means)
    )


def auc(hidden: int, weights: dict[str, torch.Tensor], data: TabularTrainingSet) -> float:
    from sklearn.metrics import roc_auc_score

    module = build_module(GrudSpec(hidden=hidden), data.n_features, public_means=data.public_means)
    module.load_state_dict(weights)
    with torch.no_grad():
        return float(roc_auc_score(data.y.numpy(), module(data.x).numpy()))


def nonprivate(hidden: int, train: TabularTrainingSet, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    spec = GrudSpec(hidden=hidden)
    module = build_module(spec, train.n_features, public_means=train.public_means)
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(OPTIONS.epochs or 2):
        for idx in torch.randperm(train.n).split(50):
            opt.zero_grad()
            loss_fn(module(train.x[idx]), train.y[idx]).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def dp_train(hidden: int, epsilon: float, train: TabularTrainingSet) -> dict[str, torch.Tensor]:
    request = JobRequest(
        dataset="icu",
        model=GrudSpec(hidden=hidden),
        method="dpsgd",
        epsilon=epsilon,
        delta=DELTA,
        dpsgd=OPTIONS,
    )
    plan = build_plan(
        request, n_rows=train.n, n_features=train.n_features, dataset_kind="timeseries"
    )
    out = run_dpsgd(
        spec=request.model,
        mechanism=plan.mechanism,
        samples=1,
        data=train,
        device=torch.device("cpu"),
        progress=lambda a, b: None,
    )
    return out.releases[0]


def standard(epsilon: float, train: TabularTrainingSet, test: TabularTrainingSet, seed: int):  # type: ignore[no-untyped-def]
    cut = int(0.8 * train.n)
    fit = TabularTrainingSet(train.x[:cut], train.y[:cut], train.public_means)
    val = TabularTrainingSet(train.x[cut:], train.y[cut:], train.public_means)
    best = max(WIDTHS, key=lambda h: auc(h, nonprivate(h, fit, seed), val))
    return best, auc(best, dp_train(best, epsilon, train), test)


def aware(epsilon: float, train: TabularTrainingSet, test: TabularTrainingSet):  # type: ignore[no-untyped-def]
    request = ArchitectureRequest(
        space=ArchitectureSpace(model="grud", depths=[1], widths=WIDTHS),
        search=ArchitectureSearch(algorithm="rs", trainings=len(WIDTHS)),
        training=OPTIONS,
        budget=SelectionBudget(training_epsilon=epsilon, training_delta=DELTA),
    )
    sizes = {"dataset": "icu", "n_rows": train.n, "n_features": train.n_features}
    request = with_total_epsilon(  # type: ignore[assignment]
        request, epsilon=epsilon, delta=DELTA, schema={"kind": "timeseries"}, **sizes
    )
    plan = architecture_plan(request, **sizes, dataset_kind="timeseries")  # type: ignore[arg-type]
    total = workflow_epsilon(plan, delta=DELTA)
    out = run_architecture_selection(
        request=request,
        plan=plan,
        data=train,
        device=torch.device("cpu"),
        progress=lambda a, b: None,
    )
    assert out.selected is not None and out.weights is not None
    hidden = out.selected.hidden[0]
    return hidden, auc(hidden, out.weights, test), total, request.budget.training_epsilon


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stays", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    command = "python benchmarks/selection_grud.py " + shlex.join(sys.argv[1:])
    train, test = series_set(args.stays, 0), series_set(1000, 1)
    rows = []
    for eps in EPSILONS:
        for rep in range(args.repeats):
            t = time.perf_counter()
            pick, s_auc = standard(eps, train, test, seed=rep)
            s_time = time.perf_counter() - t
            t = time.perf_counter()
            a_pick, a_auc, total, per = aware(eps, train, test)
            a_time = time.perf_counter() - t
            print(f"ε={eps} rep {rep}: standard H={pick} AUC {s_auc:.3f} ({s_time:.0f}s); "
                  f"private RS H={a_pick} AUC {a_auc:.3f} ({a_time:.0f}s, "
                  f"workflow ε {total:.3f}, per training {per:.3f})", flush=True)  # fmt: skip
            rows.append({"eps": eps, "std": (pick, s_auc, s_time), "rs": (a_pick, a_auc, a_time),
                         "per": per, "total": total})  # fmt: skip
    lines = [
        "# GRU-D architecture selection on the synthetic ICU series (issue 10)",
        "",
        f"Command: `{command}` ({args.stays} training stays, 1000 test stays, 8 variables × "
        f"48 h; GRU-D hidden sizes {WIDTHS}; DP-SGD {OPTIONS.epochs} epochs, batch "
        f"{OPTIONS.batch_size}; δ = {DELTA:g}; {args.repeats} repeats; 2-core machine).",
        "",
        "Standard: every hidden size trained without DP, the best validation AUC picked, "
        "the pick trained by DP-SGD at the whole ε (selection NOT private). Private: the "
        "product's architecture selection job, random search over the same sizes, each "
        "candidate DP-SGD-trained and scored by noisy validation accuracy, the whole "
        "workflow within the total ε.",
        "",
        "| total ε | workflow | median test AUC | picks (hidden) | per-training ε "
        "| median time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for eps in EPSILONS:
        rs = [r for r in rows if r["eps"] == eps]
        std_auc = statistics.median(r["std"][1] for r in rs)
        lines.append(
            f"| {eps:g} | standard (not private) | {std_auc:.3f} "
            f"| {', '.join(str(r['std'][0]) for r in rs)} | {eps:g} | "
            f"{statistics.median(r['std'][2] for r in rs):.0f} |"
        )
        lines.append(
            f"| {eps:g} | private RS ({len(WIDTHS)} candidates) | "
            f"{statistics.median(r['rs'][1] for r in rs):.3f} | "
            f"{', '.join(str(r['rs'][0]) for r in rs)} | {rs[0]['per']:.3f} | "
            f"{statistics.median(r['rs'][2] for r in rs):.0f} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "selection_grud.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for key, label in (("std", "standard (selection not private)"), ("rs", "private RS")):
        ax.plot(EPSILONS, [statistics.median(r[key][1] for r in rows if r["eps"] == e)
                           for e in EPSILONS], "o-", label=label)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("total ε")
    ax.set_ylabel("median test AUC")
    ax.set_title("GRU-D selection, synthetic ICU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "selection_grud.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
