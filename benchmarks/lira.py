"""LiRA membership inference against the product's releases (issue 22, point 3).

What "nominal" (ExpM+NF) means to an admin, measured: for each configuration and ε, M
logistic-regression models are trained through the product's own mechanisms
(worker.mechanisms.registry.run_mechanism, under the plan the API builds for the request
and the pool's expected training size n/2) on random halves of a PUBLIC pool (rows of the
bundled Adult training file), and attacked with online LiRA (Carlini et al. 2022,
leave-one-out: each model a target, the others its shadows; worker/lira.py). Reported per
row: TPR at 0.1 % and 1 % FPR over all (target, row) pairs, the AUC, the ε lower bound of
the held-out threshold test (ε ≥ log((TPR_lo − δ)/FPR_hi), Clopper–Pearson at 95 %,
Bonferroni over the two levels; Kairouz et al. 2015 Thm 2.1, Jagielski et al. 2020) with the
largest bound that test could show (its ceiling), and the proven one-run bound (Steinke,
Nasr & Jagielski 2023 Thm 3.1) on one held-out target with its ceiling.

The anchor, in the same run: ``nonprivate`` (worker.lira.nonprivate_trainer, Newton's
method, l2 = 1e-3; benchmark and tests only) — what the same attack finds with no noise.
TPR columns are also given as a ratio to the anchor's TPR at the same FPR.

Power: with M models and a pool of n rows the held-out test counts about M·n/4 members and
as many non-members; the ceiling column says the most it can show. A bound of 0 is NOT
evidence of privacy, and the pairs of one target are not independent (worker/lira.py), so
the CP-based bound is the figure LiRA papers report, not a certificate.

    .venv/bin/python benchmarks/lira.py [--pool 1000] [--models 32] [--slow-models 8]
        [--epsilons 1,4] [--configs nonprivate,dpsgd,expm,expm_nf] [--seed 0]

(``--slow-models``: M for expm_nf and expm_mcmc, whose trainings take ~1 min each on CPU.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker.lira import (  # noqa: E402
    LiraResult,
    adult_pool,
    nonprivate_trainer,
    run_lira,
    run_lira_configuration,
)

DELTA = 1e-5
SLOW = ("expm_nf", "expm_mcmc")


def row(r: LiraResult) -> dict[str, Any]:
    return {
        "configuration": r.configuration,
        "epsilon": None if math.isnan(r.epsilon) else r.epsilon,  # None: the anchor
        "delta": r.delta,
        "models": r.models,
        "pool": r.pool,
        "auc": r.auc,
        "points": [
            {
                "target_fpr": p.target_fpr,
                "tpr": p.tpr,
                "fpr": p.fpr,
                "held_out_tpr": [p.held_out_tpr.lower, p.held_out_tpr.upper],
                "held_out_tp": [p.bound.hits_world1, p.bound.runs_world1],
                "held_out_fp": [p.bound.hits_world0, p.bound.runs_world0],
                "held_out_fpr": [p.held_out_fpr.lower, p.held_out_fpr.upper],
                "epsilon_lower_bound": p.bound.epsilon,
            }
            for p in r.points
        ],
        "epsilon_lower_bound": r.epsilon_lower_bound,
        "ceiling": r.ceiling,
        "one_run": {
            "epsilon": r.one_run.epsilon,
            "ceiling": r.one_run.ceiling,
            "guesses": r.one_run.guesses,
            "correct": r.one_run.correct,
        },
        "fixed_variance": r.fixed_variance,
        "plan": r.plan,
        "train_seconds_per_model": r.train_seconds / r.models,
        "seconds": r.seconds,
    }


def write(results: dict[str, Any], stem: Path) -> None:
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    rows = results["rows"]
    anchor = {p["target_fpr"]: p["tpr"] for p in rows[0]["points"]} if rows else {}
    lines = [
        "# LiRA membership inference against the product's releases",
        "",
        f"Command: `{results['command']}`  ",
        f"Commit: {results['commit']}; load average before / after: "
        f"{results['load_before']} / {results['load_after']} (2 cores, shared); "
        f"pool: {results['pool_source']}; δ = {DELTA:g} (0 for expm_nf, a pure-ε method); "
        "95 % confidence.",
        "",
        "TPR@x: over all (target, row) pairs, threshold on the same scores (as Carlini et al. "
        "report; ×anchor: ratio to the non-private anchor's TPR at that FPR). ε_lb: the "
        "held-out test's bound (max over the two FPR levels, Bonferroni), beside the ceiling "
        "that test could show; one-run: the proven Steinke et al. bound on one held-out "
        "target (v of r guesses right), beside its ceiling. A bound of 0 is not evidence of "
        "privacy: read it against the ceiling.",
        "",
        "| config | ε | M | AUC | TPR@0.1% (×anchor) | TPR@1% (×anchor) | held-out TP/FP @1% "
        "| ε_lb (ceiling) | one-run ε_lb (ceiling), v/r | s/model |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p1, p2 = r["points"]
        eps = "—" if r["configuration"] == "nonprivate" else f"{r['epsilon']:g}"
        lines.append(
            f"| {r['configuration']} | {eps} | {r['models']} | {r['auc']:.3f} "
            f"| {p1['tpr']:.4f} ({p1['tpr'] / max(anchor[0.001], 1e-12):.2f}) "
            f"| {p2['tpr']:.4f} ({p2['tpr'] / max(anchor[0.01], 1e-12):.2f}) "
            f"| {p2['held_out_tp'][0]}/{p2['held_out_tp'][1]}, "
            f"{p2['held_out_fp'][0]}/{p2['held_out_fp'][1]} "
            f"| {r['epsilon_lower_bound']:.2f} ({r['ceiling']:.2f}) "
            f"| {r['one_run']['epsilon']:.2f} ({r['one_run']['ceiling']:.2f}), "
            f"{r['one_run']['correct']}/{r['one_run']['guesses']} "
            f"| {r['train_seconds_per_model']:.2f} |"
        )
    lines += ["", f"Total: {results['seconds']:.0f} s.", ""]
    stem.with_suffix(".md").write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", type=int, default=1000)
    ap.add_argument("--models", type=int, default=32)
    ap.add_argument("--slow-models", type=int, default=8)
    ap.add_argument("--epsilons", default="1,4")
    ap.add_argument("--configs", default="nonprivate,dpsgd,expm,expm_nf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/lira"))
    args = ap.parse_args()
    start = time.perf_counter()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    pool = adult_pool(args.pool, seed=args.seed)
    results: dict[str, Any] = {
        "command": "python benchmarks/lira.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "load_before": f"{os.getloadavg()[0]:.1f}",
        "pool_source": pool.source,
        "rows": [],
    }
    configs = args.configs.split(",")
    if configs[0] != "nonprivate":
        raise SystemExit("the first configuration must be the anchor, nonprivate")
    for name in configs:
        for eps in [float("nan")] if name == "nonprivate" else map(float, args.epsilons.split(",")):
            models = args.slow_models if name in SLOW else args.models
            if name == "nonprivate":
                r = run_lira(
                    pool=pool,
                    train=nonprivate_trainer(),
                    models=models,
                    delta=DELTA,
                    configuration=name,
                    seed=args.seed,
                )
            else:
                r = run_lira_configuration(
                    name, epsilon=eps, delta=DELTA, models=models, pool=pool, seed=args.seed
                )
            results["rows"].append(row(r))
            print(json.dumps(results["rows"][-1]), flush=True)
            results["load_after"] = f"{os.getloadavg()[0]:.1f}"
            results["seconds"] = time.perf_counter() - start
            write(results, Path(args.out))


if __name__ == "__main__":
    main()
