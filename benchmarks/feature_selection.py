"""DP correlation-based feature selection on UCI Adult: which columns DP-CFS picks at
ε = 0.1, 1, 10 (δ = 1e-5) against no noise, how good the picks are, and the time.

* The ``features`` selection job as the worker runs it: plan from
  service.selection.plans.plan_selection (one Gaussian on all H = 13 + 78 = 91
  histograms of Adult's 13 columns, ℓ2 sensitivity √H), run by
  worker.mechanisms.model_selection.run_selection (CFS-Greedy; CFS-GA with population
  40 × 40 generations: free post-processing). DP noise from the CSPRNG as in
  production, so runs are not reproducible bit for bit; ``repeats`` runs per ε.
* No noise: the same discretisation and search on the exact histograms (benchmark
  only; no such switch exists in the API).
* Quality of a pick: its merit on the *exact* SU matrix (the CFS objective without noise)
  and the test AUC of a non-private logistic regression trained on the picked columns of
  adult.data and scored on adult.test (measures the selection only; the downstream model
  is not private).
* ``--workflows``: at equal total ε (0.5, 2; δ = 1e-5; 5 repeats), an MLP [8] by DP-SGD on
  all columns (no selection); the standard workflow (non-private CFS, then DP-SGD at the
  whole ε: its selection is NOT private); DP-CFS with 10% of the ε + the final model in
  the same plan; PAFS 3 × 2 (noisy scores at 5% of the ε each, the selected subset's
  model released). Per-training ε by bisection so that each plan's whole ε (ledger's
  orders) is ≤ the total. Test AUC on adult.test.
* Time: wall time of one worker run (discretise, count, noise, search), median over the
  repeats; noisy machine (shared CPU), compare within one run.

    .venv/bin/python benchmarks/feature_selection.py --workflows   # ≈ 2–3 min on 2 cores
    .venv/bin/python benchmarks/feature_selection.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

from service.datasets.kinds import load_schema_yaml  # noqa: E402
from service.modelspec import MlpSpec  # noqa: E402
from service.plans import PlanError  # noqa: E402
from service.schemas import DpsgdOptions  # noqa: E402
from service.selection.budget import SelectionBudget  # noqa: E402
from service.selection.features import FeatureGa, FeatureLayout, FeatureRequest, FinalTraining  # noqa: E402
from service.selection.plans import plan_selection, workflow_epsilon  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.feature_selection import (  # noqa: E402
    cfs_ga,
    cfs_greedy,
    count_histograms,
    discretise,
    merit,
    su_matrices,
)
from worker.mechanisms.model_selection import run_selection  # noqa: E402

DELTA = 1e-5
GA = FeatureGa(population=40, generations=40, mutation_rate=0.1)
RESULTS = ROOT / "benchmarks" / "results"


def downstream_auc(
    layout: FeatureLayout,
    names: list[str],
    data,
    cache: dict,  # type: ignore[no-untyped-def]
) -> float:
    """Test AUC of a non-private logistic regression on the picked columns."""
    key = tuple(sorted(names))
    if key in cache:
        return float(cache[key])
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    cols = [i for c in layout.columns if c.name in names for i in range(c.start, c.start + c.width)]
    model = LogisticRegression(max_iter=500)
    model.fit(data.x_train[:, cols].numpy(), data.y_train.numpy())
    value = roc_auc_score(
        data.y_test.numpy(), model.predict_proba(data.x_test[:, cols].numpy())[:, 1]
    )
    cache[key] = float(value)
    return float(value)


HIDDEN = [8]
WORKFLOW_OPTIONS = DpsgdOptions(batch_size=256, epochs=2, learning_rate=1.0)


def cfs_final(total: float, e: float) -> FeatureRequest:
    """DP-CFS with 10% of the total ε, then a final DP-SGD model at per-training ε ``e``."""
    final = FinalTraining(
        epsilon=e, delta=DELTA, model=MlpSpec(hidden=HIDDEN), training=WORKFLOW_OPTIONS
    )
    return FeatureRequest(epsilon=0.1 * total, delta=DELTA, final=final)


def pafs(total: float, e: float) -> FeatureRequest:
    """PAFS 3 × 2, per-training ε ``e``, each noisy score at 5% of the total ε."""
    budget = SelectionBudget(training_epsilon=e, training_delta=DELTA, fitness_epsilon=0.05 * total)
    return FeatureRequest(
        method="pafs",
        ga=FeatureGa(population=3, generations=2),
        model=MlpSpec(hidden=HIDDEN),
        training=WORKFLOW_OPTIONS,
        budget=budget,
    )


def _fit_total(make_plan, total: float):  # type: ignore[no-untyped-def]
    """Largest per-training ε (bisection in log ε, 30 steps) whose plan's whole ε at
    δ = DELTA is ≤ ``total``; (ε, plan) or None."""
    lo, hi, best = 1e-2, 50.0, None
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        try:
            p = make_plan(mid)
            ok = workflow_epsilon(p, delta=DELTA) <= total
        except (PlanError, ValueError):
            p, ok = None, False
        if ok:
            lo, best = mid, (mid, p)
        else:
            hi = mid
    return best


def workflows(data, schema, names, exact_greedy, totals, repeats):  # type: ignore[no-untyped-def]
    """Standard (non-private CFS, then DP-SGD at the whole ε) vs privacy-aware workflows
    (DP-CFS with 10% of the ε + final DP-SGD model in the same plan; PAFS 3 × 2 with the
    selected subset's model released) vs no selection (DP-SGD on all columns), at equal
    total ε; MLP [8], test AUC on adult.test, wall time."""
    from selection import auc, dp_train

    train = TabularTrainingSet(data.x_train.float(), data.y_train.float())
    xte, yte = data.x_test.float(), data.y_test.float()
    spec = MlpSpec(hidden=HIDDEN)

    def plan_of(request: FeatureRequest):  # type: ignore[no-untyped-def]
        return plan_selection(
            "features",
            request,
            dataset="adult",
            n_rows=train.n,
            n_features=schema.n_features,
            schema=schema,
        )

    def columns(layout: FeatureLayout, chosen: list[str]) -> list[int]:
        return [
            i for c in layout.columns if c.name in chosen for i in range(c.start, c.start + c.width)
        ]

    rows = []
    for total in totals:
        for rep in range(repeats):
            t = time.perf_counter()
            w = dp_train(HIDDEN, total, train)
            rows.append(
                (
                    "all columns, DP-SGD (no selection)",
                    total,
                    auc(spec, w, xte, yte),
                    len(names),
                    time.perf_counter() - t,
                )
            )
            t = time.perf_counter()
            cols = columns(LAYOUT[0], exact_greedy)
            w = dp_train(HIDDEN, total, TabularTrainingSet(train.x[:, cols], train.y))
            rows.append(
                (
                    "standard: non-private CFS, then DP-SGD (selection NOT private)",
                    total,
                    auc(spec, w, xte[:, cols], yte),
                    len(exact_greedy),
                    time.perf_counter() - t,
                )
            )
            fit = _fit_total(lambda e, t=total: plan_of(cfs_final(t, e)), total)
            if fit is not None:
                e, p = fit
                request = cfs_final(total, e)
                t = time.perf_counter()
                out = run_selection(
                    request, p, data=train, device=torch.device("cpu"), progress=lambda a, b: None
                )
                chosen = list(out.selected.features)  # type: ignore[union-attr]
                cols = columns(LAYOUT[0], chosen)
                assert out.weights is not None
                rows.append(
                    (
                        f"private: DP-CFS (ε {0.1 * total:g}) + final DP-SGD",
                        total,
                        auc(spec, out.weights, xte[:, cols], yte),
                        len(chosen),
                        time.perf_counter() - t,
                    )
                )
            fit = _fit_total(lambda e, t=total: plan_of(pafs(t, e)), total)
            if fit is None:
                rows.append(("private: PAFS 3 × 2", total, float("nan"), 0, 0.0))
            else:
                e, p = fit
                t = time.perf_counter()
                out = run_selection(
                    pafs(total, e),
                    p,
                    data=train,
                    device=torch.device("cpu"),
                    progress=lambda a, b: None,
                )
                chosen = list(out.selected.features)  # type: ignore[union-attr]
                cols = columns(LAYOUT[0], chosen)
                assert out.weights is not None
                rows.append(
                    (
                        f"private: PAFS 3 × 2 (per-training ε {e:.2g})",
                        total,
                        auc(spec, out.weights, xte[:, cols], yte),
                        len(chosen),
                        time.perf_counter() - t,
                    )
                )
            for r in rows[-4:]:
                print(
                    f"T={total} rep {rep}: {r[0]}: AUC {r[2]:.3f}, {r[3]} cols, {r[4]:.1f}s",
                    flush=True,
                )
    return rows


LAYOUT: list[FeatureLayout] = []


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--workflows", action="store_true", help="also: standard vs private workflows (minutes)"
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    command = "python benchmarks/feature_selection.py " + shlex.join(sys.argv[1:])
    schema = load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())
    data = load_adult()
    train = TabularTrainingSet(data.x_train.float(), data.y_train.float())
    repeats = 2 if args.quick else args.repeats
    epsilons = [0.1, 1.0, 10.0]
    auc_cache: dict = {}

    def plan(method: str, eps: float):  # type: ignore[no-untyped-def]
        request = FeatureRequest(
            method=method,  # type: ignore[arg-type]
            epsilon=eps,
            delta=DELTA,
            ga=GA,
        )
        return request, plan_selection(
            "features",
            request,
            dataset="adult",
            n_rows=train.n,
            n_features=schema.n_features,
            schema=schema,
        )

    _, p0 = plan("cfs_greedy", 1.0)
    layout = p0.features
    assert layout is not None
    LAYOUT.append(layout)
    names = [c.name for c in layout.columns]
    codes, y = discretise(train, layout)
    su_fy, su_ff = su_matrices(count_histograms(codes, y, [c.bins for c in layout.columns]))
    exact = {
        "cfs_greedy": cfs_greedy(su_fy, su_ff),
        "cfs_ga": cfs_ga(
            su_fy,
            su_ff,
            population=GA.population,
            generations=GA.generations,
            mutation_rate=GA.mutation_rate,
            rng=np.random.default_rng(0),
        ),
    }
    rows = []
    for method in ("cfs_greedy", "cfs_ga"):
        picked = [names[i] for i in exact[method]]
        rows.append(
            {
                "method": method,
                "epsilon": None,
                "z": None,
                "cell_std": None,
                "frequency": {n: (1.0 if n in picked else 0.0) for n in names},
                "merit": merit(exact[method], su_fy, su_ff),
                "size": len(picked),
                "auc": downstream_auc(layout, picked, data, auc_cache),
                "seconds": None,
                "typical": picked,
            }
        )
        for eps in epsilons:
            request, p = plan(method, eps)
            assert p.features is not None
            counts: Counter[str] = Counter()
            merits, sizes, aucs, secs, picks = [], [], [], [], []
            for _ in range(repeats):
                t = time.perf_counter()
                out = run_selection(
                    request, p, data=train, device=torch.device("cpu"), progress=lambda a, b: None
                )
                secs.append(time.perf_counter() - t)
                chosen = list(out.selected.features)  # type: ignore[union-attr]
                picks.append(tuple(chosen))
                counts.update(chosen)
                merits.append(merit([names.index(n) for n in chosen], su_fy, su_ff))
                sizes.append(len(chosen))
                aucs.append(downstream_auc(layout, chosen, data, auc_cache))
            rows.append(
                {
                    "method": method,
                    "epsilon": eps,
                    "epsilon_charged": workflow_epsilon(p, delta=DELTA),
                    "z": p.features.noise_multiplier,
                    "cell_std": p.features.cell_scale,
                    "frequency": {n: counts[n] / repeats for n in names},
                    "merit": statistics.median(merits),
                    "size": statistics.median(sizes),
                    "auc": statistics.median(aucs),
                    "seconds": statistics.median(secs),
                    "typical": list(Counter(picks).most_common(1)[0][0]),
                }
            )
            print(
                f"{method} ε={eps}: {rows[-1]['typical']} merit {rows[-1]['merit']:.3f} "
                f"AUC {rows[-1]['auc']:.3f} {rows[-1]['seconds']:.2f}s",
                flush=True,
            )

    all_auc = downstream_auc(layout, names, data, auc_cache)
    lines = [
        "# DP-CFS on Adult: picks at ε = 0.1, 1, 10 vs no noise",
        "",
        f"Command: `{command}` ({repeats} runs per ε; δ = {DELTA:g}; H = {layout.histograms} "
        f"histograms, {layout.cells} noisy cells; n = {train.n}). Shared 2-core machine: "
        "times are indicative.",
        "",
        f"Exact-SU merit of the pick (CFS objective without noise); test AUC of a "
        f"non-private logistic regression on the picked columns (all {len(names)} columns: "
        f"{all_auc:.3f}); most frequent pick.",
        "",
        "| method | ε | z | cell noise std | median size | median exact merit | "
        "median test AUC | median time (s) | most frequent pick |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        eps = "no noise" if r["epsilon"] is None else f"{r['epsilon']:g}"
        z = "—" if r["z"] is None else f"{r['z']:.3g}"
        std = "—" if r["cell_std"] is None else f"{r['cell_std']:.3g}"
        sec = "—" if r["seconds"] is None else f"{r['seconds']:.2f}"
        lines.append(
            f"| {r['method']} | {eps} | {z} | {std} | {r['size']:g} | {r['merit']:.3f} | "
            f"{r['auc']:.3f} | {sec} | {', '.join(r['typical'])} |"
        )
    lines += ["", "Selection frequency per column (fraction of runs picking it):", ""]
    header = (
        "| column | "
        + " | ".join(
            f"{r['method']} {'exact' if r['epsilon'] is None else 'ε=' + format(r['epsilon'], 'g')}"
            for r in rows
        )
        + " |"
    )
    lines += [header, "|---" * (len(rows) + 1) + "|"]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{r['frequency'][n]:.1f}" for r in rows) + " |")
    if args.workflows:
        totals = [1.0] if args.quick else [0.5, 2.0]
        wrows = workflows(
            data,
            schema,
            names,
            [names[i] for i in exact["cfs_greedy"]],
            totals,
            1 if args.quick else 5,
        )
        lines += [
            "",
            "## Workflows at equal total ε (δ = 1e-5), MLP [8], DP-SGD batch 256 × 2 epochs",
            "",
            "Median over the repeats of the test AUC; time = wall time of the workflow.",
            "",
            "| workflow | total ε | median test AUC | columns (median) | median time (s) |",
            "|---|---|---|---|---|",
        ]
        for key in dict.fromkeys((r[0].split(" (per")[0], r[1]) for r in wrows):
            sel = [r for r in wrows if (r[0].split(" (per")[0], r[1]) == key]
            lines.append(
                f"| {key[0]} | {key[1]:g} | {statistics.median(r[2] for r in sel):.3f} | "
                f"{statistics.median(r[3] for r in sel):g} | "
                f"{statistics.median(r[4] for r in sel):.1f} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.no_write:
        return
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "feature_selection.md").write_text(text)
    (RESULTS / "feature_selection.json").write_text(
        json.dumps({"command": command, "rows": rows}, indent=2) + "\n"
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    grid = np.array([[r["frequency"][n] for r in rows] for n in names])
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_yticks(range(len(names)), names)
    ax.set_xticks(
        range(len(rows)),
        [
            f"{'greedy' if r['method'] == 'cfs_greedy' else 'GA'}\n"
            + ("exact" if r["epsilon"] is None else f"ε={r['epsilon']:g}")
            for r in rows
        ],
    )
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=7)
    ax.set_title(f"DP-CFS on Adult: selection frequency over {repeats} runs (δ = 1e-5)")
    fig.tight_layout()
    fig.savefig(RESULTS / "feature_selection.png", dpi=120)


if __name__ == "__main__":
    main()
