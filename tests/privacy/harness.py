"""Harness of the empirical privacy audit of the worker's DP-SGD (tests/privacy and
benchmarks/privacy_audit.py share it).

Each distinguisher runs the worker's real ``run_dpsgd`` many times on two neighbouring
datasets (world 0 = D, world 1 = D plus one row) under ONE plan, built exactly as the
service builds it from a *public* row count n̂ (``public_n``): the mechanism may depend on
public values only, so the plan is the same in both worlds even though the loaded rows
differ. A threshold test on a scalar statistic of each release yields a Clopper–Pearson
lower bound ε_lb (service/privacy/audit.py, threshold chosen on a held-out split), and
the test asserts ε_lb < the claimed ε.

* Row count (aimed at the normalisation of the noisy gradient): all features are zero,
  so every row's weight gradient is exactly zero and the released weights are pure noise
  scaled by public values only; a mechanism that scales them by the loaded row count n
  leaks |D|. Statistic: the mean squared weight over d coordinates (relative spread
  √(2/d), so a scale error of (n/(n−1))² is ≈ √(d/2)·2/n standard deviations). The issue's
  audit used 99 vs 100 rows and d = 50,000; 19 vs 20 rows and d = 8192 separate the
  worlds better at about a twentieth of the time per run (the benchmark runs either).
* Canary: D's rows never touch the canary's columns; the canary (ones on ``CANARY_COLUMNS``
  columns, label 1) has a gradient far above the clipping norm, all of it outside D's
  span. Statistic: the projection of the weights on the canary's columns. A correct
  mechanism moves it by at most C·lr/(q·n̂) per step against noise σ·C·lr/(q·n̂), so the
  shift is ≤ 1/σ noise standard deviations (σ ≈ 4 here). Missing clipping would make it
  ≈ 0.5·√1024/σ ≈ 4, missing noise unbounded. Noise a few times too small is not
  reliably caught at this size (one measurement each on the pre-fix code with σ divided
  by 4, 6, 10: ε_lb = 0.77, 1.26, 2.33 at 99.9%).

Sizing (see ``test_design_false_failure_probability``): at ``CONFIDENCE`` the chance that
a correct implementation fails either audit is ≤ 1e-6, computed exactly over the binomial
counts from the statistic's law under a correct mechanism. The 95% figures are printed by
benchmarks/privacy_audit.py, which reuses this harness (and can run the pre-fix DP-SGD).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from service.modelspec import LogisticSpec
from service.plans import build_plan
from service.privacy.audit import EpsilonLowerBound, split_bound
from service.schemas import DpsgdOptions, JobRequest, PrivacyPlan
from worker.mechanisms.base import MechanismOutput, ProgressFn, TabularTrainingSet

CLAIMED_EPSILON = 1.0
DELTA = 1e-5
CONFIDENCE = 0.999  # see test_design_false_failure_probability; the benchmark adds 95%
SELECTION_FRACTION = 0.3  # near-separated worlds need few runs to place the threshold
MAX_FALSE_FAILURE = 1e-6

ROW_COUNT_PUBLIC_N = 20  # D: 19 rows, D': 20 rows; a scale error (n̂/(n̂−1))² − 1 ≈ 11%
ROW_COUNT_FEATURES = 8192  # that error is √(d/2)·0.108 ≈ 6.9 standard deviations
ROW_COUNT_RUNS = 400  # per world: 120 choose the threshold, 280 measure
CANARY_PUBLIC_N = 100
CANARY_COLUMNS = 1024
CANARY_OTHER_FEATURES = 32
CANARY_RUNS = 400  # per world


class RunDpsgd(Protocol):
    """The worker's DP-SGD entry point (worker.mechanisms.dpsgd.run_dpsgd)."""

    def __call__(
        self,
        *,
        spec: Any,
        mechanism: dict[str, Any],
        samples: int,
        data: TabularTrainingSet,
        device: torch.device,
        progress: ProgressFn,
    ) -> MechanismOutput: ...


Statistic = Callable[[Mapping[str, torch.Tensor]], float]


@dataclass(frozen=True)
class Distinguisher:
    """Two neighbouring datasets, the DP-SGD options, and the statistic of a release."""

    name: str
    public_n: int  # the plan's row count, identical in both worlds
    options: DpsgdOptions
    n_features: int
    world0: TabularTrainingSet  # D
    world1: TabularTrainingSet  # D plus one row
    statistic: Statistic
    runs_per_world: int


@dataclass(frozen=True)
class AuditOutcome:
    distinguisher: str
    plan: PrivacyPlan
    stats_world0: np.ndarray
    stats_world1: np.ndarray
    seconds: float

    def bound(self, *, confidence: float) -> EpsilonLowerBound:
        return split_bound(
            stats_world0=self.stats_world0,
            stats_world1=self.stats_world1,
            delta=DELTA,
            confidence=confidence,
            selection_fraction=SELECTION_FRACTION,
        )


def request_for(options: DpsgdOptions) -> JobRequest:
    return JobRequest(
        dataset="audit",
        model=LogisticSpec(),
        method="dpsgd",
        epsilon=CLAIMED_EPSILON,
        delta=DELTA,
        dpsgd=options,
    )


def plan_for(d: Distinguisher) -> PrivacyPlan:
    """The plan exactly as the service builds it, from public values only."""
    return build_plan(request_for(d.options), n_rows=d.public_n, n_features=d.n_features)


