"""Empirical privacy audit of DP-SGD: Clopper–Pearson lower bounds on ε from the two
distinguishers of tests/privacy/test_audit_dpsgd.py (same harness, same plans), run
against the live worker code or against the pre-fix DP-SGD.

    .venv/bin/python benchmarks/privacy_audit.py --impl old       # DP-SGD as of PRE_FIX_COMMIT
    .venv/bin/python benchmarks/privacy_audit.py --impl current   # worker/mechanisms/dpsgd.py

``--impl old`` imports worker/mechanisms/dpsgd.py as it was at PRE_FIX_COMMIT (written to
``--old-path`` with ``git show`` if that file is missing); it runs on today's plan builder
and worker helpers. Options: ``--runs N`` (per world, default: the test's constants),
``--only row-count|canary``, ``--public-n N --features D`` (the row-count distinguisher's
n̂ and width; the issue's audit used 100 and 50000). Updates
benchmarks/results/privacy_audit.md: a row per (distinguisher, implementation, runs per
world), with the command that produced it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from tests.privacy.harness import (  # noqa: E402
    CLAIMED_EPSILON,
    CONFIDENCE,
    DELTA,
    ROW_COUNT_FEATURES,
    ROW_COUNT_PUBLIC_N,
    SELECTION_FRACTION,
    Distinguisher,
    RunDpsgd,
    canary_distinguisher,
    row_count_distinguisher,
    run_audit,
)

RESULTS = REPO / "benchmarks" / "results" / "privacy_audit.md"
PRE_FIX_COMMIT = "533a477f1603d9ad6054bd5046d12200741e1793"
REPORT_CONFIDENCE = 0.95
HEADER = (
    "| distinguisher | impl | runs per world | claimed ε | ε_lb (95% CP) "
    f"| ε_lb ({CONFIDENCE:.1%} CP, the test's level) | held-out hits w0 / w1 (95%) "
    "| σ, q, T | seconds | command |"
)
RULE = "|---|---|---:|---:|---:|---:|---|---|---:|---|"


def load_impl(impl: str, old_path: Path) -> RunDpsgd:
    if impl == "current":
        from worker.mechanisms.dpsgd import run_dpsgd

        return run_dpsgd
    if not old_path.exists():
        src = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{PRE_FIX_COMMIT}:worker/mechanisms/dpsgd.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        old_path.write_text(src)
    spec = importlib.util.spec_from_file_location("pre_fix_dpsgd", old_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pre_fix_dpsgd"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    fn: RunDpsgd = module.run_dpsgd
    return fn


def audit_row(
    d: Distinguisher, *, impl: str, run_dpsgd: RunDpsgd, runs: int | None, command: str
) -> str:
    outcome = run_audit(d, run_dpsgd=run_dpsgd, runs_per_world=runs)
    b95 = outcome.bound(confidence=REPORT_CONFIDENCE)
    btest = outcome.bound(confidence=CONFIDENCE)
    m = outcome.plan.mechanism
    n = outcome.stats_world0.size
    print(f"\n{d.name} [{impl}]: {n} runs per world in {outcome.seconds:.1f} s")
    print(
        f"  plan: public n = {outcome.plan.n_rows}, σ = {m['noise_multiplier']:.4f}, "
        f"q = {m['sampling_rate']:g}, T = {m['steps']}, C = {m['max_grad_norm']:g}, "
        f"lr = {m['learning_rate']:g}"
    )
    print(
        f"  statistic mean ± sd: world 0 {outcome.stats_world0.mean():.6g} ± "
        f"{outcome.stats_world0.std(ddof=1):.3g}, world 1 {outcome.stats_world1.mean():.6g} ± "
        f"{outcome.stats_world1.std(ddof=1):.3g}"
    )
    for b in (b95, btest):
        print(
            f"  ε_lb = {b.epsilon:.3f} at {b.confidence:.1%} (claimed {CLAIMED_EPSILON}, "
            f"δ = {DELTA:g}); test: {b.orientation} {b.threshold:.6g} chosen on "
            f"{b.selection_runs_world0}+{b.selection_runs_world1} runs; held-out hits "
            f"{b.hits_world0}/{b.runs_world0} vs {b.hits_world1}/{b.runs_world1}; "
            f"FPR_u = {b.fpr_upper:.4f}, FNR_u = {b.fnr_upper:.4f}"
        )
    return (
        f"| {d.name} | {impl} | {n} | {CLAIMED_EPSILON:g} | {b95.epsilon:.2f} "
        f"| {btest.epsilon:.2f} | {b95.hits_world0}/{b95.runs_world0} vs "
        f"{b95.hits_world1}/{b95.runs_world1} ({b95.orientation}) "
        f"| {m['noise_multiplier']:.3f}, {m['sampling_rate']:g}, {m['steps']} "
        f"| {outcome.seconds:.0f} | `{command}` |"
    )


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _previous_rows() -> list[str]:
    """Measured rows of the previous results file (placeholders dropped)."""
    if not RESULTS.exists():
        return []
    return [
        line
        for line in RESULTS.read_text().splitlines()
        if line.startswith("| ")
        and len(_cells(line)) > 3
        and _cells(line)[1] in ("old", "current")
        and _cells(line)[2].isdigit()
    ]


def _placeholders(impl: str) -> list[str]:
    names = (row_count_distinguisher().name, canary_distinguisher().name)
    return [
        f"| {name} | {impl} | — | {CLAIMED_EPSILON:g} | not measured yet | — | — | — | — "
        f"| `.venv/bin/python benchmarks/privacy_audit.py --impl {impl}` |"
        for name in names
    ]


def write_results(rows: list[str]) -> None:
    """New rows replace earlier rows of the same (distinguisher, impl, runs); others stay."""

    def key(line: str) -> tuple[str, str, str]:
        c = _cells(line)
        return c[0], c[1], c[2]

    new_keys = {key(r) for r in rows}
    table = [r for r in _previous_rows() if key(r) not in new_keys] + rows
    for impl in ("old", "current"):
        if not any(_cells(r)[1] == impl for r in table):
            table += _placeholders(impl)
    table.sort(key=lambda r: (_cells(r)[1] != "old", _cells(r)[0], _cells(r)[2]))
    text = (
        f"""# Privacy audit of DP-SGD: empirical lower bounds on ε

