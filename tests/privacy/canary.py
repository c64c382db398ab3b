"""The canary distinguisher shared by the ExpM samplers' audits (test_audit_langevin.py,
test_audit_langevin_hidden.py, test_audit_mcmc.py).

D: 99 rows with uniform features outside the canary's columns; D' = D plus a canary (ones on
``CANARY_COLUMNS`` columns that no row of D touches, label 1). Statistic: the released
weights' sum over the canary's columns. The plan is built as the service builds it from
public values (the public row count and the schema's norm bound: every column numeric in
[0, 1], so ‖(x, 1)‖² ≤ columns + 1); the Clopper–Pearson lower bound on ε comes from a
threshold chosen on a held-out split (service/privacy/audit.py).

With ``classes`` = K ≥ 3 (multinomial logistic regression, test_audit_langevin_multiclass.py)
the rows of D get labels drawn from the K classes, the canary keeps label 1, and the
statistic is the sum of class 1's weights over the canary's columns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from service.modelspec import LogisticSpec
from service.plans import build_plan
from service.privacy.audit import split_bound
from service.schemas import JobRequest, PrivacyPlan
from worker.mechanisms.base import MechanismOutput, TabularTrainingSet

CLAIMED_EPSILON = 1.0
DELTA = 1e-5
CONFIDENCE = 0.999
CANARY_COLUMNS = 64
OTHER_FEATURES = 8
N = 100
RUNS = 300  # per world

Run = Callable[..., MechanismOutput]


def worlds(classes: int | None = None) -> tuple[TabularTrainingSet, TabularTrainingSet]:
    g = torch.Generator().manual_seed(20261123)  # the data are fixed; the noise is not
    x = torch.zeros(N, CANARY_COLUMNS + OTHER_FEATURES)
    x[: N - 1, CANARY_COLUMNS:] = torch.rand(N - 1, OTHER_FEATURES, generator=g)
    y = (torch.rand(N, generator=g) < 0.5).float()
    if classes is not None:
        y = torch.randint(classes, (N,), generator=g).float()
    x[N - 1, :CANARY_COLUMNS] = 1.0
    y[N - 1] = 1.0
    return TabularTrainingSet(x=x[: N - 1], y=y[: N - 1]), TabularTrainingSet(x=x, y=y)


def canary_plan(
    expm: dict[str, Any], classes: int | None = None, max_rows: int | None = None
) -> PrivacyPlan:
    """The plan of method ``expm`` with these options at the claimed (ε, δ) (for a target
    of ``classes`` classes where given; ``max_rows``: the schema's public row cap)."""
    request = JobRequest(
        dataset="audit",
        model=LogisticSpec(),
        method="expm",
        epsilon=CLAIMED_EPSILON,
        delta=DELTA,
        expm=expm,  # type: ignore[arg-type]
    )
    n_features = CANARY_COLUMNS + OTHER_FEATURES
    return build_plan(
        request,
        n_rows=N,
        n_features=n_features,
        norm_sq_bound=n_features + 1,
        n_classes=classes or 2,
        max_rows=max_rows,
    )


def _projections(
    run: Run, mechanism: dict[str, Any], data: TabularTrainingSet, classes: int | None
) -> list[float]:
    out = []
    for _ in range(RUNS):
        release = run(
            spec=LogisticSpec(classes=classes),
            mechanism=mechanism,
            samples=1,
            data=data,
            device=torch.device("cpu"),
            progress=lambda step, total: None,
        ).releases[0]
        weights = release["linear.weight"].double()
        w = weights.reshape(-1) if classes is None else weights[1]  # the canary's class
        out.append(float(w[:CANARY_COLUMNS].sum()))
    return out


def canary_bound(run: Run, mechanism: dict[str, Any], classes: int | None = None) -> float:
    """ε lower bound (at ``CONFIDENCE``) of ``run`` under ``mechanism`` on the two worlds
    (of a ``classes``-class target where given)."""
    world0, world1 = worlds(classes)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny releases: one thread is faster on a busy 2-core machine
    try:
        s0 = _projections(run, mechanism, world0, classes)
        s1 = _projections(run, mechanism, world1, classes)
    finally:
        torch.set_num_threads(threads)
    return split_bound(
        stats_world0=s0,
        stats_world1=s1,
        delta=DELTA,
        confidence=CONFIDENCE,
        selection_fraction=0.3,
    ).epsilon
