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

__all__ = ["fsum_nonzero", "fsum_rows", "fsum_rows_signed"]

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
    split = _split_rows(a.copy(), None)
    if split is None:
        return [fsum_nonzero(row) for row in a]
    return split[0]


def fsum_rows_signed(a: np.ndarray, signs: np.ndarray) -> tuple[list[float], list[float]] | None:
    """``(fsum_rows(a), fsum_rows(signs * a[:r]))`` with r = len(signs), the same floats,
    for ``signs`` of shape (r, n) whose entries are all +1.0 or −1.0 (not checked here),
    from one splitting of ``a`` (issue 26: a series' signed and absolute sums of the same
    terms split the same entries twice). ``a`` is overwritten (a caller's temporary).
    None where :func:`fsum_rows` would take ``math.fsum`` row by row (a row with a NaN or
    an infinity, or too large for the splitting): the caller sums those rows itself.

    Why the signed sums are exact: ±p_i = ±q_i ± r_i level by level (multiplying by ±1
    is exact), the ±q_i of a level are multiples of its spacing 2^(k−53) with
    Σ|q_i| < 2^k (module docstring), so every partial sum of them, in any order, is a
    double and their sum exact; ``math.fsum`` of the levels' signed sums and the signed
    remainders then returns the correctly rounded Σ ±p_i, which is ``math.fsum`` of the
    row ``signs * a`` (its zero entries change no sum; a zero sum is +0.0 either way, and
    the levels' signed sums are made +0.0, not −0.0, by adding +0.0)."""
    rows, n = a.shape
    if rows == 0 or n == 0 or signs.ndim != 2 or signs.shape[1] != n or len(signs) > rows:
        return None
    return _split_rows(a, signs)


def _split_rows(
    rest: np.ndarray, signs: np.ndarray | None
) -> tuple[list[float], list[float]] | None:
    """The splitting of :func:`fsum_rows` on ``rest`` (2-D, at least one row and one
    column; overwritten): its rows' sums and, with ``signs``, those of the first
    len(signs) rows times ``signs`` (:func:`fsum_rows_signed`); None where a row is not
    finite or 2^k would exceed 2^1000 (``math.fsum`` of each row decides)."""
    rows, n = rest.shape
    largest = np.max(np.abs(rest), axis=1)
    if not bool(np.all(np.isfinite(largest))):
        return None
    _, e = np.frexp(largest)  # |p| ≤ largest < 2^e (e = 0 for a row of zeros)
    c1 = (n - 1).bit_length() + 1  # c + 1, c = ⌈log2 n⌉ (2^c ≥ n)
    k = e.astype(np.int64) + c1
    if int(k.max()) > _MAX_EXPONENT:
        return None
    r = 0 if signs is None else len(signs)
    # the levels' constants at once: level l splits at 2^(k − l·(53 − c1)) (|r_i| ≤ 2^(k − 53)
    # after a level, the next level's 2^e), while 2^k stays ≥ 2^-1000
    k_min, step = int(k.min()), 53 - c1
    count = min(_LEVELS, max(0, (k_min + _MAX_EXPONENT) // step + 1))
    if count == 0:
        return None
    splits = np.ldexp(1.0, k[None, :] - step * np.arange(count)[:, None])[:, :, None]
    highs = np.empty((count, rows, n))  # q_i of each level
    used, clean = 0, False  # clean: no remainder left
    for level in range(count):
        high = highs[level]
        np.add(splits[level], rest, out=high)
        np.subtract(high, splits[level], out=high)  # q_i, exact
        np.subtract(rest, high, out=rest)  # r_i = p_i − q_i, exact
        used += 1
        # (after the first level a remainder is nearly always left: not looked for; a
        # level after a clean one would only add +0.0 sums)
        if level > 0 and not rest.any():
            clean = True
            break
    sums = highs[:used].sum(axis=2).T.tolist()  # each exact in any order
    signed: list[list[float]] = []
    if signs is not None:  # Σ ±q_i: exact in any order (fsum_rows_signed); +0.0, not −0.0
        signed = ((highs[:used, :r] * signs).sum(axis=2) + 0.0).T.tolist()
    if clean:
        return (
            [math.fsum(level_sums) for level_sums in sums],
            [math.fsum(level_sums) for level_sums in signed],
        )
    at_row, at_col = np.nonzero(rest)  # row by row, in order
    left = rest[at_row, at_col].tolist()
    counts = np.bincount(at_row, minlength=rows).tolist()
    out: list[float] = []
    end = 0
    for level_sums, m in zip(sums, counts, strict=True):
        start, end = end, end + m
        out.append(math.fsum(level_sums + left[start:end]))
    out_signed: list[float] = []
    if signs is not None:  # the same entries, times ±1 (non-zero where rest is), in order
        signed_rest = signs * rest[:r]
        left_signed = signed_rest[signed_rest != 0.0].tolist()
        end = 0
        for level_sums, m in zip(signed, counts[:r], strict=True):
            start, end = end, end + m
            out_signed.append(math.fsum(level_sums + left_signed[start:end]))
    return out, out_signed
