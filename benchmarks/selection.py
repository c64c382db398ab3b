"""Architecture selection on UCI Adult: the standard workflow vs the privacy-aware one at
equal total ε, and the crossover ε of a simple and a complex MLP (CPU, a few minutes).

* Crossover: MLP [4] ("simple") and MLP [32, 32] ("complex"), each trained by the
  product's DP-SGD (worker.mechanisms.dpsgd.run_dpsgd, plan from service.plans) at every
  ε of a grid, δ = 1e-5; median test AUC on adult.test; the crossover ε from
  service.selection.crossover.crossover_epsilon (below it the simple model wins).
* Standard workflow: train every architecture of the space WITHOUT DP (Adam), pick the
  best validation AUC, then train the pick with DP-SGD at the whole ε. Its selection is
  NOT private: it spends no budget on looking at the data, so its stated ε is not a
  guarantee for the whole workflow. It is the baseline the literature compares against.
* Privacy-aware workflow: the ``architecture`` selection job as the worker runs it
  (worker.mechanisms.model_selection.run_architecture_selection): RS or PAAS, each
  candidate DP-SGD-trained, noisy validation accuracy, the selected candidate's model
  released; per-training ε found by bisection so that the plan's total ε (RDP → (ε, δ)
  over the ledger's orders) equals the target. Guarantee: the whole workflow. Variants:
  rs (4 candidates, composed), rs-ps (random stopping, geometric K with E[K] = 4, the
  Papernot–Steinke bound), paas (population 2 × 2 generations).

Seeds: DP noise comes from the CSPRNG as in production (runs are not reproducible
bit for bit); the non-private baseline is seeded.

    .venv/bin/python benchmarks/selection.py            # ≈ 5–10 min on 2 cores
    .venv/bin/python benchmarks/selection.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

from service.modelspec import MlpSpec  # noqa: E402
from service.plans import build_plan  # noqa: E402
from service.schemas import DpsgdOptions, JobRequest  # noqa: E402
from service.selection.crossover import crossover_epsilon  # noqa: E402
from service.selection.plans import (  # noqa: E402
    ArchitectureRequest,
    SelectionBudget,
    TnbRunsSpec,
    architecture_plan,
    with_total_epsilon,
    workflow_epsilon,
)
from service.selection.search_space import ArchitectureSearch, ArchitectureSpace  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.dpsgd import run_dpsgd  # noqa: E402
from worker.mechanisms.model_selection import run_architecture_selection  # noqa: E402
from worker.models import build_module  # noqa: E402

DELTA = 1e-5
TRAINING_DELTA = 1e-6
SIMPLE, COMPLEX = [4], [32, 32]
SPACE = ArchitectureSpace(depths=[1, 2], widths=[4, 32], activations=["tanh"])
OPTIONS = DpsgdOptions(batch_size=256, epochs=2, learning_rate=1.0)
RESULTS = ROOT / "benchmarks" / "results"


def auc(spec: MlpSpec, weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    from sklearn.metrics import roc_auc_score

    module = build_module(spec, x.shape[1])
    module.load_state_dict(weights)
    with torch.no_grad():
        return float(roc_auc_score(y.numpy(), module(x).numpy()))


def dp_train(
    hidden: list[int], epsilon: float, train: TabularTrainingSet
) -> dict[str, torch.Tensor]:
    request = JobRequest(
        dataset="adult",
        model=MlpSpec(hidden=hidden),
        method="dpsgd",
        epsilon=epsilon,
        delta=DELTA,
        dpsgd=OPTIONS,
    )
    plan = build_plan(request, n_rows=train.n, n_features=train.n_features)
    out = run_dpsgd(
        spec=request.model,
        mechanism=plan.mechanism,
        samples=1,
        data=train,
        device=torch.device("cpu"),
        progress=lambda a, b: None,
    )
    return out.releases[0]


def nonprivate_train(
    hidden: list[int], train: TabularTrainingSet, seed: int
) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    module = build_module(MlpSpec(hidden=hidden), train.n_features)
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(3):
        for idx in torch.randperm(train.n).split(256):
            opt.zero_grad()
            loss_fn(module(train.x[idx]), train.y[idx]).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def all_architectures() -> list[list[int]]:
    out: list[list[int]] = []
    for depth in SPACE.depths:
        grid: list[list[int]] = [[]]
        for _ in range(depth):
            grid = [[*g, w] for g in grid for w in SPACE.widths]
        out += grid
    return out


def aware_request(algorithm: str, fitness_epsilon: float) -> ArchitectureRequest:
    runs = None
    if algorithm == "paas":
        search = ArchitectureSearch(algorithm="paas", population=2, generations=2)
    else:
        search = ArchitectureSearch(algorithm="rs", trainings=4)
        if algorithm == "rs-ps":  # random stopping, geometric K with E[K] = 4
            runs = TnbRunsSpec(eta=1.0, gamma=0.25)
    return ArchitectureRequest(
        space=SPACE,
        search=search,
        training=OPTIONS,
        runs=runs,
        budget=SelectionBudget(
            training_epsilon=1.0, training_delta=TRAINING_DELTA, fitness_epsilon=fitness_epsilon
        ),
    )


def calibrate(algorithm: str, target: float, n: int, d: int) -> ArchitectureRequest:
    """Largest per-training ε whose whole plan stays within (target, δ); each noisy score
    gets ε = 2 % of the target."""
    request = with_total_epsilon(
        aware_request(algorithm, 0.02 * target),
        epsilon=target,
        delta=DELTA,
        dataset="adult",
        n_rows=n,
        n_features=d,
    )
    assert isinstance(request, ArchitectureRequest)
    return request


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    command = "python benchmarks/selection.py " + shlex.join(sys.argv[1:])
    data = load_adult()
    train = TabularTrainingSet(data.x_train.float(), data.y_train.float())
    xte, yte = data.x_test.float(), data.y_test.float()
    n, d = train.n, train.n_features
    grid = [0.1, 1.0] if args.quick else [0.02, 0.05, 0.1, 0.3, 1.0, 3.0, 10.0]
    repeats = 1 if args.quick else 3
    totals = [1.0] if args.quick else [0.5, 2.0]
    workflow_repeats = 1 if args.quick else 3

    # ---- crossover
    curves: dict[str, list[float]] = {"simple": [], "complex": []}
    for eps in grid:
        for name, hidden in (("simple", SIMPLE), ("complex", COMPLEX)):
            aucs = [
                auc(MlpSpec(hidden=hidden), dp_train(hidden, eps, train), xte, yte)
                for _ in range(repeats)
            ]
            curves[name].append(statistics.median(aucs))
            print(
                f"crossover ε={eps:g} {name} {hidden}: median AUC {curves[name][-1]:.4f}",
                flush=True,
            )
    cross = crossover_epsilon(epsilons=grid, simple=curves["simple"], complex=curves["complex"])

    # ---- workflows at equal total ε
    rows: list[dict[str, object]] = []
    for total in totals:
        # standard: non-private selection (NOT private), then DP-SGD at the whole ε
        for r in range(workflow_repeats):
            t0 = time.perf_counter()
            g = torch.Generator().manual_seed(r)
            val_mask = torch.rand(n, generator=g) < 0.2
            tr = TabularTrainingSet(train.x[~val_mask], train.y[~val_mask])
            scores = {
                tuple(h): auc(
                    MlpSpec(hidden=h),
                    nonprivate_train(h, tr, r),
                    train.x[val_mask],
                    train.y[val_mask],
                )
                for h in all_architectures()
            }
            pick = list(max(scores, key=scores.__getitem__))
            final = auc(MlpSpec(hidden=pick), dp_train(pick, total, train), xte, yte)
            rows.append(
                dict(
                    total=total,
                    workflow="standard (selection NOT private)",
                    selected=str(pick),
                    auc=final,
                    seconds=time.perf_counter() - t0,
                    per_training="–",
                )
            )
            print(rows[-1], flush=True)
        for algorithm in ("rs", "rs-ps", "paas"):
            request = calibrate(algorithm, total, n, d)
            plan = architecture_plan(request, dataset="adult", n_rows=n, n_features=d)
            charged = workflow_epsilon(plan, delta=DELTA)
            for _ in range(workflow_repeats):
                t0 = time.perf_counter()
                out = run_architecture_selection(
                    request=request,
                    plan=plan,
                    data=train,
                    device=torch.device("cpu"),
                    progress=lambda a, b: None,
                )
                if out.selected is None or out.weights is None:
                    continue  # K = 0 cannot happen for the geometric law; kept for Poisson
                spec = MlpSpec(hidden=list(out.selected.hidden))
                rows.append(
                    dict(
                        total=total,
                        workflow=f"privacy-aware {algorithm} (ε charged {charged:.3g})",
                        selected=str(list(out.selected.hidden)),
                        auc=auc(spec, out.weights, xte, yte),
                        seconds=time.perf_counter() - t0,
                        per_training=f"{request.budget.training_epsilon:.3g}",
                    )
                )
                print(rows[-1], flush=True)

    lines = [
        "# Architecture selection on Adult: standard vs privacy-aware workflow, crossover ε",
        "",
        f"Command: `{command}` ({platform.machine()}, torch threads {args.threads}, shared "
        "2-core machine: timings are noisy). δ = 1e-5; test AUC on adult.test; DP noise "
        "from the CSPRNG (not reproducible bit for bit).",
        "",
        "## Crossover (DP-SGD, 2 epochs, batch 256, lr 1.0; median of 3 runs per cell)",
        "",
        "| ε | simple MLP [4] | complex MLP [32, 32] |",
        "|---|---|---|",
        *[
            f"| {e:g} | {s:.4f} | {c:.4f} |"
            for e, s, c in zip(grid, curves["simple"], curves["complex"], strict=True)
        ],
        "",
        "Crossover ε (simple wins below): "
        f"{f'{cross.crossover:.3g}' if cross.crossover is not None else 'none on the grid'}"
        f"{' (simple wins everywhere)' if cross.simple_wins_everywhere else ''}"
        f"{' (complex wins everywhere)' if cross.complex_wins_everywhere else ''}.",
        "",
        "## Workflows at equal total ε",
        "",
        "The standard workflow's selection looks at the data without any noise: it is NOT "
        "private, and its ε covers only the final training. The privacy-aware rows' ε covers "
        "the whole workflow (every training and every noisy score). rs: 4 random "
        "candidates, composed; rs-ps: random search with Papernot–Steinke random stopping "
        "(geometric K, E[K] = 4, charged by their bound); paas: genetic, population 2 × "
        "2 generations. Each noisy score: ε = 2 % of the total. Space: depth 1–2, widths "
        "{4, 32}, tanh.",
        "",
        "| total ε | workflow | per-training ε | selected | test AUC | seconds |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['total']:g} | {r['workflow']} | {r['per_training']} | {r['selected']} | "
            f"{float(r['auc']):.4f} | {float(r['seconds']):.1f} |"
            for r in rows
        ],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.no_write:
        return
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "selection.md").write_text(text)
    (RESULTS / "selection.json").write_text(
        json.dumps(
            {
                "command": command,
                "grid": grid,
                "curves": curves,
                "crossover": cross.crossover,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(grid, curves["simple"], "o-", label=f"simple MLP {SIMPLE}")
    ax.plot(grid, curves["complex"], "s-", label=f"complex MLP {COMPLEX}")
    if cross.crossover is not None:
        ax.axvline(
            cross.crossover, color="grey", ls="--", label=f"crossover ε ≈ {cross.crossover:.2g}"
        )
    ax.set_xscale("log")
    ax.set_xlabel("ε (δ = 1e-5)")
    ax.set_ylabel("median test AUC")
    ax.set_title("DP-SGD on Adult: simple vs complex MLP")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "selection.png", dpi=120)


if __name__ == "__main__":
    main()
