"""DP-SGD with constant noise against the decaying schedule at equal ε, on Adult, one run.

Issue 12 asks for the AUC of constant and decaying noise (Zhang, Ding, Wu, Wong, Nguyen &
Pan 2021: σ_e² = σ₀²·R^e per epoch e) at ε ∈ {0.01, 0.1, 1, 10}, δ = 1e-5, "report what
you find". Both use the plan the service builds (the decaying one calibrates σ₀ on the
whole heterogeneous history, service/privacy/schedules.py), the same batch (256), epochs
(``--epochs``), learning rate and clipping, and the product's DP-SGD worker. Test AUC on
adult.test, the median of ``--repeats`` releases per cell.

    .venv/bin/python benchmarks/dpsgd_schedule.py [--repeats 5] [--epochs 10] [--decay 0.8]

Results: benchmarks/results/dpsgd_schedule.{md,json,png}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402
from expm_proven import auc  # noqa: E402

from service.plans import build_plan  # noqa: E402
from service.schemas import JobRequest  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.dpsgd import run_dpsgd  # noqa: E402

EPSILONS = (0.01, 0.1, 1.0, 10.0)
DELTA = 1e-5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--decay", type=float, default=0.8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    command = "python benchmarks/dpsgd_schedule.py " + shlex.join(sys.argv[1:])
    data = load_adult()
    n, d = data.x_train.shape
    train = TabularTrainingSet(data.x_train.float(), data.y_train.float())
    rows = []
    for eps in EPSILONS:
        for schedule in ("constant", "exponential"):
            options: dict[str, object] = {"batch_size": 256, "epochs": args.epochs}
            if schedule == "exponential":
                options |= {"noise_schedule": "exponential", "noise_decay": args.decay}
            request = JobRequest.model_validate(
                {
                    "dataset": "adult",
                    "method": "dpsgd",
                    "epsilon": eps,
                    "delta": DELTA,
                    "dpsgd": options,
                }
            )
            plan = build_plan(request, n_rows=n, n_features=d)
            aucs = []
            for _ in range(args.repeats):
                out = run_dpsgd(
                    spec=request.model,
                    mechanism=plan.mechanism,
                    samples=1,
                    data=train,
                    device=torch.device("cpu"),
                    progress=lambda a, b: None,
                )
                aucs.append(auc(out.releases[0], data.x_test, data.y_test))
            sigmas = plan.mechanism.get("noise_multipliers") or [plan.mechanism["noise_multiplier"]]
            row = {
                "epsilon": eps,
                "schedule": schedule,
                "sigma_first": sigmas[0],
                "sigma_last": sigmas[-1],
                "steps": plan.mechanism["steps"],
                "auc_median": statistics.median(aucs),
                "auc_min": min(aucs),
                "auc_max": max(aucs),
            }
            rows.append(row)
            print(
                f"ε={eps:g} {schedule:11s} σ {row['sigma_first']:.4g} → {row['sigma_last']:.4g} "
                f"AUC median {row['auc_median']:.4f} [{row['auc_min']:.4f}, {row['auc_max']:.4f}]",
                flush=True,
            )
    if args.no_write:
        return
    out_dir = ROOT / "benchmarks/results"
    meta = {"command": command, "repeats": args.repeats, "rows": rows}
    (out_dir / "dpsgd_schedule.json").write_text(json.dumps(meta, indent=2) + "\n")
    lines = [
        "# DP-SGD: constant vs decaying noise at equal ε (Adult, logistic regression)",
        "",
        f"Command: `{command}` (batch 256, {args.epochs} epochs, decay R = {args.decay} per "
        f"epoch, δ = {DELTA:g}, {args.repeats} releases per cell, test AUC on adult.test).",
        "",
        "| ε | schedule | σ first epoch | σ last epoch | AUC median | AUC min–max |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['epsilon']:g} | {r['schedule']} | {r['sigma_first']:.4g} | "
            f"{r['sigma_last']:.4g} | {r['auc_median']:.4f} | "
            f"{r['auc_min']:.4f}–{r['auc_max']:.4f} |"
        )
    (out_dir / "dpsgd_schedule.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for schedule in ("constant", "exponential"):
        pts = [r for r in rows if r["schedule"] == schedule]
        ax.plot([r["epsilon"] for r in pts], [r["auc_median"] for r in pts], "o-", label=schedule)
    ax.set_xscale("log")
    ax.set_xlabel("ε (δ = 1e-5)")
    ax.set_ylabel("test AUC (median)")
    ax.set_title(f"DP-SGD noise schedules, Adult (R = {args.decay})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "dpsgd_schedule.png", dpi=120)


if __name__ == "__main__":
    main()
