"""A monotone search answered with fewer evaluations (issue 26: the decaying schedule's σ₀
search in schedules.py and the quote's remaining ε in filters.py spent most of a quote
evaluating points their bisections could have known).

A *walk* is a deterministic search that asks "sufficient?" at a sequence of points, each
depending on the answers before it, and ends at a pair: its result and the insufficient
point next to it (None where there is none). Sufficiency is monotone: sufficient at y
implies sufficient at every x on one side of y (``yes_upward``: every x ≥ y; else every
x ≤ y), so an evaluated point answers every point on its side. :func:`guided_walk` runs
the walk answering from the evaluated points; where the walk reaches a point none
answers, it replays the walk with such points decided by an estimate of the boundary and
evaluates the replay's end pair first (when the estimate is right, the walk then
completes), else the walk's own point; after ``max_guesses`` guesses only the walk's own
points. It returns once the walk completes with both points of its end pair evaluated.

The result is the walk's own wherever the evaluated function is monotone over the points
evaluated and asked (the callers' tests compare with the plain walk on random cases); in
any case its end pair was evaluated, so its result is sufficient and its neighbour is not,
as in the plain walk. A wrong estimate costs evaluations, never a different answer.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

P = TypeVar("P", int, float)
"""A point of the search."""

__all__ = ["guided_walk"]


class _Unanswered(Exception):
    """The walk asked at a point that no evaluation answers yet."""

    def __init__(self, point: float) -> None:
        super().__init__(point)
        self.point = point


def guided_walk(
    walk: Callable[[Callable[[P], bool]], tuple[P, P | None]],
    *,
    evaluate: Callable[[P], float],
    sufficient: Callable[[float], bool],
    yes_upward: bool,
    estimate: Callable[[dict[P, float]], float | None],
    max_guesses: int,
) -> tuple[P, P | None]:
    """``walk``'s end pair (module docstring), answering its questions from
    ``evaluate``'s values (point → value, ``sufficient(value)``) where one answers.
    ``estimate``: where sufficiency changes, from the evaluated points (None: no guess);
    a ValueError from a replay on the estimate lets the walk's own point be evaluated."""
    known: dict[P, float] = {}

    def answer(x: P) -> bool | None:
        """Sufficient at x, as the evaluated points say; None where none does (or where
        they say both)."""
        if x in known:
            return sufficient(known[x])
        yes = any(sufficient(v) and (y <= x if yes_upward else y >= x) for y, v in known.items())
        no = any(not sufficient(v) and (y >= x if yes_upward else y <= x) for y, v in known.items())
        return yes if yes != no else None

    def strict(x: P) -> bool:
        decided = answer(x)
        if decided is None:
            raise _Unanswered(x)
        return decided

    def predicted(at: float, x: P) -> bool:
        """As :func:`answer`, and where it has none, sufficient on the estimate's side of
        ``at``."""
        decided = answer(x)
        if decided is not None:
            return decided
        return x >= at if yes_upward else x <= at

    guesses = 0
    while True:
        pending: P
        try:
            end = walk(strict)
        except _Unanswered as stop:
            pending = stop.point  # type: ignore[assignment]  # the P the walk asked at
        else:
            missing = [x for x in end if x is not None and x not in known]
            if not missing:
                return end
            pending = missing[0]
        boundary = estimate(known) if guesses < max_guesses else None
        if boundary is not None:
            try:
                replay: tuple[P, P | None] = walk(partial(predicted, boundary))
            except ValueError:  # unreachable on the estimate: the walk's own point decides
                replay = (pending, None)
            guess = next((x for x in replay if x is not None and x not in known), None)
            if guess is not None:
                guesses += 1
                pending = guess
        known[pending] = evaluate(pending)
