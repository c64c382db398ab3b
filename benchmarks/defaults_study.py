"""Do the default settings of DP-SGD and the proven Langevin ExpM fit datasets they were
not chosen on? (issue 21, point 2.)

For each dataset of the study and each method (``dpsgd``, logistic regression, and
``expm`` with the proven ``langevin`` sampler; on request ``dpsgd_mlp``, DP-SGD on the
product's default MLP, and ``expm_nf``, ExpM+NF, see below) at ε = 1, δ = 1e-5 (0 for
expm_nf), the test AUC of:

* **default**: the request with no method options, planned by the product
  (service.plans.build_plan, i.e. service/methods/{dpsgd,expm}.py's resolution of the
  defaults from public values) and run by the worker's own mechanism
  (worker/mechanisms/dpsgd.py, worker/mechanisms/langevin.py); R releases,
  median;
* **grid best**: a grid over the method's settings (below), chosen by looking at the
  data: a reference for the benchmark, not a product feature. Two stages to keep the study
  short and the best figure honest: every grid point is released once (stage 1); the
  ``--top`` best of stage 1 are released R more times with fresh noise
  (stage 2) and the grid's best is the best of those medians (the stage-1 draw is not
  reused, so one lucky release cannot be the reported best);
* **non-private**: scikit-learn's L-BFGS logistic regression (C = 1) on the same encoding
  (for every method, the MLP's rows included: a reference for the dataset, not a
  non-private twin of each model).

Gap = grid best − default (positive: the default loses). The goal of the issue: gap ≤ 0.02
on every dataset.

``--methods dpsgd_mlp`` studies DP-SGD on an MLP: the request ``{"model": {"kind": "mlp"}}``
(the product's default MLP, MlpSpec: one hidden layer of 16 tanh units, sigmoid output)
with the default engine (``exact``), its defaults from service/methods/dpsgd.py's rule for
models other than logistic regression, over the dpsgd grid below; the test AUC ranks the
release's logit (worker/models/mlp.py). A dpsgd_mlp release costs the worker about 5 µs
per (row, step) plus ~1 ms per step here, so its grid runs in minutes per dataset.

``--methods expm_nf`` studies ExpM+NF (method ``expm_nf``, the exponential mechanism sampled
through a normalizing flow; its ε is nominal): the logistic request with δ = 0 (a pure ε-DP
mechanism; the plan refuses any other δ), its defaults from service/methods/expm_nf.py, run
by worker/mechanisms/expm_nf.py's run_expm_nf with the plan's parameters
(worker/mechanisms/expm_job.py's params_from_mechanism) and a CSPRNG-seeded generator. The
enclave-only diagnostics (the flow's importance weights on all rows, the MCMC fidelity
reference) are switched off (diagnostic_samples = 0): they never reach the release and do
not change its distribution, and the reference chains would cost more than the flow. A
release at the defaults (1,500 steps) took 21-43 s here at load 1-5, 90-140 s at load 6-12.

``--methods dpsgd,expm,auto`` adds ``method: "auto"`` (issue 21, point 3;
service/methods/auto.py): R releases of the request ``auto`` plans (the chosen method at its
defaults), against the better of the two methods' grid bests on the same dataset (so it
needs both methods' rows, listed before it), in a second table.

Datasets (each encoded into [0, 1]^d as the product does; n is the training row count,
used as the public row count n̂ of the plans: on a registered dataset n̂ is a DP noisy
count a few rows away):

* ``adult``: examples/adult, the product's schema (d = 104 one-hot and scaled columns,
  ‖(x, 1)‖² ≤ B = 14), train file 30,162 rows, scored on the public test file;
* ``adult3000``, ``adult700``: fixed random subsets (seed 0) of Adult's train file, scored
  on the public test file;
* ``breast_cancer``: scikit-learn's load_breast_cancer (569 rows, d = 30 numeric columns,
  B = 31), min–max scaled with bounds from the 569 rows (a stand-in for the owner's
  declared bounds), a fixed stratified 30 % held out for scoring (seed 0);
* ``digits_parity``: scikit-learn's load_digits (1,797 images of 8 × 8 pixels in 0..16,
  divided by 16; d = 64, B = 65), target "the digit is odd", 30 % held out (seed 0).

Confirmation sets, not looked at when the rules were chosen (``--datasets``): ``adultN``
(N rows of Adult's train file, seed 0; e.g. adult1500, adult10000) and ``digits_ge5``
(load_digits, target "the digit is 5 or more").

The bundled ICU sample is not in the study: it is a time-series dataset, and the product
trains only GRU-D on those (neither logistic DP-SGD nor the Langevin sampler applies).

Grids (benchmark only):

* dpsgd (and dpsgd_mlp): batch ∈ {max(16, n/100), n/20, n/4} × epochs ∈ {3, 10, 30} ×
  learning rate ∈ {0.5, 2, 8} × clip norm ∈ {0.2, 1}, points with more than 3,000 steps
  left out;
* expm (langevin): steps ∈ {10, 30, 100, 300, 1000} × learning rate ∈ {0.25, 1, 4} ×
  l2 ∈ {1, 10, 100}. The sampler's inverse temperature k = 2n̂/(lr·σ²·B) follows from these
  (σ from the steps), so it is not a separate axis.
* expm_nf: steps ∈ {500, 1500} × l2 ∈ {0.1, 1, 10, 100} (8 points; the learning rate
  0.02, the planar flow's 4 layers, 64 draws and 1,024 rows per step as the defaults). l2
  sets the target itself (the prior's std is 1/√(2ε·l2)); steps (and the learning rate,
  not varied: a release costs ~14-20 ms of CPU per step, and the study had to fit in
  about 40 minutes of a shared machine) only how well the flow fits it.

    .venv/bin/python benchmarks/defaults_study.py [--repeats 3] [--screen 1]
        [--small-repeats 7] [--small-screen 3] [--top 3]
        [--datasets adult,adult3000,...] [--methods dpsgd,expm]
    .venv/bin/python benchmarks/defaults_study.py --grid-from benchmarks/results/defaults_study.json

``--no-grid`` measures the defaults and the non-private reference only; ``--epsilon`` sets
ε (1 unless given). ``--grid-from`` re-measures the defaults and the non-private reference
and takes the grid's results from an earlier run's JSON (the grid does not depend on the
defaults): used after a change of the default rule. It also releases the earlier grid
best's settings R more times in this run; the gap is then taken against the higher of the
two medians. Torch
runs on 1 thread (a shared machine).

Results: benchmarks/results/defaults_study.{md,json} (``--out`` changes the stem).
``--merge a.json,b.json --out STEM [--note TEXT]`` writes one result from runs on disjoint
datasets (each run's command, load and wall time listed).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

from service.datasets.kinds import load_schema_yaml  # noqa: E402
from service.methods.expm import row_norm_sq_bound  # noqa: E402
from service.modelspec import MODEL_SPEC, LogisticSpec, ModelSpec  # noqa: E402
from service.plans import PlanError, build_plan  # noqa: E402
from service.schemas import JobRequest, PrivacyPlan  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.dpsgd import run_dpsgd  # noqa: E402
from worker.mechanisms.expm_job import params_from_mechanism  # noqa: E402
from worker.mechanisms.expm_nf import run_expm_nf  # noqa: E402
from worker.mechanisms.langevin import run_expm_langevin  # noqa: E402
from worker.models import build_module  # noqa: E402
from worker.rng import secure_generator  # noqa: E402

EPSILON = [1.0]  # the study's ε; --epsilon changes it (a list so that main can set it)
DELTA = 1e-5
METHODS = ("dpsgd", "expm")


@dataclass(frozen=True)
class StudyMethod:
    """What a study method name (``--methods``) requests: the product's method and model."""

    method: str
    model: dict[str, Any]
    pure: bool = False  # a pure ε-DP method: requested with δ = 0


