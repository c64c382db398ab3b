"""Hyperparameter tuning of a K-class GRU-D on a K-class time-series dataset (issue 20): the
tuned GRU-D is fitted to the outcome's classes as a DP-SGD job's is (K logits; a binary one
is unchanged, so its dumps and digests are what they were); what does not fit is a
PlanError (→ 422, nothing charged); the charge is the tuning rule of every other model
(Papernot & Steinke random stopping over any of the DP-SGD trainings, each as a DP-SGD job
of the same model on the public training split plans it, plus one noisy count); the quote
estimates the padded runs; and the worker trains the drawn runs by exact DP-SGD (the GRU-D
exact engine, worker/mechanisms/exact_grud.py) and releases a K-logit GRU-D."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from service.datasets.kinds import parse_dataset_schema
from service.datasets.timeseries import TimeSeriesSchema, deltas_from_masks, pack_grud_inputs
from service.methods.dpsgd import dpsgd_training_seconds
from service.modelspec import GrudSpec, parameter_count
from service.plans import PlanError
from service.privacy.events import event_from_json
from service.privacy.orders import ORDERS
from service.resources import plan_resources
from service.selection.plans import (
    HyperparameterRequest,
    SelectionBudget,
    TnbRunsSpec,
    fit_to_dataset,
    plan_selection,
)
from tests.unit.test_cnn_tuning import _expected_event, _quoted
from tests.unit.test_timeseries import TINY
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.model_selection import released_summary, run_hyperparameter_selection

CLASSES = ["home", "ward", "icu"]
BUDGET = SelectionBudget(training_epsilon=2.0, training_delta=1e-5, fitness_epsilon=0.5)
N_STAYS = 400


def _series(outcome: dict[str, Any]) -> dict[str, Any]:
    schema = parse_dataset_schema({**TINY, "name": "tri-icu", "outcome": outcome})
    assert isinstance(schema, TimeSeriesSchema)
    return schema.model_dump(mode="json")


THREE = _series({"column": "died", "classes": CLASSES})
BINARY = _series(TINY["outcome"])  # type: ignore[arg-type]


def _request(model: dict[str, Any], **grid: Any) -> HyperparameterRequest:
    return HyperparameterRequest.model_validate(
        {
            "model": model,
            "learning_rates": [0.5, 2.0],
            "batch_sizes": [40],
            "epochs": [1],
            "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.5},
            "budget": BUDGET.model_dump(),
            **grid,
        }
    )


def test_a_tuned_grud_is_fitted_to_the_classes_and_a_binary_one_is_unchanged() -> None:
    fitted = fit_to_dataset("hyperparameters", _request({"kind": "grud", "hidden": 3}), THREE)
    assert isinstance(fitted, HyperparameterRequest) and isinstance(fitted.model, GrudSpec)
    assert fitted.model.classes == 3 and fitted.model.hidden == 3
    binary = _request({"kind": "grud", "hidden": 3})
    assert fit_to_dataset("hyperparameters", binary, BINARY) == binary
    assert "classes" not in binary.model.model_dump()


@pytest.mark.parametrize(
    ("model", "schema", "text"),
    [
        ({"kind": "grud", "hidden": 3, "classes": 4}, THREE, "differs from the dataset's 3"),
        ({"kind": "grud", "hidden": 3, "classes": 3}, BINARY, "target is binary"),
    ],
)
def test_what_does_not_fit_the_dataset_is_a_plan_error(
    model: dict[str, Any], schema: dict[str, Any], text: str
) -> None:
    with pytest.raises(PlanError, match=re.escape(text)):
        plan_selection(
            "hyperparameters",
            _request(model),
            dataset="tri-icu",
            n_rows=N_STAYS,
            n_features=2,
            schema=schema,
        )


COMMON = {
    "kind": "hyperparameters",
    "epsilon": 6.0,
    "delta": 1e-5,
    "training_epsilon": 1.0,
    "fitness_epsilon": 0.2,
    "learning_rates": [0.5, 2.0],
    "epochs": [1],
    "model": {"kind": "grud", "hidden": 3},
    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.5, "max_runs": 4},
}


@pytest.mark.parametrize("batch_sizes", [[40], [20, 40]])
def test_the_charge_is_the_tuning_rule_rebuilt_from_dpsgd_job_plans(
    batch_sizes: list[int],
) -> None:
    quoted = _quoted({**COMMON, "batch_sizes": batch_sizes}, THREE, N_STAYS)
    charged = event_from_json(quoted["plan"].event)
    expected = _expected_event(quoted, THREE)
    assert charged == expected
    assert list(charged.rdp(ORDERS)) == list(expected.rdp(ORDERS))
    plan = quoted["plan"]
    assert plan.guarantee == "proven" and plan.epsilon <= 6.0
    assert plan.model == {"kind": "grud", "hidden": 3, "classes": 3}
    # stored fitted, as the worker trains it (the job's model, its plan's and its estimate's)
    assert quoted["request"].selection["request"]["model"] == plan.model
    k_class = parameter_count(GrudSpec(hidden=3, classes=3), 2)
    assert k_class - parameter_count(GrudSpec(hidden=3), 2) == 2 * (3 + 1)  # K·(H + 1) head
    assert {c["parameters"] for c in plan.mechanism["candidates"]} == {k_class}
    assert len(plan.mechanism["candidates"]) == len(batch_sizes)
    assert all("engine" not in c for c in plan.mechanism["candidates"])  # exact
    # the binary GRU-D's tuning is what it was: stored and planned as sent
    binary = _quoted({**COMMON, "batch_sizes": batch_sizes}, BINARY, N_STAYS)
    assert binary["plan"].model == {"kind": "grud", "hidden": 3}
    assert binary["request"].selection["request"]["model"] == {"kind": "grud", "hidden": 3}
    assert event_from_json(binary["plan"].event) == _expected_event(binary, BINARY)


def test_the_quote_estimates_the_padded_runs_of_the_k_class_model() -> None:
    plan = _quoted({**COMMON, "batch_sizes": [40]}, THREE, N_STAYS)["plan"]
    estimate = plan_resources(plan, schema=parse_dataset_schema(THREE))
    (mechanism,) = plan.mechanism["candidates"]
    spec = GrudSpec.model_validate(plan.model)
    assert spec.classes == 3
    # max_runs 4: the worker always trains 4 (decoys after the K-th), each estimated
    assert estimate.seconds is not None and estimate.memory_bytes is not None
    assert estimate.seconds >= 4 * dpsgd_training_seconds(spec, mechanism) - 1e-9


def _stays(n: int, *, seed: int) -> TabularTrainingSet:
    """Random stays on TINY's grid (T = 4, V = 2), the class by the first variable's level."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 3, n)
    masks = (rng.random((n, 4, 2)) < 0.8).astype(np.float32)
    values = (rng.normal(0, 0.3, (n, 4, 2)) + (label[:, None, None] - 1.0)).astype(np.float32)
    values *= masks
    x = torch.as_tensor(pack_grud_inputs(values, masks, deltas_from_masks(masks)))
    return TabularTrainingSet(x, torch.as_tensor(label.astype(np.float32)), (0.0, 0.0))


def test_a_three_class_grud_tuning_trains_the_padded_runs_and_releases_k_logits() -> None:
    request = _request(
        {"kind": "grud", "hidden": 3},
        runs=TnbRunsSpec(eta=1.0, gamma=0.5, max_runs=2).model_dump(),
    )
    fitted = fit_to_dataset("hyperparameters", request, THREE)
    assert isinstance(fitted, HyperparameterRequest)
    plan = plan_selection(
        "hyperparameters", fitted, dataset="tri-icu", n_rows=N_STAYS, n_features=2, schema=THREE
    )
    seen: list[tuple[int, int]] = []
    out = run_hyperparameter_selection(
        request=fitted,
        plan=plan,
        data=_stays(N_STAYS, seed=0),
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    assert seen == [(0, 1), (1, 1)]  # K is never shown
    assert out.trainings in (1, 2) and out.weights is not None
    summary = released_summary(out)
    assert summary["model"] == {"kind": "grud", "hidden": 3, "classes": 3}
    assert summary["selected"]["learning_rate"] in (0.5, 2.0)  # type: ignore[index]
    assert out.weights["head.weight"].shape == (3, 3)  # K logits of H = 3
