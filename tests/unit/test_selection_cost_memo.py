"""The per-training ε's bisection reads the whole-workflow ε of a step an earlier request
with the same planning inputs already planned (service.selection.kinds._COSTS): the
resolved request must be the one a fresh process computes, whatever was asked before."""

from __future__ import annotations

from typing import Any

import pytest

from service.selection import kinds
from service.selection.architecture import ArchitectureRequest
from service.selection.budget import SelectionBudget
from service.selection.hyperparameters import HyperparameterRequest
from service.selection.kinds import SelectionRequest, with_total_epsilon

FACTS: dict[str, Any] = {"dataset": "toy", "n_rows": 600, "n_features": 4}


def _arch(**budget: float) -> ArchitectureRequest:
    return ArchitectureRequest.model_validate(
        {
            "space": {"depths": [1], "widths": [8]},
            "search": {"algorithm": "rs", "trainings": 3},
            "training": {"epochs": 2, "batch_size": 64},
            "budget": SelectionBudget(
                training_epsilon=budget.get("training_epsilon", 3.0),
                training_delta=1e-5,
                fitness_epsilon=budget.get("fitness_epsilon", 0.1),
            ).model_dump(),
        }
    )


def _resolved(request: SelectionRequest, epsilon: float, delta: float = 1e-5) -> str:
    out = with_total_epsilon(request, epsilon=epsilon, delta=delta, **FACTS)
    return out.model_dump_json()


def _fresh(request: SelectionRequest, epsilon: float, delta: float = 1e-5) -> str:
    kinds._COSTS.clear()
    return _resolved(request, epsilon, delta)


def test_a_repeat_plans_nothing_and_resolves_the_same() -> None:
    first = _fresh(_arch(), 3.0)
    size = len(kinds._COSTS._items)
    assert size >= 40  # the doubling start and the 40 bisection steps
    assert _resolved(_arch(), 3.0) == first
    assert len(kinds._COSTS._items) == size  # every step was read


def test_a_nearby_epsilon_shares_steps_and_resolves_as_a_fresh_process() -> None:
    expected = {eps: _fresh(_arch(), eps) for eps in (3.0, 3.0137, 2.5)}
    kinds._COSTS.clear()
    _resolved(_arch(), 3.0)
    size = len(kinds._COSTS._items)
    assert _resolved(_arch(), 3.0137) == expected[3.0137]
    assert len(kinds._COSTS._items) - size < 40  # the common first steps were read
    assert _resolved(_arch(), 2.5) == expected[2.5]
    # the request's own ε is not a planning input: the one it starts from changes nothing
    assert _resolved(_arch(training_epsilon=7.0), 3.0) == expected[3.0]


@pytest.mark.parametrize(
    "other",
    [
        lambda: (_arch(fitness_epsilon=0.2), 1e-5, FACTS),
        lambda: (_arch(), 1e-6, FACTS),
        lambda: (_arch(), 1e-5, {**FACTS, "n_rows": 900}),
        lambda: (_arch(), 1e-5, {**FACTS, "n_features": 5}),
        lambda: (
            HyperparameterRequest.model_validate(
                {"epochs": [2], "batch_sizes": [64], "budget": _arch().budget.model_dump()}
            ),
            1e-5,
            FACTS,
        ),
    ],
    ids=["fitness epsilon", "delta", "rows", "features", "kind"],
)
def test_other_planning_inputs_do_not_read_each_others_steps(other: Any) -> None:
    request, delta, facts = other()
    kinds._COSTS.clear()
    fresh = with_total_epsilon(request, epsilon=3.0, delta=delta, **facts).model_dump_json()
    kinds._COSTS.clear()
    _resolved(_arch(), 3.0)  # the same t's, other inputs
    warm = with_total_epsilon(request, epsilon=3.0, delta=delta, **facts).model_dump_json()
    assert warm == fresh


def test_refusals_are_remembered_with_their_reason() -> None:
    kinds._COSTS.clear()
    messages = []
    for _ in range(2):
        with pytest.raises(kinds.PlanError) as exc:
            with_total_epsilon(_arch(), epsilon=0.01, delta=1e-5, **FACTS)
        messages.append(str(exc.value))
    assert messages[0] == messages[1]