LOGISTIC = {"kind": "logistic"}
STUDY_METHODS = {
    "dpsgd": StudyMethod("dpsgd", LOGISTIC),
    "expm": StudyMethod("expm", LOGISTIC),
    "auto": StudyMethod("auto", LOGISTIC),
    "dpsgd_mlp": StudyMethod("dpsgd", {"kind": "mlp"}),  # MlpSpec's defaults: [16], tanh
    "expm_nf": StudyMethod("expm_nf", LOGISTIC, pure=True),
}
DATASETS = ("adult", "adult3000", "adult700", "breast_cancer", "digits_parity")
MAX_DPSGD_STEPS = 3000
SMALL_N = 10_000  # datasets below this size get --small-screen / --small-repeats releases


@dataclass(frozen=True)
class Dataset:
    name: str
    x: torch.Tensor  # float32 (n, d) in [0, 1]
    y: torch.Tensor  # float32 (n,) in {0, 1}
    x_test: torch.Tensor
    y_test: torch.Tensor
    norm_sq_bound: int  # B ≥ ‖(x, 1)‖², from the encoding's public bounds
    source: str

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def d(self) -> int:
        return int(self.x.shape[1])


def _split(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, ...]:
    from sklearn.model_selection import train_test_split

    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)
    return tuple(
        torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in (xtr, ytr, xte, yte)
    )


