"""Micro-unit rounding: charges up, budgets down, never spuriously."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.privacy.amounts import (
    MICRO,
    MICRO_CAP,
    curve_to_micro_up,
    from_micro,
    signed_to_micro_down,
    to_micro_down,
    to_micro_up,
)

amounts = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


def test_typed_decimals_are_not_rounded_spuriously() -> None:
    assert MICRO == 1_000_000
    assert to_micro_up(0.1) == 100_000
    assert to_micro_down(0.1) == 100_000
    assert to_micro_up(0.3) == 300_000
    assert to_micro_up(1e-6) == 1
    assert to_micro_up(1.5e-6) == 2
    assert to_micro_down(1.5e-6) == 1
    assert to_micro_up(0.0) == 0 == to_micro_down(0.0)
    assert to_micro_up(10) == 10_000_000
    # ten charges of 0.1 fit exactly into a budget of 1.0
    assert 10 * to_micro_up(0.1) == to_micro_down(1.0)
    # a float just above 0.1 is charged the next micro-unit
    assert to_micro_up(math.nextafter(0.1, 1.0)) == 100_001


@given(amounts)
def test_up_and_down_bracket_the_value(x: float) -> None:
    up, down = to_micro_up(x), to_micro_down(x)
    exact = Fraction(x) * MICRO
    half_ulp = Fraction(math.ulp(x)) / 2 * MICRO
    # the rounded value is on the safe side of the float, up to the half-ulp
    # by which the float's shortest decimal can differ from its binary value
    assert up >= exact - half_ulp
    assert down <= exact + half_ulp
    # exactly on the safe side of the shortest decimal the float stands for
    dec = Fraction(Decimal(repr(x))) * MICRO
    assert down <= dec <= up
    # and never more than one micro-unit away
    assert up - 1 < exact + half_ulp
    assert down + 1 > exact - half_ulp
    assert 0 <= up - down <= 1


@given(amounts, amounts)
def test_rounding_is_monotone(x: float, y: float) -> None:
    lo, hi = min(x, y), max(x, y)
    assert to_micro_up(lo) <= to_micro_up(hi)
    assert to_micro_down(lo) <= to_micro_down(hi)


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_from_micro_round_trips(m: int) -> None:
    assert from_micro(m) == m / MICRO
    if m >= 0:
        assert to_micro_up(from_micro(m)) == m == to_micro_down(from_micro(m))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1e-9, -1.0, True, "1", None])
def test_rejects_invalid_amounts(bad: object) -> None:
    with pytest.raises(ValueError):
        to_micro_up(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        to_micro_down(bad)  # type: ignore[arg-type]


def test_signed_floor_for_budgets() -> None:
    assert signed_to_micro_down(-0.1) == -100_000
    assert signed_to_micro_down(-1e-7) == -1
    assert signed_to_micro_down(2.5) == 2_500_000
    with pytest.raises(ValueError):
        signed_to_micro_down(math.nan)
    with pytest.raises(ValueError):
        from_micro(1.5)  # type: ignore[arg-type]


def test_huge_amounts_saturate() -> None:
    assert to_micro_up(1e300) == MICRO_CAP
    assert to_micro_down(1e300) == MICRO_CAP


def test_curve_conversion() -> None:
    assert curve_to_micro_up([0.0, 1e-20, 0.5, math.inf]) == [0, 1, 500_001, MICRO_CAP]
    with pytest.raises(ValueError):
        curve_to_micro_up([0.1, math.nan])
    with pytest.raises(ValueError):
        curve_to_micro_up([-1e-12])


@given(st.lists(amounts, min_size=1, max_size=8))
def test_curve_charges_round_up(curve: list[float]) -> None:
    out = curve_to_micro_up(curve)
    for x, m in zip(curve, out, strict=True):
        assert Fraction(m) >= Fraction(x) * MICRO
        assert m <= to_micro_up(x) + 2 + x * 1e-3  # slack: 1e-9 relative + 1e-12 absolute
