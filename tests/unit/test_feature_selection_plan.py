"""The ``features`` selection kind's plan: DP-CFS is one Gaussian with ℓ2 sensitivity √H
(closed-form RDP), independent of the search; PAFS composes its planned trainings and
noisy scores; bad input is refused before anything is charged."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from service.datasets.tabular import parse_schema
from service.modelspec import MlpSpec
from service.plans import PlanError
from service.privacy.events import (
    ComposedEvent,
    PoissonSubsampledGaussianEvent,
    SelfComposedEvent,
)
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp
from service.privacy.sampling import PMF_RELATIVE_ERROR, count_event, noise_slack
from service.schemas import DpsgdOptions
from service.selection.budget import SelectionBudget
from service.selection.features import (
    FeatureGa,
    FeatureRequest,
    FinalTraining,
    cfs_event,
    histogram_count,
)
from service.selection.plans import (
    REQUEST_MODELS,
    ArchitectureRequest,
    architecture_plan,
    plan_selection,
    plan_summary,
    workflow_epsilon,
)

SCHEMA_DICT = {
    "name": "toy",
    "target": {"column": "y", "positive": ["1"], "negative": ["0"]},
    "columns": [
        {"name": "a", "type": "numeric", "min": 0, "max": 10},
        {"name": "b", "type": "categorical", "levels": ["x", "y", "z"]},
        {"name": "c", "type": "numeric", "min": 1, "max": 100, "transform": "log1p"},
        {"name": "d", "type": "categorical", "levels": ["u", "v"]},
    ],
}
SCHEMA = parse_schema(SCHEMA_DICT)


def _plan(request: FeatureRequest, n: int = 1000):  # type: ignore[no-untyped-def]
    return plan_selection(
        "features", request, dataset="toy", n_rows=n, n_features=SCHEMA.n_features, schema=SCHEMA
    )


def test_histogram_count_and_cells() -> None:
    assert [histogram_count(f) for f in (1, 2, 4, 14)] == [1, 3, 10, 105]
    plan = _plan(FeatureRequest(epsilon=1.0, delta=1e-6, numeric_bins=5))
    assert plan.features is not None
    bins = [5, 3, 5, 2]
    cells = sum(2 * b for b in bins) + sum(
        bins[i] * bins[j] for i in range(4) for j in range(i + 1, 4)
    )
    assert plan.features.histograms == 10 and plan.features.cells == cells
    assert [c.bins for c in plan.features.columns] == bins
    assert [(c.start, c.width) for c in plan.features.columns] == [(0, 1), (1, 3), (4, 1), (5, 2)]


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 10.0])
def test_cfs_charge_is_one_gaussian_with_sensitivity_sqrt_h(epsilon: float) -> None:
    delta = 1e-6
    plan = _plan(FeatureRequest(epsilon=epsilon, delta=delta))
    f = plan.features
    assert f is not None and f.noise_multiplier is not None and f.cell_scale is not None
    z = f.noise_multiplier
    assert plan.event == ComposedEvent(
        events=(
            PoissonSubsampledGaussianEvent(sampling_rate=1.0, noise_multiplier=z, steps=1),
            noise_slack(draws=f.cells),
        )
    )
    # closed form: Gaussian with std σ_cell on counts of ℓ2 sensitivity √H has RDP
    # α·H/(2σ_cell²) = α/(2z²); the pmf gap adds τ(2α − 1)/(α − 1), τ = cells·(−log(1 − η))
    tau = f.cells * -math.log1p(-PMF_RELATIVE_ERROR)
    alphas = np.array(ORDERS)
    sigma = f.cell_scale
    expected = alphas * f.histograms / (2 * sigma**2) + tau * (2 * alphas - 1) / (alphas - 1)
    assert np.allclose(plan.event.rdp(ORDERS), expected, rtol=1e-9, atol=0)
    assert sigma == pytest.approx(z * math.sqrt(f.histograms))
    # the ledger's ε is within the request, and z is the smallest such (to 1e-6)
    assert workflow_epsilon(plan, delta=delta) <= epsilon
    looser = cfs_event(noise_multiplier=z * (1 - 1e-5), cells=f.cells)
    assert epsilon_from_rdp(rdp=looser.rdp(ORDERS), orders=ORDERS, delta=delta) > epsilon
    summary = plan_summary(plan, delta=delta)
    assert summary["epsilon"] <= epsilon and summary["trainings"] == 0
    assert summary["histograms"] == 10 and summary["noise_multiplier"] == z


def test_cfs_charge_does_not_depend_on_the_search() -> None:
    base = _plan(FeatureRequest(epsilon=1.0, delta=1e-6)).event
    for request in (
        FeatureRequest(method="cfs_ga", epsilon=1.0, delta=1e-6),
        FeatureRequest(
            method="cfs_ga", epsilon=1.0, delta=1e-6, ga=FeatureGa(population=64, generations=100)
        ),
        FeatureRequest(epsilon=1.0, delta=1e-6, max_selected=2),
    ):
        assert _plan(request).event == base


def test_pafs_charge_composes_planned_trainings_and_scores() -> None:
    budget = SelectionBudget(training_epsilon=1.0, training_delta=1e-6, fitness_epsilon=0.3)
    request = FeatureRequest(
        method="pafs",
        ga=FeatureGa(population=3, generations=4),
        model=MlpSpec(hidden=[8]),
        training=DpsgdOptions(epochs=2, batch_size=64),
        budget=budget,
    )
    plan = _plan(request)
    assert plan.trainings == 12 and (plan.n_train, plan.n_val) == (800, 200)
    # the training event is the architecture kind's for the same model on all features
    arch = architecture_plan(
        ArchitectureRequest.model_validate(
            {
                "space": {"depths": [1], "widths": [8], "activations": ["tanh"]},
                "search": {"algorithm": "rs", "trainings": 1},
                "training": {"epochs": 2, "batch_size": 64},
                "budget": budget.model_dump(),
            }
        ),
        dataset="toy",
        n_rows=1000,
        n_features=SCHEMA.n_features,
    )
    assert isinstance(plan.event, SelfComposedEvent) and plan.event.count == 12
    assert plan.event.event == arch.event
    assert plan.event.event == ComposedEvent(
        events=(arch.event.events[0], count_event(epsilon=0.3))  # type: ignore[attr-defined]
    )
    assert np.allclose(plan.event.rdp(ORDERS), 12 * arch.event.rdp(ORDERS))


def test_bad_requests_are_refused() -> None:
    model = REQUEST_MODELS["features"]
    with pytest.raises(ValidationError):
        model.model_validate({"method": "cfs_greedy"})  # no ε, δ
    with pytest.raises(ValidationError):
        model.model_validate({"method": "pafs", "epsilon": 1.0, "delta": 1e-6})  # no budget
    with pytest.raises(ValidationError):
        model.model_validate({"epsilon": 1.0, "delta": 1e-6, "numeric_bins": 1})
    with pytest.raises(ValidationError):
        model.model_validate({"epsilon": 1.0, "delta": 1e-6, "surprise": 1})
    ok = FeatureRequest(epsilon=1.0, delta=1e-6)
    with pytest.raises(PlanError):
        plan_selection("features", ok, dataset="toy", n_rows=100, n_features=7)  # no schema
    with pytest.raises(PlanError):
        plan_selection(
            "features", ok, dataset="toy", n_rows=100, n_features=6, schema=SCHEMA_DICT
        )  # feature count mismatch
    with pytest.raises(PlanError):
        plan_selection(
            "features", ok, dataset="toy", n_rows=100, n_features=7, schema={"kind": "timeseries"}
        )
    wide = {
        **SCHEMA_DICT,
        "columns": [{"name": f"c{i}", "type": "numeric", "min": 0, "max": 1} for i in range(33)],
    }
    with pytest.raises(PlanError):
        plan_selection("features", ok, dataset="toy", n_rows=100, n_features=33, schema=wide)
    # a dict schema is accepted as the ledger stores it
    assert (
        plan_selection(
            "features", ok, dataset="toy", n_rows=100, n_features=7, schema=SCHEMA_DICT
        ).event
        == _plan(ok, 100).event
    )


def test_final_model_is_charged_in_the_same_plan() -> None:
    final = FinalTraining(
        epsilon=2.0, delta=1e-6, model=MlpSpec(hidden=[8]), training=DpsgdOptions(epochs=2)
    )
    bare = _plan(FeatureRequest(epsilon=1.0, delta=1e-6))
    plan = _plan(FeatureRequest(epsilon=1.0, delta=1e-6, final=final))
    assert plan.features is not None and plan.features.training_key is not None
    assert bare.features is not None
    batch = plan.features.training_key[0]
    arch = architecture_plan(
        ArchitectureRequest.model_validate(
            {
                "space": {"depths": [1], "widths": [8], "activations": ["tanh"]},
                "search": {"algorithm": "rs", "trainings": 1},
                "training": {"epochs": 2, "batch_size": batch},
                "budget": {"training_epsilon": 2.0, "training_delta": 1e-6},
            }
        ),
        dataset="toy",
        n_rows=1250,  # its training part is 1000 rows, as the final model's
        n_features=SCHEMA.n_features,
    )
    training = arch.event.events[0]  # type: ignore[attr-defined]
    assert plan.event == ComposedEvent(events=(bare.event, training))
    assert plan.trainings == 1
    assert plan.features.noise_multiplier == bare.features.noise_multiplier
    with pytest.raises(ValidationError):
        FeatureRequest(
            method="pafs",
            budget=SelectionBudget(training_epsilon=1.0, training_delta=1e-6),
            final=final,
        )


def test_final_model_is_tabular() -> None:
    with pytest.raises(ValidationError):
        FinalTraining.model_validate(
            {"epsilon": 1.0, "delta": 1e-6, "model": {"kind": "grud", "hidden": 4}}
        )
    logistic = FinalTraining.model_validate(
        {"epsilon": 1.0, "delta": 1e-6, "model": {"kind": "logistic"}}
    )
    plan = _plan(FeatureRequest(epsilon=1.0, delta=1e-6, final=logistic))
    assert plan.trainings == 1