def load_datasets(names: list[str]) -> list[Dataset]:
    out = []
    if any(n.startswith("adult") for n in names):
        adult = load_adult()
        bound = row_norm_sq_bound(
            load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())
        )
        for name in names:
            if not name.startswith("adult"):
                continue
            x, y = adult.x_train, adult.y_train
            source = "examples/adult train file; test: adult.test"
            if name != "adult":
                size = int(name.removeprefix("adult"))
                idx = torch.from_numpy(np.random.default_rng(0).choice(len(x), size, replace=False))
                x, y = x[idx], y[idx]
                source = f"{size} rows of Adult's train file (seed 0); test: adult.test"
            out.append(
                Dataset(
                    name,
                    x.float(),
                    y.float(),
                    adult.x_test.float(),
                    adult.y_test.float(),
                    bound,
                    source,
                )
            )
    if "breast_cancer" in names:
        from sklearn.datasets import load_breast_cancer

        bc = load_breast_cancer()
        lo, hi = bc.data.min(axis=0), bc.data.max(axis=0)
        x = (bc.data - lo) / (hi - lo)
        xtr, ytr, xte, yte = _split(x, bc.target)
        out.append(
            Dataset(
                "breast_cancer",
                xtr,
                ytr,
                xte,
                yte,
                x.shape[1] + 1,
                "sklearn load_breast_cancer, min-max scaled; 30 % held out (seed 0)",
            )
        )
    targets = {
        "digits_parity": ("odd digit", lambda t: t % 2),
        "digits_ge5": ("digit ≥ 5", lambda t: t >= 5),
    }
    for name, (what, target) in targets.items():
        if name not in names:
            continue
        from sklearn.datasets import load_digits

        dg = load_digits()
        xtr, ytr, xte, yte = _split(dg.data / 16.0, target(dg.target).astype(np.int64))
        out.append(
            Dataset(
                name,
                xtr,
                ytr,
                xte,
                yte,
                dg.data.shape[1] + 1,
                f"sklearn load_digits / 16, target: {what}; 30 % held out (seed 0)",
            )
        )
    order = {n: i for i, n in enumerate(names)}
    return sorted(out, key=lambda ds: order[ds.name])


def test_auc(ds: Dataset, weights: dict[str, torch.Tensor], spec: ModelSpec | None = None) -> float:
    """Test AUC of a release: logistic regression's x·w (the bias does not change the
    ranking), or any other model's output (an MLP's logit) on the test rows."""
    from sklearn.metrics import roc_auc_score

    if spec is None or isinstance(spec, LogisticSpec):
        scores = ds.x_test.double() @ weights["linear.weight"].double().reshape(-1)
    else:
        module = build_module(spec, ds.d)
        module.load_state_dict(weights)
        dtype = next(iter(weights.values())).dtype
        with torch.no_grad():
            scores = module.to(dtype)(ds.x_test.to(dtype)).double().reshape(-1)
    if not bool(torch.isfinite(scores).all()):
        return 0.5  # a diverged release (non-finite weights) ranks no better than chance
    return float(roc_auc_score(ds.y_test.numpy(), scores.numpy()))


def nonprivate_auc(ds: Dataset) -> float:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=1.0, max_iter=5000).fit(ds.x.numpy(), ds.y.numpy())
    w = torch.from_numpy(model.coef_.astype(np.float64))
    return test_auc(ds, {"linear.weight": w})


