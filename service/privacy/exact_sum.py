"""Correctly rounded sums of the rows of a float64 array: ``math.fsum`` of each row's
non-zero entries (:func:`fsum_nonzero`), the same float, in a few whole-array numpy
operations instead of one Python list per row (issue 26: the exact sums were half of a
fractional-order RDP series' time).

Why the result is ``math.fsum``'s, bit for bit. ``math.fsum`` returns the exact sum of
its inputs correctly rounded to nearest, ties to even (CPython's msum: Shewchuk's exact
partials and a final half-even correction), and +0.0 for an exact zero. Any procedure
that hands ``math.fsum`` other floats with the *same exact sum* therefore gets the same
float back. :func:`fsum_rows` does that, with an error-free splitting of every entry
(Rump, Ogita & Oishi 2008, "Accurate floating-point summation part I: faithful
rounding", SIAM J. Sci. Comput. 31(1), Sec. 3, ExtractScalar/ExtractVector):

Let the row have n entries p_i with |p_i| ≤ 2^e, c = ⌈log2 n⌉ and S = 2^k, k = e + c + 1,
so |p_i| ≤ S/2. In IEEE-754 double arithmetic, rounding to nearest:

* s_i = fl(S + p_i) lies in [S/2, 3S/2], so fl(s_i − S) = s_i − S exactly (Sterbenz's
  lemma: S/2 ≤ s_i ≤ 2S). Call it q_i. Both s_i and S are multiples of 2^(k−53) (the
  spacing of doubles in [S/2, S)), hence so is q_i.
* p_i − q_i = (S + p_i) − s_i is the rounding error of one addition, always a double
  (e.g. Knuth's TwoSum), so r_i = fl(p_i − q_i) = p_i − q_i exactly, and
  |r_i| ≤ ulp(s_i)/2 ≤ 2^(k−53).
* |q_i| ≤ |p_i| + |r_i| ≤ 2^e + 2^(k−53), so every partial sum of the q_i, in any order,
  is a multiple of 2^(k−53) of magnitude ≤ n·2^e + n·2^(k−53) < 2^(k−1) + 2^(k−1) = 2^k
  (n < 2^52): a double. The sum of the q_i is computed exactly by any summation (numpy's
  pairwise one included).

So Σ p_i = τ + Σ r_i with τ = Σ q_i exact, and the r_i are again a row, now bounded by
2^(k−53). Repeating the step (e ← k − 53) splits off ~53 − c − 1 bits per level; after
a few levels most r_i are 0 (an entry whose bits all lie above the level's spacing leaves
nothing). ``math.fsum`` of the levels' τ and the non-zero remainders then has the row's
exact sum. Gradual underflow keeps every step exact (Sterbenz and the exact rounding
error hold with subnormals); overflow is excluded by falling back to ``math.fsum`` of the
row itself where 2^k would exceed 2^1000, or where a row holds a NaN or an infinity
(``math.fsum``'s own special cases then apply as before); the splitting stops before 2^k
falls below 2^-1000 (the remainders go to ``math.fsum`` as they are). Assumes only IEEE-754 doubles
with rounding to nearest (numpy's float64 ``+`` and ``−`` are correctly rounded, element
by element). tests/unit/privacy/test_exact_sum.py compares with ``math.fsum`` bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fsum_nonzero", "fsum_rows"]

_LEVELS = 4
"""Splitting levels before the remainders go to ``math.fsum`` (speed only: each level
leaves the entries more than ~2^-(53 − c − 1)·level below the row's largest one)."""

_MAX_EXPONENT = 1000
"""Rows whose splitting constant 2^k would exceed 2^1000 are summed by ``math.fsum``."""


def fsum_nonzero(terms: np.ndarray) -> float:
    """``math.fsum(terms.tolist())`` of a 1-D array: the exactly rounded sum, which the
    zero entries (most of a series' underflowed tail) do not change (a zero sum is +0.0
    either way), so they are left out."""
    return math.fsum(terms[terms != 0.0].tolist())


def fsum_rows(a: np.ndarray) -> list[float]:
    """``[fsum_nonzero(row) for row in a]`` for a 2-D float64 array, the same floats
    (module docstring; the levels' sums are never −0.0, as fl(x − x) = +0.0): each row
    split into a few exactly summed levels, ``math.fsum`` of the levels' sums and of the
    entries left over."""
    rows, n = a.shape
    if rows == 0:
        return []
    if n == 0:
        return [0.0] * rows
    largest = np.max(np.abs(a), axis=1)
    if not bool(np.all(np.isfinite(largest))):
        return [fsum_nonzero(row) for row in a]
    _, e = np.frexp(largest)  # |p| ≤ largest < 2^e (e = 0 for a row of zeros)
    c1 = (n - 1).bit_length() + 1  # c + 1, c = ⌈log2 n⌉ (2^c ≥ n)
    k = e.astype(np.int64) + c1
    if int(k.max()) > _MAX_EXPONENT:
        return [fsum_nonzero(row) for row in a]
    levels: list[np.ndarray] = []
    rest = a.copy()
    high = np.empty_like(rest)
    clean = False  # no remainder left
    for _ in range(_LEVELS):
        if int(k.min()) < -_MAX_EXPONENT:
            break  # 2^k near the bottom of the exponent range: the rest goes to fsum
        split = np.ldexp(1.0, k)[:, None]  # S = 2^k per row, exact
        np.subtract(np.add(split, rest, out=high), split, out=high)  # q_i, exact
        np.subtract(rest, high, out=rest)  # r_i = p_i − q_i, exact
        levels.append(high.sum(axis=1))  # exact in any order
        k = k - (53 - c1)  # |r_i| ≤ 2^(k − 53) = 2^(new e)
        if not rest.any():
            clean = True
            break
    if not levels:
        return [fsum_nonzero(row) for row in a]
    sums = np.stack(levels, axis=1).tolist()
    if clean:
        return [math.fsum(level_sums) for level_sums in sums]
    at_row, at_col = np.nonzero(rest)  # row by row, in order
    left = rest[at_row, at_col].tolist()
    out: list[float] = []
    end = 0
    for level_sums, count in zip(sums, np.bincount(at_row, minlength=rows).tolist(), strict=True):
        start, end = end, end + count
        out.append(math.fsum(level_sums + left[start:end]))
    return out
