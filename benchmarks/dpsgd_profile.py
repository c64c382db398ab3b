"""Where the product's DP-SGD time goes, stage by stage (Adult logistic regression, ε = 1,
batch 256, 3 epochs: the configuration of dpsgd_speed.py).

The stages of one run of worker.mechanisms.dpsgd._train_one, each timed around the same
objects the run uses: PoissonSampler, the engine ``dpsgd.integer_sum_for`` builds for the
plan (the exact engine, ``grad_engines.exact_clipper``: for logistic regression the
IEEE-only exact clipper, whose per-row residuals and norm bounds are fixed-point functions
of the row and θ alone), NoiseStream and the flat parameter buffer; summed over the run's
T steps, the median over ``--repeats`` runs, next to the median of the whole run_dpsgd call
measured in the same process, rounds interleaved. "Loop and other" is the whole run minus
the stages (Python loop, progress callback, model construction). Then a cProfile of one
whole run_dpsgd: the functions with the most own time, so the exact engine's inside (σ̃,
the fixed-point rows, the clip weights, the reduction) shows whatever classes implement it.
Run:

    .venv/bin/python benchmarks/dpsgd_profile.py [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import platform
import pstats
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

from service.modelspec import LogisticSpec  # noqa: E402
from service.plans import build_plan  # noqa: E402
from service.schemas import DpsgdOptions, JobRequest  # noqa: E402
from worker.mechanisms import dpsgd  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.models import build_module  # noqa: E402
from worker.noise import secure_rng  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
STAGES = (
    "Poisson coins (all steps)",
    "gather rows",
    "exact engine: clipped integer sum",
    "noise draw + add",
    "scale + step",
)


def engine_name(params: dpsgd.DpsgdParams, data: TabularTrainingSet) -> str:
    """The class the run's engine is (what ``integer_sum_for`` picks for the plan)."""
    module = build_module(LogisticSpec(), data.n_features)
    engine = dpsgd.integer_sum_for(params, module=module, rng=secure_rng())
    return f"{type(engine).__module__}.{type(engine).__qualname__}"


def staged_run(params: dpsgd.DpsgdParams, data: TabularTrainingSet) -> dict[str, float]:
    """One run of the product's stages with a timer around each (seconds per stage)."""
    spent: dict[str, float] = defaultdict(float)
    module = build_module(LogisticSpec(), data.n_features)
    theta = dpsgd._flat_parameters(module)
    rng = secure_rng()
    integer_sum = dpsgd.integer_sum_for(params, module=module, rng=rng)
    sampler = dpsgd.PoissonSampler(sampling_rate=params.sampling_rate, rng=rng)
    noise = dpsgd.NoiseStream(rng=rng, size=params.parameters, steps=params.steps)
    unit = params.learning_rate * params.max_grad_norm * 2.0**-params.grid_bits
    unit /= params.expected_batch_size
    t = time.perf_counter()
    batches = [
        idx
        for block in sampler.blocks(data.n, params.steps)
        for idx in torch.from_numpy(block.rows).split(block.sizes)
    ]
    spent[STAGES[0]] += time.perf_counter() - t
    for step, idx in enumerate(batches, start=1):
        t0 = time.perf_counter()
        x, y = data.x.index_select(0, idx), data.y.index_select(0, idx)
        t1 = time.perf_counter()
        summed = integer_sum(x, y)
        t2 = time.perf_counter()
        scale = params.sigma_at(step) * 2.0**params.grid_bits
        summed += noise.draw(scale=scale, same_scale_ahead=params.steps_with_same_sigma(step))
        t3 = time.perf_counter()
        theta.sub_(summed.double() * unit)
        t4 = time.perf_counter()
        marks = (t0, t1, t2, t3, t4)
        for name, a, b in zip(STAGES[1:], marks[:-1], marks[1:], strict=True):
            spent[name] += b - a
    return spent


