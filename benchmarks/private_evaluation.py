"""Private evaluation (issue 21): coverage and width of the released intervals over
simulated holdouts, and the ε an empirical distinguisher shows against the charged ε.

    .venv/bin/python benchmarks/private_evaluation.py --runs 1000 --audit-runs 3000 --auc-runs 1000

Population: the discrete one of tests/unit/test_private_evaluation.py (five score levels,
binary labels), so every population metric is an exact sum. Holdout n = 300, nominal
level 0.90, all four scalar metrics in one plan (equal shares of ε, δ = 1e-6). Accuracy
also gets its exact coverage (the law of the released count summed, no simulation) and,
as the anchor, the union-bound interval it replaced (issue 21) on the same releases; the
binary AUC and the calibration error likewise get the union bounds e8230b0 replaced. The
distinguishers are the unit tests' (accuracy: ε = 1, n = 50; AUC: ε = 2, n = 400, one
positive moved across all negatives), with more runs. Last, AUC alone at n = 300, ε = 1
against the retired propose-test-release mechanism (``--only-auc`` runs just that table).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.privacy.audit import clopper_pearson_lower, clopper_pearson_upper, threshold_bound
from service.privacy.evaluation import (
    ECE_GRID,
    EvaluationPlan,
    NoiseKind,
    laplace_scale,
    noise_tail,
    plan_evaluation,
)
from service.privacy.evaluation_intervals import Interval, _auc_range
from service.privacy.sampling import noise_slack
from tests.unit.test_private_evaluation import (
    _PMODEL,
    _PX,
    _RX,
    _draw_binary,
    _inside,
    _Intervals,
    _population_binary,
    _releases,
    _scalar_plan,
)
from worker.mechanisms.evaluation import (
    auc_exact,
    correct_count,
    evaluate,
    probability_matrix,
)
from worker.noise import discrete_laplace

METRICS = ("accuracy", "auc", "log_loss", "calibration_error")


def union_bound_interval(noisy: int, n: int, noise: NoiseKind, scale: float) -> Interval:
    """The accuracy interval before issue 21 (commit cb1bb3b), the anchor: the noise's
    quantile t at α/2 and a Clopper–Pearson interval at α/2 evaluated at C̃ ∓ t."""
    a = 0.05
    t = noise_tail(noise=noise, scale=scale, probability=a)
    lo_c, hi_c = min(max(noisy - t, 0), n), min(max(noisy + t, 0), n)
    lo = clopper_pearson_lower(successes=lo_c, trials=n, alpha=a / 2) if lo_c > 0 else 0.0
    hi = clopper_pearson_upper(successes=hi_c, trials=n, alpha=a / 2) if hi_c < n else 1.0
    return Interval(lo, hi, 0.9)


def auc_union_bound(plan: EvaluationPlan, twice_u: int, count: int) -> Interval:
    """The binary AUC interval before e8230b0 (the anchor): 2U's noise, the count's noise
    and McDiarmid's sampling bound, α/3 each (union bound)."""
    e = plan.metric("auc")
    assert e.count_scale is not None
    a, n = (1.0 - plan.confidence) / 3.0, plan.n
    t = noise_tail(noise=plan.noise, scale=e.scale, probability=a)
    tau = noise_tail(noise=plan.noise, scale=e.count_scale, probability=a)
    lo, hi = max(1, count - tau), min(n - 1, count + tau)
    if lo > hi:
        return Interval(0.0, 1.0, plan.confidence)
    low, high = _auc_range(twice_u, t, lo, hi, n)
    s = math.sqrt(math.log(2.0 / a) * (1.0 / lo + 1.0 / (n - hi)) / 2.0)
    return Interval(max(0.0, low - s), min(1.0, high + s), plan.confidence)


def ece_union_bound(plan: EvaluationPlan, total: int) -> Interval:
    """The calibration error's interval before e8230b0 (the anchor): noise quantile and
    McDiarmid at α/2 each, two-sided, and the bias bound √(B/n) below."""
    e, n = plan.metric("calibration_error"), plan.n
    a = (1.0 - plan.confidence) / 2.0
    t = noise_tail(noise=plan.noise, scale=e.scale, probability=a)
    s = math.sqrt(2.0 * math.log(2.0 / a) / n)
    f = total / (ECE_GRID * n)
    w = t / (ECE_GRID * n) + 1.0 / (2.0 * ECE_GRID)
    lower = f - w - s - math.sqrt(plan.bins / n)
    return Interval(max(0.0, lower), min(1.0, f + w + s), plan.confidence)


