"""A wall-clock bound on one request's planning (issue 19 item 8: four analysts held every
planning slot with plans whose noise calibration took ~20 s).

The API sets a deadline around the planning of a quote or submission
(:func:`planning_deadline`); noise calibration checks it before each evaluation of ε(σ)
(:func:`check_deadline`, called by :mod:`service.privacy.calibrate`), so a planning slot
is held at most the deadline plus one evaluation. The worker re-plans without a deadline:
a plan the API admitted is never refused by the worker for time.

:class:`PlanningTimeout` is deliberately not a ``ValueError``: the calibration code and
the searches over a per-training ε read a ``ValueError`` as "no σ fits", and a timeout
must never be mistaken for that (it would change a plan, not stop it).

The timeout depends only on public inputs and the machine's load, never on private rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["PlanningTimeout", "check_deadline", "planning_deadline"]

_deadline: ContextVar[tuple[float, float] | None] = ContextVar("planning_deadline", default=None)


class PlanningTimeout(RuntimeError):
    """Planning ran past the request's deadline (nothing was charged)."""


@contextmanager
def planning_deadline(seconds: float | None) -> Iterator[None]:
    """Bound the planning done inside the block to ``seconds`` (None: unbounded)."""
    token = _deadline.set(None if seconds is None else (time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def check_deadline() -> None:
    """Raise :class:`PlanningTimeout` if the current planning deadline has passed."""
    current = _deadline.get()
    if current is not None and time.monotonic() > current[0]:
        raise PlanningTimeout(
            f"planning this request took longer than the {current[1]:g} s the service "
            "allows: ask for the rdp accountant, fewer steps (epochs, larger batches) or a "
            "constant noise schedule"
        )
