"""Architecture search over GRU-D hidden sizes on a K-class time series (issue 20): the GRU-D
space is fitted to the outcome's classes (``classes: K``, every candidate K logits, as a
K-class GRU-D job's model; a binary space is unchanged, so its dumps and digests are what
they were); ExpM+NF candidates, the ghost and JL engines and a classes count that is not the
outcome's are PlanErrors (→ 422, nothing charged); the charge is the rule of every other
search (N × (the largest candidate's DP-SGD job event on the training split + one noisy
count), or Papernot & Steinke random stopping over one such run for rs with ``runs``); and
the worker trains each candidate by exact DP-SGD and releases a K-logit GRU-D."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from service.modelspec import GrudSpec, parameter_count
from service.plans import PlanError, plan_for_dataset
from service.privacy.events import ComposedEvent, RandomStoppingEvent, event_from_json
from service.privacy.orders import ORDERS
from service.privacy.sampling import count_event
from service.schemas import JobRequest
from service.selection.plans import ArchitectureRequest, fit_to_dataset, plan_selection
from service.selection.runs_spec import runs_distribution
from service.selection.search_space import ArchitectureSearch
from tests.unit.test_cnn_architecture import _expected_event, _quoted
from tests.unit.test_grud_classes_tuning import BINARY, N_STAYS, THREE, _stays
from worker.mechanisms.model_selection import released_summary, run_architecture_selection

SPACE = {"model": "grud", "depths": [1], "widths": [2, 3]}
COMMON: dict[str, Any] = {
    "kind": "architecture",
    "epsilon": 6.0,
    "delta": 1e-5,
    "training_epsilon": 1.0,
    "fitness_epsilon": 0.2,
    "space": SPACE,
    "training": {"epochs": 1, "batch_size": 40},
}


def _request(**changes: Any) -> ArchitectureRequest:
    return ArchitectureRequest.model_validate(
        {
            "space": SPACE,
            "search": {"algorithm": "rs", "trainings": 2},
            "training": {"epochs": 1, "batch_size": 40},
            "budget": {"training_epsilon": 2.0, "training_delta": 1e-5, "fitness_epsilon": 0.5},
            **changes,
        }
    )


def test_a_grud_space_is_fitted_to_the_classes_and_a_binary_one_is_unchanged() -> None:
    fitted = fit_to_dataset("architecture", _request(), THREE)
    assert isinstance(fitted, ArchitectureRequest) and fitted.space.classes == 3
    assert fitted.space.largest() == GrudSpec(hidden=3, classes=3)
    binary = fit_to_dataset("architecture", _request(), BINARY)
    assert isinstance(binary, ArchitectureRequest) and binary.space == _request().space
    assert "classes" not in binary.space.model_dump()
    assert binary.space.largest() == GrudSpec(hidden=3)


EXPM_NF = {"steps": 3, "n_samples_per_step": 4, "batch_size": 8}


@pytest.mark.parametrize(
    ("changes", "schema", "text"),
    [
        ({"space": {**SPACE, "classes": 4}}, THREE, "space.classes 4 differs from the dataset's 3"),
        (
            {"space": {**SPACE, "classes": 3}},
            BINARY,
            "space.classes 3 differs from the dataset's 2",
        ),
        (
            {"training": {"epochs": 1, "batch_size": 40, "engine": "ghost"}},
            THREE,
            "not by method 'dpsgd', model 'grud', engine 'ghost'",
        ),
        (
            {"training": {"epochs": 1, "batch_size": 40, "engine": "jl", "jl_projections": 4}},
            THREE,
            "not by method 'dpsgd', model 'grud', engine 'jl'",
        ),
        (
            {"method": "expm_nf", "training": {}, "expm_nf": EXPM_NF},
            THREE,
            "not by method 'expm_nf', model 'grud'",
        ),
    ],
)
def test_what_does_not_train_k_classes_is_a_plan_error(
    changes: dict[str, Any], schema: dict[str, Any], text: str
) -> None:
    with pytest.raises(PlanError, match=re.escape(text)):
        plan_selection(
            "architecture",
            _request(**changes),
            dataset="tri-icu",
            n_rows=N_STAYS,
            n_features=2,
            schema=schema,
        )


def test_a_binary_expm_nf_grud_search_still_plans() -> None:
    plan = plan_selection(
        "architecture",
        _request(method="expm_nf", training={}, expm_nf=EXPM_NF),
        dataset="tiny-icu",
        n_rows=N_STAYS,
        n_features=2,
        schema=BINARY,
    )
    assert plan.trainings == 2 and plan.guarantee == "nominal"


@pytest.mark.parametrize(
    "search",
    [{"algorithm": "rs", "trainings": 3}, {"algorithm": "paas", "generations": 2}],
)
def test_the_charge_is_the_search_rule_rebuilt_from_a_dpsgd_job_plan(
    search: dict[str, Any],
) -> None:
    quoted = _quoted({**COMMON, "search": search}, THREE, N_STAYS)
    plan = quoted["plan"]
    charged = event_from_json(plan.event)
    expected = _expected_event(quoted, THREE, N_STAYS)
    assert charged == expected
    assert list(charged.rdp(ORDERS)) == list(expected.rdp(ORDERS))
    assert plan.guarantee == "proven" and plan.epsilon <= 6.0
    assert plan.model == {"kind": "grud", "hidden": 3, "classes": 3}
    (candidate,) = plan.mechanism["candidates"]
    assert candidate["parameters"] == parameter_count(GrudSpec(hidden=3, classes=3), 2)
    assert "engine" not in candidate  # exact
    assert quoted["request"]["selection"]["request"]["space"]["classes"] == 3  # stored fitted
    # the binary search is what it was: no classes, one logit
    binary = _quoted({**COMMON, "search": search}, BINARY, N_STAYS)
    assert binary["plan"].model == {"kind": "grud", "hidden": 3}
    assert "classes" not in binary["request"]["selection"]["request"]["space"]
    assert event_from_json(binary["plan"].event) == _expected_event(binary, BINARY, N_STAYS)


def test_random_stopping_rs_charges_the_tuning_rule() -> None:
    runs = {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.5, "max_runs": 3}
    body = {**COMMON, "search": {"algorithm": "rs"}, "runs": runs}
    quoted = _quoted(body, THREE, N_STAYS)
    request = JobRequest.model_validate(quoted["request"])
    kind = ArchitectureRequest.model_validate(request.selection["request"])  # type: ignore[index]
    (candidate,) = quoted["mechanism"]["candidates"]
    training = JobRequest(
        dataset=request.dataset,
        method="dpsgd",
        model=request.model,
        epsilon=kind.budget.training_epsilon,
        delta=kind.budget.training_delta,
        dpsgd=kind.training.model_copy(update={"batch_size": candidate["batch_size"]}),
    )
    assert request.model == GrudSpec(hidden=3, classes=3)
    train = plan_for_dataset(
        training, n_rows=quoted["mechanism"]["n_train_public"], public_schema=THREE
    )
    one = ComposedEvent(
        events=(event_from_json(train.event), count_event(epsilon=kind.budget.fitness_epsilon))
    )
    expected = RandomStoppingEvent(event=one, runs=runs_distribution(kind.runs))  # type: ignore[arg-type]
    assert event_from_json(quoted["plan"].event) == expected


def test_a_three_class_grud_search_trains_the_candidates_and_releases_k_logits() -> None:
    fitted = fit_to_dataset("architecture", _request(), THREE)
    assert isinstance(fitted, ArchitectureRequest)
    fitted = fitted.model_copy(update={"search": ArchitectureSearch(algorithm="rs", trainings=2)})
    plan = plan_selection(
        "architecture", fitted, dataset="tri-icu", n_rows=N_STAYS, n_features=2, schema=THREE
    )
    seen: list[tuple[int, int]] = []
    out = run_architecture_selection(
        request=fitted,
        plan=plan,
        data=_stays(N_STAYS, seed=0),
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    assert out.trainings == 2 and seen[-1] == (2, 2)
    assert out.selected is not None and out.weights is not None
    summary = released_summary(out)
    model = GrudSpec.model_validate(summary["model"])
    assert model.classes == 3 and model.hidden in (2, 3)
    assert out.weights["head.weight"].shape == (3, model.hidden)  # K logits