def request_for(method: str, options: dict[str, Any] | None) -> JobRequest:
    """The request of study method ``method`` (a key of STUDY_METHODS) with ``options``
    (None: the product's defaults)."""
    study = STUDY_METHODS[method]
    body: dict[str, Any] = {
        "dataset": "study",
        "method": study.method,
        "epsilon": EPSILON[0],
        "delta": 0.0 if study.pure else DELTA,
        "model": study.model,
    }
    if options is not None:
        body[study.method] = options
    return JobRequest.model_validate(body)


def plan_for(ds: Dataset, method: str, options: dict[str, Any] | None) -> PrivacyPlan:
    return build_plan(
        request_for(method, options), n_rows=ds.n, n_features=ds.d, norm_sq_bound=ds.norm_sq_bound
    )


def run_expm_nf_study(
    *,
    spec: ModelSpec,
    mechanism: dict[str, Any],
    samples: int,
    data: TabularTrainingSet,
    device: torch.device,
    progress: Callable[[int, int], None],
) -> Any:
    """One ExpM+NF release as the worker runs the plan (worker/mechanisms/expm_job.py), less
    the enclave-only diagnostics (module docstring)."""
    params = dataclasses.replace(
        params_from_mechanism(mechanism, samples=samples), diagnostic_samples=0
    )
    return run_expm_nf(
        spec=spec,
        params=params,
        data=data,
        device=device,
        generator=secure_generator(device),
        progress=progress,
    )


RUNNERS: dict[str, Callable[..., Any]] = {
    "dpsgd": run_dpsgd,
    "expm": run_expm_langevin,
    "expm_nf": run_expm_nf_study,
}


def release(ds: Dataset, plan: PrivacyPlan) -> tuple[float, float]:
    """(test AUC, seconds) of one release of ``plan`` as the worker runs it (by the plan's
    method: for ``auto``, the one chosen)."""
    data = TabularTrainingSet(ds.x, ds.y)
    spec: ModelSpec = MODEL_SPEC.validate_python(plan.model)
    t0 = time.perf_counter()
    out = RUNNERS[plan.method](
        spec=spec,
        mechanism=plan.mechanism,
        samples=1,
        data=data,
        device=torch.device("cpu"),
        progress=lambda a, b: None,
    )
    return test_auc(ds, out.releases[0], spec), time.perf_counter() - t0


