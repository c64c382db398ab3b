"""Issue 24: the proven Langevin sampler charged by the hidden-iterate bound
(``expm.accounting = "hidden"``, service/privacy/lattice_langevin.py) against the same
sampler charged by composition, the exact regularised ExpM (HMC, asymptotic) at the same
l2, and DP-SGD, at equal (ε, δ) on Adult, in one run.

Rows per ε (δ = 1e-5), each the plan the service builds for the request:

* ``composition``: ``expm`` Langevin with its defaults (T ≤ 300, l2 = 1), composition charge;
* ``hidden l2=L``: ``expm`` Langevin with ``accounting: hidden`` and l2 = L (its defaults:
  the largest contracting step, T = ⌈ln 100/(1 − c)⌉ ≤ 20,000); the schema's row cap
  ``max_rows`` is Adult's training rows + 5 %;
* ``exact l2=L``: the same regularised target by HMC (``expm``, sampler ``mcmc``, l2 = L),
  the plan's Gaussian-DP temperature for (ε, δ): the mechanism the hidden chain samples;
* ``dpsgd``: the product's DP-SGD, batch 256, 3 epochs.

Each row: median test AUC over ``--repeats`` releases (min–max), seconds per release (one
torch thread), the plan's σ (and σ_eff) and inverse temperature k. Wall times are at the
machine's load of the moment (printed); compare within one run only.

    .venv/bin/python benchmarks/expm_hidden.py [--repeats 3] [--epsilons 0.01,0.1,1]
        [--l2 30,300] [--methods composition,hidden,exact,dpsgd]
        [--releases-out FILE.jsonl] [--exact-draws]

``--l2 default`` leaves l2 out of the request (the plan's default). ``--releases-out``
appends one JSON line per release (ε, row, AUC, seconds) as it goes, so a cut run keeps its
releases. ``--exact-draws`` also scores every kept post-warm-up HMC draw of the exact row's
run (all chains; draws of π, correlated), whose mean estimates the exact mechanism's
expected AUC, which one final state (the release) does not.

Results: benchmarks/results/expm_hidden.md.
"""

from __future__ import annotations

import argparse
import json
import os
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

from service.datasets.kinds import load_schema_yaml  # noqa: E402
from service.methods.expm import row_norm_sq_bound  # noqa: E402
from service.plans import PlanError, build_plan  # noqa: E402
from service.schemas import JobRequest  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.registry import run_mechanism  # noqa: E402

DELTA = 1e-5