def coverage(runs: int) -> None:
    truth = _population_binary(1e-4, 10)
    print(
        "| noise | ε | accuracy: exact coverage, exact mean width | "
        "accuracy before (union bound): coverage, mean width | width ratio after/before | "
        + " | ".join(f"{m}: coverage, mean width" for m in METRICS)
        + " | auc before (union bound) | calibration_error before (union bound) |"
    )
    print("|---|---:|---:|---:|---:|" + "---:|" * (len(METRICS) + 2))
    noises: tuple[NoiseKind, ...] = ("laplace", "gaussian")
    for noise in noises:
        for eps in (0.5, 1.0, 4.0):
            plan = _scalar_plan(noise, eps)
            scale = plan.metric("accuracy").scale
            exact, exact_width = _Intervals(plan.n, noise, scale, 0.9).exact_coverage(
                truth["accuracy"]
            )
            rng = np.random.default_rng(5)
            cov = dict.fromkeys(METRICS, 0)
            width = dict.fromkeys(METRICS, 0.0)
            old_cov, old_width = 0, 0.0
            anchors = {"auc": [0, 0.0], "calibration_error": [0, 0.0]}
            for _ in range(runs):
                p, y = _draw_binary(rng, plan.n)
                r = evaluate(plan=plan, probabilities=p, labels=y)
                for m in METRICS:
                    iv = getattr(r, m).interval
                    cov[m] += _inside(truth[m], iv)
                    width[m] += iv.upper - iv.lower
                assert r.accuracy is not None
                old = union_bound_interval(round(r.accuracy.value * plan.n), plan.n, noise, scale)
                old_cov += _inside(truth["accuracy"], old)
                old_width += old.upper - old.lower
                assert r.auc is not None and r.calibration_error is not None
                total = round(r.calibration_error.value * ECE_GRID * plan.n)
                for m, iv in (
                    (
                        "auc",
                        auc_union_bound(plan, r.auc.noisy_twice_u[0], r.auc.noisy_class_counts[0]),
                    ),
                    ("calibration_error", ece_union_bound(plan, total)),
                ):
                    anchors[m][0] += _inside(truth[m], iv)
                    anchors[m][1] += iv.upper - iv.lower
            cells = " | ".join(
                f"{cov[m] / runs:.3f}, {width[m] / runs:.3f}" for m in METRICS
            ) + "".join(f" | {c / runs:.3f}, {w / runs:.3f}" for c, w in anchors.values())
            print(
                f"| {noise} | {eps:g} | {exact:.4f}, {exact_width:.3f} | "
                f"{old_cov / runs:.3f}, {old_width / runs:.3f} | "
                f"{width['accuracy'] / old_width:.2f} | {cells} |"
            )


def audits(runs: int) -> None:
    n = 50
    y = np.r_[np.zeros(25, np.int64), np.ones(25, np.int64)]
    p0 = np.r_[np.full(25, 0.2), np.full(25, 0.8)]
    p0[0] = 0.9
    p1 = p0.copy()
    p1[0] = 0.1
    plan = plan_evaluation(
        metrics=["accuracy"], n=n, classes=2, epsilon=1.0, delta=0.0, noise="laplace"
    )
    c0 = correct_count(probability_matrix(p0, classes=2), y)
    s0 = _releases(plan, p0, y, runs, "accuracy")
    s1 = _releases(plan, p1, y, runs, "accuracy")
    b = threshold_bound(stats_world0=s0, stats_world1=s1, threshold=(c0 + 0.5) / n, delta=0.0)
    print(f"accuracy: charged ε = 1, 95% lower bound from {runs} runs per world: {b.epsilon:.3f}")

    neg = np.linspace(0.1, 0.9, 200)
    pos = np.r_[0.0, np.linspace(0.3, 0.95, 199)]
    y = np.r_[np.zeros(200, np.int64), np.ones(200, np.int64)]
    q0 = np.r_[neg, pos]
    q1 = q0.copy()
    q1[200] = 1.0
    plan = plan_evaluation(
        metrics=["auc"], n=400, classes=2, epsilon=2.0, delta=1e-6, noise="laplace"
    )
    a0 = float(auc_exact(probability_matrix(q0, classes=2), y))
    a1 = float(auc_exact(probability_matrix(q1, classes=2), y))
    t0 = _releases(plan, q0, y, runs, "auc")
    t1 = _releases(plan, q1, y, runs, "auc")
    b = threshold_bound(stats_world0=t0, stats_world1=t1, threshold=(a0 + a1) / 2, delta=1e-6)
    print(
        f"AUC: charged ε = 2 (0.5 to the counts, which are equal here, 1.5 to 2U), 95% lower "
        f"bound from {runs} runs per world: {b.epsilon:.3f}"
    )


# A 15%-positive population with a tie between two score levels (the unit test
# test_auc_interval_covers_an_imbalanced_population's): P(x), P(y = 1 | x), the score p(x).
_IMBALANCED = (
    np.array([0.3, 0.3, 0.2, 0.2]),
    np.array([0.02, 0.1, 0.2, 0.35]),
    np.array([0.1, 0.3, 0.3, 0.8]),
)


def _population_auc(px: np.ndarray, rx: np.ndarray, pm: np.ndarray) -> float:
    f1, f0 = px * rx / np.sum(px * rx), px * (1 - rx) / np.sum(px * (1 - rx))
    return float(
        sum(
            f1[i] * f0[j] * (1.0 if pm[i] > pm[j] else 0.5 if pm[i] == pm[j] else 0.0)
            for i in range(len(px))
            for j in range(len(px))
        )
    )


