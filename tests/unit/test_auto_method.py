"""``method: "auto"`` (issue 21, point 3; service/methods/auto.py): the rule at several public
inputs, the plan it gives (the chosen method's default plan plus the record of the choice),
and the requests it refuses."""

from __future__ import annotations

import math
from typing import Any

import pytest

from service.methods.auto import LANGEVIN_MIN_SCALE, auto_choice, langevin_scale
from service.methods.common import PlanFacts
from service.plans import PlanError, build_plan, plan_for_dataset
from service.schemas import JobRequest, PrivacyPlan
from tests.plan_cases import N_ROWS, adult_schema

ADULT_B = 14  # Adult's row-norm bound: 13 columns and the bias (service/methods/expm.py)


def _auto(**fields: Any) -> JobRequest:
    body = {"dataset": "adult", "method": "auto", "epsilon": 1.0, "delta": 1e-5, **fields}
    return JobRequest.model_validate(body)


def _adult_plan(request: JobRequest, n_rows: int = N_ROWS) -> PrivacyPlan:
    return plan_for_dataset(request, n_rows=n_rows, public_schema=adult_schema())


@pytest.mark.parametrize(
    ("n_rows", "epsilon", "method"),
    [
        (N_ROWS, 1.0, "expm"),  # s = 8702: the study's Adult, where the Langevin ExpM won
        (10_000, 1.0, "expm"),  # s = 2673: adult10000
        (3_000, 1.0, "dpsgd"),  # s = 802: adult3000, where DP-SGD won
        (700, 1.0, "dpsgd"),  # s = 187
        (N_ROWS, 0.1, "dpsgd"),  # s = 870: Adult at ε = 0.1
        (1_000, 10.0, "expm"),  # s = 2673: a small set at a large ε
        (5_612, 1.0, "dpsgd"),  # s = 1499.9: just below the threshold
        (5_613, 1.0, "expm"),  # s = 1500.2: just above it
    ],
)
def test_binary_logistic_goes_to_the_langevin_expm_from_the_threshold(
    n_rows: int, epsilon: float, method: str
) -> None:
    s = n_rows * epsilon / math.sqrt(ADULT_B)
    assert (s >= LANGEVIN_MIN_SCALE) == (method == "expm")
    plan = _adult_plan(_auto(epsilon=epsilon), n_rows)
    assert plan.method == method
    assert plan.guarantee == "proven"
    choice = plan.method_choice
    assert choice is not None
    assert (choice.requested, choice.method) == ("auto", method)
    assert f"n̂·ε/√B = {s:.1f}" in choice.reason
    if method == "expm":
        assert plan.mechanism["sampler"] == "langevin"


@pytest.mark.parametrize(("n_rows", "epsilon"), [(N_ROWS, 1.0), (3_000, 1.0), (700, 0.5)])
def test_the_auto_plan_is_the_chosen_methods_default_plan_with_the_choice(
    n_rows: int, epsilon: float
) -> None:
    auto = _adult_plan(_auto(epsilon=epsilon), n_rows)
    assert auto.method_choice is not None
    named = _adult_plan(_auto(epsilon=epsilon).model_copy(update={"method": auto.method}), n_rows)
    assert named.method_choice is None
    assert auto.model_copy(update={"method_choice": None}) == named
    # Stored as JSON and read back (the worker's plan check compares these): the same plan.
    stored = PrivacyPlan.model_validate(auto.model_dump(mode="json"))
    assert stored == auto == _adult_plan(_auto(epsilon=epsilon), n_rows)


def test_a_named_methods_plan_has_no_choice_key() -> None:
    plan = _adult_plan(_auto().model_copy(update={"method": "dpsgd"}))
    assert "method_choice" not in plan.model_dump(mode="json")
    assert "method_choice" in _adult_plan(_auto()).model_dump(mode="json")


def test_other_models_go_to_dpsgd() -> None:
    plan = _adult_plan(_auto(model={"kind": "mlp", "hidden": [8]}))
    assert plan.method == "dpsgd"
    assert plan.method_choice is not None and "'mlp'" in plan.method_choice.reason


def test_a_time_series_model_goes_to_dpsgd() -> None:
    request = _auto(model={"kind": "grud", "hidden": 8})
    plan = build_plan(request, n_rows=5_000, n_features=4, dataset_kind="timeseries")
    assert plan.method == "dpsgd" and plan.guarantee == "proven"


def test_k_classes_go_to_dpsgd_whatever_the_scale() -> None:
    # s = 10^6·1/√65 ≈ 124,000, far above the threshold: binary, this would be the ExpM.
    plan = build_plan(_auto(), n_rows=1_000_000, n_features=64, norm_sq_bound=65, n_classes=10)
    assert plan.method == "dpsgd"
    assert plan.model["classes"] == 10
    assert plan.method_choice is not None and "10 classes" in plan.method_choice.reason
    binary = build_plan(_auto(), n_rows=1_000_000, n_features=64, norm_sq_bound=65)
    assert binary.method == "expm"


def test_a_kind_without_a_norm_bound_goes_to_dpsgd() -> None:
    plan = build_plan(_auto(epsilon=50.0), n_rows=100_000, n_features=4)
    assert plan.method == "dpsgd"


@pytest.mark.parametrize("n_rows", [1, 50, 400, 2_000, 10_000, 100_000, 10_000_000])
@pytest.mark.parametrize("epsilon", [1e-3, 0.1, 1.0, 8.0])
@pytest.mark.parametrize("norm_sq_bound", [None, 2, 14, 785])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_the_rule_only_chooses_proven_methods_by_its_scale(
    n_rows: int, epsilon: float, norm_sq_bound: int | None, n_classes: int
) -> None:
    facts = PlanFacts(n_rows=n_rows, n_features=10, norm_sq_bound=norm_sq_bound)
    choice = auto_choice(_auto(epsilon=epsilon), facts, n_classes=n_classes)
    expm = (
        n_classes == 2
        and norm_sq_bound is not None
        and langevin_scale(n_rows=n_rows, epsilon=epsilon, norm_sq_bound=norm_sq_bound)
        >= LANGEVIN_MIN_SCALE
    )
    assert choice.method == ("expm" if expm else "dpsgd")
    assert choice.requested == "auto" and choice.reason


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dpsgd": {"epochs": 3}}, "dpsgd options cannot go with it"),
        ({"expm": {"steps": 10}}, "expm options cannot go with it"),
        ({"expm_nf": {"layers": 1}}, "expm_nf options cannot go with it"),
        ({"dpsgd": {}, "expm": {}}, "dpsgd, expm options cannot go with it"),
        ({"delta": 0.0}, "send delta > 0"),
    ],
)
def test_auto_refuses_method_options_and_pure_dp(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        _adult_plan(_auto(**fields))
