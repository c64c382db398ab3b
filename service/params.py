"""One validated type per privacy-relevant parameter, used at every door.

Single jobs (:mod:`service.schemas`), every selection kind's lists
(:mod:`service.selection.api_bodies`, :mod:`service.selection.plans`,
:mod:`service.selection.search_space`, :mod:`service.selection.features`) and the admin
routes (budgets, caps) name these types
instead of restating bounds, so a bound cannot be forgotten in one place: a clip norm of
−1e-4 in a tuning grid once turned clipping off while a single job's clip norm was checked
(issue 19).

Every numeric type here

* refuses a JSON boolean (``true`` is not the number 1: pydantic's lax mode would take it),
* refuses NaN and ±∞ (``allow_inf_nan=False``), and
* has a lower and an upper bound (zero where meaningless, absurd magnitudes refused).

:class:`InputModel` is the base of the API's input models: unknown fields, NaN and
infinities are errors, and a boolean given for any non-boolean field (a number, a list of
numbers, a string) is refused as well, whether or not that field uses a type from here.
The mechanisms check their own preconditions again at run time
(:mod:`worker.mechanisms.guards`); this module is the first line, not the only one.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

__all__ = [
    "DELTA_FLOOR",
    "EPSILON_FLOOR",
    "BatchSize",
    "BudgetEpsilon",
    "ClipNorm",
    "Delta",
    "Depth",
    "Epochs",
    "Epsilon",
    "InputModel",
    "JlProjections",
    "LearningRate",
    "NoiseDecay",
    "PositiveDelta",
    "Probability",
    "Width",
    "admits_bool",
    "not_bool",
]

EPSILON_FLOOR = 1e-6
"""Smallest ε (nats) a request, budget or cap may name: the ledger's unit (amounts are
integer micro-nats; a smaller ε would round to a free charge or an empty budget)."""
DELTA_FLOOR = 1e-20
"""Smallest non-zero δ: below it δ means nothing in practice, and the ledger's exact
decimal strings (≤ 40 characters) stay within their column on every database."""


def not_bool(value: Any) -> Any:
    """Refuse a boolean where a number is expected (``bool`` is an ``int`` in Python, and
    pydantic's lax mode turns ``true`` into 1 and ``false`` into 0: ``delta_total: false``
    once made a dataset pure-DP)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


_NotBool = BeforeValidator(not_bool)
_Finite = Field(allow_inf_nan=False)


def _check_delta(value: float) -> float:
    if value != 0 and not DELTA_FLOOR <= value < 1:
        raise ValueError(f"δ must be 0 or in [{DELTA_FLOOR:g}, 1), got {value!r}")
    return value


Epsilon = Annotated[float, _NotBool, _Finite, Field(ge=EPSILON_FLOOR, le=100)]
"""ε (nats) of one job, one selection workflow or one part of it: [1e-6, 100]."""
BudgetEpsilon = Annotated[float, _NotBool, _Finite, Field(ge=EPSILON_FLOOR, le=1e4)]
"""ε (nats) of a dataset's budget or an analyst's cap: [1e-6, 1e4]."""
Delta = Annotated[float, _NotBool, _Finite, Field(ge=0, lt=1), AfterValidator(_check_delta)]
"""δ of a request, budget or cap: 0 (pure DP) or in [1e-20, 1)."""
PositiveDelta = Annotated[float, _NotBool, _Finite, Field(ge=DELTA_FLOOR, lt=1)]
"""δ of a mechanism that needs one (DP-SGD trainings): [1e-20, 1)."""
Probability = Annotated[float, _NotBool, _Finite, Field(gt=0, lt=1)]
"""A public probability strictly between 0 and 1 (validation fraction)."""

ClipNorm = Annotated[float, _NotBool, _Finite, Field(gt=0, le=1e3)]
"""DP-SGD's clip norm C: (0, 1e3]. C ≤ 0 would void clipping (the clipper's cap 2^k/C
turns negative); C above 1e3 makes the integer sum's scale 2^k/C underflow."""
LearningRate = Annotated[float, _NotBool, _Finite, Field(gt=0, le=1e3)]
"""DP-SGD's learning rate: (0, 1e3]."""
BatchSize = Annotated[int, _NotBool, Field(ge=1, le=1_000_000)]
"""DP-SGD's expected batch size: [1, 10⁶]."""
Epochs = Annotated[int, _NotBool, Field(ge=1, le=100)]
"""DP-SGD's passes over the data: [1, 100]."""
NoiseDecay = Annotated[float, _NotBool, _Finite, Field(gt=0, lt=1)]
"""Decaying-noise DP-SGD's per-epoch factor R: (0, 1)."""
JlProjections = Annotated[int, _NotBool, Field(ge=1, le=64)]
"""The JL engine's number of random projections r: [1, 64]."""
Width = Annotated[int, _NotBool, Field(ge=1, le=1024)]
"""Hidden units of one MLP layer: [1, 1024]. The exact DP-SGD engine's grids hold at this
width (worker/mechanisms/exact_net.py) and one Adult epoch at width 1024 took 2.4 s on one
thread (benchmarks/results/dpsgd_widths.md); larger jobs are refused by the worker's
resource limits (service/resources.py), not by this cap."""
Depth = Annotated[int, _NotBool, Field(ge=1, le=3)]
"""Hidden layers of an MLP in an architecture search: [1, 3]."""


def admits_bool(annotation: Any) -> bool:
    """Whether a field's annotation accepts a boolean as such (``bool``, ``Any``, or a
    union/Annotated containing one): elsewhere a boolean is refused by
    :class:`InputModel`."""
    if annotation is bool or annotation is Any or annotation is object:
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return admits_bool(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(admits_bool(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    return False


def _element_annotation(annotation: Any) -> Any | None:
    """The item type of ``list[X]`` / ``tuple[X, ...]`` (unwrapping Optional/Annotated)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _element_annotation(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        for a in typing.get_args(annotation):
            inner = _element_annotation(a)
            if inner is not None:
                return inner
        return None
    if origin in (list, tuple, set, frozenset):
        args = typing.get_args(annotation)
        return args[0] if args else Any
    return None


class InputModel(BaseModel):
    """Base of the API's input models: unknown fields, NaN and infinities are errors, not
    silently dropped, and a boolean is accepted only where the field is a boolean."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _booleans_only_where_boolean(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            field = cls.model_fields.get(name) if isinstance(name, str) else None
            if field is None:
                continue  # unknown fields are refused by extra="forbid"
            annotation = field.annotation
            if isinstance(value, bool):
                if not admits_bool(annotation):
                    raise ValueError(f"{name}: a boolean is not a number (or a string)")
            elif isinstance(value, list | tuple):
                item = _element_annotation(annotation)
                if (
                    item is not None
                    and not admits_bool(item)
                    and any(isinstance(v, bool) for v in value)
                ):
                    raise ValueError(f"{name}: a boolean is not a number")
        return data
