"""Hyperparameter tuning of a CNN on an image dataset (issue 20): the tuned CNN is fitted to
the images' shape and classes as a DP-SGD job's is; what does not fit is a PlanError
(→ 422, nothing charged); the charge is the tuning rule of every other model
(Papernot & Steinke random stopping over one DP-SGD training, as a DP-SGD job on the
training split plans it, plus one noisy count); the quote estimates its trainings; and
the worker trains the drawn runs by exact DP-SGD and releases a CNN."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from service.datasets.kinds import load_schema_yaml
from service.methods.dpsgd import dpsgd_training_seconds
from service.modelspec import CnnSpec, MlpSpec
from service.plans import PlanError, plan_for_dataset
from service.privacy.events import (
    AnyOfEvent,
    ComposedEvent,
    RandomStoppingEvent,
    event_from_json,
)
from service.privacy.orders import ORDERS
from service.privacy.sampling import count_event
from service.resources import plan_resources
from service.schemas import DpsgdOptions, JobRequest
from service.selection.api_bodies import SelectionRequest, job_request, plan_selection_job
from service.selection.plans import (
    HyperparameterRequest,
    SelectionBudget,
    TnbRunsSpec,
    fit_to_dataset,
    plan_selection,
)
from service.selection.runs_spec import runs_distribution
from tests.plan_cases import N_ROWS, adult_schema
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.model_selection import released_summary, run_hyperparameter_selection

REPO = Path(__file__).resolve().parents[2]
DIGITS: dict[str, Any] = load_schema_yaml(
    (REPO / "examples" / "digits" / "schema.yaml").read_text()
).model_dump(mode="json")
DIGITS_ROWS = 1797
BUDGET = SelectionBudget(training_epsilon=2.0, training_delta=1e-5, fitness_epsilon=0.5)
CONV = [{"channels": 4, "kernel": 3, "padding": 1, "pool": "avg2"}]


def _images(classes: int, size: int = 6) -> dict[str, Any]:
    """A public image schema (size × size, one channel) with ``classes`` classes."""
    return {
        **DIGITS,
        "name": "toy",
        "height": size,
        "width": size,
        "classes": [f"c{i}" for i in range(classes)],
    }


def _request(model: dict[str, Any], **grid: Any) -> HyperparameterRequest:
    return HyperparameterRequest.model_validate(
        {
            "model": model,
            "learning_rates": [0.5, 2.0],
            "batch_sizes": [128],
            "epochs": [1],
            "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.5},
            "budget": BUDGET.model_dump(),
            **grid,
        }
    )


def test_a_tuned_cnn_is_fitted_to_the_images_and_other_models_are_unchanged() -> None:
    fitted = fit_to_dataset("hyperparameters", _request({"kind": "cnn", "conv": CONV}), DIGITS)
    assert isinstance(fitted, HyperparameterRequest) and isinstance(fitted.model, CnnSpec)
    assert fitted.model.classes == 10
    assert fitted.model.image is not None
    assert fitted.model.image.model_dump() == {"channels": 1, "height": 8, "width": 8}
    # binary images: one logit, no classes
    binary = fit_to_dataset("hyperparameters", _request({"kind": "cnn", "conv": CONV}), _images(2))
    assert isinstance(binary.model, CnnSpec)  # type: ignore[union-attr]
    assert binary.model.classes is None and binary.model.image is not None  # type: ignore[union-attr]
    # an MLP on Adult is what it was (no image, no classes: its plans' digests unchanged)
    mlp = _request({"kind": "mlp", "hidden": [8]})
    assert fit_to_dataset("hyperparameters", mlp, adult_schema()) == mlp


@pytest.mark.parametrize(
    ("model", "schema", "text"),
    [
        ({"kind": "cnn", "conv": CONV}, "adult", "needs an image dataset; this dataset is tabular"),
        (
            {"kind": "cnn", "conv": CONV, "image": {"channels": 3, "height": 8, "width": 8}},
            "digits",
            "differs from the dataset's",
        ),
        ({"kind": "cnn", "conv": CONV, "classes": 4}, "digits", "differs from the dataset's 10"),
        # 4 × 4 images: three 2 × 2 poolings leave an empty map
        ({"kind": "cnn", "conv": CONV * 3}, "small", "is empty"),
    ],
)
def test_what_does_not_fit_the_dataset_is_a_plan_error(
    model: dict[str, Any], schema: str, text: str
) -> None:
    schemas = {"adult": adult_schema(), "digits": DIGITS, "small": _images(3, size=4)}
    with pytest.raises(PlanError, match=re.escape(text)):
        plan_selection(
            "hyperparameters",
            _request(model),
            dataset="x",
            n_rows=1000,
            n_features=64,
            schema=schemas[schema],
        )


def _quoted(body: dict[str, Any], schema: dict[str, Any], n_rows: int) -> dict[str, Any]:
    selection = SelectionRequest.model_validate({"dataset": str(schema["name"]), **body}).root
    request = job_request(selection, n_rows=n_rows, public_schema=schema)
    _, plan = plan_selection_job(request, n_rows=n_rows, public_schema=schema)
    return {"request": request, "plan": plan}


def _expected_event(quoted: dict[str, Any], schema: dict[str, Any]) -> RandomStoppingEvent:
    """The tuning rule rebuilt from its parts: random stopping (the declared law of K) over
    one run = any of the DP-SGD trainings of the grid's privacy settings, each as a DP-SGD
    job of the same model on the public training split plans it, + one noisy count."""
    request: JobRequest = quoted["request"]
    kind = HyperparameterRequest.model_validate(request.selection["request"])  # type: ignore[index]
    mech = quoted["plan"].mechanism
    trainings = []
    for candidate in mech["candidates"]:
        job = JobRequest(
            dataset=request.dataset,
            method="dpsgd",
            model=kind.model,
            epsilon=kind.budget.training_epsilon,
            delta=kind.budget.training_delta,
            dpsgd=DpsgdOptions(batch_size=candidate["batch_size"], epochs=candidate["epochs"]),
        )
        plan = plan_for_dataset(job, n_rows=mech["n_train_public"], public_schema=schema)
        trainings.append(event_from_json(plan.event))
    train = trainings[0] if len(trainings) == 1 else AnyOfEvent(events=tuple(trainings))
    one = ComposedEvent(events=(train, count_event(epsilon=kind.budget.fitness_epsilon)))
    return RandomStoppingEvent(event=one, runs=runs_distribution(kind.runs))


COMMON = {
    "kind": "hyperparameters",
    "epsilon": 6.0,
    "delta": 1e-5,
    "training_epsilon": 1.0,
    "fitness_epsilon": 0.2,
    "learning_rates": [0.5, 2.0],
    "epochs": [1],
    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.5, "max_runs": 4},
}


@pytest.mark.parametrize("batch_sizes", [[128], [64, 128]])
def test_the_charge_is_the_tuning_rule_of_every_other_model(batch_sizes: list[int]) -> None:
    cnn_body = {**COMMON, "batch_sizes": batch_sizes, "model": {"kind": "cnn", "conv": CONV}}
    mlp_body = {**COMMON, "batch_sizes": batch_sizes, "model": {"kind": "mlp", "hidden": [4]}}
    cnn = _quoted(cnn_body, DIGITS, DIGITS_ROWS)
    mlp = _quoted(mlp_body, adult_schema(), N_ROWS)
    for quoted, schema in ((cnn, DIGITS), (mlp, adult_schema())):
        charged = event_from_json(quoted["plan"].event)
        expected = _expected_event(quoted, schema)
        assert charged == expected
        assert list(charged.rdp(ORDERS)) == list(expected.rdp(ORDERS))
        assert len(quoted["plan"].mechanism["candidates"]) == len(batch_sizes)
    plan = cnn["plan"]
    assert plan.guarantee == "proven" and plan.epsilon <= 6.0
    # conv 1 → 4 (3·3 + 1)·4 = 40, head (4·4·4 + 1)·10 = 650
    assert plan.model["kind"] == "cnn" and plan.model["classes"] == 10
    assert plan.model["image"] == {"channels": 1, "height": 8, "width": 8}
    assert {c["parameters"] for c in plan.mechanism["candidates"]} == {40 + 650}
    assert all("engine" not in c for c in plan.mechanism["candidates"])  # exact
    stored = cnn["request"].selection["request"]["model"]
    assert stored == plan.model  # stored fitted, as the worker trains it
    assert isinstance(MlpSpec.model_validate(mlp["plan"].model), MlpSpec)
    assert "image" not in mlp["request"].selection["request"]["model"]


def test_the_quote_estimates_the_padded_runs() -> None:
    quoted = _quoted(
        {**COMMON, "batch_sizes": [128], "model": {"kind": "cnn", "conv": CONV}},
        DIGITS,
        DIGITS_ROWS,
    )
    plan = quoted["plan"]
    schema = load_schema_yaml((REPO / "examples" / "digits" / "schema.yaml").read_text())
    estimate = plan_resources(plan, schema=schema)
    (mechanism,) = plan.mechanism["candidates"]
    spec = CnnSpec.model_validate(plan.model)
    # max_runs 4: the worker always trains 4 (decoys after the K-th), each estimated
    assert estimate.seconds is not None and estimate.memory_bytes is not None
    assert estimate.seconds >= 4 * dpsgd_training_seconds(spec, mechanism) - 1e-9
    assert estimate.memory_bytes > 0


def test_a_binary_cnn_tuning_trains_the_padded_runs_and_releases_a_cnn() -> None:
    schema = _images(2)
    request = _request(
        {"kind": "cnn", "conv": [{"channels": 2, "kernel": 3}]},
        runs=TnbRunsSpec(eta=1.0, gamma=0.5, max_runs=2).model_dump(),
    )
    fitted = fit_to_dataset("hyperparameters", request, schema)
    assert isinstance(fitted, HyperparameterRequest)
    plan = plan_selection(
        "hyperparameters", fitted, dataset="toy", n_rows=400, n_features=36, schema=schema
    )
    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 36, generator=g)
    y = (x[:, :18].mean(dim=1) > x[:, 18:].mean(dim=1)).float()
    seen: list[tuple[int, int]] = []
    out = run_hyperparameter_selection(
        request=fitted,
        plan=plan,
        data=TabularTrainingSet(x, y),
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    assert seen == [(0, 1), (1, 1)]  # K is never shown
    assert out.trainings in (1, 2) and out.weights is not None
    summary = released_summary(out)
    model = CnnSpec.model_validate(summary["model"])
    assert model.classes is None and model.conv[0].channels == 2
    assert summary["selected"]["learning_rate"] in (0.5, 2.0)  # type: ignore[index]
    # 6 × 6 → 4 × 4 (kernel 3, no padding)
    assert out.weights["head.weight"].shape == (1, 2 * 4 * 4)