def _auc(weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    from sklearn.metrics import roc_auc_score

    scores = x.double() @ weights["linear.weight"].double().reshape(-1)
    return float(roc_auc_score(y.numpy(), scores.numpy()))


def _body(kind: str, eps: float, l2: float | None) -> dict[str, object]:
    body: dict[str, object] = {"dataset": "adult", "epsilon": eps, "delta": DELTA}
    if kind == "dpsgd":
        return {**body, "method": "dpsgd", "dpsgd": {"batch_size": 256, "epochs": 3}}
    if kind == "composition":
        return {**body, "method": "expm", "expm": {"accounting": "composition"}}
    regulariser = {} if l2 is None else {"l2": l2}
    if kind == "hidden":
        return {**body, "method": "expm", "expm": {"accounting": "hidden", **regulariser}}
    return {**body, "method": "expm", "expm": {"sampler": "mcmc", **regulariser}}


def _exact_draws_aucs(
    mechanism: dict[str, object], train: TabularTrainingSet, x: torch.Tensor, y: torch.Tensor
) -> list[float]:
    """Test AUC of every kept post-warm-up draw of one HMC run of the plan (all chains)."""
    from sklearn.metrics import roc_auc_score

    from worker.mechanisms.mcmc import LogisticTarget, McmcParams, checked_rows, sample_hmc
    from worker.rng import secure_generator

    params = McmcParams.from_plan(dict(mechanism))
    rows = checked_rows(train.x, norm_sq_bound=params.row_norm_sq_bound)
    target = LogisticTarget(
        rows=rows, y=train.y.double(), inverse_temperature=params.inverse_temperature, l2=params.l2
    )
    run = sample_hmc(
        target,
        params=params,
        generator=secure_generator(torch.device("cpu")),
        progress=lambda a, b: None,
    )
    draws = run.draws.reshape(-1, run.draws.shape[-1])  # (chains × kept, P + 1)
    scores = x.double().numpy() @ draws[:, :-1].T  # the bias does not change the AUC
    return [float(roc_auc_score(y.numpy(), scores[:, j])) for j in range(draws.shape[0])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epsilons", default="0.001,0.01,0.1,1")
    ap.add_argument("--l2", default="30,300")
    ap.add_argument("--methods", default="composition,hidden,exact,dpsgd")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--releases-out", type=Path)
    ap.add_argument("--exact-draws", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    command = "python benchmarks/expm_hidden.py " + shlex.join(sys.argv[1:])
    data = load_adult()
    schema = load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())
    n, d = data.x_train.shape
    bound = row_norm_sq_bound(schema)
    cap = n + n // 20
    blocks = getattr(schema, "one_hot_blocks", None)  # as worker/data.py passes them
    train = TabularTrainingSet(data.x_train.float(), data.y_train.float(), one_hot_blocks=blocks)
    lines = [
        "# Hidden-iterate Langevin vs composition vs the exact mechanism vs DP-SGD, Adult",
        "",
        f"Command: `{command}` (1 torch thread; load average at start "
        f"{os.getloadavg()[0]:.1f}; {args.repeats} releases per cell; δ = {DELTA:g}; "
        f"max_rows = {cap} for the hidden rows; test AUC on adult.test).",
        "",
        "| ε | method | guarantee | AUC median | AUC min–max | s / release | T | σ (σ_eff) | k |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    l2s = [None if v == "default" else float(v) for v in args.l2.split(",")]
    for eps in (float(e) for e in args.epsilons.split(",")):
        for kind in args.methods.split(","):
            for l2 in l2s if kind in ("hidden", "exact") else [None]:
                label = kind
                if kind in ("hidden", "exact"):
                    label += " l2=default" if l2 is None else f" l2={l2:g}"
                request = JobRequest.model_validate(_body(kind, eps, l2))
                try:
                    plan = build_plan(
                        request, n_rows=n, n_features=d, norm_sq_bound=bound, max_rows=cap
                    )
                except PlanError as exc:
                    print(f"ε={eps:g} {label}: refused: {exc}", flush=True)
                    lines.append(f"| {eps:g} | {label} | refused (422) | | | | | | {exc} |")
                    continue
                aucs, secs = [], []
                repeats = 1 if kind == "exact" else args.repeats
                if kind == "exact" and args.exact_draws:
                    repeats = 0  # the row is every kept draw of one run, below
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    out = run_mechanism(
                        plan=plan,
                        spec=request.model,
                        data=train,
                        device=torch.device("cpu"),
                        progress=lambda a, b: None,
                    )
                    secs.append(time.perf_counter() - t0)
                    aucs.append(_auc(out.releases[0], data.x_test, data.y_test))
                    if args.releases_out is not None:
                        record = {"epsilon": eps, "row": label, "l2": plan.mechanism.get("l2")}
                        record |= {"auc": aucs[-1], "seconds": secs[-1]}
                        record["load"] = os.getloadavg()[0]
                        with args.releases_out.open("a") as f:
                            f.write(json.dumps(record) + "\n")
                m = plan.mechanism
                if kind == "exact" and args.exact_draws:
                    t0 = time.perf_counter()
                    aucs = _exact_draws_aucs(m, train, data.x_test, data.y_test)
                    secs.append(time.perf_counter() - t0)
                    label += f" ({len(aucs)} kept draws, mean {statistics.fmean(aucs):.4f})"
                    if args.releases_out is not None:
                        record = {"epsilon": eps, "row": label, "l2": m.get("l2")}
                        record |= {"aucs": aucs, "seconds": secs[-1]}
                        with args.releases_out.open("a") as f:
                            f.write(json.dumps(record) + "\n")
                sigma = m.get("noise_multiplier")
                eff = m.get("effective_noise_multiplier")
                sig = "" if sigma is None else f"{sigma:.4g}"
                if eff is not None:
                    sig += f" ({eff:.4g})"
                k = m.get("inverse_temperature")
                row = (
                    f"| {eps:g} | {label} | {plan.guarantee} | {statistics.median(aucs):.4f} | "
                    f"{min(aucs):.4f}–{max(aucs):.4f} | {statistics.median(secs):.1f} | "
                    f"{m.get('steps', '')} | {sig} | {'' if k is None else f'{k:.3g}'} |"
                )
                print(row, flush=True)
                lines.append(row)
    lines.append("")
    if not args.no_write:
        (ROOT / "benchmarks/results/expm_hidden.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
