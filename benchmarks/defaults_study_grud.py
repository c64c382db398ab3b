"""Do DP-SGD's default settings fit GRU-D on time series they were not chosen on? (issue 21,
point 2, for the time-series model; benchmarks/defaults_study.py does the tabular models.)

For each dataset below, at ε = 1, δ = 1e-5 (defaults_study.py's), the test AUC of:

* **default**: the request ``{"method": "dpsgd", "model": {"kind": "grud"}}`` with no
  DP-SGD options, planned by the product (service.plans.build_plan with
  ``dataset_kind="timeseries"``: service/methods/dpsgd.py's resolve_dpsgd_options, the
  rule for models other than logistic regression and MLPs: batch n̂/20 clamped to
  [16, 256], epochs for ≈ 300 steps, at least 3 and at most 100; learning rate 1, clip
  norm 1) and run by the worker's own mechanism (worker/mechanisms/dpsgd.py's run_dpsgd,
  GRU-D's exact engine, as benchmarks/selection_grud.py runs it); R releases, median;
* **grid best**: a grid over learning rate × epochs (below; batch size and clip norm at
  their defaults), chosen by looking at the test AUC: a reference for the benchmark, not a
  product feature. Two stages, as in defaults_study.py: every grid point is released S
  times (stage 1); the ``--top`` best are released R more times with fresh noise
  (stage 2), and the grid best is the best of those medians (the stage-1 draws are not
  reused, so one lucky release cannot be the reported best);
* **non-private**: the same GRU-D (hidden 16) trained without DP by Adam (lr 0.01, batch
  50, 10 epochs, seed 0): a reference for the dataset.

Gap = grid best − default (positive: the default loses). The goal of the issue: gap ≤ 0.02
on every dataset.

Datasets (worker/synthetic_icu.py's public generator, 8 variables; no dataset was looked at
when the default rule was chosen; n is the training stay count, used as the public row
count n̂ of the plans):

* ``icu2000``: the bundled ICU sample's stays (examples/icu: generate_icu(2000, 48 h) with
  the sample's seed 20261123, before the CSV's rounding to 2 decimals);
* ``icu500``: the first 500 of those stays;
* ``icu1000_24h``: 1,000 fresh stays of 24 hourly steps (seed 7): half the series length;

confirmation sets, drawn after the candidate rules (below) were read off the grid:
``icu1000`` (1,000 fresh stays of 48 h, seed 11) and ``icu250`` (250, seed 12);

scored on fresh stays of the same generator and length never used for training (4,000,
seed 1 for 48 h; seed 8 for 24 h).

Grid (benchmark only): learning rate ∈ {0.5, 2, 8} × epochs ∈ {2, 5, 15, 40} (the default
rule gives 15 epochs on all three datasets: ⌈300 / 20⌉), batch n̂/20 and clip norm 1 as
the defaults: 12 points. A release costs here about 0.1-0.2 s per step at batch 100 and
48 steps (the exact engine's per-example gradients of the recurrence), so the study had
to leave out batch size and clip norm to fit in about an hour of a shared 2-core machine.

    .venv/bin/python benchmarks/defaults_study_grud.py [--datasets icu2000,icu500,icu1000_24h]
        [--screen 1] [--repeats 3] [--top 2] [--out benchmarks/results/defaults_study_grud]
    .venv/bin/python benchmarks/defaults_study_grud.py --merge a.json,b.json --out STEM

``--candidates tabular,steps100,steps100_lr0.5`` measures, instead of the grid, the
default and candidate default rules (candidate_options) R times each on every dataset.

Torch runs on 1 thread (a shared machine). Results: ``--out``.{md,json}, rewritten after
each dataset. ``--merge`` writes one result from runs on disjoint datasets.
benchmarks/results/defaults_study_grud.md (the grid) and defaults_study_grud_candidates.md
(the candidate rules) hold the runs of issue 21's study.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.methods.dpsgd import resolve_dpsgd_options  # noqa: E402
from service.modelspec import GrudSpec  # noqa: E402
from service.plans import build_plan  # noqa: E402
from service.schemas import DpsgdOptions, JobRequest, PrivacyPlan  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.dpsgd import run_dpsgd  # noqa: E402
from worker.models import build_module  # noqa: E402
from worker.synthetic_icu import generate_icu  # noqa: E402

EPSILON = 1.0
DELTA = 1e-5
SAMPLE_SEED = 20261123  # examples/icu/generate.py's SEED
DATASETS = ("icu2000", "icu500", "icu1000_24h")
LEARNING_RATES = (0.5, 2.0, 8.0)
EPOCHS = (2, 5, 15, 40)
TEST_STAYS = 4000
# Confirmation sets (``--datasets``), drawn after the candidate rules were read off the grid:
# name -> (stays, seed), 48 h.
CONFIRM = {"icu1000": (1000, 11), "icu250": (250, 12)}
SPEC = GrudSpec()  # the request {"kind": "grud"}: hidden 16, binary head


@dataclass(frozen=True)
class SeriesDataset:
    name: str
    train: TabularTrainingSet
    test: TabularTrainingSet
    hours: int
    source: str

    @property
    def n(self) -> int:
        return int(self.train.n)


def _series(n: int, hours: int, seed: int) -> TabularTrainingSet:
    s = generate_icu(n, hours=hours, rng=np.random.default_rng(seed))
    return TabularTrainingSet(
        torch.tensor(s.packed()), torch.tensor(s.labels).float(), tuple(s.schema.scaled_means)
    )


def _head(data: TabularTrainingSet, n: int) -> TabularTrainingSet:
    return TabularTrainingSet(data.x[:n], data.y[:n], data.public_means)


def load_datasets(names: list[str]) -> list[SeriesDataset]:
    out = []
    test48 = _series(TEST_STAYS, 48, 1)
    sample = _series(2000, 48, SAMPLE_SEED)
    for name in names:
        if name == "icu2000":
            out.append(
                SeriesDataset(
                    name, sample, test48, 48, "the ICU sample's 2,000 stays (seed 20261123)"
                )
            )
        elif name == "icu500":
            out.append(
                SeriesDataset(
                    name, _head(sample, 500), test48, 48, "the first 500 of the ICU sample's stays"
                )
            )
        elif name in CONFIRM:
            n, seed = CONFIRM[name]
            out.append(
                SeriesDataset(
                    name, _series(n, 48, seed), test48, 48, f"{n:,} fresh stays (seed {seed})"
                )
            )
        elif name == "icu1000_24h":
            out.append(
                SeriesDataset(
                    name,
                    _series(1000, 24, 7),
                    _series(TEST_STAYS, 24, 8),
                    24,
                    "1,000 fresh stays of 24 h (seed 7)",
                )
            )
        else:
            raise SystemExit(f"unknown dataset {name!r}")
    return out


def test_auc(ds: SeriesDataset, weights: dict[str, torch.Tensor]) -> float:
    from sklearn.metrics import roc_auc_score

    module = build_module(SPEC, ds.test.n_features, public_means=ds.test.public_means)
    module.load_state_dict(weights)
    dtype = next(iter(weights.values())).dtype
    with torch.no_grad():
        scores = module.to(dtype)(ds.test.x.to(dtype)).double().reshape(-1)
    if not bool(torch.isfinite(scores).all()):
        return 0.5  # a diverged release ranks no better than chance
    return float(roc_auc_score(ds.test.y.numpy(), scores.numpy()))


def nonprivate_auc(ds: SeriesDataset) -> float:
    torch.manual_seed(0)
    module = build_module(SPEC, ds.train.n_features, public_means=ds.train.public_means)
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    loss_fn = torch.nn.BCEWithLogitsLoss()  # forward returns the logit
    for _ in range(10):
        for idx in torch.randperm(ds.n).split(50):
            opt.zero_grad()
            loss_fn(module(ds.train.x[idx]), ds.train.y[idx]).backward()
            opt.step()
    return test_auc(ds, {k: v.detach().clone() for k, v in module.state_dict().items()})


def plan_for(ds: SeriesDataset, options: dict[str, Any] | None) -> PrivacyPlan:
    body: dict[str, Any] = {
        "dataset": "study",
        "method": "dpsgd",
        "epsilon": EPSILON,
        "delta": DELTA,
        "model": {"kind": "grud"},
    }
    if options is not None:
        body["dpsgd"] = options
    return build_plan(
        JobRequest.model_validate(body),
        n_rows=ds.n,
        n_features=ds.train.n_features,
        dataset_kind="timeseries",
    )


def release(ds: SeriesDataset, plan: PrivacyPlan) -> tuple[float, float]:
    """(test AUC, seconds) of one release of ``plan`` as the worker runs it."""
    t0 = time.perf_counter()
    out = run_dpsgd(
        spec=SPEC,
        mechanism=plan.mechanism,
        samples=1,
        data=ds.train,
        device=torch.device("cpu"),
        progress=lambda a, b: None,
    )
    return test_auc(ds, out.releases[0]), time.perf_counter() - t0


SETTINGS = ("batch_size", "epochs", "steps", "learning_rate", "max_grad_norm", "noise_multiplier")


def measure(ds: SeriesDataset, options: dict[str, Any] | None, repeats: int) -> dict[str, Any]:
    plan = plan_for(ds, options)
    runs = [release(ds, plan) for _ in range(repeats)]
    aucs = [a for a, _ in runs]
    out = {
        "options": options,
        "settings": {k: plan.mechanism[k] for k in SETTINGS},
        "aucs": aucs,
        "median": statistics.median(aucs),
        "seconds": statistics.median(s for _, s in runs),
    }
    print(
        f"  {ds.name} {options} {[round(a, 4) for a in aucs]} ({out['seconds']:.0f} s)", flush=True
    )
    return out


def grid() -> list[dict[str, Any]]:
    return [
        {"learning_rate": lr, "epochs": e} for lr, e in itertools.product(LEARNING_RATES, EPOCHS)
    ]


def candidate_options(ds: SeriesDataset, name: str) -> dict[str, Any]:
    """The DP-SGD options of a candidate default rule (``--candidates``), from public values
    only (n̂ = ds.n): ``tabular``, the logistic/MLP rule of resolve_dpsgd_options (batch n̂/4
    clamped to [16, 256], ≈ 300 steps, 3-20 epochs); ``steps100``, GRU-D's batch n̂/20
    (clamped the same way) with epochs for ≈ 100 steps (≥ 3) instead of ≈ 300, learning
    rate 1; ``steps100_lr0.5``, the same at learning rate 0.5. The last two were read off
    this study's grid (stage 1), so on these datasets they are not out-of-sample evidence."""
    if name == "tabular":
        o = resolve_dpsgd_options(DpsgdOptions(), n_rows=ds.n, model_kind="logistic")
        return {"batch_size": o.batch_size, "epochs": o.epochs}
    if name in ("steps100", "steps100_lr0.5"):
        o = resolve_dpsgd_options(DpsgdOptions(), n_rows=ds.n, model_kind="grud")
        assert o.batch_size is not None
        epochs = max(3, math.ceil(100 / math.ceil(ds.n / o.batch_size)))
        lr = {"steps100": 1.0, "steps100_lr0.5": 0.5}[name]
        return {"batch_size": o.batch_size, "epochs": epochs, "learning_rate": lr}
    raise SystemExit(f"unknown candidate rule {name!r}")


