"""Privacy amounts as integers in micro-units (1 unit = 1e-6 nat).

The ledger stores and adds integers, never floats, so that sums are exact and
associative. Charges round *up* and budgets / remaining amounts round *down*,
so rounding can only make the ledger more conservative.

Which real number a float stands for. A float such as 0.1 is not exactly one
tenth (it is 0.1000000000000000055…). Rounding its exact binary value up would
turn a charge of "ε = 0.1" into 100001 micro-units, and ten such charges would
overflow a budget of 1.0. We therefore round the *shortest decimal that
round-trips to the float* (Python's ``repr``, here via ``Decimal(repr(x))``):
0.1 → 100000. That decimal differs from the float's exact value by less than
half an ulp (≈ 1e-17 relative), which is far below both the micro-unit and the
floating-point error of any mechanism; property tests pin the bound
|to_micro_up(x)/1e6 − x| ≤ 1e-6 with to_micro_up(x)/1e6 ≥ x − ulp(x)/2.

RDP curves are computed, not typed, so :func:`curve_to_micro_up` additionally
adds a small slack (1e-9 relative + 1e-12 absolute) before rounding up, to cover
the floating-point error of the formulas themselves.

Amounts at or above :data:`MICRO_CAP` (≈ 9.0e9 nats) saturate to it and mean
"no usable bound" (e.g. an RDP order whose value is +inf); the filters never
admit a charge at the cap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Final

__all__ = [
    "MICRO",
    "MICRO_CAP",
    "curve_to_micro_up",
    "from_micro",
    "to_micro_down",
    "to_micro_up",
]

MICRO: Final[int] = 1_000_000
"""Micro-units per nat."""

MICRO_CAP: Final[int] = 2**53
"""Saturation value: an amount this large means "no finite bound" (fits int64)."""

_CURVE_SLACK_REL: Final[float] = 1e-9
_CURVE_SLACK_ABS: Final[float] = 1e-12


def _check_amount(x: float) -> Decimal:
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise ValueError(f"amount must be a real number, got {x!r}")
    xf = float(x)
    if math.isnan(xf) or math.isinf(xf):
        raise ValueError(f"amount must be finite, got {x!r}")
    if xf < 0.0:
        raise ValueError(f"amount must be >= 0, got {x!r}")
    # repr gives the shortest decimal that round-trips to xf (see module docstring).
    return Decimal(repr(xf))


def _to_int(d: Decimal, rounding: str) -> int:
    return min(int((d * MICRO).to_integral_value(rounding=rounding)), MICRO_CAP)


def to_micro_up(x: float) -> int:
    """A charge in micro-units, rounded up (ceil). ValueError on NaN, ±inf, x < 0."""
    return _to_int(_check_amount(x), ROUND_CEILING)


def to_micro_down(x: float) -> int:
    """A budget / remaining amount in micro-units, rounded down (floor).
    ValueError on NaN, ±inf, x < 0."""
    return _to_int(_check_amount(x), ROUND_FLOOR)


def signed_to_micro_down(x: float) -> int:
    """Like :func:`to_micro_down` but also accepts negative finite x (per-order RDP
    budgets can be negative: that order is unusable)."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(float(x)):
        raise ValueError(f"amount must be a finite real number, got {x!r}")
    xf = float(x)
    if xf >= 0.0:
        return to_micro_down(xf)
    return max(-MICRO_CAP, int((Decimal(repr(xf)) * MICRO).to_integral_value(ROUND_FLOOR)))


def from_micro(m: int) -> float:
    """Micro-units back to nats (for display and for building events)."""
    if isinstance(m, bool) or not isinstance(m, int):
        raise ValueError(f"micro amount must be an int, got {m!r}")
    return m / MICRO


def curve_to_micro_up(curve: Iterable[float]) -> list[int]:
    """An RDP curve (nats per order) as micro-unit charges, each rounded up after
    adding the floating-point slack; +inf entries become :data:`MICRO_CAP`.
    ValueError on NaN or negative entries."""
    out: list[int] = []
    for v in curve:
        x = float(v)
        if math.isnan(x) or x < 0.0:
            raise ValueError(f"RDP curve entries must be >= 0 and not NaN, got {v!r}")
        if math.isinf(x):
            out.append(MICRO_CAP)
        elif x == 0.0:
            out.append(0)
        else:
            padded = x + x * _CURVE_SLACK_REL + _CURVE_SLACK_ABS
            out.append(to_micro_up(padded) if math.isfinite(padded) else MICRO_CAP)
    return out
