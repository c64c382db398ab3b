"""DP-SGD's measured worker time against its quote-time estimate
(service/methods/dpsgd.py, asked by service/resources.py).

Each case plans a real DP-SGD request (tabular: logistic and MLPs on d = 104 features, as
Adult; time series: GRU-D on the bundled ICU schema, T = 48 hourly steps, V = 8), runs the
worker's own DP-SGD (worker.mechanisms.dpsgd.run_dpsgd) on synthetic rows of the same
shapes for the plan's steps, and prints seconds per step next to
``service.methods.dpsgd.dpsgd_seconds``'s estimate. The estimate's constants are set
from these figures with a margin (see service/methods/dpsgd.py); this script is how they
were measured.

    .venv/bin/python benchmarks/dpsgd_work.py [--steps 8]

Writes benchmarks/results/dpsgd_work.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.methods.dpsgd import dpsgd_seconds  # noqa: E402
from service.plans import build_plan, plan_for_dataset  # noqa: E402
from service.schemas import JobRequest, PrivacyPlan  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.dpsgd import run_dpsgd  # noqa: E402
from worker.synthetic_icu import generate_icu  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ICU_SCHEMA = yaml.safe_load((ROOT / "examples" / "icu" / "schema.yaml").read_text())
TABULAR = [
    ("logistic", {"kind": "logistic"}, 64),
    ("logistic", {"kind": "logistic"}, 256),
    ("mlp [64, 64]", {"kind": "mlp", "hidden": [64, 64]}, 256),
    ("mlp [256, 256, 256]", {"kind": "mlp", "hidden": [256, 256, 256]}, 256),
]
SERIES = [
    ("grud H=16", {"kind": "grud", "hidden": 16}, 16),
    ("grud H=16", {"kind": "grud", "hidden": 16}, 64),
    ("grud H=64", {"kind": "grud", "hidden": 64}, 64),
]


def request(model: dict, batch: int) -> JobRequest:
    return JobRequest.model_validate(
        {
            "dataset": "bench",
            "method": "dpsgd",
            "model": model,
            "epsilon": 1.0,
            "delta": 1e-5,
            "dpsgd": {"epochs": 1, "batch_size": batch},
        }
    )


def measure(plan: PrivacyPlan, data: TabularTrainingSet) -> float:
    """Seconds per step of the worker's DP-SGD on `data` (after a 2-step warm-up)."""
    from pydantic import TypeAdapter

    from service.modelspec import ModelSpec

    spec = TypeAdapter(ModelSpec).validate_python(plan.model)
    warm = {**plan.mechanism, "steps": 2}
    kw = {"spec": spec, "samples": 1, "data": data, "device": torch.device("cpu")}
    run_dpsgd(mechanism=warm, progress=lambda k, t: None, **kw)  # type: ignore[arg-type]
    t = time.perf_counter()
    run_dpsgd(mechanism=plan.mechanism, progress=lambda k, t: None, **kw)  # type: ignore[arg-type]
    return (time.perf_counter() - t) / int(plan.mechanism["steps"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8, help="steps per case (n = steps·batch)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    for name, model, batch in TABULAR:
        n = args.steps * batch
        plan = build_plan(request(model, batch), n_rows=n, n_features=104)
        data = TabularTrainingSet(torch.rand(n, 104), (torch.rand(n) > 0.5).float())
        rows.append((name, batch, plan, measure(plan, data), dpsgd_seconds(plan)))
        print(rows[-1][0], rows[-1][1], rows[-1][3], rows[-1][4], flush=True)
    steps_t = int(ICU_SCHEMA["grid"]["steps"])
    for name, model, batch in SERIES:
        n = args.steps * batch
        plan = plan_for_dataset(request(model, batch), n_rows=n, public_schema=ICU_SCHEMA)
        series = generate_icu(n, hours=steps_t, rng=np.random.default_rng(0))
        data = TabularTrainingSet(
            torch.tensor(series.packed()),
            torch.tensor(series.labels, dtype=torch.float32),
            public_means=tuple(series.schema.scaled_means),
        )
        est = dpsgd_seconds(plan, series_steps=steps_t)
        rows.append((name, batch, plan, measure(plan, data), est))
        print(rows[-1][0], rows[-1][1], rows[-1][3], rows[-1][4], flush=True)

    cmd = "python " + " ".join(["benchmarks/dpsgd_work.py", *sys.argv[1:]])
    lines = [
        "# DP-SGD worker time: measured vs the quote-time estimate",
        "",
        f"Command: `{cmd}`. Machine: {platform.machine()}, 2 torch threads, CPU, "
        f"torch {torch.__version__}; shared with other jobs while measured (noisy).",
        "",
        "| model | expected batch | parameters | steps | measured s/step | estimate s/step "
        "| estimate ÷ measured |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, batch, plan, per_step, est in rows:
        steps = int(plan.mechanism["steps"])
        lines.append(
            f"| {name} | {batch} | {plan.mechanism['parameters']} | {steps} | "
            f"{per_step:.4f} | {est / steps:.4f} | {est / steps / per_step:.1f} |"
        )
    ratios = [est / int(p.mechanism["steps"]) / s for _, _, p, s, est in rows]
    lines += [
        "",
        f"Estimate ÷ measured: {min(ratios):.1f}× to {max(ratios):.1f}×. The estimate is a "
        "ceiling with a margin for a busier or slower machine (service/methods/dpsgd.py), used "
        "to refuse at quote time plans that could not finish within ENCLAVE_JOB_TIME_LIMIT_S.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dpsgd_work.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
