"""Every job kind's measured worker time against its public time estimate
(service/resources.py ``plan_resources``, which the release hold's D is made from:
service/release_hold.py).

Each case plans a real request on the bundled datasets' public schemas (Adult; the ICU
sample for GRU-D), runs the worker's own code for it on the bundled rows (the rows loaded
and encoded as a job loads them, from a temporary data folder) and prints the wall time
next to the estimate: DP-SGD (logistic, MLP), ExpM by MCMC, ExpM+NF (logistic planar and
Sylvester on a domain of radius 10, which skips the enclave-only fidelity check: its MCMC
reference is the MCMC case's sampler, 44,800 gradient passes over the rows, ~15 min here;
MLP planar; GRU-D), an evaluation (holdout load,
scoring, the noisy metrics; logistic, MLP, GRU-D) and a features selection's statistics
stage (cfs_greedy). Steps are cut from the defaults so the run fits a few minutes; the
estimates are linear in them. Timings on a shared machine are noisy: each case runs
``--repeats`` times, interleaved, and the table shows the smallest and largest time.

    .venv/bin/python benchmarks/job_estimates.py [--repeats 2]

Writes benchmarks/results/job_estimates.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.datasets.kinds import load_schema_yaml, parse_dataset_schema  # noqa: E402
from service.evaluations import evaluation_plan, plan_evaluation_job  # noqa: E402
from service.modelspec import MODEL_SPEC  # noqa: E402
from service.plans import plan_for_dataset  # noqa: E402
from service.resources import plan_resources  # noqa: E402
from service.schemas import JobRequest, PrivacyPlan  # noqa: E402
from worker.data import (  # noqa: E402
    load_holdout,
    load_training_set,
    prepare_dataset,
    split_holdout,
    store_holdout,
    store_prepared,
)
from worker.evaluation_job import run_evaluation  # noqa: E402
from worker.mechanisms.registry import run_mechanism  # noqa: E402
from worker.models import build_module  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CPU = torch.device("cpu")

_NF = {"epsilon": 1.0, "delta": 0.0, "method": "expm_nf"}
SAMPLER_CASES: list[tuple[str, str, dict[str, Any]]] = [
    (
        "expm mcmc logistic, 8 chains 10+10 it, 8 leapfrog",
        "adult",
        {
            "epsilon": 1.0,
            "delta": 1e-5,
            "method": "expm",
            "expm": {"sampler": "mcmc", "steps": 10, "warmup": 10, "leapfrog_steps": 8},
        },
    ),
    (
        "expm_nf logistic planar, 100 steps, R=10 (no fidelity check)",
        "adult",
        {**_NF, "expm_nf": {"steps": 100, "domain_radius": 10.0}},
    ),
    (
        "expm_nf mlp [16] planar, 20 steps",
        "adult",
        {**_NF, "model": {"kind": "mlp", "hidden": [16]}, "expm_nf": {"steps": 20}},
    ),
    (
        "expm_nf logistic sylvester, 50 steps, R=10",
        "adult",
        {**_NF, "expm_nf": {"steps": 50, "flow": "sylvester", "domain_radius": 10.0}},
    ),
    (
        "expm_nf grud H=16, 20 steps",
        "icu",
        {**_NF, "model": {"kind": "grud", "hidden": 16}, "expm_nf": {"steps": 20}},
    ),
]
"""The samplers' cases (name, bundled dataset, request body): steps cut from the defaults
(benchmarks/gpu_methods.py runs the same cases on CPU and CUDA)."""


def _dataset(folder: Path, name: str, holdout: int) -> tuple[dict[str, Any], int]:
    """Store a bundled dataset (training rows and a holdout of ``holdout`` rows) in
    ``folder`` as registration does; its public schema and its training rows' count."""
    base = ROOT / "examples" / name
    schema = load_schema_yaml((base / "schema.yaml").read_text())
    if name == "adult":
        prepared = prepare_dataset(schema, base / "adult.data.gz")
    else:
        prepared = prepare_dataset(schema, base / "observations.csv.gz", base / "outcomes.csv.gz")
    train, held = split_holdout(
        schema, prepared, holdout_rows=holdout, rng=np.random.default_rng(0)
    )
    store_prepared(folder, schema, train)
    store_holdout(folder, schema, held)
    return schema.model_dump(mode="json"), int(train.report.rows_kept) - holdout


def _request(body: dict[str, Any]) -> JobRequest:
    return JobRequest.model_validate({"dataset": "bench", **body})


def _estimate(plan: PrivacyPlan, schema: dict[str, Any]) -> float:
    seconds = plan_resources(plan, schema=parse_dataset_schema(schema)).seconds
    assert seconds is not None and seconds > 0, plan.method
    return seconds


def _training(folder: Path, schema: dict[str, Any], plan: PrivacyPlan) -> Callable[[], None]:
    spec = MODEL_SPEC.validate_python(plan.model)

    def run() -> None:
        data = load_training_set(folder, schema, CPU, before_first_read=lambda: None)
        run_mechanism(plan=plan, spec=spec, data=data, device=CPU, progress=lambda a, b: None)

    return run