def grid(method: str, n: int) -> list[dict[str, Any]]:
    """The grid of study method ``method``: by the product method it requests."""
    if STUDY_METHODS[method].method == "expm_nf":
        return [
            {"steps": t, "l2": l2}
            for t, l2 in itertools.product((500, 1500), (0.1, 1.0, 10.0, 100.0))
        ]
    if STUDY_METHODS[method].method == "expm":
        return [
            {"sampler": "langevin", "steps": t, "learning_rate": lr, "l2": l2}
            for t, lr, l2 in itertools.product(
                (10, 30, 100, 300, 1000), (0.25, 1.0, 4.0), (1.0, 10.0, 100.0)
            )
        ]
    points = []
    batches = sorted({max(16, n // 100), max(16, n // 20), max(16, n // 4)})
    for b, e, lr, c in itertools.product(batches, (3, 10, 30), (0.5, 2.0, 8.0), (0.2, 1.0)):
        if e * math.ceil(n / b) <= MAX_DPSGD_STEPS:
            points.append({"batch_size": b, "epochs": e, "learning_rate": lr, "max_grad_norm": c})
    return points


def settings_of(plan: PrivacyPlan) -> dict[str, Any]:
    """The resolved settings a plan runs with (what the table shows)."""
    m = plan.mechanism
    if plan.method == "dpsgd":
        keys = (
            "batch_size",
            "epochs",
            "learning_rate",
            "max_grad_norm",
            "steps",
            "noise_multiplier",
        )
    elif plan.method == "expm_nf":
        keys = ("steps", "learning_rate", "l2", "n_samples_per_step", "batch_size")
    else:
        keys = ("steps", "learning_rate", "l2", "inverse_temperature", "noise_multiplier")
    return {k: m[k] for k in keys}


def measure(
    ds: Dataset, method: str, options: dict[str, Any] | None, repeats: int
) -> dict[str, Any]:
    plan = plan_for(ds, method, options)
    runs = [release(ds, plan) for _ in range(repeats)]
    aucs = [a for a, _ in runs]
    return {
        "options": options,
        "method": plan.method,
        "settings": settings_of(plan),
        "aucs": aucs,
        "median": statistics.median(aucs),
        "seconds": statistics.median(s for _, s in runs),
    }


def repeats_for(ds: Dataset, args: argparse.Namespace) -> tuple[int, int]:
    """(screen, final) releases per grid point: more on small datasets, whose releases are
    both cheap and far noisier."""
    if ds.n < SMALL_N:
        return args.small_screen, args.small_repeats
    return args.screen, args.repeats


def study_one(
    ds: Dataset, method: str, args: argparse.Namespace, old: dict[str, Any] | None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    screen, repeats = repeats_for(ds, args)
    default = measure(ds, method, None, repeats)
    if args.no_grid:
        print(f"{ds.name:14s} {method:6s} default {default['median']:.4f}", flush=True)
        return {"dataset": ds.name, "method": method, "default": default}
    if old is not None:
        grid_part = {k: old[k] for k in ("stage1", "stage2", "best")}
        grid_part["grid_from"] = args.grid_from
        # The earlier best point again, with fresh noise and the same R as the default, so
        # that the gap is not a difference between two runs' luck or machine load.
        grid_part["best_again"] = measure(ds, method, old["best"]["options"], repeats)
    else:
        stage1 = []
        for options in grid(method, ds.n):
            try:
                stage1.append(measure(ds, method, options, screen))
            except PlanError as exc:
                stage1.append({"options": options, "refused": str(exc)})
        ranked = sorted((r for r in stage1 if "median" in r), key=lambda r: -r["median"])
        stage2 = [measure(ds, method, r["options"], repeats) for r in ranked[: args.top]]
        best = max(stage2, key=lambda r: r["median"])
        grid_part = {"stage1": stage1, "stage2": stage2, "best": best}
    gap = grid_best(grid_part) - default["median"]
    print(
        f"{ds.name:14s} {method:6s} default {default['median']:.4f} best "
        f"{grid_part['best']['median']:.4f} gap {gap:+.4f} ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    return {"dataset": ds.name, "method": method, "default": default, **grid_part, "gap": gap}


def grid_best(row: dict[str, Any]) -> float:
    """A row's grid best: the higher of its best point's median and, with --grid-from, the
    median of that point released again in this run."""
    return float(max(row["best"]["median"], row.get("best_again", {}).get("median", 0.0)))


def study_auto(ds: Dataset, args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``method: "auto"`` on ``ds``: R releases of its plan, against the best of ``rows``'
    grid bests (this dataset's rows of the other methods)."""
    _, repeats = repeats_for(ds, args)
    plan = plan_for(ds, "auto", None)
    assert plan.method_choice is not None
    default = measure(ds, "auto", None, repeats)
    out: dict[str, Any] = {
        "dataset": ds.name,
        "method": "auto",
        "chosen": plan.method,
        "reason": plan.method_choice.reason,
        "default": default,
    }
    graded = [r for r in rows if "best" in r]
    if graded:
        best = max(graded, key=grid_best)
        out.update(best_method=best["method"], best_median=grid_best(best))
        out["gap"] = out["best_median"] - default["median"]
    print(
        f"{ds.name:14s} auto -> {plan.method:5s} {default['median']:.4f}"
        + (f" best {out['best_median']:.4f} gap {out['gap']:+.4f}" if graded else ""),
        flush=True,
    )
    return out


def _fmt_settings(method: str, s: dict[str, Any]) -> str:
    """``s`` (settings_of) in a table cell; ``method``: a study or product method name."""
    if STUDY_METHODS[method].method == "dpsgd":
        return (
            f"B {s['batch_size']}, E {s['epochs']} (T {s['steps']}), lr {s['learning_rate']:g}, "
            f"C {s['max_grad_norm']:g}; σ {s['noise_multiplier']:.3g}"
        )
    if STUDY_METHODS[method].method == "expm_nf":
        return (
            f"T {s['steps']}, lr {s['learning_rate']:g}, l2 {s['l2']:g}; "
            f"N {s['n_samples_per_step']}, b {s['batch_size']}"
        )
    return (
        f"T {s['steps']}, lr {s['learning_rate']:g}, l2 {s['l2']:g}; "
        f"σ {s['noise_multiplier']:.3g}, k {s['inverse_temperature']:.3g}"
    )


def _again(r: dict[str, Any]) -> str:
    again = r.get("best_again")
    return "" if again is None else f" (again in this run: {again['median']:.4f})"


def _spread(m: dict[str, Any]) -> str:
    return f"{min(m['aucs']):.3f}–{max(m['aucs']):.3f}"


def write(results: dict[str, Any], stem: Path) -> None:
    Path(f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    runs = results.get("parts", [results])  # --merge: each run's own line
    lines = [
        "# Defaults study: default settings against a grid, several datasets (issue 21, point 2)",
        "",
        *(
            f"Command: `{r['command']}`: load average (1 min) {r['load_start']:.1f} at the "
            f"start, {r['load_end']:.1f} at the end; {r['wall_s'] / 60:.1f} min in all."
            for r in runs
        ),
        "",
        f"Machine: {results['machine']}.",
        "",
        *([results["note"], ""] if results.get("note") else []),
        f"ε = {EPSILON[0]:g}, δ = {DELTA:g}{_pure(results)}, {_models(results)}. Default: "
        "median test AUC of R releases of the request without method options. Grid best: "
        "the best median of R "
        f"fresh releases among the {results['top']} best grid points of a screen of S "
        "releases per point (see the module docstring for the grids). (S, R) = "
        f"{tuple(results['repeats'])} for n ≥ {SMALL_N:,}, {tuple(results['small_repeats'])} "
        "below. Gap = grid best − default; the goal is gap ≤ 0.02. Spread: the default's "
        "and the grid best's R releases, min–max.",
        "",
    ]
    if results.get("grid_from"):
        lines += [
            f"The grid columns come from `{results['grid_from']}` (an earlier run of the full "
            "study); the default and non-private columns were measured in this run, and the "
            'grid best\'s settings were released R more times in this run ("again"); the '
            "gap is against the higher of the two grid-best medians.",
            "",
        ]
    lines += [
        "| dataset | n | d | method | non-private AUC | default AUC | default settings "
        "| grid best AUC | grid best settings | gap | spread (default; best) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        ds = results["datasets"][r["dataset"]]
        if r["method"] == "auto":
            continue  # its own table below
        if "best" not in r:  # --no-grid
            lines.append(
                f"| {r['dataset']} | {ds['n']} | {ds['d']} | {r['method']} | "
                f"{ds['nonprivate_auc']:.4f} | {r['default']['median']:.4f} | "
                f"{_fmt_settings(r['method'], r['default']['settings'])} | | | | "
                f"{_spread(r['default'])} |"
            )
            continue
        gap = r["gap"]
        mark = " **(> 0.02)**" if gap > 0.02 else ""
        default, best = r["default"], r["best"]
        lines.append(
            f"| {r['dataset']} | {ds['n']} | {ds['d']} | {r['method']} | "
            f"{ds['nonprivate_auc']:.4f} | {default['median']:.4f} | "
            f"{_fmt_settings(r['method'], default['settings'])} | {best['median']:.4f} | "
            f"{_fmt_settings(r['method'], best['settings'])}{_again(r)} | "
            f"{gap:+.4f}{mark} | {_spread(r['default'])}; {_spread(r['best'])} |"
        )
    lines += _auto_table(results)
    lines += ["", "Datasets:", ""]
    for name, ds in results["datasets"].items():
        lines.append(
            f"- `{name}`: {ds['source']} (n = {ds['n']}, d = {ds['d']}, B = {ds['B']}, "
            f"test rows {ds['n_test']})"
        )
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")


def _pure(results: dict[str, Any]) -> str:
    """The δ of the pure ε-DP rows, in words (the table's header line)."""
    pure = sorted({r["method"] for r in results["rows"] if STUDY_METHODS[r["method"]].pure})
    return f" (δ = 0 for {', '.join(pure)}: pure ε-DP)" if pure else ""


def _models(results: dict[str, Any]) -> str:
    """The models the rows train, in words (the table's header line)."""
    if all(STUDY_METHODS[r["method"]].model == LOGISTIC for r in results["rows"]):
        return "logistic regression"
    return (
        "logistic regression, except dpsgd_mlp: the product's default MLP (one hidden layer "
        "of 16 tanh units, engine exact; the non-private column stays logistic regression)"
    )


def _auto_table(results: dict[str, Any]) -> list[str]:
    rows = [r for r in results["rows"] if r["method"] == "auto"]
    if not rows:
        return []
    lines = [
        "",
        '`method: "auto"` (service/methods/auto.py): the method it chose and its default '
        "settings, R releases as above, against the better of the two methods' grid bests "
        "(gap = that − auto; s = n·ε/√B, the rule's scale).",
        "",
        "| dataset | n | s | auto chose | auto AUC | settings | grid best AUC (method) | gap "
        "| spread |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ds = results["datasets"][r["dataset"]]
        s = ds["n"] * EPSILON[0] / math.sqrt(ds["B"])
        default = r["default"]
        best = f"{r['best_median']:.4f} ({r['best_method']})" if "gap" in r else ""
        gap = (
            f"{r['gap']:+.4f}" + (" **(> 0.02)**" if r["gap"] > 0.02 else "") if "gap" in r else ""
        )
        lines.append(
            f"| {r['dataset']} | {ds['n']} | {s:.0f} | {r['chosen']} | {default['median']:.4f} | "
            f"{_fmt_settings(r['chosen'], default['settings'])} | {best} | {gap} | "
            f"{_spread(default)} |"
        )
    return lines


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One result of several runs of the study on disjoint datasets (``--merge
    a.json,b.json``): their rows and datasets, and each run's command, load and wall time."""
    out = dict(parts[0])
    for key in ("repeats", "small_repeats", "top", "grid_from"):
        if any(p[key] != out[key] for p in parts):
            raise SystemExit(f"the runs differ in {key}")
    out["parts"] = [
        {k: p[k] for k in ("command", "load_start", "load_end", "wall_s")} for p in parts
    ]
    out["datasets"] = {k: v for p in parts for k, v in p["datasets"].items()}
    out["rows"] = [r for p in parts for r in p["rows"]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--screen", type=int, default=1)
    parser.add_argument("--small-repeats", type=int, default=7)
    parser.add_argument("--small-screen", type=int, default=3)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--grid-from", default=None)
    parser.add_argument("--no-grid", action="store_true")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--merge", default=None)
    parser.add_argument("--note", default=None, help="with --merge: a paragraph for the table")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/defaults_study"))
    args = parser.parse_args()
    if args.merge:
        parts = [json.loads(Path(p).read_text()) for p in args.merge.split(",")]
        merged = merge(parts)
        merged["command"] = "python benchmarks/defaults_study.py " + shlex.join(sys.argv[1:])
        if args.note:
            merged["note"] = args.note
        write(merged, Path(args.out))
        return
    torch.set_num_threads(1)
    EPSILON[0] = args.epsilon
    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]
    old_rows: dict[tuple[str, str], dict[str, Any]] = {}
    if args.grid_from:
        old = json.loads(Path(args.grid_from).read_text())
        old_rows = {(r["dataset"], r["method"]): r for r in old["rows"]}
    datasets = load_datasets(args.datasets.split(","))
    results: dict[str, Any] = {
        "command": "python benchmarks/defaults_study.py " + shlex.join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads 1",
        "load_start": load_start,
        "repeats": [args.screen, args.repeats],
        "small_repeats": [args.small_screen, args.small_repeats],
        "top": args.top,
        "grid_from": args.grid_from,
        "datasets": {},
        "rows": [],
    }
    for ds in datasets:
        results["datasets"][ds.name] = {
            "n": ds.n,
            "d": ds.d,
            "B": ds.norm_sq_bound,
            "n_test": int(ds.x_test.shape[0]),
            "source": ds.source,
            "nonprivate_auc": nonprivate_auc(ds),
        }
        for method in args.methods.split(","):
            if method == "auto":
                rows = [
                    r
                    for r in results["rows"]
                    if r["dataset"] == ds.name
                    and STUDY_METHODS[r["method"]].model == LOGISTIC
                    and not STUDY_METHODS[r["method"]].pure  # auto picks proven methods only
                ]
                results["rows"].append(study_auto(ds, args, rows))
            else:
                old_row = old_rows.get((ds.name, method)) if args.grid_from else None
                if args.grid_from and old_row is None:
                    raise SystemExit(f"{args.grid_from} has no row for {ds.name}/{method}")
                results["rows"].append(study_one(ds, method, args, old_row))
            results["load_end"] = os.getloadavg()[0]
            results["wall_s"] = time.perf_counter() - t0
            write(results, Path(args.out))


if __name__ == "__main__":
    main()