def study_candidates(ds: SeriesDataset, args: argparse.Namespace) -> dict[str, Any]:
    """``--candidates``: the default and each candidate rule, R releases each (no grid)."""
    t0 = time.perf_counter()
    default = measure(ds, None, args.repeats)
    candidates = {
        name: measure(ds, candidate_options(ds, name), args.repeats)
        for name in args.candidates.split(",")
    }
    return {
        "dataset": ds.name,
        "default": default,
        "candidates": candidates,
        "wall_s": time.perf_counter() - t0,
    }


def study_one(ds: SeriesDataset, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    default = measure(ds, None, args.repeats)
    stage1 = [measure(ds, options, args.screen) for options in grid()]
    ranked = sorted(stage1, key=lambda r: -r["median"])
    stage2 = [measure(ds, r["options"], args.repeats) for r in ranked[: args.top]]
    best = max(stage2, key=lambda r: r["median"])
    gap = best["median"] - default["median"]
    wall = time.perf_counter() - t0
    print(
        f"{ds.name}: default {default['median']:.4f} best {best['median']:.4f} gap {gap:+.4f} "
        f"({wall:.0f} s)",
        flush=True,
    )
    return {
        "dataset": ds.name,
        "default": default,
        "stage1": stage1,
        "stage2": stage2,
        "best": best,
        "gap": gap,
        "wall_s": wall,
    }


def _fmt(s: dict[str, Any]) -> str:
    return (
        f"B {s['batch_size']}, E {s['epochs']} (T {s['steps']}), lr {s['learning_rate']:g}, "
        f"C {s['max_grad_norm']:g}; σ {s['noise_multiplier']:.3g}"
    )


def _spread(m: dict[str, Any]) -> str:
    return f"{min(m['aucs']):.3f}–{max(m['aucs']):.3f}"


def write(results: dict[str, Any], stem: Path) -> None:
    Path(f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    runs = results.get("parts", [results])
    lines = [
        "# Defaults study, GRU-D: DP-SGD's default settings against a grid (issue 21, point 2)",
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
        f"ε = {EPSILON:g}, δ = {DELTA:g}; model GRU-D (hidden 16, the request "
        '`{"kind": "grud"}`), DP-SGD engine exact. Default: median test AUC of R releases of '
        "the request without DP-SGD options. Grid best: the best median of R fresh releases "
        f"among the {results['top']} best points of a screen of S releases per point over "
        f"learning rate {list(LEARNING_RATES)} × epochs {list(EPOCHS)} (batch, clip norm at "
        f"the defaults). (S, R) = {_tuple(results['repeats'])}. Gap = grid best − default; "
        "the goal is gap ≤ 0.02. Spread: the default's and the grid best's R releases, "
        "min–max. Non-private: the same GRU-D trained by Adam without DP (a reference).",
    ]
    graded = any("best" in r for r in results["rows"])
    if graded:
        lines += [
            "",
            "| dataset | n | T (h) | non-private AUC | default AUC | default settings "
            "| grid best AUC | grid best settings | gap | spread (default; best) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
    for r in results["rows"]:
        if "best" not in r:  # --candidates: their own table below
            continue
        ds = results["datasets"][r["dataset"]]
        default, best, gap = r["default"], r["best"], r["gap"]
        mark = " **(> 0.02)**" if gap > 0.02 else ""
        lines.append(
            f"| {r['dataset']} | {ds['n']} | {ds['hours']} | {ds['nonprivate_auc']:.4f} | "
            f"{default['median']:.4f} | {_fmt(default['settings'])} | {best['median']:.4f} | "
            f"{_fmt(best['settings'])} | {gap:+.4f}{mark} | {_spread(default)}; "
            f"{_spread(best)} |"
        )
    lines += _candidates_table(results)
    if graded:
        lines += ["", "Stage 1 (S releases per point; median test AUC; seconds per release):"]
    lines.append("")
    header = " | ".join(f"lr {lr:g}" for lr in LEARNING_RATES)
    for r in results["rows"]:
        if "stage1" not in r:
            continue
        lines += [
            f"`{r['dataset']}`:",
            "",
            f"| epochs | {header} |",
            "|---" * (len(LEARNING_RATES) + 1) + "|",
        ]
        cells = {(p["options"]["learning_rate"], p["options"]["epochs"]): p for p in r["stage1"]}
        for e in EPOCHS:
            row = " | ".join(
                f"{cells[(lr, e)]['median']:.4f} ({cells[(lr, e)]['seconds']:.0f} s)"
                for lr in LEARNING_RATES
            )
            lines.append(f"| {e} | {row} |")
        lines.append("")
    lines += ["Datasets:", ""]
    for name, ds in results["datasets"].items():
        lines.append(
            f"- `{name}`: {ds['source']} (n = {ds['n']}, {ds['hours']} h × 8 variables, "
            f"positive rate {ds['positive_rate']:.2f}; test: {ds['n_test']} fresh stays)"
        )
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")


def _candidates_table(results: dict[str, Any]) -> list[str]:
    rows = [r for r in results["rows"] if "candidates" in r]
    if not rows:
        return []
    lines = [
        "",
        "Candidate rules (`--candidates`, see candidate_options), R releases each, in the "
        "same run as the default:",
        "",
        "| dataset | n | default AUC | candidate | candidate AUC | candidate settings | spread |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ds = results["datasets"][r["dataset"]]
        for name, m in r["candidates"].items():
            lines.append(
                f"| {r['dataset']} | {ds['n']} | {r['default']['median']:.4f} | {name} | "
                f"{m['median']:.4f} | {_fmt(m['settings'])} | {_spread(m)} |"
            )
    return lines


def _tuple(value: Any) -> str:
    return str(tuple(value)) if isinstance(value, list | tuple) else str(value)


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(parts[0])
    out["repeats"] = tuple(out["repeats"])
    for key in ("repeats", "top"):  # where the runs differ, say which datasets had which
        if any(tuple(p[key]) != tuple(out[key]) if key == "repeats" else p[key] != out[key]
               for p in parts):  # fmt: skip
            out[key] = ", ".join(f"{_tuple(p[key])} ({', '.join(p['datasets'])})" for p in parts)
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
    parser.add_argument("--top", type=int, default=2)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--candidates", default=None, help="e.g. tabular,steps100_lr0.5")
    parser.add_argument("--merge", default=None)
    parser.add_argument("--note", default=None)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/defaults_study_grud"))
    args = parser.parse_args()
    command = "python benchmarks/defaults_study_grud.py " + shlex.join(sys.argv[1:])
    if args.merge:
        merged = merge([json.loads(Path(p).read_text()) for p in args.merge.split(",")])
        merged["command"] = command
        if args.note:
            merged["note"] = args.note
        write(merged, Path(args.out))
        return
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads 1",
        "load_start": os.getloadavg()[0],
        "repeats": [args.screen, args.repeats],
        "top": args.top,
        "datasets": {},
        "rows": [],
    }
    for ds in load_datasets(args.datasets.split(",")):
        results["datasets"][ds.name] = {
            "n": ds.n,
            "hours": ds.hours,
            "n_test": int(ds.test.n),
            "positive_rate": float(ds.train.y.mean()),
            "source": ds.source,
            "nonprivate_auc": nonprivate_auc(ds),
        }
        print(f"{ds.name}: non-private {results['datasets'][ds.name]['nonprivate_auc']:.4f}")
        study = study_candidates if args.candidates else study_one
        results["rows"].append(study(ds, args))
        results["load_end"] = os.getloadavg()[0]
        results["wall_s"] = time.perf_counter() - t0
        write(results, Path(args.out))


if __name__ == "__main__":
    main()
