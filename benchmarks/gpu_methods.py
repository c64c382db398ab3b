"""Every method's worker time on the CPU and on a CUDA GPU, in one run on one machine.

Each case plans a real request on a bundled dataset's public schema (Adult; the ICU sample
for GRU-D; the digits images for the CNN), loads the rows as a job loads them
(``worker.data.load_training_set`` onto the device; the digits as
benchmarks/digits_data.py encodes them) and runs the worker's own entry point for it
(``run_mechanism``, ``run_selection``, ``run_evaluation``) with ``device`` = cpu, then
cuda. Stock Opacus 1.6 (hooks; Poisson sampling; the product plan's σ, clip, batch, steps
and learning rate) is the anchor for DP-SGD on the MLP and the CNN: a ratio product /
Opacus is read only inside one device's column. Steps are cut from the defaults so that
the whole run fits a few minutes of a lent GPU machine.

Every case runs ``--repeats`` times per device; the first run of a device includes its
one-off costs (CUDA context, kernel compilation, numba JIT), so the table reports the first
and the fastest run. A case that fails on a device reports its error's type and first line
instead of a time (the error is the finding: nothing here is caught to hide it).

    python benchmarks/gpu_methods.py --repeats 2 [--only NAME] [--out DIR]

Writes DIR/gpu_methods.md and DIR/gpu_methods.json (DIR: benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from digits_data import generated_sets, load_digits_set  # noqa: E402
from job_estimates import SAMPLER_CASES, _dataset, _request  # noqa: E402
from job_estimates import _evaluation as job_evaluation  # noqa: E402

from service.modelspec import MODEL_SPEC  # noqa: E402
from service.plans import plan_for_dataset  # noqa: E402
from service.schemas import PrivacyPlan  # noqa: E402
from worker.data import load_training_set  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.registry import run_mechanism  # noqa: E402
from worker.models import build_module  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
EVALUATION = "evaluation mlp [256]x3, 3000 rows"
CPU_ONLY = {EVALUATION}  # the worker scores a release on the CPU (worker/runner.py)
Run = Callable[[torch.device], object]
CONV = [
    {"channels": 16, "kernel": 3, "padding": 1, "pool": "avg2"},
    {"channels": 32, "kernel": 3, "padding": 1, "pool": "avg2"},
]


def _quiet(*_: object) -> None:
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _opacus(plan: PrivacyPlan, data: Callable[[torch.device], TabularTrainingSet]) -> Run:
    """Stock Opacus 1.6 on the plan's model and DP-SGD parameters (hooks, Poisson sampling,
    σ, clip, expected batch, steps, SGD at the plan's learning rate on the mean loss)."""
    from opacus import PrivacyEngine

    spec = MODEL_SPEC.validate_python(plan.model)
    m = plan.mechanism

    def run(device: torch.device) -> object:
        train = data(device)
        x, y = train.x, train.y
        classes = int(plan.model.get("classes") or 2)
        module = build_module(spec, x.shape[1]).to(device)
        optimizer = torch.optim.SGD(module.parameters(), lr=float(m["learning_rate"]))
        batch = max(1, round(float(m["sampling_rate"]) * len(x)))
        target = y.long() if classes > 2 else y.float()
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, target), batch_size=batch
        )
        engine = PrivacyEngine(accountant="rdp")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer, loader = engine.make_private(
                module=module,
                optimizer=optimizer,
                data_loader=loader,
                noise_multiplier=float(m["noise_multiplier"]),
                max_grad_norm=float(m.get("max_grad_norm", 1.0)),
                poisson_sampling=True,
            )
        if classes > 2:
            loss: Callable[..., torch.Tensor] = torch.nn.CrossEntropyLoss()
        else:
            bce = torch.nn.BCEWithLogitsLoss()

            def loss(out: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
                return bce(out.reshape(-1), yb)

        steps = 0
        while steps < int(m["steps"]):
            for xb, yb in loader:
                if steps == int(m["steps"]):
                    break
                optimizer.zero_grad()
                if len(xb):
                    loss(model(xb), yb).backward()
                optimizer.step()
                steps += 1
        return module

    return run


def cases(folder: Path) -> list[tuple[str, Run]]:
    adult, n_adult = _dataset(folder, "adult", 3000)
    icu, n_icu = _dataset(folder, "icu", 400)
    digits = load_digits_set()
    colour, _ = generated_sets(10_000, 1, (32, 32, 3))
    out: list[tuple[str, Run]] = []

    def rows(schema: dict[str, Any]) -> Callable[[torch.device], TabularTrainingSet]:
        for images in (digits, colour):
            if schema is images.public:
                x, y = images.data.x, images.data.y
                return lambda d: TabularTrainingSet(x=x.to(d), y=y.to(d))
        schema = {k: v for k, v in schema.items() if k != "max_rows"}
        return lambda d: load_training_set(folder, schema, d, before_first_read=lambda: None)

    def plan_of(schema: dict[str, Any], n: int, body: dict[str, Any]) -> PrivacyPlan:
        return plan_for_dataset(_request(body), n_rows=n, public_schema=schema)

    def training(name: str, schema: dict[str, Any], n: int, body: dict[str, Any]) -> PrivacyPlan:
        plan = plan_of(schema, n, body)
        spec = MODEL_SPEC.validate_python(plan.model)
        data = rows(schema)

        def run(device: torch.device) -> object:
            return run_mechanism(
                plan=plan, spec=spec, data=data(device), device=device, progress=_quiet
            )

        out.append((name, run))
        return plan

    dp = {"epsilon": 1.0, "delta": 1e-5, "method": "dpsgd"}
    one = {"epochs": 1, "batch_size": 256}
    mlp = {"kind": "mlp", "hidden": [64, 64]}
    engines: dict[str, dict[str, Any]] = {
        "exact": {"engine": "exact"},
        "ghost": {"engine": "ghost"},
        "jl r=5": {"engine": "jl", "jl_projections": 5},
    }
    for engine, options in engines.items():
        training(
            f"dpsgd logistic {engine}, 1 epoch", adult, n_adult, {**dp, "dpsgd": {**one, **options}}
        )
    for engine, options in engines.items():
        plan = training(
            f"dpsgd mlp [64, 64] {engine}, 1 epoch",
            adult,
            n_adult,
            {**dp, "model": mlp, "dpsgd": {**one, **options}},
        )
        if engine == "exact":
            out.append(("opacus mlp [64, 64] (anchor), 1 epoch", _opacus(plan, rows(adult))))
    training(
        "dpsgd mlp [64, 64] exact, decaying noise, 2 epochs",
        adult,
        n_adult,
        {
            **dp,
            "model": mlp,
            "dpsgd": {
                "epochs": 2,
                "batch_size": 256,
                "noise_schedule": "exponential",
                "noise_decay": 0.5,
            },
        },
    )
    training(
        "dpsgd grud H=16, 1 epoch",
        icu,
        n_icu,
        {**dp, "model": {"kind": "grud", "hidden": 16}, "dpsgd": {"epochs": 1}},
    )
    cnn = {"kind": "cnn", "conv": CONV}
    plan = training(
        "dpsgd cnn digits, 2 epochs",
        digits.public,
        len(digits.x),
        {**dp, "model": cnn, "dpsgd": {"epochs": 2}},
    )
    out.append(("opacus cnn digits (anchor), 2 epochs", _opacus(plan, rows(digits.public))))
    plan = training(
        "dpsgd cnn 32x32x3 generated, 10,000 rows, 1 epoch",
        colour.public,
        10_000,
        {**dp, "model": cnn, "dpsgd": {"epochs": 1}},
    )
    out.append(("opacus cnn 32x32x3 (anchor), 1 epoch", _opacus(plan, rows(colour.public))))
    expm = {"epsilon": 1.0, "delta": 1e-5, "method": "expm"}
    training(
        "expm langevin, composition, 200 steps",
        adult,
        n_adult,
        {**expm, "expm": {"steps": 200, "accounting": "composition"}},
    )
    capped = {**adult, "max_rows": n_adult + n_adult // 20}  # the hidden charge needs a cap
    training(
        "expm langevin, hidden iterates (default plan)",
        capped,
        n_adult,
        {**expm, "expm": {"accounting": "hidden"}},
    )
    for name, dataset, body in SAMPLER_CASES:  # MCMC and ExpM+NF, as job_estimates.py's
        training(
            name, icu if dataset == "icu" else adult, n_icu if dataset == "icu" else n_adult, body
        )
    for kind, body in (
        ("features cfs_greedy", {"kind": "features", "method": "cfs_greedy"}),
        (
            "hyperparameters, logistic, 2 lr",
            {
                "kind": "hyperparameters",
                "model": {"kind": "logistic"},
                "learning_rates": [0.5, 2.0],
                "batch_sizes": [256],
                "epochs": [1],
                "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.5},
            },
        ),
    ):
        out.append((f"selection {kind}", _selection(body, adult, n_adult, rows(adult))))
    holdout_model = {"kind": "mlp", "hidden": [256, 256, 256]}
    out.append((EVALUATION, _evaluation(folder, adult, holdout_model)))
    return out


def _selection(
    body: dict[str, Any],
    schema: dict[str, Any],
    n: int,
    data: Callable[[torch.device], TabularTrainingSet],
) -> Run:
    from service.selection.api_bodies import SelectionRequest, job_request, plan_selection_job
    from worker.mechanisms.model_selection import run_selection

    full = {"dataset": "bench", "epsilon": 1.0, "delta": 1e-6, **body}
    request = job_request(
        SelectionRequest.model_validate(full).root, n_rows=n, public_schema=schema
    )
    resolved, _ = plan_selection_job(request, n_rows=n, public_schema=schema)

    def run(device: torch.device) -> object:
        return run_selection(
            resolved.request, resolved.plan, data=data(device), device=device, progress=_quiet
        )

    return run


def _evaluation(folder: Path, schema: dict[str, Any], model: dict[str, Any]) -> Run:
    """job_estimates.py's evaluation case (3,000 holdout rows), on the CPU as the worker
    scores (:data:`CPU_ONLY`)."""
    _, run = job_evaluation(folder, schema, model, 3000)
    return lambda device: run()


def _timed(run: Run, device: torch.device) -> tuple[float | None, str | None]:
    try:
        _sync(device)
        t = time.perf_counter()
        run(device)
        _sync(device)
        return time.perf_counter() - t, None
    except Exception as exc:  # the failure is the result: reported, not hidden
        first = (str(exc).splitlines() or [""])[0][:160]
        traceback.print_exc()
        return None, f"{type(exc).__name__}: {first}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default="", help="run only cases whose name contains this")
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    devices = [torch.device(d) for d in args.devices.split(",")]
    if any(d.type == "cuda" for d in devices) and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --devices cpu")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        todo = [c for c in cases(Path(tmp)) if args.only in c[0]]
        for name, run in todo:
            results[name] = {}
            for device in devices:
                if device.type != "cpu" and name in CPU_ONLY:
                    continue
                times: list[float] = []
                error = None
                for _ in range(args.repeats):
                    seconds, error = _timed(run, device)
                    if seconds is None:
                        break
                    times.append(seconds)
                results[name][device.type] = {"times": times, "error": error}
                shown = error or " ".join(f"{t:.2f}" for t in times)
                print(f"{name} [{device.type}]: {shown}", flush=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    meta = {
        "command": "python " + " ".join(["benchmarks/gpu_methods.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} "
        f"torch threads, GPU {gpu}, torch {torch.__version__}, numpy {np.__version__}",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_methods.json").write_text(json.dumps({**meta, "cases": results}, indent=1))
    (args.out / "gpu_methods.md").write_text(_table(meta, results, devices))
    print(_table(meta, results, devices))


def _cell(entry: dict[str, Any]) -> str:
    if entry["error"] is not None:
        return f"fails: {entry['error']}"
    t = entry["times"]
    return f"{t[0]:.3g} / {min(t):.3g}"


def _table(meta: dict[str, str], results: dict[str, Any], devices: list[torch.device]) -> str:
    names = [d.type for d in devices]
    lines = [
        "# Every method's worker time, CPU and CUDA, one run",
        "",
        f"Command: `{meta['command']}`. Machine: {meta['machine']}.",
        "",
        "Seconds, first run / fastest run (the first includes one-off costs).",
        "",
        "| case | " + " | ".join(f"{n} s" for n in names) + " | cpu ÷ cuda (fastest) |",
        "|---|" + "---:|" * (len(names) + 1),
    ]
    for name, row in results.items():
        cells = [_cell(row[n]) if n in row else "CPU by design" for n in names]
        ratio = ""
        ok = [row[n] for n in ("cpu", "cuda") if n in row and row[n]["error"] is None]
        if len(ok) == 2:
            ratio = f"{min(ok[0]['times']) / min(ok[1]['times']):.2f}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