def release(
    *, run_dpsgd: RunDpsgd, plan: PrivacyPlan, data: TabularTrainingSet
) -> dict[str, torch.Tensor]:
    out = run_dpsgd(
        spec=LogisticSpec.model_validate(plan.model),
        mechanism=plan.mechanism,
        samples=1,
        data=data,
        device=torch.device("cpu"),
        progress=lambda step, total: None,
    )
    assert len(out.releases) == 1
    return out.releases[0]


def run_audit(
    d: Distinguisher, *, run_dpsgd: RunDpsgd, runs_per_world: int | None = None
) -> AuditOutcome:
    """Alternate the worlds run by run (so slow drifts of the machine hit both alike).

    One torch thread while it runs: these releases are tiny, and on a busy 2-core machine
    two threads made each run 20–50× slower (measured), presumably OpenMP workers spinning.
    """
    runs = d.runs_per_world if runs_per_world is None else runs_per_world
    plan = plan_for(d)
    s0, s1 = np.empty(runs), np.empty(runs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        for i in range(runs):
            s0[i] = d.statistic(release(run_dpsgd=run_dpsgd, plan=plan, data=d.world0))
            s1[i] = d.statistic(release(run_dpsgd=run_dpsgd, plan=plan, data=d.world1))
    finally:
        torch.set_num_threads(threads)
    return AuditOutcome(d.name, plan, s0, s1, time.perf_counter() - start)


# ------------------------------------------------------------------ the two distinguishers


def _mean_squared_weight(state: Mapping[str, torch.Tensor]) -> float:
    return float(state["linear.weight"].double().pow(2).mean())


def row_count_distinguisher(
    *,
    public_n: int = ROW_COUNT_PUBLIC_N,
    n_features: int = ROW_COUNT_FEATURES,
    runs_per_world: int = ROW_COUNT_RUNS,
) -> Distinguisher:
    """D: n̂ − 1 rows, D': n̂ rows, every feature zero; labels alternate (the extra row: 1).

    Full batch (q = 1, T = 1; ⌈(n̂−1)/n̂⌉ = ⌈n̂/n̂⌉, so the pre-fix code accepts the plan).
    A scale error by the loaded n shows whatever q and T are; the audit's cost grows with
    n̂·d per run (per-example gradients) and its power with √d·2/n̂, hence a small n̂.
    """
    y = torch.tensor([float(i % 2) for i in range(public_n)])
    y[public_n - 1] = 1.0
    x = torch.zeros(public_n, n_features)
    return Distinguisher(
        name=(
            f"row count ({public_n - 1} vs {public_n} rows, {n_features} zero features; "
            "mean squared weight)"
        ),
        public_n=public_n,
        options=DpsgdOptions(epochs=1, batch_size=public_n, max_grad_norm=1.0, learning_rate=1.0),
        n_features=n_features,
        world0=TabularTrainingSet(x=x[: public_n - 1], y=y[: public_n - 1]),
        world1=TabularTrainingSet(x=x, y=y),
        statistic=_mean_squared_weight,
        runs_per_world=runs_per_world,
    )


def _canary_projection(state: Mapping[str, torch.Tensor]) -> float:
    w = state["linear.weight"].double().reshape(-1)
    return float(w[:CANARY_COLUMNS].sum() / CANARY_COLUMNS**0.5)


def canary_distinguisher() -> Distinguisher:
    """D: 99 rows with uniform features in the last ``CANARY_OTHER_FEATURES`` columns and
    zeros in the first ``CANARY_COLUMNS``; D' = D plus a canary with ones there (and zeros
    elsewhere), label 1. Full batch (q = 1), one step: the release is one Gaussian
    mechanism on the clipped sum, so the final model shows everything the run did."""
    g = torch.Generator().manual_seed(20251122)  # the data are fixed; the noise is not
    n = CANARY_PUBLIC_N
    n_features = CANARY_COLUMNS + CANARY_OTHER_FEATURES
    x = torch.zeros(n, n_features)
    x[: n - 1, CANARY_COLUMNS:] = torch.rand(n - 1, CANARY_OTHER_FEATURES, generator=g)
    y = (torch.rand(n, generator=g) < 0.5).float()
    x[n - 1, :CANARY_COLUMNS] = 1.0
    y[n - 1] = 1.0
    return Distinguisher(
        name=f"canary ({CANARY_COLUMNS} private columns, label 1; projection on them)",
        public_n=n,
        options=DpsgdOptions(epochs=1, batch_size=n, max_grad_norm=1.0, learning_rate=1.0),
        n_features=n_features,
        world0=TabularTrainingSet(x=x[: n - 1], y=y[: n - 1]),
        world1=TabularTrainingSet(x=x, y=y),
        statistic=_canary_projection,
        runs_per_world=CANARY_RUNS,
    )


def describe(outcome: AuditOutcome, bound: EpsilonLowerBound) -> str:
    return (
        f"{outcome.distinguisher}: ε_lb = {bound.epsilon:.3f} at {bound.confidence:.1%} "
        f"(claimed ε = {CLAIMED_EPSILON}); held-out hits {bound.hits_world0}/{bound.runs_world0} "
        f"(world 0) vs {bound.hits_world1}/{bound.runs_world1} (world 1), "
        f"{bound.orientation} {bound.threshold:.6g}; "
        f"σ = {outcome.plan.mechanism['noise_multiplier']:.4f}"
    )


# ------------------------------------------------------------------ tests


def live_run_dpsgd() -> RunDpsgd:
    from worker.mechanisms.dpsgd import run_dpsgd

    return run_dpsgd