Each row is one run of the command in its last column (rows are replaced only by a rerun
of the same distinguisher, implementation and run count). Machine: {platform.machine()},
{os.cpu_count()} cores, CPU only, 1 torch thread during the runs, torch {torch.__version__}.

Both worlds run under ONE plan built by `service.plans.build_plan` from the public row
count n̂ (world 1's size), claimed (ε, δ) = ({CLAIMED_EPSILON:g}, {DELTA:g}); the data differ by
one row (world 0 = D, world 1 = D plus one row). The statistic's threshold and orientation are
chosen on the first {SELECTION_FRACTION:.0%} of each world's runs; ε_lb comes from the rest
(`service.privacy.audit.split_bound`: ε_lb = max(0, log((1 − δ − FNR_u)/FPR_u),
log((1 − δ − FPR_u)/FNR_u)) with one-sided Clopper–Pearson upper bounds on the two error
rates, each at level α/2). `old` is worker/mechanisms/dpsgd.py at {PRE_FIX_COMMIT[:10]}
(Opacus; learning rate divided by q·n with the *loaded* n) run on today's plan builder;
`current` is the working tree. The test (tests/privacy/test_audit_dpsgd.py) asserts
ε_lb < ε at {CONFIDENCE:.1%} with the default run counts.

{HEADER}
{RULE}
"""
        + "\n".join(table)
        + "\n"
    )
    RESULTS.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=["old", "current"], required=True)
    ap.add_argument("--runs", type=int, default=None, help="runs per world (default: the test's)")
    ap.add_argument("--only", choices=["row-count", "canary"], default=None)
    ap.add_argument("--public-n", type=int, default=ROW_COUNT_PUBLIC_N, help="row count: n̂")
    ap.add_argument("--features", type=int, default=ROW_COUNT_FEATURES, help="row count: d")
    ap.add_argument("--old-path", type=Path, default=Path("/tmp/old_dpsgd.py"))
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    # Opacus's secure-RNG and backward-hook notices, once per run, would drown the figures.
    warnings.filterwarnings("ignore", category=UserWarning)
    command = shlex.join([".venv/bin/python", "benchmarks/privacy_audit.py", *sys.argv[1:]])
    print(f"$ {command}")
    run_dpsgd = load_impl(args.impl, args.old_path)
    chosen = {
        "row-count": lambda: row_count_distinguisher(
            public_n=args.public_n, n_features=args.features
        ),
        "canary": canary_distinguisher,
    }
    names = [args.only] if args.only else list(chosen)
    start = time.perf_counter()
    rows = [
        audit_row(chosen[k](), impl=args.impl, run_dpsgd=run_dpsgd, runs=args.runs, command=command)
        for k in names
    ]
    print(f"\ntotal {time.perf_counter() - start:.1f} s")
    if not args.no_write:
        write_results(rows)
        print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