def ptr_release(
    rng: np.random.Generator, auc: float, positives: int, n: int, eps: float, delta: float
) -> tuple[float | None, Interval]:
    """The retired propose-test-release AUC (commit 7e49e7d's parent, Laplace, the plan's
    whole (ε, δ) on AUC), re-stated here as the anchor: ε/2 to the noisy positive count
    ñ, δ to its test (τ = the count noise's tail at δ), the AUC noised on the grid
    (1/m)/4096 with m = min(ñ − τ, n − ñ − τ), scale 4097/(ε/2) units (withheld if m < 1);
    its interval: noise at α/3, counts at α/3, McDiarmid at α/3, plus half a unit."""
    grid = 2**12
    e = eps / 2.0 - 2.0 * noise_slack(draws=1).tau
    count_scale, scale = laplace_scale(sensitivity=1, epsilon=e), (grid + 1) / e
    noisy_n = positives + int(discrete_laplace(rng, scale=count_scale, size=1)[0])
    tau = noise_tail(noise="laplace", scale=count_scale, probability=delta)
    m = min(noisy_n - tau, n - noisy_n - tau)
    if m < 1:
        return None, Interval(0.0, 1.0, 0.9)
    unit = 1.0 / (m * grid)
    value = (round(auc / unit) + int(discrete_laplace(rng, scale=scale, size=1)[0])) * unit
    a = 0.1 / 3
    t = noise_tail(noise="laplace", scale=scale, probability=a)
    tau2 = noise_tail(noise="laplace", scale=count_scale, probability=a)
    p_lo, q_lo = noisy_n - tau2, n - noisy_n - tau2
    if min(p_lo, q_lo) < 1:
        return value, Interval(0.0, 1.0, 0.9)
    half = math.sqrt(math.log(2 / a) * (1 / p_lo + 1 / q_lo) / 2) + t * unit + unit / 2
    return value, Interval(max(0.0, value - half), min(1.0, value + half), 0.9)


def auc_against_ptr(runs: int) -> None:
    """AUC alone at n = 300, ε = 1, nominal 0.90: the charged mechanism (2U and the
    counts) against the retired PTR one on the same holdouts. Noise RMS: the root mean
    square of (released AUC − the holdout's exact AUC), over the releases made."""
    print(
        "| population | mechanism | noise, δ | AUC noise RMS | RMS / PTR's | withheld | "
        "coverage | mean width |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    populations = {
        "balanced (48% positive)": (_PX, _RX, _PMODEL),
        "imbalanced (15% positive)": _IMBALANCED,
    }
    n, eps = 300, 1.0
    for name, (px, rx, pm) in populations.items():
        truth = _population_auc(px, rx, pm)
        draws = []
        rng = np.random.default_rng(11)
        for _ in range(runs):
            x = rng.choice(len(px), size=n, p=px)
            y = (rng.random(n) < rx[x]).astype(np.int64)
            draws.append((pm[x], y, float(auc_exact(probability_matrix(pm[x], classes=2), y))))
        noise_rng = np.random.default_rng(12)
        rows: list[tuple[str, str, list[float], int, int, float]] = []
        errs: list[float] = []
        withheld = covered = 0
        width = 0.0
        for _p, y, exact in draws:
            value, iv = ptr_release(noise_rng, exact, int(y.sum()), n, eps, 1e-6)
            if value is None:
                withheld += 1
            else:
                errs.append(value - exact)
            covered += _inside(truth, iv)
            width += iv.upper - iv.lower
        rows.append(("PTR (retired)", "laplace, 1e-6", errs, withheld, covered, width))
        for noise, delta in (("laplace", 0.0), ("gaussian", 1e-6)):
            plan = plan_evaluation(
                metrics=["auc"], n=n, classes=2, epsilon=eps, delta=delta, noise=noise,
                confidence=0.9,
            )  # fmt: skip
            errs, covered, width = [], 0, 0.0
            for p, y, exact in draws:
                r = evaluate(plan=plan, probabilities=p, labels=y).auc
                assert r is not None
                errs.append(r.value - exact)
                covered += _inside(truth, r.interval)
                width += r.interval.upper - r.interval.lower
            rows.append(("2U + counts (charged)", f"{noise}, {delta:g}", errs, 0, covered, width))
        anchor = math.sqrt(np.mean(np.square(rows[0][2]))) if rows[0][2] else math.nan
        for mech, law, e, held, cov, w in rows:
            rms = math.sqrt(np.mean(np.square(e))) if e else math.nan
            print(
                f"| {name} | {mech} | {law} | {rms:.4f} | {rms / anchor:.2f} | "
                f"{held / runs:.3f} | {cov / runs:.3f} | {w / runs:.3f} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--audit-runs", type=int, default=1000)
    ap.add_argument("--auc-runs", type=int, default=1000)
    ap.add_argument("--only-auc", action="store_true", help="only the AUC-against-PTR table")
    args = ap.parse_args()
    if not args.only_auc:
        coverage(args.runs)
        audits(args.audit_runs)
    auc_against_ptr(args.auc_runs)


if __name__ == "__main__":
    main()
