"""The per-training ε's search reads the whole-workflow ε of a step an earlier request
with the same planning inputs already planned (service.selection.kinds._COSTS): the
resolved request must be the one a fresh process computes, whatever was asked before."""

from __future__ import annotations

import math
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
    assert size >= 8  # the doubling start and the search's steps
    assert _resolved(_arch(), 3.0) == first
    assert len(kinds._COSTS._items) == size  # every step was read


def test_a_nearby_epsilon_shares_steps_and_resolves_as_a_fresh_process() -> None:
    expected = {eps: _fresh(_arch(), eps) for eps in (3.0, 3.0137, 2.5)}
    kinds._COSTS.clear()
    _resolved(_arch(), 3.0)
    size = len(kinds._COSTS._items)
    assert _resolved(_arch(), 3.0137) == expected[3.0137]
    assert len(kinds._COSTS._items) - size < size  # the common doubling start was read
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


def _step_cost(level: Any) -> Any:
    """The cost level(t) (None above 60: not plannable), recording every t asked."""
    asked: list[float] = []

    def cost(t: float) -> float | None:
        asked.append(t)
        return None if t > 60.0 else level(t)

    cost.asked = asked  # type: ignore[attr-defined]
    cost.level = level  # type: ignore[attr-defined]
    return cost


def _stairs(t: float) -> float:
    """A non-decreasing step function with steps 2e-6 wide (relative), as σ's grid
    makes the whole-workflow ε, on a smooth trend."""
    step = math.floor(math.log(t / 1e-3) / math.log1p(2e-6))
    return 0.1 + 0.6 * (1e-3 * (1.0 + 2e-6) ** step) ** 1.2


@pytest.mark.parametrize("target", [0.5, 1.3, 2.0000001, 7.0, 49.0])
def test_the_search_returns_a_point_at_or_below_the_target_next_to_one_above(
    target: float,
) -> None:
    """largest_within: the answer was evaluated at or below the target, a point within
    T_TOL above it was evaluated above the target, every t asked lies on the public grid,
    and a second run asks the same t's (deterministic)."""
    cost = _step_cost(_stairs)
    t = kinds.largest_within(cost, lo=1e-3, low_cost=cost(1e-3), target=target)
    asked = list(cost.asked)
    assert _stairs(t) <= target
    above = [s for s in asked if s > t and (s > 60.0 or _stairs(s) > target)]
    assert above and min(above) <= t * (1.0 + kinds.T_TOL)
    assert all(s == kinds.grid_up(s, kinds.T_BITS) for s in asked[1:])
    assert len(set(asked)) < 30  # a bisection to T_TOL from [1e-3, 100] needs ~34
    again = _step_cost(_stairs)
    assert kinds.largest_within(again, lo=1e-3, low_cost=again(1e-3), target=target) == t
    assert again.asked == asked


def test_the_search_takes_the_largest_t_when_everything_fits() -> None:
    """Up to where planning refuses (60 here), or T_MAX where it never does."""
    cost = _step_cost(lambda t: 0.5)
    t = kinds.largest_within(cost, lo=1e-3, low_cost=0.5, target=1.0)
    assert 60.0 * (1.0 - kinds.T_TOL) < t <= 60.0
    plannable = lambda t: 0.5  # noqa: E731
    assert kinds.largest_within(plannable, lo=1e-3, low_cost=0.5, target=1.0) == 100.0


def test_the_search_never_returns_a_t_above_the_target_by_rounding() -> None:
    """A cost a hair above the target (log(c/target) rounds to 0) is above it."""
    target = 3.0
    hair = math.nextafter(target, math.inf)
    cost = _step_cost(lambda t: 1.0 if t < 2.0 else hair)
    t = kinds.largest_within(cost, lo=1e-3, low_cost=1.0, target=target)
    assert 2.0 * (1.0 - kinds.T_TOL) < t < 2.0
