"""Empirical privacy audit of the proven ExpM sampler (method ``expm``, ``langevin``).

A canary distinguisher on the worker's real :func:`run_expm_langevin`, with the plan built
exactly as the service builds it from public values (the public row count and the schema's
norm bound). D: 99 rows with uniform features outside the canary's columns; D' = D plus a
canary (ones on ``CANARY_COLUMNS`` columns that no row of D touches, label 1). Statistic:
the released weights' projection on the canary's columns. Each step moves it by at most
(lr/n̂)·√64 against noise (lr/n̂)·σ·√B, so a correct mechanism shifts it by about
√T·8/(σ·√73) ≈ 0.2 noise standard deviations at ε = 1; the Clopper–Pearson lower bound
(threshold chosen on a held-out split, service/privacy/audit.py) must stay below the
claimed ε. The second test shows the audit has teeth: the same runs with the plan's noise
multiplier divided by 100 (a sampler that does not add the noise it was charged for) give a
bound far above the claim.
"""

from __future__ import annotations

import pytest
import torch

from service.modelspec import LogisticSpec
from service.plans import build_plan
from service.privacy.audit import split_bound
from service.schemas import JobRequest, PrivacyPlan
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.langevin import run_expm_langevin

CLAIMED_EPSILON = 1.0
DELTA = 1e-5
CONFIDENCE = 0.999
CANARY_COLUMNS = 64
OTHER_FEATURES = 8
N = 100
STEPS = 10
RUNS = 300  # per world


def _worlds() -> tuple[TabularTrainingSet, TabularTrainingSet]:
    g = torch.Generator().manual_seed(20261123)  # the data are fixed; the noise is not
    x = torch.zeros(N, CANARY_COLUMNS + OTHER_FEATURES)
    x[: N - 1, CANARY_COLUMNS:] = torch.rand(N - 1, OTHER_FEATURES, generator=g)
    y = (torch.rand(N, generator=g) < 0.5).float()
    x[N - 1, :CANARY_COLUMNS] = 1.0
    y[N - 1] = 1.0
    return TabularTrainingSet(x=x[: N - 1], y=y[: N - 1]), TabularTrainingSet(x=x, y=y)


def _plan() -> PrivacyPlan:
    request = JobRequest(
        dataset="audit",
        model=LogisticSpec(),
        method="expm",
        epsilon=CLAIMED_EPSILON,
        delta=DELTA,
        expm={"steps": STEPS, "learning_rate": 1.0, "l2": 1.0},  # type: ignore[arg-type]
    )
    n_features = CANARY_COLUMNS + OTHER_FEATURES
    # Every column is numeric in [0, 1]: ‖(x, 1)‖² ≤ n_features + 1 from the "schema".
    return build_plan(request, n_rows=N, n_features=n_features, norm_sq_bound=n_features + 1)


def _projections(mechanism: dict, data: TabularTrainingSet) -> list[float]:
    out = []
    for _ in range(RUNS):
        release = run_expm_langevin(
            spec=LogisticSpec(),
            mechanism=mechanism,
            samples=1,
            data=data,
            device=torch.device("cpu"),
            progress=lambda step, total: None,
        ).releases[0]
        w = release["linear.weight"].double().reshape(-1)
        out.append(float(w[:CANARY_COLUMNS].sum()))
    return out


def _bound(mechanism: dict) -> float:
    world0, world1 = _worlds()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        s0, s1 = _projections(mechanism, world0), _projections(mechanism, world1)
    finally:
        torch.set_num_threads(threads)
    bound = split_bound(
        stats_world0=s0,
        stats_world1=s1,
        delta=DELTA,
        confidence=CONFIDENCE,
        selection_fraction=0.3,
    )
    return bound.epsilon


@pytest.mark.slow
def test_canary_is_not_revealed_by_the_langevin_release() -> None:
    plan = _plan()
    assert plan.guarantee == "proven" and plan.mechanism["steps"] == STEPS
    assert _bound(plan.mechanism) < CLAIMED_EPSILON


@pytest.mark.slow
def test_the_audit_catches_a_sampler_with_too_little_noise() -> None:
    mechanism = dict(_plan().mechanism)
    mechanism["noise_multiplier"] /= 100.0
    assert _bound(mechanism) > 2 * CLAIMED_EPSILON
