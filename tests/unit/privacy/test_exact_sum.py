"""service/privacy/exact_sum.py: fsum_rows gives math.fsum's float of every row's non-zero
entries, bit for bit (sign of zero included), on rows built to be hard: entries over the
whole exponent range, subnormals, exact cancellations, ties, rows long enough for several
levels."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from service.privacy.exact_sum import fsum_rows, fsum_rows_signed


def _same(rows: np.ndarray) -> None:
    """fsum_rows(rows) is math.fsum of each row's non-zero entries, or raises what
    math.fsum raises."""
    try:
        want = [math.fsum(r[r != 0.0].tolist()) for r in rows]
    except (OverflowError, ValueError) as exc:  # e.g. an intermediate overflow
        try:
            fsum_rows(rows)
        except type(exc):
            return
        raise AssertionError(f"math.fsum raised {exc!r}, fsum_rows did not") from None
    got = fsum_rows(rows)
    assert [g.hex() for g in got] == [w.hex() for w in want]  # the sign of a zero, NaN
    _same_signed(rows)


def _same_signed(rows: np.ndarray) -> None:
    """fsum_rows_signed(rows, signs) is (math.fsum of each row's non-zero entries, of each
    of the first len(signs) rows times signs), or None where a row is not finite (math.fsum
    row by row then: fsum_rows' own fallback), for random signs ±1 on all or some rows."""
    rng = np.random.default_rng(len(rows) * 1000 + rows.shape[1])
    for r in {len(rows), max(len(rows) // 2, 1)}:
        signs = rng.choice(np.array([-1.0, 1.0]), size=(r, rows.shape[1]))
        if not bool(np.isfinite(rows).all()):
            assert fsum_rows_signed(rows.copy(), signs) is None
            continue
        try:
            want = [math.fsum(x[x != 0.0].tolist()) for x in rows]
            want_signed = [math.fsum(x[x != 0.0].tolist()) for x in signs * rows[:r]]
        except (OverflowError, ValueError):
            continue  # then fsum_rows' own path (2^k too large) answers None
        got = fsum_rows_signed(rows.copy(), signs)
        if got is None:  # only where the splitting cannot start: 2^k out of [2^-1000, 2^1000]
            c1 = (rows.shape[1] - 1).bit_length() + 1
            k = [math.frexp(float(np.max(np.abs(x))))[1] + c1 for x in rows]
            assert max(k) > 1000 or min(k) < -1000
            continue
        assert [g.hex() for g in got[0]] == [w.hex() for w in want]
        assert [g.hex() for g in got[1]] == [w.hex() for w in want_signed]


_finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(_finite, min_size=1, max_size=40), min_size=1, max_size=6))
def test_any_finite_floats(rows: list[list[float]]) -> None:
    width = max(len(r) for r in rows)
    a = np.array([r + [0.0] * (width - len(r)) for r in rows])
    _same(a)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 3000),
    low=st.floats(-1070.0, 0.0),
    high=st.floats(0.0, 60.0),
)
def test_series_like_rows(seed: int, n: int, low: float, high: float) -> None:
    """Rows of many magnitudes, signs, zeros and exact cancellations (a − a, x and −x)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((5, n)) * np.exp2(rng.uniform(low, high, (5, n)))
    a[0, rng.integers(0, n, n // 2)] = 0.0
    a[1] = np.abs(a[1])
    a[2, : n // 2] = -a[2, n - n // 2 :][: n // 2]  # pairs that cancel exactly
    a[3] = np.round(a[3] * 2.0**20) * 2.0**-21  # many ties of half-ulps
    _same(a)


def test_edge_rows() -> None:
    tiny, huge = 5e-324, 1.7e308
    cases = [
        [[0.0, -0.0]],
        [[-0.0]],
        [[1.0, 2.0**-53, 2.0**-106]],  # a tie broken by a far entry
        [[1.0, 2.0**-53]],  # an exact tie: to even
        [[1.0, -(2.0**-53), 2.0**-160, tiny]],
        [[tiny, tiny, -tiny, 2.2250738585072014e-308]],
        [[huge, huge, -huge]],  # fsum's own path (2^k would overflow)
        [[1e300, -1e300, 1.0], [3.0, 4.0, 5.0]],
        [[math.inf, 1.0], [1.0, 2.0]],
        [[math.nan, 1.0]],
    ]
    for rows in cases:
        a = np.array(rows)
        _same(a)
    assert fsum_rows(np.zeros((2, 0))) == [0.0, 0.0]
    assert fsum_rows(np.zeros((0, 3))) == []
