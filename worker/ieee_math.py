"""float64 exp and log from IEEE-754 basic operations only, with proven error bounds.

Why this exists (issue 25, "proofs that assume only IEEE arithmetic"): the error bound of
the rounded Gaussian sampler (worker/noise.py, PMF_RELATIVE_ERROR) may assume only what
IEEE-754 guarantees: correct rounding of +, −, ×, ÷, √ in binary64 (round to nearest,
unit roundoff u = 2^-53, so fl(a ∘ b) = (a ∘ b)(1 + δ) with |δ| ≤ u for normal results)
and exact operations (scaling by powers of two, `frexp`, rounding to integers, comparisons,
integer arithmetic). numpy's `exp`/`log` (the platform libm or numpy's SIMD kernels) carry
no such guarantee: their accuracy is a measured property of a library. The two functions
here use only the operations above, elementwise on numpy arrays, and each states an error
bound that is derived in its docstring (`test_ieee_math.py` recomputes every constant of
the derivations in 60-digit mpmath and checks both functions against mpmath on edge cases).

Notation: γ_n = n·u/(1 − n·u) (Higham 2002, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., §3.1); θ_n is any quantity with |θ_n| ≤ γ_n. Horner's rule
y ← fl(fl(x·y) + a_i), started from y = a_n, returns (Higham eq. (5.2))
    p̂(x) = Σ_i a_i x^i (1 + θ_{2i+1})   (the leading term gets θ_{2n}),
so |p̂(x) − p(x)| ≤ Σ_i γ_{2i+1}|a_i||x|^i, which for positive coefficients and a small
argument is ≈ u·|a_0| instead of the cruder γ_{2n}Σ|a_i||x|^i of Higham's eq. (5.3).
If the last step is a product without addition (p(x) = x·(a_1 + a_2 x + …)), the term
a_i x^i gets θ_{2i} instead.

Constants are hexadecimal literals; the tests check each against mpmath (LN2_HI has 32
significant bits, LN2_LO and INV_STEP are the doubles nearest to ln 2 − LN2_HI and 32/ln 2)
and the 2^{j/32} table is built from exact integer 32nd roots at import.

Speed: both are ~10-15x slower than numpy's (≈ 8 and 10 ns per element against 0.6), which
the sampler pays when it builds a plan's table (scales up to ~3276) and, above that, only
for the few proposals its screen leaves to Γ̂ (worker/noise.py, "Screen"). `exp_one` and
`log_one` are the same operations on one float, compiled (worker/ieee_jit.py), for the
sampler's compiled fast path, where ~25 numpy passes on one or two elements cost ~50 µs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from worker.ieee_jit import ieee_njit

__all__ = [
    "EXP_RELATIVE_ERROR",
    "LOG_ABSOLUTE_ERROR",
    "LOG_RELATIVE_ERROR",
    "LOG_RELATIVE_ERROR_NEAR_ONE",
    "exp",
    "exp_one",
    "log",
    "log_one",
]

FloatArray = npt.NDArray[np.float64]

U = 2.0**-53
#: ln 2 split as LN2_HI + LN2_LO (Cody & Waite 1980): LN2_HI has 32 significant bits, so
#: n·LN2_HI is exact for |n| < 2^21; LN2_LO is the double nearest to ln 2 − LN2_HI
#: (|ln 2 − LN2_HI − LN2_LO| < 2^-86).
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")

#: Elements per pass: the ~10 temporaries of a block stay in the core's cache (4096: about
#: 7-9 ns per element for exp on the shared development machine, 2-4x less than one pass
#: over 32768; smaller blocks pay numpy's per-call overhead).
_BLOCK = 4096


def _blocked(kernel: Callable[[FloatArray], FloatArray], x: npt.ArrayLike) -> FloatArray:
    """``kernel`` (elementwise) over a flat float64 copy of ``x`` in blocks of `_BLOCK`."""
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    if flat.size == 0:
        return np.empty(np.shape(x))
    if flat.size <= _BLOCK:
        return kernel(flat).reshape(np.shape(x))
    out = np.empty_like(flat)
    for start in range(0, flat.size, _BLOCK):
        out[start : start + _BLOCK] = kernel(flat[start : start + _BLOCK])
    return out.reshape(np.shape(x))


# ------------------------------------------------------------------------------------ exp

_EXP_BITS = 5  # table of 2^{j/32}
_EXP_N = 1 << _EXP_BITS
#: the double nearest to 32/ln 2
INV_STEP = float.fromhex("0x1.71547652b82fep+5")
_STEP_HI = LN2_HI / _EXP_N  # exact (power-of-two scaling); 32 significant bits
_STEP_LO = LN2_LO / _EXP_N  # exact
#: Taylor coefficients of e^r − 1 = Σ_{i=1}^{6} r^i/i!, highest first (each 1/i! correctly
#: rounded, relative error ≤ u: Python's float division of integers is IEEE division).
_EXP_COEFFS: tuple[float, ...] = tuple(1.0 / math.factorial(i) for i in range(6, 0, -1))
#: |r| ≤ EXP_R_MAX after the reduction (derivation in `exp`).
EXP_R_MAX = 0.01084
#: Proven bound on |exp(x)/e^x − 1| for normal results, in units of u (`exp` docstring).
EXP_RELATIVE_ERROR = 1.1 * U
_SHIFTER = 1.5 * 2.0**52
_SHIFTER_BITS = int(np.float64(_SHIFTER).view(np.int64))
_EXP_CLIP_LO = -746.0  # e^x < 2^-1076: rounds to 0
_EXP_CLIP_HI = 710.0  # e^x > 2^1024: overflows to inf


def _exact_exp2_table() -> tuple[FloatArray, FloatArray]:
    """2^{j/32} = T_j + T'_j (j = 0..31) as a pair of doubles, from exact integers: T_j is
    2^{j/32} correctly rounded and T'_j the double nearest to 2^{j/32} − T_j, so
    |T_j + T'_j − 2^{j/32}| ≤ u·|T'_j| ≤ u²·2^{j/32}. With q = 256,
    M = ⌊2^{j/32}·2^q⌋ = ⌊(2^{j+32q})^{1/32}⌋ is five nested `isqrt`s (⌊√⌊√a⌋⌋ = ⌊a^{1/4}⌋),
    so 2^{j/32}·2^q ∈ (M, M+1) (irrational for j > 0); Python's int/int division rounds
    correctly and is monotone, so when both ends round to the same double, that double is
    the correctly rounded value (checked, for T_j and for T'_j)."""
    q = 256
    hi = np.empty(_EXP_N)
    lo = np.empty(_EXP_N)
    for j in range(_EXP_N):
        m = 1 << (j + _EXP_N * q)
        for _ in range(_EXP_BITS):
            m = math.isqrt(m)
        t_hi = m / (1 << q)
        num, den = t_hi.as_integer_ratio()  # den is a power of two ≤ 2^52
        rest = m * den - (num << q)  # (2^{j/32} − t_hi)·2^q·den ∈ [rest, rest + den)
        t_lo = rest / (den << q)
        if t_hi != (m + 1) / (1 << q) or (j and t_lo != (rest + den) / (den << q)):
            raise RuntimeError("2^(j/32) table: rounding not settled")  # pragma: no cover
        hi[j], lo[j] = t_hi, t_lo
    hi.flags.writeable = lo.flags.writeable = False
    return hi, lo


_EXP2_HI, _EXP2_LO = _exact_exp2_table()


def exp(x: npt.ArrayLike) -> FloatArray:
    """e^x elementwise (float64), from IEEE-754 basic operations only.

    Bound (proven below): |exp(x) − e^x| ≤ 1.1u·e^x (EXP_RELATIVE_ERROR; < 1.1 ulp) whenever
    e^x ≥ 2^-1022 (x ≥ −708.39); for subnormal results add 2^-1075 absolute (one rounding of
    the final scaling). exp(x) = +inf for x ≥ 710 (e^x > DBL_MAX from 709.7828), 0 for
    x ≤ −746, NaN for NaN. The arguments of the sampler lie in [−42, 0].

    Method (Tang 1989, "Table-driven implementation of the exponential function in IEEE
    floating-point arithmetic", ACM TOMS 15(2), with a Taylor polynomial; Muller et al.,
    "Handbook of Floating-Point Arithmetic", 2nd ed., 2018, ch. 11, for the Cody-Waite range
    reduction): with x clipped to [−746, 710],
      n = rint(fl(x·INV_STEP)), an integer, |n| ≤ 34442 < 2^16, n = 32k + j, 0 ≤ j < 32;
      r_hi = x − n·STEP_HI, r̂ = fl(r_hi − fl(n·STEP_LO)), STEP_* = LN2_*/32 (exact);
      e^x = 2^k · 2^{j/32} · e^ρ, ρ = x − n·ln2/32;
      result = ldexp(fl(T_j + fl(T'_j + fl(T_j·p̂(r̂)))), k),
    T_j + T'_j = 2^{j/32} (`_exact_exp2_table`), p̂ the Horner value of
    p(r) = Σ_{i=1}^{6} r^i/i! = r·(1 + r·(½ + r·(⅙ + …))).

    Proof of the bound (each constant recomputed in 60-digit mpmath by the tests).
    (1) Reduction. fl(x·INV_STEP) = x·(32/ln 2)(1 + θ_2) (INV_STEP and the product, one
    rounding each); rint is fl(y + 1.5·2^52) − 1.5·2^52, exact for |y| < 2^51 (the sum lies
    in [2^52, 2^53), where binary64 spacing is 1, so it is y rounded to the nearest integer,
    ties to even, and the subtraction is exact by Sterbenz). So |n − 32x/ln 2| ≤ ½ +
    746·46.17·γ_2 < ½ + 8e-12 and |ρ| ≤ (ln2/32)(½ + 8e-12) < 0.0108305. n·STEP_HI is
    exact (16 + 32 bits ≤ 53). r_hi is exact: if n = 0 it is x; otherwise |x| > 0.0108 >
    2^-7, so x is a multiple of 2^-59, n·STEP_HI a multiple of 2^-37, and |r_hi| ≤ |ρ| +
    |n|·|ln2/32 − STEP_HI| < 0.0108305 + 2^16·2^-37 < 2^-6 is a multiple of 2^-59 below
    2^-6, i.e. representable (a grid argument in place of Sterbenz's lemma). Then
    r̂ = ρ + ε_r with |ε_r| ≤ u·|r̂| + u·|n·STEP_LO| + |n|·|ln2 − LN2_HI − LN2_LO|/32
    ≤ 0.01084u, and |r̂| ≤ R = EXP_R_MAX = 0.01084.
    (2) Polynomial. Horner ending in a product: |p̂ − p(r̂)| ≤ Σ_{i=1}^{6} γ_{2i}·a_i·R^i
    ≤ 0.0220u (a_i = fl(1/i!)); the rounded coefficients (relative u; ½ and 1 exact) add
    ≤ u·Σ_{i≥3} R^i/i! < 2e-7u; the truncation Σ_{i≥7} R^i/i! ≤ 0.0315u. So
    |p̂ − P| ≤ A = 0.0535u with P = e^{r̂} − 1, |P| ≤ e^R − 1 < 0.0109.
    (3) Reconstruction. With T = 2^{j/32}: T_j·(1 + p̂) + T'_j differs from T·e^{r̂} by at
    most T_j·A + |T'_j·P| + u²T ≤ (A + 0.0109u + u²)·T(1 + u) (|T'_j| ≤ u·T_j); the two
    inner roundings add ≤ u·|T_j p̂| + u·|T'_j + fl(T_j p̂)| ≤ 2·0.0109u·T(1 + 2u). Relative
    to T·e^{r̂} ≥ T·e^{−R} this is |η| ≤ 0.0872u; the final sum rounds once more (1 + δ),
    and e^{r̂} = e^ρ·e^{ε_r}, |e^{ε_r} − 1| ≤ 0.01085u. So
    |result/e^x − 1| ≤ (1 + 0.0872u)(1 + u)(1 + 0.01085u) − 1 ≤ 1.098u ≤ 1.1u.
    (4) Scaling by 2^k (`ldexp`) is exact for a normal result and one rounding (≤ 2^-1075
    absolute) for a subnormal one. ∎

    Evaluated in ~25 elementwise numpy passes (two table gathers and `ldexp` among them), in
    blocks of 4096 elements; a NaN or out-of-range input (one min/max test) costs three more.
    """
    return _blocked(_exp_block, x)


def _exp_block(x: FloatArray) -> FloatArray:
    nan = None
    xc = x
    if not (x.min() >= _EXP_CLIP_LO and x.max() <= _EXP_CLIP_HI):  # NaN fails this too
        nan = np.isnan(x)
        xc = np.clip(x, _EXP_CLIP_LO, _EXP_CLIP_HI)
        xc[nan] = 0.0
    # n = rint(fl(x·INV_STEP)): |fl(x·INV_STEP)| < 2^16, and adding 1.5·2^52 lands in
    # [2^52, 2^53) where the spacing is 1, so that sum is rounded to the nearest integer
    # (ties to even) and subtracting 1.5·2^52 back is exact; the integer is also the
    # difference of the encodings (numpy's rint is a slow scalar loop).
    t = xc * INV_STEP
    t += _SHIFTER
    ni = t.view(np.int64) - _SHIFTER_BITS
    t -= _SHIFTER  # n as a float
    r = t * _STEP_HI  # exact
    np.subtract(xc, r, out=r)  # exact (proof step 1)
    t *= _STEP_LO
    r -= t
    j = ni & (_EXP_N - 1)
    coeffs = _EXP_COEFFS
    p = r * coeffs[0]
    for a in coeffs[1:]:
        p += a
        p *= r
    table = _EXP2_HI[j]
    p *= table
    p += _EXP2_LO[j]
    p += table
    k = (ni >> _EXP_BITS).astype(np.int32)  # |k| ≤ 1077 (numpy's int32 ldexp is the fast one)
    with np.errstate(over="ignore"):  # x ≥ 709.79: +inf, as documented
        out: FloatArray = np.ldexp(p, k)
    if nan is not None:
        out[nan] = np.nan
    return out


_EXP_COEFF_ARRAY = np.array(_EXP_COEFFS)
_EXP_COEFF_ARRAY.flags.writeable = False


@ieee_njit
def exp_one(x: float) -> float:  # pragma: no cover - compiled (numba runs this source)
    """`exp` of one float x ∈ [−745, 709] (issue 25: called from compiled kernels, where the
    ~25 numpy passes of `exp` cost ~50 µs per call on a handful of elements): the same IEEE
    operations in the same order as `_exp_block` (worker/ieee_jit.py: no FMA), so the same
    bits (test_ieee_math compares them). n is read as fl(t − 1.5·2^52), which is the integer
    `_exp_block` reads from the encodings (t ∈ [2^52, 2^53), spacing 1); 2^k by `ldexp`.
    Outside [−745, 709] (and for NaN) the caller must use `exp`."""
    t = x * INV_STEP
    t += _SHIFTER
    t -= _SHIFTER  # n as a float, exact
    ni = np.int64(t)
    r = x - t * _STEP_HI  # the product is exact (proof step 1)
    r -= t * _STEP_LO
    coeffs = _EXP_COEFF_ARRAY
    p = r * coeffs[0]
    for i in range(1, coeffs.shape[0]):
        p += coeffs[i]
        p *= r
    table = _EXP2_HI[ni & (_EXP_N - 1)]
    p *= table
    p += _EXP2_LO[ni & (_EXP_N - 1)]
    p += table
    return math.ldexp(p, int(ni >> _EXP_BITS))


# ------------------------------------------------------------------------------------ log

#: the double nearest to 1/√2 (0x1.6a09e667f3bcdp-1 = 0.70710678118654757 > 1/√2)
SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
_MIN_NORMAL = 2.0**-1022
_FRACTION_MASK = (1 << 52) - 1
_SQRT_HALF_FRACTION = int(np.float64(SQRT_HALF).view(np.int64)) & _FRACTION_MASK
#: Q(w) = Σ_{i=0}^{9} 2w^i/(2i+3), highest first (2/(2i+3) correctly rounded), so that
#: 2·atanh(s) = 2s + s·R, R = s²·Q(s²) + (truncation).
_LOG_COEFFS: tuple[float, ...] = tuple(2.0 / (2 * i + 3) for i in range(9, -1, -1))
_LOG_COEFF_ARRAY = np.array(_LOG_COEFFS)
_LOG_COEFF_ARRAY.flags.writeable = False
#: Proven bound on |log(x) − ln x| / |ln x| for x ∈ [SQRT_HALF, 2·SQRT_HALF), in units of u.
LOG_RELATIVE_ERROR_NEAR_ONE = 1.91 * U
#: Proven bound for every positive finite x: |log(x) − ln x| ≤ u·|ln x| + LOG_ABSOLUTE_ERROR.
LOG_ABSOLUTE_ERROR = 1.01 * U
#: Proven relative bound for every positive finite x ≠ 1 (from the two above).
LOG_RELATIVE_ERROR = 3.91 * U


def log(x: npt.ArrayLike) -> FloatArray:
    """Natural logarithm elementwise (float64), from IEEE-754 basic operations only.

    Bounds (proven below), for every positive finite x including subnormals:
        |log(x) − ln x| ≤ u·|ln x| + 1.01u          (LOG_ABSOLUTE_ERROR),
        |log(x) − ln x| ≤ 1.91u·|ln x|  for x ∈ [C, 2C), C = fl(1/√2)
                                        (LOG_RELATIVE_ERROR_NEAR_ONE: no exponent part),
        |log(x) − ln x| ≤ 3.91u·|ln x|  for all x (LOG_RELATIVE_ERROR),
    and log(1) = 0, log(±0) = −inf, log(+inf) = +inf, NaN for x < 0 and NaN.

    Method (the reduction of Cody & Waite, Muller et al. 2018 ch. 11; the evaluation order
    of fdlibm's e_log.c, with a Taylor series in place of its minimax polynomial so that the
    remainder is provable):
      (m, e) = frexp(x), m ∈ [½, 1) (by bit operations on the binary64 encoding, after
      an exact scaling by 2^54 of subnormal x); if m < C then m ← 2m, e ← e − 1 (exact), so
      x = 2^e·m with m ∈ [C, 2C); f = m − 1 (exact by Sterbenz, m ∈ [½, 2]);
      s = f/(2 + f), so ln m = 2·atanh(s) = f − s·(f − R), R = (2 atanh s − 2s)/s
      = Σ_{i≥1} 2s^{2i}/(2i+1) = s²·Q∞(s²), Q∞(w) = Σ_{i≥0} 2w^i/(2i+3);
      computed: ŝ = fl(f/fl(2 + f)), ŵ = fl(ŝ²), Q̂ = Horner of Q_9 (10 terms) at ŵ,
      R̂ = fl(ŵ·Q̂), ℓ = fl(f − fl(ŝ·fl(f − R̂))), and
      log x = fl(e·LN2_HI + fl(ℓ + fl(e·LN2_LO)))
      (e·LN2_HI exact: |e| ≤ 1075 < 2^21; for e = 0 the last two steps return ℓ exactly).

    Proof (each constant recomputed in 60-digit mpmath by the tests). Let a = |s| ≤ s*
    = (2C − 1)/(2C + 1) < 0.171573, w* = s*² < 0.0294373.
    (1) ŝ = s(1 + δ₁)/(1 + δ₂): |ŝ/s − 1| ≤ σ = 2u/(1 − u); ŵ = s²(1 + θ_w),
    |θ_w| ≤ (1 + σ)²(1 + u) − 1 ≤ 5.0001u.
    (2) Q∞ ≥ 2/3. At ŵ ≤ w*(1 + 5.0001u): |Q̂ − Q∞(s²)| ≤ Σ_{i=0}^{9} γ_{2i+1}·c_i·ŵ^i
    (Horner, eq. (5.2): 0.704u) + Σ|fl(c_i) − c_i|·ŵ^i (rounded coefficients: 0.340u)
    + Σ c_i s^{2i}((1 + θ_w)^i − 1) (ŵ ≠ s²: 0.062u) + (2/23)w*^{10}/(1 − w*) (truncation:
    0.395u) ≤ 1.50u = 2.248u·(2/3). So Q̂ = Q∞(s²)(1 + ε_Q), |ε_Q| ≤ 2.248u, and
    R̂ = R(1 + ε_R), |ε_R| ≤ (1 + θ_w)(1 + ε_Q)(1 + u) − 1 ≤ 8.248u.
    (3) R ≤ (2/3)a²/(1 − a²) and |f| = 2a/(1 ∓ a) ≥ 2a/(1 + a), so (R > 0, |f − R| ≥
    |f| − R) R/|f − R| ≤ a/(3 − 4a) ≤ 0.07416; hence fl(f − R̂) = (f − R)(1 + ε_g),
    |ε_g| ≤ (1 + 0.07416·8.248u)(1 + u) − 1 ≤ 1.612u, and ĉ = fl(ŝ·fl(f − R̂)) = c(1 + ε_c),
    c = s(f − R) = f − ln m, |ε_c| ≤ (1 + σ)(1 + ε_g)(1 + u) − 1 ≤ 4.612u.
    (4) |c| = |f − ln(1 + f)| ≤ κ·|ln m|, κ = the larger of f/ln(1 + f) − 1 at f = 2C − 1
    and 1 − f/ln(1 + f) at f = C − 1 (f/ln(1 + f) increases on (−1, ∞)): κ ≤ 0.19517. So
    |ℓ − ln m| ≤ u·|ln m| + (1 + u)·κ·ε_c·|ln m| ≤ 1.9001u·|ln m|: the bound near one.
    (5) e ≠ 0: |e·LN2_LO| ≤ 2.06e-7 and its product rounds by ≤ u·2.06e-7, the split
    errs by |e|·2^-86; lo = fl(ℓ + fl(e·LN2_LO)) rounds by ≤ u·(λ·(1 + 1.9001u) + 2.06e-7),
    λ = ln(2C) = max|ln m| < 0.3465736; the last sum by u·|result|. In all
    ≤ u·|ln x| + ((1.9001 + 1)λ + 3e-7)u·(1 + u) ≤ u·|ln x| + 1.0051u (for e = 0 the bound
    near one implies it too). Since |ln x| ≥ ln 2 − λ > 0.3465735 when e ≠ 0, the relative
    error is ≤ u + 1.0051u/0.3465735 ≤ 3.9001u. ∎

    Evaluated in ~30 elementwise numpy passes, in blocks of 4096 elements; a subnormal,
    non-positive or non-finite input (one min/max test) costs a few more.
    """
    return _blocked(_log_block, x)


def _log_block(given: FloatArray) -> FloatArray:
    xs = given
    shift: npt.NDArray[np.int64] | int = 0
    bad = None
    if not (given.min() >= _MIN_NORMAL and given.max() < np.inf):  # NaN fails this too
        bad = ~((given > 0.0) & (given < np.inf))  # 0, negative, inf, NaN: set at the end
        xs = np.where(bad, 1.0, given)
        tiny = xs < _MIN_NORMAL  # subnormal: scale by 2^54 (exact), e − 54
        xs[tiny] *= 2.0**54
        shift = tiny.astype(np.int64) * 54
    # frexp by bit operations (exact): xs = 2^(E − 1022)·m0, m0 ∈ [½, 1) with the same
    # fraction bits; m = 2·m0 where m0 < C (fraction bits below C's), so m ∈ [C, 2C).
    bits = xs.view(np.int64)
    fraction = bits & _FRACTION_MASK
    small = (fraction < _SQRT_HALF_FRACTION).astype(np.int64)
    m = (fraction | ((small + 0x3FE) << 52)).view(np.float64)
    e = bits >> 52
    e -= small
    e -= shift + 1022
    ef = e.astype(np.float64)
    f = m - 1.0  # exact
    s = f + 2.0
    np.divide(f, s, out=s)
    w = s * s
    coeffs = _LOG_COEFFS
    q = w * coeffs[0]
    for a in coeffs[1:-1]:
        q += a
        q *= w
    q += coeffs[-1]
    q *= w  # R̂
    np.subtract(f, q, out=q)
    q *= s
    np.subtract(f, q, out=q)  # ℓ = log m
    lo = ef * LN2_LO
    lo += q
    out: FloatArray = ef * LN2_HI  # exact
    out += lo
    if bad is not None and bool(bad.any()):
        special = given[bad]
        out[bad] = np.where(special == 0.0, -np.inf, np.where(special > 0.0, np.inf, np.nan))
    return out


@ieee_njit
def log_one(x: float) -> float:  # pragma: no cover - compiled (numba runs this source)
    """`log` of one positive normal finite float (2^-1022 ≤ x < inf; the caller must use
    `log` otherwise): the same IEEE operations in the same order as `_log_block`
    (worker/ieee_jit.py: no FMA), so the same bits (test_ieee_math compares them).
    (m0, e0) = frexp(x) is exact, m0 ∈ [½, 1) carries x's fraction bits, so m0 < C exactly
    when `_log_block`'s fraction test says so, and (m, e) = (2m0, e0 − 1) or (m0, e0) are
    its m and e."""
    m, e = math.frexp(x)
    if m < SQRT_HALF:
        m *= 2.0  # exact
        e -= 1
    ef = float(e)
    f = m - 1.0  # exact
    s = f / (f + 2.0)
    w = s * s
    coeffs = _LOG_COEFF_ARRAY
    q = w * coeffs[0]
    for i in range(1, coeffs.shape[0] - 1):
        q += coeffs[i]
        q *= w
    q += coeffs[coeffs.shape[0] - 1]
    q *= w  # R̂
    q = f - q
    q *= s
    q = f - q  # ℓ = log m
    lo = ef * LN2_LO
    lo += q
    return ef * LN2_HI + lo