def profile_table(run: Callable[[], object], *, top: int) -> tuple[float, list[str]]:
    """cProfile of one call of ``run``: (its seconds, markdown rows of the ``top``
    functions by own time)."""
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.runcall(run)
    seconds = time.perf_counter() - t
    stats = pstats.Stats(prof, stream=io.StringIO())
    entries = sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: kv[1][2],
        reverse=True,
    )[:top]
    rows = []
    for (file, line, name), (_, calls, own, cum, _) in entries:
        where = f"{Path(file).name}:{line}" if line else "built-in"
        rows.append(
            f"| `{name}` ({where}) | {calls} | {own * 1e3:.1f} | {cum * 1e3:.1f} | "
            f"{own / seconds:.0%} |"
        )
    return seconds, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=15, help="cProfile rows")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    adult = load_adult()
    data = TabularTrainingSet(adult.x_train.float(), adult.y_train.float())
    request = JobRequest(
        dataset="adult",
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        dpsgd=DpsgdOptions(batch_size=256, epochs=3, learning_rate=1.0, max_grad_norm=1.0),
    )
    mechanism = build_plan(request, n_rows=data.n, n_features=data.n_features).mechanism
    params = dpsgd.DpsgdParams.from_plan(mechanism)

    def whole() -> None:
        dpsgd.run_dpsgd(
            spec=LogisticSpec(),
            mechanism=mechanism,
            samples=1,
            data=data,
            device=torch.device("cpu"),
            progress=lambda a, b: None,
        )

    whole()
    staged_run(params, data)  # warm-up
    totals: list[float] = []
    stages: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.repeats):  # interleaved
        t = time.perf_counter()
        whole()
        totals.append(time.perf_counter() - t)
        for name, seconds in staged_run(params, data).items():
            stages[name].append(seconds)
    total = statistics.median(totals)
    med = {name: statistics.median(stages[name]) for name in STAGES}
    profiled, top_rows = profile_table(whole, top=args.top)
    command = ".venv/bin/python benchmarks/dpsgd_profile.py " + shlex.join(sys.argv[1:])
    ms_per_step = 1e3 / params.steps
    lines = [
        "# DP-SGD: where the product's time goes (Adult logistic regression)",
        "",
        f"Command: `{command}`. Machine: {platform.machine()}, {torch.get_num_threads()} "
        f"torch threads, CPU, torch {torch.__version__}. ε = 1, δ = 1e-5, T = "
        f"{params.steps} steps, q = {params.sampling_rate:.6g}, {params.parameters} "
        f"parameters, engine `{params.engine}` = `{engine_name(params, data)}`. Medians of "
        f"{args.repeats} runs; whole run_dpsgd median {total:.4f} s "
        f"(min {min(totals):.4f}, max {max(totals):.4f}).",
        "",
        "| stage | median s per run | ms per step | share of the whole run |",
        "|---|---:|---:|---:|",
    ]
    for name in STAGES:
        lines.append(
            f"| {name} | {med[name]:.4f} | {med[name] * ms_per_step:.3f} | "
            f"{med[name] / total:.0%} |"
        )
    rest = total - sum(med.values())
    lines.append(f"| loop and other | {rest:.4f} | {rest * ms_per_step:.3f} | {rest / total:.0%} |")
    lines.append(f"| **whole run** | {total:.4f} | {total * ms_per_step:.3f} | 100% |")
    lines += [
        "",
        f"cProfile of one whole run_dpsgd ({profiled:.3f} s under the profiler), the "
        f"{args.top} functions with the most own time (torch and numpy operators count "
        "inside the Python function that calls them unless listed as built-ins):",
        "",
        "| function | calls | own ms | cumulative ms | own share |",
        "|---|---:|---:|---:|---:|",
        *top_rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (RESULTS / "dpsgd_profile.md").write_text(text)
        print(f"wrote {RESULTS / 'dpsgd_profile.md'}")


if __name__ == "__main__":
    main()