def _evaluation(
    folder: Path, schema: dict[str, Any], model: dict[str, Any], holdout: int
) -> tuple[PrivacyPlan, Callable[[], None]]:
    request = _request(
        {
            "method": "evaluation",
            "model": model,
            "epsilon": 1.0,
            "delta": 0.0,
            "evaluation": {
                "job_id": "bench",
                "sample": 0,
                "metrics": ["accuracy", "log_loss", "auc", "calibration_error"],
                "noise": "laplace",
                "confidence": 0.95,
            },
        }
    )
    plan = plan_evaluation_job(request, holdout_rows=holdout, public_schema=schema)
    stats = evaluation_plan(request, holdout_rows=holdout, public_schema=schema)
    spec = MODEL_SPEC.validate_python(model)
    parsed = parse_dataset_schema(schema)
    means = getattr(parsed, "scaled_means", None)

    def run() -> None:
        module = build_module(spec, parsed.n_features, public_means=means)
        data = load_holdout(folder, schema, CPU, before_first_read=lambda: None)
        run_evaluation(plan=stats, module=module, data=data)

    return plan, run


def _features(folder: Path, schema: dict[str, Any], n_rows: int) -> tuple[PrivacyPlan, Any]:
    from service.selection.api_bodies import SelectionRequest, job_request, plan_selection_job
    from service.selection.features import FeatureRequest
    from service.selection.kinds import plan_selection
    from worker.mechanisms.model_selection import run_selection

    body = {"kind": "features", "epsilon": 1.0, "delta": 1e-6, "method": "cfs_greedy"}
    selection = SelectionRequest.model_validate({"dataset": "bench", **body}).root
    request = job_request(selection, n_rows=n_rows, public_schema=schema)
    _, plan = plan_selection_job(request, n_rows=n_rows, public_schema=schema)
    parsed = parse_dataset_schema(schema)
    feature_request = FeatureRequest(method="cfs_greedy", epsilon=1.0, delta=1e-6)
    worker_plan = plan_selection(
        "features",
        feature_request,
        dataset="bench",
        n_rows=n_rows,
        n_features=parsed.n_features,
        schema=parsed,
    )

    def run() -> None:
        data = load_training_set(folder, schema, CPU, before_first_read=lambda: None)
        run_selection(
            feature_request, worker_plan, data=data, device=CPU, progress=lambda a, b: None
        )

    return plan, run


def cases(folder: Path) -> list[tuple[str, PrivacyPlan, dict[str, Any], Callable[[], None]]]:
    adult, n_adult = _dataset(folder, "adult", 3000)
    icu, n_icu = _dataset(folder, "icu", 400)
    out: list[tuple[str, PrivacyPlan, dict[str, Any], Callable[[], None]]] = []

    def training(name: str, schema: dict[str, Any], n: int, body: dict[str, Any]) -> None:
        plan = plan_for_dataset(_request(body), n_rows=n, public_schema=schema)
        out.append((name, plan, schema, _training(folder, schema, plan)))

    dp = {"epsilon": 1.0, "delta": 1e-5}
    training(
        "dpsgd logistic, 1 epoch B=256",
        adult,
        n_adult,
        {**dp, "method": "dpsgd", "dpsgd": {"epochs": 1, "batch_size": 256}},
    )
    training(
        "dpsgd mlp [64, 64], 1 epoch B=256",
        adult,
        n_adult,
        {
            **dp,
            "method": "dpsgd",
            "model": {"kind": "mlp", "hidden": [64, 64]},
            "dpsgd": {"epochs": 1, "batch_size": 256},
        },
    )
    for name, dataset, body in SAMPLER_CASES:
        training(
            name, icu if dataset == "icu" else adult, n_icu if dataset == "icu" else n_adult, body
        )
    for name, schema, model, holdout in (
        ("evaluation logistic, 3000 rows", adult, {"kind": "logistic"}, 3000),
        (
            "evaluation mlp [256, 256, 256], 3000 rows",
            adult,
            {"kind": "mlp", "hidden": [256, 256, 256]},
            3000,
        ),
        ("evaluation grud H=16, 400 stays", icu, {"kind": "grud", "hidden": 16}, 400),
    ):
        plan, run = _evaluation(folder, schema, model, holdout)
        out.append((name, plan, schema, run))
    plan, run = _features(folder, adult, n_adult)
    out.append(("features cfs_greedy statistics", plan, adult, run))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default="", help="run only cases whose name contains this")
    args = ap.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        todo = [c for c in cases(Path(tmp)) if args.only in c[0]]
        times: dict[str, list[float]] = {c[0]: [] for c in todo}
        loads = [os.getloadavg()[0]]
        for _ in range(args.repeats):
            for name, _plan, _schema, run in todo:
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
                print(name, f"{times[name][-1]:.2f}", flush=True)
            loads.append(os.getloadavg()[0])
    cmd = "python " + " ".join(["benchmarks/job_estimates.py", *sys.argv[1:]])
    lines = [
        "# Every job kind's worker time: measured vs the public estimate",
        "",
        f"Command: `{cmd}`. Machine: {platform.machine()}, {os.cpu_count()} cores, 2 torch "
        f"threads, CPU, torch {torch.__version__}; shared with other jobs while measured "
        f"(1-minute load average {min(loads):.1f} to {max(loads):.1f}).",
        "",
        "| case | estimate s | measured s (min–max) | estimate ÷ slowest | estimate ÷ fastest |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, plan, schema, _run in todo:
        est = _estimate(plan, schema)
        lo, hi = min(times[name]), max(times[name])
        lines.append(
            f"| {name} | {est:.3g} | {lo:.3g}–{hi:.3g} | {est / hi:.2f} | {est / lo:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.only:
        (RESULTS / "job_estimates.md").write_text(text)


if __name__ == "__main__":
    main()
