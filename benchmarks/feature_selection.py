"""DP correlation-based feature selection on UCI Adult: which columns DP-CFS picks at
ε = 0.1, 1, 10 (δ = 1e-5) against no noise, how good the picks are, and the time.

* The ``features`` selection job as the worker runs it: plan from
  service.selection_plans.plan_selection (one Gaussian on all H = 13 + 78 = 91
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
* Time: wall time of one worker run (discretise, count, noise, search), median over the
  repeats; noisy machine (shared CPU), compare within one run.

    .venv/bin/python benchmarks/feature_selection.py            # ≈ 1–2 min on 2 cores
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

from service.dataschema import load_schema_yaml  # noqa: E402
from service.feature_selection import FeatureGa, FeatureLayout, FeatureRequest  # noqa: E402
from service.selection_plans import plan_selection, workflow_epsilon  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-write", action="store_true")
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
