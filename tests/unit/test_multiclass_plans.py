"""Issue 20, multi-class targets: the public schema declares K ≥ 3 classes, DP-SGD plans
multinomial logistic regression (proven, K·(d + 1) parameters, ``classes: K`` in the plan's
model) and K-logit MLPs (engines exact and ghost), so does the proven ExpM (Langevin
sampler) for logistic regression, and every other method, engine, model and selection
refuses it at quote time; a binary schema and its plans are unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from service.datasets.tabular import encode_target, parse_schema
from service.modelspec import MAX_CLASSES, LogisticSpec, MlpSpec, parameter_count
from service.plans import PlanError, plan_for_dataset, with_classes
from service.schemas import DpsgdOptions, ExpmOptions, JobRequest
from service.selection.budget import SelectionBudget
from service.selection.hyperparameters import HyperparameterRequest
from service.selection.kinds import fit_to_classes, n_classes_of, plan_selection
from tests.plan_cases import adult_schema

CLASSES = ["setosa", "versicolor", "virginica"]


def _schema(**target: Any) -> dict[str, Any]:
    return {
        "name": "iris",
        "target": {"column": "species", **target},
        "columns": [
            {"name": "a", "type": "numeric", "min": 0, "max": 10},
            {"name": "b", "type": "numeric", "min": 0, "max": 10},
        ],
    }


def _public(**target: Any) -> dict[str, Any]:
    return parse_schema(_schema(**target)).model_dump(mode="json")


def _dpsgd(**options: Any) -> JobRequest:
    return JobRequest(
        dataset="iris",
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        dpsgd=DpsgdOptions(epochs=2, batch_size=32, **options),
    )


def test_a_target_declares_classes_or_positive_and_negative_never_both() -> None:
    schema = parse_schema(_schema(classes=CLASSES))
    assert schema.n_classes == 3 and schema.target.values == CLASSES
    binary = parse_schema(_schema(positive=["x"], negative=["y"]))
    assert binary.n_classes == 2
    assert "classes" not in binary.model_dump(mode="json")["target"]  # binary dump unchanged
    assert "positive" not in schema.model_dump(mode="json")["target"]
    for bad in (
        {"classes": CLASSES, "positive": ["setosa"]},
        {"positive": ["x"]},
        {},
        {"classes": ["a", "b"]},  # two classes: positive/negative
        {"classes": ["a", "b", "a"]},
    ):
        with pytest.raises(ValidationError):
            parse_schema(_schema(**bad))


def test_classes_encode_as_their_index_int64_and_binary_as_before() -> None:
    schema = parse_schema(_schema(classes=CLASSES))
    frame = pd.DataFrame({"species": ["virginica", "setosa", "versicolor"], "a": ["1"] * 3})
    y = encode_target(schema, frame)
    assert y.dtype == np.int64 and y.tolist() == [2, 0, 1]
    binary = parse_schema(_schema(positive=["x"], negative=["y"]))
    yb = encode_target(binary, pd.DataFrame({"species": ["x", "y"]}))
    assert yb.dtype == np.float32 and yb.tolist() == [1.0, 0.0]


def test_dpsgd_plans_multinomial_logistic_regression_proven() -> None:
    plan = plan_for_dataset(_dpsgd(), n_rows=600, public_schema=_public(classes=CLASSES))
    assert plan.model == {"kind": "logistic", "classes": 3}
    assert plan.mechanism["parameters"] == 3 * (2 + 1)
    assert plan.guarantee == "proven"
    # the same request with the classes stated gives the same plan; a wrong count is refused
    stated = _dpsgd().model_copy(update={"model": LogisticSpec(classes=3)})
    assert plan_for_dataset(stated, n_rows=600, public_schema=_public(classes=CLASSES)) == plan
    wrong = _dpsgd().model_copy(update={"model": LogisticSpec(classes=4)})
    with pytest.raises(PlanError, match="differs"):
        plan_for_dataset(wrong, n_rows=600, public_schema=_public(classes=CLASSES))


def test_a_binary_plan_has_no_classes_and_refuses_a_stated_count() -> None:
    plan = plan_for_dataset(_dpsgd(), n_rows=30162, public_schema=adult_schema())
    assert plan.model == {"kind": "logistic"}
    stated = _dpsgd().model_copy(update={"model": LogisticSpec(classes=3)})
    with pytest.raises(PlanError, match="binary"):
        plan_for_dataset(stated, n_rows=30162, public_schema=adult_schema())


@pytest.mark.parametrize("engine", ["exact", "ghost"])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_dpsgd_plans_k_logit_mlps_proven_and_binary_mlps_as_before(
    engine: str, activation: str
) -> None:
    spec = MlpSpec(hidden=[8, 4], activation=activation)  # type: ignore[arg-type]
    request = _dpsgd(engine=engine).model_copy(update={"model": spec})
    plan = plan_for_dataset(request, n_rows=600, public_schema=_public(classes=CLASSES))
    model = {"kind": "mlp", "hidden": [8, 4], "classes": 3}
    assert plan.model == (model if activation == "tanh" else {**model, "activation": "relu"})
    assert plan.mechanism["parameters"] == (2 + 1) * 8 + (8 + 1) * 4 + (4 + 1) * 3
    assert plan.mechanism.get("engine", "exact") == engine and plan.guarantee == "proven"
    binary = plan_for_dataset(request, n_rows=30162, public_schema=adult_schema())
    assert "classes" not in binary.model and binary.guarantee == "proven"
    width = parse_schema(adult_schema()).n_features
    assert binary.mechanism["parameters"] == parameter_count(spec, width)  # one logit


@pytest.mark.parametrize(
    "request_",
    [
        _dpsgd(engine="ghost"),
        _dpsgd(engine="jl", jl_projections=4),
        _dpsgd(engine="jl", jl_projections=4).model_copy(update={"model": MlpSpec(hidden=[8])}),
        JobRequest(dataset="iris", method="expm", epsilon=1.0, expm=ExpmOptions(sampler="mcmc")),
        JobRequest(dataset="iris", method="expm_nf", epsilon=1.0),
        JobRequest(dataset="iris", method="expm", epsilon=1.0, delta=1e-5, model=MlpSpec()),
    ],
    ids=["ghost", "jl", "jl_mlp", "expm_mcmc", "expm_nf", "expm_langevin_mlp"],
)
def test_every_other_method_engine_and_model_refuses_k_classes(request_: JobRequest) -> None:
    with pytest.raises(PlanError, match=r"3 classes.*'dpsgd', engine 'exact'.*'logistic'"):
        plan_for_dataset(request_, n_rows=600, public_schema=_public(classes=CLASSES))


@pytest.mark.parametrize("kind", ["architecture", "features"])
def test_selections_but_tuning_refuse_k_classes(kind: str) -> None:
    with pytest.raises(PlanError, match=r"3 classes.*only 'hyperparameters' takes"):
        plan_selection(
            kind,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            dataset="iris",
            n_rows=600,
            n_features=2,
            schema=_public(classes=CLASSES),
        )


def test_tuning_plans_k_class_logistic_and_mlp_candidates() -> None:
    budget = SelectionBudget(training_epsilon=1.0, training_delta=1e-6, fitness_epsilon=0.1)
    request = HyperparameterRequest(model=LogisticSpec(), batch_sizes=[64], budget=budget)
    schema = _public(classes=CLASSES)
    fitted = fit_to_classes("hyperparameters", request, n_classes_of(schema))
    assert fitted.model == LogisticSpec(classes=3)
    plan = plan_selection(
        "hyperparameters", request, dataset="iris", n_rows=600, n_features=2, schema=schema
    )
    (mechanism,) = plan.mechanisms.values()
    assert mechanism["parameters"] == 3 * (2 + 1) and plan.training_guarantee == "proven"
    binary = plan_selection(
        "hyperparameters",
        request,
        dataset="iris",
        n_rows=600,
        n_features=2,
        schema=_public(positive=["virginica"], negative=["setosa"]),
    )
    assert next(iter(binary.mechanisms.values()))["parameters"] == 2 + 1
    mlp = request.model_copy(update={"model": MlpSpec(hidden=[4])})
    assert fit_to_classes("hyperparameters", mlp, 3).model == MlpSpec(hidden=[4], classes=3)
    plan = plan_selection(
        "hyperparameters", mlp, dataset="iris", n_rows=600, n_features=2, schema=schema
    )
    (mechanism,) = plan.mechanisms.values()
    assert mechanism["parameters"] == (2 + 1) * 4 + (4 + 1) * 3
    assert plan.training_guarantee == "proven"


def test_more_classes_than_the_engine_takes_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match=r"model\.classes"):
        with_classes(_dpsgd(), MAX_CLASSES + 1)
    assert with_classes(_dpsgd(), MAX_CLASSES).model == LogisticSpec(classes=MAX_CLASSES)
