"""DP-SGD epoch time by model width: the product (exact fixed-point engine) vs Opacus 1.6
with per-sample-gradient hooks and with ghost clipping, in one run (issue 25, speed).

Adult (public-schema encoding, 104 features, 30162 rows); models: logistic regression and
tanh MLPs with one hidden layer of each ``--widths`` (default 64 256 1024). For each
model, one epoch of the plan the service builds for ε = 1, δ = 1e-5 with the default
batch size (n̂/20 clamped to [16, 256]: 256 on Adult), ``epochs = 1``, engine ``exact``:
q, T = ⌈n/256⌉ steps, σ from that plan, C = 1, the default learning rate.

* ``product``: worker.mechanisms.dpsgd.run_dpsgd exactly as a job runs it (own Poisson
  sampler, ExactNetClipper's integer sum, integer noise, update).
* ``opacus-hooks`` / ``opacus-ghost``: stock Opacus 1.6 ``PrivacyEngine.make_private`` with
  ``grad_sample_mode="hooks"`` (per-sample gradients materialised) or ``"ghost"`` (ghost
  clipping: per-sample norms without per-sample gradients, a second backward on the
  reweighted loss; make_private then also returns its criterion wrapper), Poisson
  sampling with the same q (its DataLoader's 1/len(loader), batch = round(q·n)), σ, C,
  T steps, SGD with a sum-reduced BCE-with-logits loss and lr/B, as
  benchmarks/dpsgd_speed.py sets Opacus up.

Width 1024 exceeds the API's hidden-width cap (256, service/params.py): the spec is built
with ``MlpSpec.model_construct`` (no validation), which changes nothing in what is timed.

Timing: torch at ``--threads`` (default 1) threads, in-process; one warm-up of each run on
logistic regression (imports, allocator), then per model ``--repeats`` interleaved rounds
(product, opacus-hooks, opacus-ghost, repeat) so drift hits all three alike; widths at or
above ``--wide-from`` get ``--wide-repeats`` rounds instead (kept short on a shared
machine). The table reports medians, min/max, and product / best Opacus median per model,
plus the AUC on adult.test of the first round's model of each (a sanity check that the runs
trained). A cProfile of one product epoch at ``--profile-width`` (top 15 cumulative and
the cumulative time of each worker/mechanisms/exact_net.py function) follows.

With ``--clip-baseline REV`` the clipped sum alone (ExactNetClipper, engines exact and
ghost) is also timed against its own code at git revision REV (exact_net.py and
fixed_point.py from ``git show``, imported as a separate package), interleaved on the same
batches, and every int64 sum is compared bit for bit: the before/after of a speed change
under the same load.

With ``--product-baseline REV`` the product's whole epoch also runs with worker/mechanisms'
dpsgd.py, exact_net.py and fixed_point.py, and worker/noise.py's ``rounded_gaussian``, as of
REV (imported as a separate package, its ``exact`` engine the baseline ExactNetClipper; the
rest of the tree is today's) as a fourth
interleaved run, ``product@REV``; once per model both run on the same seeded ChaCha stream
(instead of secure_rng) and their releases are compared bit for bit. ``--noise-baseline
REV`` does the same with only worker/noise.py as of REV (this tree's dpsgd.py calling that
revision's ``rounded_gaussian``): a change to the noise sampler alone, isolated from other
work in the tree.

``--widths`` with no value times logistic regression alone; ``--profile-width 0`` profiles
the logistic epoch.

    .venv/bin/python benchmarks/dpsgd_widths.py [--repeats 3] [--widths 64 256 1024]
        [--clip-baseline REV] [--product-baseline REV | --noise-baseline REV]
        [--profile-width 256]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

from service.modelspec import LogisticSpec, MlpSpec  # noqa: E402
from service.plans import build_plan  # noqa: E402
from service.schemas import DpsgdOptions, JobRequest  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.dpsgd import run_dpsgd  # noqa: E402
from worker.models import build_module  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RUNS = ("product", "opacus-hooks", "opacus-ghost")
BASELINE_RUN = "product@baseline"
State = dict[str, torch.Tensor]


def spec_for(width: int | None) -> Any:
    if width is None:
        return LogisticSpec()
    # model_construct: 1024 is above the API's cap on a hidden width (256).
    return MlpSpec.model_construct(kind="mlp", hidden=[width], activation="tanh")


def plan_for(spec: Any, n: int, d: int) -> dict[str, Any]:
    request = JobRequest(
        dataset="adult",
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        model=spec_for(None) if spec.kind == "logistic" else MlpSpec(hidden=[16]),
        dpsgd=DpsgdOptions(engine="exact", epochs=1),
    )
    # The request is validated with a stand-in model of the same kind; the real (possibly
    # over-cap) one is swapped in unvalidated.
    plan = build_plan(request.model_copy(update={"model": spec}), n_rows=n, n_features=d)
    return dict(plan.mechanism)


def make_runs(
    spec: Any,
    mechanism: dict[str, Any],
    x: torch.Tensor,
    y: torch.Tensor,
    baseline: Any = None,
) -> dict[str, Callable[[], State]]:
    n, d = x.shape
    q, steps, sigma = mechanism["sampling_rate"], mechanism["steps"], mechanism["noise_multiplier"]
    clip = float(mechanism.get("max_grad_norm", 1.0))
    lr = float(mechanism.get("learning_rate", 1.0))
    train = TabularTrainingSet(x, y)

    def product(run: Callable[..., Any] = run_dpsgd) -> State:
        out = run(
            spec=spec,
            mechanism=mechanism,
            samples=1,
            data=train,
            device=torch.device("cpu"),
            progress=lambda a, b: None,
        )
        return out.releases[0]

    def opacus(mode: str) -> State:
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        module = build_module(spec, d)
        batch = round(q * n)  # Opacus: q = 1/len(loader) = 1/ceil(n/batch)
        loader = DataLoader(TensorDataset(x, y), batch_size=batch)
        opt = torch.optim.SGD(module.parameters(), lr=lr / batch)
        loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")
        engine = PrivacyEngine(accountant="rdp")
        kw: dict[str, Any] = {
            "module": module,
            "optimizer": opt,
            "data_loader": loader,
            "noise_multiplier": sigma,
            "max_grad_norm": clip,
            "loss_reduction": "sum",
            "poisson_sampling": True,
            "grad_sample_mode": mode,
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if mode == "ghost":
                wrapped, dp_opt, criterion, dp_loader = engine.make_private(criterion=loss_fn, **kw)
            else:
                wrapped, dp_opt, dp_loader = engine.make_private(**kw)
                criterion = loss_fn
        done = 0
        while done < steps:
            for xb, yb in dp_loader:
                dp_opt.zero_grad(set_to_none=True)
                criterion(wrapped(xb), yb).backward()
                dp_opt.step()
                done += 1
                if done == steps:
                    break
        inner = wrapped._module
        return {k: v.detach().clone() for k, v in inner.state_dict().items()}

    runs: dict[str, Callable[[], State]] = {"product": product}
    if baseline is not None:
        runs[BASELINE_RUN] = lambda: product(baseline.run_dpsgd)
    runs["opacus-hooks"] = lambda: opacus("hooks")
    runs["opacus-ghost"] = lambda: opacus("ghost")
    return runs


def auc(spec: Any, d: int, state: State, x: torch.Tensor, y: torch.Tensor) -> float:
    from sklearn.metrics import roc_auc_score

    module = build_module(spec, d)
    module.load_state_dict({k: v.float() for k, v in state.items()})
    with torch.no_grad():
        scores = module(x.float())
    return float(roc_auc_score(y.numpy(), scores.numpy()))


def profile_product(run: Callable[[], State]) -> tuple[float, str, list[tuple[str, float, int]]]:
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    run()
    prof.disable()
    wall = time.perf_counter() - start
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("cumulative").print_stats(15)
    top = "\n".join(
        line.replace(str(ROOT) + "/", "").rstrip()
        for line in buf.getvalue().splitlines()
        if line.strip()
    )
    ours: list[tuple[str, float, int]] = []
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, line, func), (_cc, ncalls, _tt, ct, _callers) in raw.items():
        if filename.endswith("exact_net.py") or filename.endswith("fixed_point.py"):
            name = f"{Path(filename).name}:{line}({func})"
            ours.append((name, ct, ncalls))
    ours.sort(key=lambda t: -t[1])
    # The two stages of a step: the noise draw (dpsgd.py's draw → worker/noise.py) and the
    # clipped integer sum (ExactNetClipper.__call__).
    for (filename, _line, func), (_cc, ncalls, _tt, ct, _callers) in raw.items():
        if filename.endswith("mechanisms/dpsgd.py") and func == "draw":
            ours.insert(0, ("noise: dpsgd.py(draw) → worker/noise.py", ct, ncalls))
    return wall, top, ours


def load_baseline(rev: str, package_name: str, modules: tuple[str, ...]) -> dict[str, Any]:
    """worker/mechanisms/<module>.py for each of ``modules`` as of git revision ``rev``,
    imported as the separate package ``package_name`` (their imports of one another
    rewritten; the rest of the tree is today's)."""
    import importlib
    import subprocess
    import tempfile

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout

    tmp = Path(tempfile.mkdtemp(prefix=f"{package_name}_"))
    package = tmp / package_name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in modules:
        source = show(f"worker/mechanisms/{name}.py")
        for other in modules:
            source = source.replace(
                f"from worker.mechanisms.{other} import", f"from {package_name}.{other} import"
            )
        (package / f"{name}.py").write_text(source)
    sys.path.insert(0, str(tmp))
    return {name: importlib.import_module(f"{package_name}.{name}") for name in modules}


def load_baseline_clipper(rev: str) -> Any:
    """exact_net.py and fixed_point.py as of git revision ``rev``, imported as a separate
    package (the rest of the tree is today's), for the clipped sum's before/after."""
    return load_baseline(rev, "clip_baseline", ("fixed_point", "exact_net"))["exact_net"]


def load_baseline_dpsgd(rev: str) -> Any:
    """dpsgd.py, exact_net.py and fixed_point.py as of ``rev`` (:func:`load_baseline`),
    the baseline's ``exact`` engine being its own ExactNetClipper (logistic regression and
    MLPs, the models timed here), and its noise draws worker/noise.py's ``rounded_gaussian``
    as of ``rev`` (benchmarks/noise_speed.py's loader), for the whole epoch's before/after."""
    from noise_speed import load_baseline as load_noise  # benchmarks/noise_speed.py

    mods = load_baseline(rev, "dpsgd_baseline", ("fixed_point", "exact_net", "dpsgd"))
    dpsgd, exact_net = mods["dpsgd"], mods["exact_net"]
    dpsgd.exact_clipper = lambda module, **kw: exact_net.ExactNetClipper(module, **kw)
    dpsgd.rounded_gaussian = load_noise(rev).rounded_gaussian
    return dpsgd


class NoiseBaseline:
    """This tree's run_dpsgd with worker/noise.py as of ``rev`` (its ``rounded_gaussian``, the
    only noise function dpsgd.py calls, swapped in for the call): the epoch's before/after
    of a change to the sampler alone. ``secure_rng`` is the one the call uses (same_releases
    replaces it, as for a baseline package)."""

    def __init__(self, rev: str) -> None:
        from noise_speed import load_baseline as load_noise  # benchmarks/noise_speed.py

        from worker.mechanisms import dpsgd

        self.rounded_gaussian = load_noise(rev).rounded_gaussian
        self.secure_rng = dpsgd.secure_rng

    def run_dpsgd(self, **kwargs: Any) -> Any:
        from worker.mechanisms import dpsgd

        saved = dpsgd.rounded_gaussian, dpsgd.secure_rng
        dpsgd.rounded_gaussian, dpsgd.secure_rng = self.rounded_gaussian, self.secure_rng
        try:
            return dpsgd.run_dpsgd(**kwargs)
        finally:
            dpsgd.rounded_gaussian, dpsgd.secure_rng = saved


def same_releases(
    spec: Any, mechanism: dict[str, Any], x: torch.Tensor, y: torch.Tensor, baseline: Any
) -> bool:
    """One epoch of this tree's run_dpsgd and the baseline's on the same seeded ChaCha
    stream (secure_rng replaced in both modules for the call) from the same initial weights
    (torch's generator seeded before each): bit-identical releases?"""
    import numpy as np
    from randomgen import ChaCha

    from worker.mechanisms import dpsgd as tree

    train = TabularTrainingSet(x, y)
    releases = []
    for module in (tree, baseline):
        saved = module.secure_rng
        module.secure_rng = lambda: np.random.Generator(ChaCha(key=25, rounds=20))
        torch.manual_seed(25)  # an MLP's initial weights come from torch's generator
        try:
            out = module.run_dpsgd(
                spec=spec,
                mechanism=mechanism,
                samples=1,
                data=train,
                device=torch.device("cpu"),
                progress=lambda a, b: None,
            )
        finally:
            module.secure_rng = saved
        releases.append(out.releases[0])
    a, b = releases
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def compare_clippers(
    rev: str,
    models: list[tuple[str, int | None]],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch: int,
    steps: int,
    rounds: int,
) -> list[str]:
    """ExactNetClipper (engine exact/ghost) of this tree vs revision ``rev`` on the same
    ``steps`` batches of ``batch`` Adult rows per model, interleaved rounds; medians in ms
    per step, and whether every int64 sum is bit-identical."""
    from worker.mechanisms import exact_net

    baseline = load_baseline_clipper(rev)
    gen = torch.Generator().manual_seed(25)
    batches = [torch.randperm(x.shape[0], generator=gen)[:batch] for _ in range(steps)]
    lines = [
        f"## The clipped sum alone: this tree vs {rev}",
        "",
        f"ExactNetClipper(x, y) on the same {steps} batches of {batch} Adult rows per model "
        f"(random parameters, grid 2^-20, C = 1), {rounds} interleaved rounds (baseline, "
        "this tree); medians in ms per step, and whether every int64 sum is bit-identical.",
        "",
        f"| model | {rev} ms/step | this tree ms/step | this / {rev} | sums identical |",
        "|---|---:|---:|---:|---|",
    ]
    for label, w in models:
        torch.manual_seed(0)
        module = build_module(spec_for(w), x.shape[1])
        p = sum(v.numel() for v in module.parameters())
        clips = {
            name: mod.ExactNetClipper(module, grid_bits=20, max_grad_norm=1.0, parameters=p)
            for name, mod in (("baseline", baseline), ("tree", exact_net))
        }
        times: dict[str, list[float]] = {k: [] for k in clips}
        sums: dict[str, list[torch.Tensor]] = {}
        for _ in range(rounds):
            for name, clip in clips.items():
                t = time.perf_counter()
                sums[name] = [clip(x[i], y[i]) for i in batches]
                times[name].append((time.perf_counter() - t) / steps * 1e3)
        same = all(torch.equal(a, b) for a, b in zip(sums["baseline"], sums["tree"], strict=True))
        old, new = statistics.median(times["baseline"]), statistics.median(times["tree"])
        print(label, "clip ms/step", round(old, 2), round(new, 2), same, flush=True)
        lines.append(
            f"| {label} | {old:.2f} | {new:.2f} | {new / old:.2f} | {'yes' if same else 'NO'} |"
        )
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--widths", type=int, nargs="*", default=[64, 256, 1024])
    ap.add_argument("--wide-from", type=int, default=1024)
    ap.add_argument("--wide-repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile-width", type=int, default=256)
    ap.add_argument("--no-logistic", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--clip-baseline",
        default=None,
        help="a git revision: also time ExactNetClipper of that revision against this tree's",
    )
    ap.add_argument("--clip-rounds", type=int, default=5)
    ap.add_argument(
        "--product-baseline",
        default=None,
        help="a git revision: also time the product's epoch with that revision's dpsgd.py, "
        "exact_net.py, fixed_point.py and noise sampler, interleaved, and compare releases on "
        "a seeded stream",
    )
    ap.add_argument(
        "--noise-baseline",
        default=None,
        help="a git revision: as --product-baseline, but only worker/noise.py is that "
        "revision's (this tree's dpsgd.py with its rounded_gaussian)",
    )
    args = ap.parse_args()
    if args.product_baseline and args.noise_baseline:
        ap.error("--product-baseline and --noise-baseline are exclusive")
    # Opacus's secure-RNG notice and torch's full-backward-hook notice, once per run.
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    t_start = time.perf_counter()
    data = load_adult()
    x, y = data.x_train.float(), data.y_train.float()
    n, d = x.shape

    models: list[tuple[str, int | None]] = [] if args.no_logistic else [("logistic", None)]
    models += [(f"MLP [{w}]", w) for w in args.widths]
    plans = {label: plan_for(spec_for(w), n, d) for label, w in models}

    baseline: Any = None
    if args.product_baseline:
        baseline = load_baseline_dpsgd(args.product_baseline)
    elif args.noise_baseline:
        baseline = NoiseBaseline(args.noise_baseline)
    runs_order = RUNS if baseline is None else (RUNS[0], BASELINE_RUN, *RUNS[1:])
    # Warm-up: each run once on logistic regression (imports, allocator).
    warm = make_runs(spec_for(None), plan_for(spec_for(None), n, d), x, y, baseline)
    for fn in warm.values():
        fn()

    rows: list[dict[str, Any]] = []
    for label, w in models:
        spec = spec_for(w)
        runs = make_runs(spec, plans[label], x, y, baseline)
        rounds = args.wide_repeats if w is not None and w >= args.wide_from else args.repeats
        times: dict[str, list[float]] = {k: [] for k in runs_order}
        aucs: dict[str, float] = {}
        identical = (
            same_releases(spec, plans[label], x, y, baseline) if baseline is not None else None
        )
        for r in range(rounds):  # interleaved: product, (baseline,) hooks, ghost, repeat
            for name in runs_order:
                t = time.perf_counter()
                state = runs[name]()
                times[name].append(time.perf_counter() - t)
                if r == 0:
                    aucs[name] = auc(spec, d, state, data.x_test, data.y_test)
            print(label, r, {k: round(v[-1], 3) for k, v in times.items()}, flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        best = min(("opacus-hooks", "opacus-ghost"), key=lambda k: med[k])
        params = sum(v.numel() for v in build_module(spec, d).parameters())
        rows.append(
            {
                "label": label,
                "width": w,
                "params": params,
                "rounds": rounds,
                "times": times,
                "med": med,
                "best": best,
                "ratio": med["product"] / med[best],
                "ratio_ghost": med["product"] / med["opacus-ghost"],
                "aucs": aucs,
                "plan": plans[label],
                "identical": identical,
            }
        )

    prof_w = args.profile_width or None  # 0: logistic regression
    prof_label = "logistic" if prof_w is None else f"MLP [{prof_w}]"
    prof_plan = plan_for(spec_for(prof_w), n, d)
    prof_wall, prof_top, prof_ours = profile_product(
        make_runs(spec_for(prof_w), prof_plan, x, y)["product"]
    )
    clip_lines: list[str] = []
    if args.clip_baseline:
        clip_lines = compare_clippers(
            args.clip_baseline,
            models,
            x,
            y,
            batch=round(plans[models[0][0]]["sampling_rate"] * n),
            steps=40,
            rounds=args.clip_rounds,
        )
    load_end = os.getloadavg()
    total = time.perf_counter() - t_start

    def load(t: tuple[float, float, float]) -> str:
        return " / ".join(f"{v:.2f}" for v in t)

    command = ".venv/bin/python benchmarks/dpsgd_widths.py " + shlex.join(sys.argv[1:])
    m0 = rows[0]["plan"]
    lines = [
        "# DP-SGD epoch time by width: the product vs Opacus hooks and ghost (one run)",
        "",
        f"Command: `{command.strip()}`. Machine: {platform.machine()}, {os.cpu_count()} "
        f"cores (shared), {torch.get_num_threads()} torch thread(s), CPU, "
        f"torch {torch.__version__}. Load average (1/5/15 min) at start {load(load_start)}, "
        f"at end {load(load_end)}. Total wall time {total:.0f} s.",
        "",
        f"Adult, n = {n}, d = {d}; one epoch of the plan for (ε, δ) = (1, 1e-5), default "
        f"batch (expected {m0['sampling_rate'] * n:.0f}), engine exact: q = "
        f"{m0['sampling_rate']:.6g}, T = {m0['steps']}, C = {m0.get('max_grad_norm', 1.0)}, "
        f"lr = {m0.get('learning_rate', 1.0)}; σ per model below. Medians of the "
        "interleaved rounds (product, opacus-hooks, opacus-ghost) after one warm-up of each "
        "on logistic regression; AUC on adult.test of each run's first-round model.",
        "",
        "| model | params | σ | rounds | product s | opacus-hooks s | opacus-ghost s "
        "| product / best Opacus | product / ghost | AUC product / hooks / ghost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def cell(r: dict[str, Any], k: str) -> str:
        ts = r["times"][k]
        return f"{r['med'][k]:.3f} ({min(ts):.3f}–{max(ts):.3f})"

    for r in rows:
        a = r["aucs"]
        lines.append(
            f"| {r['label']} | {r['params']} | {r['plan']['noise_multiplier']:.4g} | "
            f"{r['rounds']} | {cell(r, 'product')} | {cell(r, 'opacus-hooks')} | "
            f"{cell(r, 'opacus-ghost')} | {r['ratio']:.3f} ({r['best']}) | "
            f"{r['ratio_ghost']:.3f} | "
            f"{a['product']:.4f} / {a['opacus-hooks']:.4f} / {a['opacus-ghost']:.4f} |"
        )
    lines += ["", "Cells: median (min–max) seconds per epoch.", ""]
    if baseline is not None:
        rev = args.product_baseline or f"noise@{args.noise_baseline}"
        swapped = (
            "dpsgd.py, exact_net.py, fixed_point.py and worker/noise.py's rounded_gaussian"
            if args.product_baseline
            else "worker/noise.py (the rest this tree's)"
        )
        lines += [
            f"## The product's epoch: this tree vs {rev}",
            "",
            f"product@{rev}: {swapped} as of {rev.removeprefix('noise@')}, timed in "
            "the same interleaved rounds (medians). Releases: one epoch of each on the same "
            "seeded ChaCha stream, compared bit for bit.",
            "",
            f"| model | {rev} s | this tree s | this / {rev} | {rev} / best Opacus "
            "| this / best Opacus | releases identical |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            best = r["med"][r["best"]]
            old, new = r["med"][BASELINE_RUN], r["med"]["product"]
            lines.append(
                f"| {r['label']} | {cell(r, BASELINE_RUN)} | {cell(r, 'product')} | "
                f"{new / old:.3f} | {old / best:.3f} | {new / best:.3f} | "
                f"{'yes' if r['identical'] else 'NO'} |"
            )
        lines.append("")
    lines += ["## Goal check", ""]
    for r in rows:
        goal = 0.2 if r["width"] is None else 1.0
        met = "met" if r["ratio"] <= goal else "NOT met"
        lines.append(
            f"- {r['label']}: product / best Opacus = {r['ratio']:.3f} (goal ≤ {goal}): **{met}**."
        )
    lines += [
        "",
        f"## Where the product's time goes ({prof_label}, one epoch, cProfile)",
        "",
        f"One profiled epoch: {prof_wall:.2f} s wall (profiler overhead included).",
        "",
        "Cumulative time of the noise draw and of worker/mechanisms/exact_net.py "
        "(and fixed_point.py) functions:",
        "",
        "| function | calls | cumulative s | share of epoch |",
        "|---|---:|---:|---:|",
    ]
    for name, ct, ncalls in prof_ours[:12]:
        lines.append(f"| {name} | {ncalls} | {ct:.3f} | {ct / prof_wall:.0%} |")
    lines += ["", "Top 15 by cumulative time:", "", "```", prof_top, "```", ""]
    lines += clip_lines
    noise = next((ct for name, ct, _ in prof_ours if name.startswith("noise:")), 0.0)
    clip = next((ct for name, ct, _ in prof_ours if name.endswith("(__call__)")), 0.0)
    met = [r["label"] for r in rows if r["ratio"] <= (0.2 if r["width"] is None else 1.0)]
    lines += [
        "## Reading",
        "",
        f"Goal met for: {', '.join(met) if met else 'none of the models'}. "
        f"In the profiled {prof_label} epoch the noise draw takes {noise / prof_wall:.0%} "
        f"and the exact clipped sum (ExactNetClipper.__call__) {clip / prof_wall:.0%} of the "
        "time; the rest is the sampler, indexing and the update. The machine is shared "
        f"(load {load_start[0]:.1f} at start, {load_end[0]:.1f} at end on "
        f"{os.cpu_count()} cores): single rounds vary, compare medians within this run only.",
        "",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (RESULTS / "dpsgd_widths.md").write_text(text)
        print(f"wrote {RESULTS / 'dpsgd_widths.md'}")


if __name__ == "__main__":
    main()
