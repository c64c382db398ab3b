"""Empirical privacy audit of the asymptotic ExpM sampler (method ``expm``, ``mcmc``).

The canary distinguisher of test_audit_langevin.py (D: 99 rows whose features avoid the
canary's 64 columns; D' = D plus the canary, ones on those columns, label 1; statistic: the
released weights' sum over the canary's columns) on the worker's real
:func:`run_expm_mcmc`, with the plan built as the service builds it. The label is
asymptotic because no proof covers the finite chain; this audit is the empirical check that
the short run the test affords does not reveal the canary beyond the claimed ε (the
Clopper–Pearson lower bound, service/privacy/audit.py, must stay below it). The second test
shows the audit has teeth: the same chains on a target 10⁴ times sharper than the plan's
(a sampler not at the temperature it was charged for) give a bound far above the claim.
"""

from __future__ import annotations

import pytest
import torch

from service.modelspec import LogisticSpec
from service.plans import build_plan
from service.privacy.audit import split_bound
from service.schemas import JobRequest, PrivacyPlan
from tests.privacy.test_audit_langevin import CANARY_COLUMNS, OTHER_FEATURES, N, _worlds
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.mcmc import run_expm_mcmc

CLAIMED_EPSILON = 1.0
DELTA = 1e-5
CONFIDENCE = 0.999
RUNS = 300  # per world


def _plan() -> PrivacyPlan:
    request = JobRequest(
        dataset="audit",
        model=LogisticSpec(),
        method="expm",
        epsilon=CLAIMED_EPSILON,
        delta=DELTA,
        expm={"sampler": "mcmc", "chains": 2, "steps": 20, "warmup": 20, "leapfrog_steps": 8},  # type: ignore[arg-type]
    )
    n_features = CANARY_COLUMNS + OTHER_FEATURES
    # Every column is numeric in [0, 1]: ‖(x, 1)‖² ≤ n_features + 1 from the "schema".
    return build_plan(request, n_rows=N, n_features=n_features, norm_sq_bound=n_features + 1)


def _projections(mechanism: dict, data: TabularTrainingSet) -> list[float]:
    out = []
    for _ in range(RUNS):
        release = run_expm_mcmc(
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
    return split_bound(
        stats_world0=s0,
        stats_world1=s1,
        delta=DELTA,
        confidence=CONFIDENCE,
        selection_fraction=0.3,
    ).epsilon


@pytest.mark.slow
def test_canary_is_not_revealed_by_the_mcmc_release() -> None:
    plan = _plan()
    assert plan.guarantee == "asymptotic"
    assert _bound(plan.mechanism) < CLAIMED_EPSILON


@pytest.mark.slow
def test_the_audit_catches_a_sampler_at_the_wrong_temperature() -> None:
    mechanism = dict(_plan().mechanism)
    mechanism["inverse_temperature"] *= 1e4
    assert _bound(mechanism) > 2 * CLAIMED_EPSILON
