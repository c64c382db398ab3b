"""DP-SGD per-example gradient engines: per-epoch time, peak memory and the largest batch
under a fixed memory budget (CPU; no GPU on this machine).

Rows: non-private (the same model, mean loss, one backward, plain SGD), exact (Linear
hooks for the MLP, torch.func vmap for GRU-D; worker.mechanisms.dpsgd), ghost and JL with
r = 1, 5, 20 (worker/mechanisms/grad_engines.py), on

* MLP (hidden 16) on Adult (public-schema encoding, 104 features, 30162 rows), and
* GRU-D (hidden 16) on the synthetic ICU series (worker.synthetic_icu, 48 h × 8 variables).
  Ghost and JL refuse GRU-D (their sound reduction needs Linear layers on one vector per
  example), so those rows read "n/a".

Per-epoch time: worker.mechanisms.dpsgd.run_dpsgd for one epoch of the plan the service
builds (ε = 1, δ = 1e-5; Poisson sampling, integer noise, update: everything a job runs),
median of ``--repeats``; non-private: the same number of steps on uniform batches of the
expected size. JL r = 1 has no plan at ε = 1 (κ ≈ 6.5e6: the noise exceeds the sampler's
range, a 422), so it is timed with the r = 5 plan's κ (time does not depend on κ).

Memory: one engine step (the integer sum; the non-private row: loss + backward) at batch
B, in a fresh process per (model, engine): peak = VmHWM − VmRSS around the step (VmHWM reset
through /proc/self/clear_refs), glibc's mmap threshold fixed so freed tensors leave the
resident set (as benchmarks/grud_memory.py). Largest batch: binary search for the largest
B whose measured peak stays ≤ ``--budget-mib`` (doubling from 16, then bisection; up to
2^18 rows for the MLP, 2^14 for GRU-D, rows repeated).
The exact engine computes per-example gradients in chunks of 2^24 elements, so its peak
plateaus at large B: below that plateau it grows like B·P.

    .venv/bin/python benchmarks/dpsgd_engines.py [--repeats 3] [--budget-mib 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ENGINES = ("nonprivate", "exact", "ghost", "jl1", "jl5", "jl20")
MODELS = ("mlp", "grud")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _setup(model: str) -> dict[str, Any]:
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from service.modelspec import GrudSpec, MlpSpec

    if model == "mlp":
        from expm_adult import load_adult

        adult = load_adult()
        x, y = adult.x_train.float(), adult.y_train.float()
        return {
            "spec": MlpSpec(hidden=[16]),
            "x": x,
            "y": y,
            "width": x.shape[1],
            "means": None,
            "batch": 256,
            "mem_batch": 4096,
            "max_batch": 1 << 18,
        }
    from worker.synthetic_icu import generate_icu

    series = generate_icu(1000, hours=48, rng=np.random.default_rng(0))
    return {
        "spec": GrudSpec(hidden=16),
        "x": torch.tensor(series.packed()),
        "y": torch.tensor(series.labels).float(),
        "width": series.schema.n_vars,
        "means": series.schema.scaled_means,
        "batch": 50,
        "mem_batch": 256,
        "max_batch": 1 << 14,
    }


def _plan_mechanism(setup: dict[str, Any], engine: str) -> dict[str, Any] | None:
    from service.plans import build_plan
    from service.schemas import DpsgdOptions, JobRequest

    if engine == "nonprivate":
        return None
    name, r = ("jl", int(engine[2:])) if engine.startswith("jl") else (engine, None)
    if setup["spec"].kind == "grud" and name != "exact":
        return None
    timing_r = 5 if r == 1 else r  # r = 1: no plan (κ beyond the sampler); same cost
    request = JobRequest(
        dataset="bench",
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        model=setup["spec"],
        dpsgd=DpsgdOptions(
            engine=name,
            jl_projections=timing_r,  # type: ignore[arg-type]
            batch_size=setup["batch"],
            epochs=1,
        ),
    )
    kind = "timeseries" if setup["spec"].kind == "grud" else "tabular"
    plan = build_plan(request, n_rows=len(setup["x"]), n_features=setup["width"], dataset_kind=kind)
    mechanism = dict(plan.mechanism)
    if r == 1:
        mechanism["jl_projections"] = 1
    return mechanism


def _epoch_seconds(setup: dict[str, Any], engine: str, repeats: int) -> float | None:
    import torch

    from worker.mechanisms.base import TabularTrainingSet
    from worker.mechanisms.dpsgd import run_dpsgd
    from worker.models import build_module

    data = TabularTrainingSet(setup["x"], setup["y"], public_means=setup["means"])
    n, batch = len(setup["x"]), setup["batch"]
    steps = -(-n // batch)
    mechanism = _plan_mechanism(setup, engine)
    if engine != "nonprivate" and mechanism is None:
        return None

    def private() -> None:
        run_dpsgd(
            spec=setup["spec"],
            mechanism=mechanism or {},
            samples=1,
            data=data,
            device=torch.device("cpu"),
            progress=lambda k, t: None,
        )

    def nonprivate() -> None:
        module = build_module(setup["spec"], setup["width"], public_means=setup["means"])
        opt = torch.optim.SGD(module.parameters(), lr=0.5)
        for _ in range(steps):
            idx = torch.randint(0, n, (batch,))
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(
                module(setup["x"][idx]), setup["y"][idx]
            ).backward()
            opt.step()

    run = nonprivate if engine == "nonprivate" else private
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _step_fn(setup: dict[str, Any], engine: str) -> Callable[[int], object] | None:
    import torch

    from service.privacy.sampling import GRID_BITS
    from worker.mechanisms import grad_engines as ge
    from worker.models import build_module
    from worker.noise import secure_rng

    module = build_module(setup["spec"], setup["width"], public_means=setup["means"])
    p = sum(t.numel() for t in module.parameters())
    top = setup["max_batch"]
    reps = -(-top // len(setup["x"]))
    x = setup["x"].repeat(reps, *([1] * (setup["x"].dim() - 1)))[:top]
    y = setup["y"].repeat(reps)[:top]
    kw = {"grid_bits": GRID_BITS, "max_grad_norm": 1.0, "parameters": p}
    rng = secure_rng()
    if engine == "nonprivate":

        def step(b: int) -> None:
            module.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(module(x[:b]), y[:b]).backward()

        return step
    if engine == "exact":
        return lambda b: ge.clipped_integer_sum(module, x[:b], y[:b], **kw)
    if setup["spec"].kind == "grud":
        return None
    if engine == "ghost":
        return lambda b: ge.ghost_integer_sum(module, x[:b], y[:b], **kw)
    r = int(engine[2:])
    return lambda b: ge.jl_integer_sum(
        module, x[:b], y[:b], **kw, projections=r, kappa=2.0, rng=rng
    )


def _peak_mib(step: Callable[[int], object], batch: int) -> float:
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    step(batch)
    return (_status_kib("VmHWM") - before) / 1024


def child(model: str, engine: str, repeats: int, budget: float, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    setup = _setup(model)
    row: dict[str, Any] = {"model": model, "engine": engine}
    step = _step_fn(setup, engine)
    if step is None:
        return {**row, "supported": False}
    step(8)  # warm-up: one-time allocations
    b_mem = setup["mem_batch"]
    start = time.perf_counter()
    row["peak_mib"] = _peak_mib(step, b_mem)
    row["step_seconds"] = time.perf_counter() - start
    row["mem_batch"] = b_mem
    # largest b with peak(b) ≤ budget (assuming peak grows with b): doubling, then bisection
    lo, hi = 0, 16
    while hi <= setup["max_batch"] and _peak_mib(step, hi) <= budget:
        lo, hi = hi, 2 * hi
    hi = min(hi, setup["max_batch"] + 1)
    while hi - lo > max(1, lo // 64):  # to within 1.6%
        mid = (lo + hi) // 2
        if _peak_mib(step, mid) <= budget:
            lo = mid
        else:
            hi = mid
    row["largest_batch"] = lo
    row["batch_cap"] = setup["max_batch"]
    row["epoch_seconds"] = _epoch_seconds(setup, engine, repeats)
    row["supported"] = True
    return row


def auc_rows(*, runs: int, threads: int, epochs: int = 3) -> list[dict[str, Any]]:
    """Holdout AUC of the MLP on Adult at ε = 1, δ = 1e-5 (batch 256, ``epochs``), median of
    ``runs`` releases per engine: what the JL noise factor κ costs in utility."""
    import torch
    from expm_adult import load_adult
    from sklearn.metrics import roc_auc_score

    from service.plans import PlanError, build_plan
    from service.schemas import DpsgdOptions, JobRequest
    from worker.mechanisms.base import TabularTrainingSet
    from worker.mechanisms.dpsgd import run_dpsgd
    from worker.models import build_module

    torch.set_num_threads(threads)
    adult = load_adult()
    x, y = adult.x_train.float(), adult.y_train.float()
    spec = _setup_spec_mlp()
    out = []
    for engine in ENGINES:
        aucs: list[float] = []
        sigma = None
        for _ in range(runs):
            module = build_module(spec, x.shape[1])
            if engine == "nonprivate":
                opt = torch.optim.SGD(module.parameters(), lr=1.0)
                for _ in range(epochs * -(-len(x) // 256)):
                    idx = torch.randint(0, len(x), (256,))
                    opt.zero_grad()
                    torch.nn.functional.binary_cross_entropy_with_logits(
                        module(x[idx]), y[idx]
                    ).backward()
                    opt.step()
            else:
                name, r = ("jl", int(engine[2:])) if engine.startswith("jl") else (engine, None)
                request = JobRequest(
                    dataset="adult",
                    method="dpsgd",
                    epsilon=1.0,
                    delta=1e-5,
                    model=spec,
                    dpsgd=DpsgdOptions(
                        engine=name,  # type: ignore[arg-type]
                        jl_projections=r,
                        batch_size=256,
                        epochs=epochs,
                    ),
                )
                try:
                    plan = build_plan(request, n_rows=len(x), n_features=x.shape[1])
                except PlanError:
                    break
                sigma = plan.mechanism["noise_multiplier"]
                release = run_dpsgd(
                    spec=spec,
                    mechanism=plan.mechanism,
                    samples=1,
                    data=TabularTrainingSet(x, y),
                    device=torch.device("cpu"),
                    progress=lambda k, t: None,
                )
                module.load_state_dict(release.releases[0])
            with torch.no_grad():
                scores = module(adult.x_test.float()).numpy()
            aucs.append(float(roc_auc_score(adult.y_test.numpy(), scores)))
        row = {
            "engine": engine,
            "sigma": sigma,
            "auc_median": statistics.median(aucs) if aucs else None,
            "aucs": aucs,
        }
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def _setup_spec_mlp() -> Any:
    from service.modelspec import MlpSpec

    return MlpSpec(hidden=[16])


def _env() -> dict[str, str]:
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-mib", type=float, default=64.0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: on a shared 2-core machine two threads spin and run 10-20x slower)",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--auc-runs", type=int, default=3, help="releases per engine for AUC")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        row = child(args.child[0], args.child[1], args.repeats, args.budget_mib, args.threads)
        print(json.dumps(row))
        return
    command = ".venv/bin/python benchmarks/dpsgd_engines.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    print(f"$ {command}", flush=True)
    rows = []
    for model in args.models:
        for engine in ENGINES:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    model,
                    engine,
                    "--repeats",
                    str(args.repeats),
                    "--budget-mib",
                    str(args.budget_mib),
                    "--threads",
                    str(args.threads),
                ],
                check=True,
                capture_output=True,
                text=True,
                env=_env(),
                cwd=ROOT,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    aucs = auc_rows(runs=args.auc_runs, threads=args.threads) if "mlp" in args.models else []
    write(rows, aucs, command=command, budget=args.budget_mib, threads=args.threads, out=args.out)


def _largest(row: dict[str, Any], model: str) -> str:
    cap = row.get("batch_cap", 1 << 18 if model == "mlp" else 1 << 14)
    return f"≥ {cap} (the cap)" if row["largest_batch"] >= cap else str(row["largest_batch"])


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def write(
    rows: list[dict[str, Any]],
    aucs: list[dict[str, Any]],
    *,
    command: str,
    budget: float,
    threads: int,
    out: Path,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# DP-SGD gradient engines: time, peak memory, largest batch under a budget (CPU)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.platform()}, {threads} torch thread(s), shared with other jobs "
        "(load average ≈ 4 on 2 cores: timings "
        "are noisy; compare within a column of one run). No GPU was available.  ",
        "Per-epoch: one epoch of run_dpsgd on the service's plan (ε = 1, δ = 1e-5; MLP on "
        "Adult at B = 256, GRU-D on 1000 synthetic ICU stays at B = 50), median of the "
        "repeats. Peak: one engine step at batch B_mem (MLP 4096, GRU-D 256), VmHWM − VmRSS. "
        f"Largest batch: the largest B whose step peak stays ≤ {budget:g} MiB (binary "
        f"search to 1.6%, capped at 2^18 rows for the MLP, 2^14 for GRU-D). JL r = 1 is "
        "timed with the r = 5 plan's κ "
        "(its own plan is refused: κ ≈ 6.5e6). n/a: the engine refuses the model.",
        "",
        "| model | engine | per-epoch (s) | × non-private | peak at B_mem (MiB) | "
        f"largest B ≤ {budget:g} MiB |",
        "|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        base = next((r for r in rows if r["model"] == model and r["engine"] == "nonprivate"), None)
        for r in (r for r in rows if r["model"] == model):
            if not r["supported"]:
                lines.append(f"| {model} | {r['engine']} | n/a | n/a | n/a | n/a |")
                continue
            ratio = (
                r["epoch_seconds"] / base["epoch_seconds"] if base and r["epoch_seconds"] else None
            )
            lines.append(
                f"| {model} | {r['engine']} | {_fmt(r['epoch_seconds'], '.2f')} | "
                f"{_fmt(ratio, '.2f')} | {r['peak_mib']:.1f} | {_largest(r, model)} |"
            )
    lines += [
        "",
        "Utility: MLP (hidden 16) on Adult, ε = 1, δ = 1e-5, batch 256, 3 epochs, holdout AUC "
        "(median of the runs; non-private: the same loop without clipping or noise). σ is the "
        "noise multiplier the run adds (JL: κ·σ_eff).",
        "",
        "| engine | σ added | holdout AUC (median) | runs |",
        "|---|---|---|---|",
    ]
    for a in aucs:
        if a["auc_median"] is None:
            lines.append(f"| {a['engine']} | refused (422) | n/a | 0 |")
            continue
        sigma = "none" if a["sigma"] is None else f"{a['sigma']:.3g}"
        runs = ", ".join(f"{v:.3f}" for v in a["aucs"])
        lines.append(f"| {a['engine']} | {sigma} | {a['auc_median']:.3f} | {runs} |")
    lines.append("")
    text = "\n".join(lines)
    (out / "dpsgd_engines.md").write_text(text)
    (out / "dpsgd_engines.json").write_text(
        json.dumps({"command": command, "rows": rows, "auc": aucs}, indent=1)
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in (
        (axes[0], "peak_mib", "peak MiB at B_mem"),
        (axes[1], "largest_batch", f"largest B ≤ {budget:g} MiB"),
    ):
        names, values, colors = [], [], []
        for r in rows:
            if r["supported"]:
                names.append(f"{r['model']}\n{r['engine']}")
                values.append(max(float(r[key]), 0.1))
                colors.append("tab:blue" if r["model"] == "mlp" else "tab:orange")
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)), names, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(label)
    fig.tight_layout()
    fig.savefig(out / "dpsgd_engines.png", dpi=120)
    print(text)


if __name__ == "__main__":
    main()
