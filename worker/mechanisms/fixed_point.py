"""Exact fixed-point building blocks from IEEE-754 basic operations only (issue 25).

A privacy proof that "assumes only IEEE-754 correct rounding" may use +, −, ×, ÷ and √
on float64 (each correctly rounded, so the same bits whatever lane, position, batch size
or thread computes it; eager torch runs every operation as its own kernel, so no FMA
contraction joins two of them), exact power-of-two scalings, rounding to integers and
comparisons; and sums of integers below 2^53, exact in any order. It may not use a
transcendental function (no IEEE operation is one: libm's and vendor kernels' results
differ) or a float reduction whose order depends on the batch (BLAS picks kernels by
shape). These helpers give a mechanism a per-row quantity that is a function of the row
and the public state alone, bit for bit:

* :func:`theta_bits` / :func:`quantised_theta`: parameters on the grid 2^-b, clamped to
  ±2^m with P·2^(c+m) ≤ 2^52, so a dot product with features on the grid 2^-c is an
  exact integer sum in float64 whatever its order;
* :func:`sigmoid_basic`: a logistic function from basic operations only;
* :func:`softmax_basic`: a softmax over K classes from basic operations only.

Used by the proven Langevin sampler (worker/mechanisms/langevin.py) and the exact DP-SGD
engine for logistic regression (worker/mechanisms/grad_engines.py).
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import torch

from worker.ieee_jit import ieee_njit
from worker.mechanisms.base import PlanMismatch

__all__ = [
    "THETA_RANGE_BITS",
    "exp_neg_basic",
    "parameters_on_grid",
    "pow2",
    "pow2_tensor",
    "quantised_theta",
    "sigmoid_basic",
    "sigmoid_element",
    "softmax_basic",
    "tanh_basic",
    "tanh_on_grid",
    "theta_bits",
]


THETA_RANGE_BITS: Final[int] = 10
"""|θ̃_j| ≤ 2^10 = 1024: the quantised parameters' range (a logistic weight beyond it is
clamped when the gradient is evaluated; the chain's own θ is not)."""
_EXP_TERMS: Final[int] = 18
_EXP_SQUARINGS: Final[int] = 6  # exp(−u) = exp(−u/64)^64, u ≤ 64
_INV_FACTORIALS: Final[tuple[float, ...]] = tuple(
    1.0 / math.factorial(j) for j in range(_EXP_TERMS + 1)
)


def theta_bits(*, feature_bits: int, parameters: int) -> tuple[int, int]:
    """(b, m): θ's grid 2^-b and integer range ±2^m with P·2^(c+m) ≤ 2^52, so the logit
    numerator x_int·θ_int is exact in float64 in any order (module docstring)."""
    m = 52 - feature_bits - math.ceil(math.log2(max(parameters, 1)))
    b = m - THETA_RANGE_BITS
    if b < 8:
        raise PlanMismatch("the Langevin grid leaves θ too coarse a grid for this many inputs")
    return b, m


def quantised_theta(theta: torch.Tensor, *, bits: int, limit_bits: int) -> torch.Tensor:
    """θ_int = clamp(round(θ·2^b), ±2^m) as integer-valued float64 (exact operations: a
    power-of-two scaling, rounding to an integer, a comparison)."""
    limit = float(2**limit_bits)
    return torch.clamp(torch.round(theta * 2.0**bits), -limit, limit)


def pow2(e: int) -> float:
    """2^e exactly (C's ldexp scales by a power of two without rounding in range)."""
    return math.ldexp(1.0, e)


_POW2_RANGE: Final[int] = 62
_POW2_TABLE: Final[torch.Tensor] = torch.tensor(
    [math.ldexp(1.0, e) for e in range(-_POW2_RANGE, _POW2_RANGE + 1)], dtype=torch.float64
)


def pow2_tensor(e: torch.Tensor) -> torch.Tensor:
    """2^e as float64 for an int64 tensor e with |e| ≤ 62, exactly: looked up in a table of
    the 125 powers 2^-62 … 2^62, each from ``math.ldexp`` (exact in range), so the same
    values as an integer shift converted to float64 (or its exact reciprocal), in one
    gather instead of seven elementwise passes."""
    return torch.take(_POW2_TABLE.to(e.device), e + _POW2_RANGE)


MAX_GRID_BITS: Final[int] = 60
"""A layer's parameter grid is never finer than 2^-60."""


def parameters_on_grid(
    weight: torch.Tensor, bias: torch.Tensor | None, *, range_bits: int
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(W_int, b_int, b): a Linear layer's public parameters on the grid 2^-b with
    |W_int|, |b_int| ≤ 2^range_bits, b = range_bits − e where max|θ| < 2^e (frexp's exponent,
    exact), at most :data:`MAX_GRID_BITS`; rounding to an integer then cannot pass 2^range_bits.
    Non-finite parameters are refused (PlanMismatch). Integer-valued float64 tensors."""
    w = weight.detach().double()
    b = bias.detach().double() if bias is not None else None
    parts = [w.reshape(-1)] + ([b.reshape(-1)] if b is not None else [])
    flat = torch.cat(parts)
    largest = float(flat.abs().max()) if flat.numel() else 0.0
    if not math.isfinite(largest):
        raise PlanMismatch("the model's parameters are not finite")
    exponent = math.frexp(largest)[1] if largest > 0 else -MAX_GRID_BITS
    bits = min(range_bits - exponent, MAX_GRID_BITS)
    scale = pow2(bits)
    return (
        torch.round(w * scale),
        torch.round(b * scale) if b is not None else None,
        bits,
    )


_BLOCK: Final[int] = 16384
"""Elements per block of the CPU kernels below: a block's few float64 arrays (128 KiB
each) stay in the core's L2 cache through the ≈ 50 elementwise passes, which otherwise
stream the whole tensor through memory once per pass (2.2× faster at 256 × 1024). Each
element still goes through the same IEEE operations in the same order, so blocking
changes no bit; the block size is a constant, so the work is the same whatever the data."""


def exp_neg_basic(u: torch.Tensor) -> torch.Tensor:
    """exp(−u) for u ≥ 0 (elementwise; u is clamped at 0 from below) from IEEE basic
    operations only: (Σ_{j≤18} (−v)^j/j!)^64 by Horner on v = min(u, 64)/64 and six
    squarings, clamped at 0 (so e^-64 ≈ 1.6e-28 for u ≥ 64). The same bits for an element
    whatever tensor it sits in (module docstring)."""
    if u.device.type == "cpu":
        return torch.from_numpy(_exp_neg_numpy(np.maximum(u.detach().double().numpy(), 0.0)))
    v = torch.clamp(u, min=0.0, max=64.0) * (1.0 / 64.0)  # exact: max/min, × 2^-6
    p = torch.full_like(v, _INV_FACTORIALS[_EXP_TERMS])
    for j in range(_EXP_TERMS - 1, -1, -1):  # Horner: Σ (−v)^j / j!
        p = p * (-v) + _INV_FACTORIALS[j]
    for _ in range(_EXP_SQUARINGS):
        p = p * p
    return torch.clamp(p, min=0.0)


def _blocks(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat contiguous float64 input, flat output buffer) for a blocked elementwise kernel."""
    flat = np.ascontiguousarray(z, dtype=np.float64).reshape(-1)
    return flat, np.empty(flat.shape[0], dtype=np.float64)


def _exp_neg_block(u: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = :func:`exp_neg_basic`'s value at u ≥ 0 for one block (``out`` may be ``u``):
    min(u, 64)·2^-6, −v, Horner's 18 steps p·(−v) + 1/j!, six squarings, max(p, 0), each a
    numpy ufunc (one correctly rounded operation per element; numpy contracts nothing into
    an FMA)."""
    neg = np.minimum(u, 64.0)
    np.multiply(neg, 1.0 / 64.0, out=neg)
    np.negative(neg, out=neg)
    out.fill(_INV_FACTORIALS[_EXP_TERMS])
    for j in range(_EXP_TERMS - 1, -1, -1):
        np.multiply(out, neg, out=out)
        np.add(out, _INV_FACTORIALS[j], out=out)
    for _ in range(_EXP_SQUARINGS):
        np.multiply(out, out, out=out)
    return np.maximum(out, 0.0, out=out)


def _exp_neg_numpy(u: np.ndarray) -> np.ndarray:
    """:func:`exp_neg_basic` on the CPU for u ≥ 0, the same sequence of IEEE operations,
    block by block (:data:`_BLOCK`)."""
    flat, out = _blocks(u)
    for start in range(0, flat.shape[0], _BLOCK):
        stop = start + _BLOCK
        _exp_neg_block(flat[start:stop], out[start:stop])
    return out.reshape(u.shape)


def sigmoid_basic(z: torch.Tensor) -> torch.Tensor:
    """σ̃(z) in [0, 1] from IEEE basic operations only, elementwise: the same bits for an
    element whatever tensor it sits in. e = exp(−|z|) by :func:`exp_neg_basic`, then
    1/(1 + e) for z ≥ 0, else e/(1 + e): a correctly rounded quotient of 0 ≤ x ≤ y lies in
    [0, 1], so σ̃ ∈ [0, 1] exactly. It is within 1.4e-15 of σ (measured on [−80, 80]);
    proofs use only σ̃ ∈ [0, 1]."""
    if z.device.type == "cpu":  # numpy's ufuncs: the same IEEE operations, less overhead
        out = _sigmoid_basic_numpy(z.detach().double().numpy())
        return torch.from_numpy(out)
    e = exp_neg_basic(torch.abs(z))
    one_plus = 1.0 + e
    return torch.where(z >= 0, 1.0 / one_plus, e / one_plus)


def softmax_basic(logits: torch.Tensor) -> torch.Tensor:
    """p̃ (rows, K) ∈ [0, 1] from basic operations: μ = the row maximum (exact in any
    order), u_k = μ − z_k ≥ 0 (one correctly rounded subtraction), e_k =
    exp_neg_basic(u_k) (e_k = 1 exactly where u_k = 0), s = ((e_0 + e_1) + e_2) + …
    in the fixed class order, and one quotient p̃_k = e_k / s per entry, in [0, 1] since
    0 ≤ e_k ≤ s (adding non-negative floats never decreases a sum). Every step is
    elementwise or a per-row sequence of fixed order, so a row's p̃ is the same bits in any
    batch (worker/mechanisms/exact_softmax.py's docstring, "Softmax from basic
    operations")."""
    top = logits.amax(dim=1, keepdim=True)
    e = exp_neg_basic(top - logits).to(logits.device)
    total = e[:, 0].clone()
    for k in range(1, e.shape[1]):  # the fixed order: ((e_0 + e_1) + e_2) + …
        total = total + e[:, k]
    return e / total.unsqueeze(1)


def _sigmoid_block(z: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = σ̃(z) for 1-D z and out of one shape (``out`` may be ``z``; any strides):
    e = exp_neg(|z|), then (z ≥ 0 ? 1 : e)/(1 + e), the same quotient as 1/(1 + e) or
    e/(1 + e) (selecting the numerator first changes no operation on any element), in one
    compiled loop (:func:`_sigmoid_kernel`; until issue 24's speed work, one numpy pass per
    operation over blocks of :data:`_BLOCK`: the same operations, the same bits)."""
    if z.shape != out.shape or z.ndim != 1:
        raise ValueError("_sigmoid_block needs 1-D z and out of one shape")
    if z.size and _sigmoid_kernel(z, out):
        # A NaN z, which the kernel copied to out as it is: the numpy sequence's value,
        # −(|z|·2^-6) (each later operation returns its one NaN operand unchanged). LLVM
        # need not keep a NaN's sign through arithmetic (it may turn p·(−v) + c into
        # c − p·v), so the kernel leaves it to these numpy operations.
        nan = np.isnan(out)
        out[nan] = np.negative(np.multiply(np.abs(out[nan]), 1.0 / 64.0))
    return out


def _sigmoid_basic_numpy(z: np.ndarray) -> np.ndarray:
    """:func:`sigmoid_basic` on the CPU, the same sequence of IEEE operations (the compiled
    loop of :func:`_sigmoid_block`, one IEEE operation per source operation, no FMA)."""
    flat, out = _blocks(z)
    return _sigmoid_block(flat, out).reshape(z.shape)


def tanh_grid_block(
    z: np.ndarray, *, scale_bits: int, out_bits: int, out: np.ndarray
) -> np.ndarray:
    """out = round(tanh̃(z·2^s)·2^o) for one block of integer-valued (or non-finite) float64
    z, |z| < 2^53, s ≥ −1000 and o ≤ 60 (``out`` may be a strided view, not ``z``): the
    values of :func:`tanh_on_grid`'s sequence (× 2^s, × 2, |·|, min(·, 64), × 2^-6, −v,
    Horner p·(−v) + 1/j! from p = 1/18!, six squarings, max(p, 0), 1 + e, (z ≥ 0 ? 1 : e)
    ÷ (1 + e), × 2, − 1, × 2^o, round half to even) in 54 operations per element instead
    of 58, all in one compiled loop (:func:`_tanh_grid_kernel`; until issue 25's numba kernel,
    54 numpy passes over the block: the same operations, the same bits), by identities that
    hold for every float64 and change no bit (NaN's sign included: the same negation flips
    it):

    * min(|z·2^s·2|, 64)·2^-6 = min(|z|·2^(s−5), 1): scalings by powers of two are exact
      while no result is subnormal or infinite; a nonzero |z| ≥ 1 (an integer) times
      2^(s−5) ≥ 2^-1005 is normal, and where z·2^(s+1) or |z|·2^(s−5) overflows, both sides
      are 1 (the overflow is ≥ 64 resp. ≥ 1, the clamp gives 64·2^-6 resp. 1). NaN stays NaN.
    * Horner's first step (1/18!)·(−v) + 1/17! as (−v)·(1/18!) + 1/17!: the product
      commutes, and the constant 1/18! need not be written out first.
    * max(p, 0) after a squaring is p: a product x·x is never negative (NaN stays NaN).
    * z ≥ 0 ⇔ z·2^(s+1) ≥ 0 (exact scaling keeps the sign; −0 ≥ 0 both ways; NaN false).
    * fl(n/(1 + e))·2 then − 1 then × 2^o equals fl(n·2^(o+1)/(1 + e)) − 2^o then rounded:
      n·2^(o+1) is exact (e ≥ 0.36^64 > 2^-100 is normal), scaling a quotient or a
      difference by a power of two commutes with rounding away from subnormals and overflow
      (the quotient is in [2^-100, 1], the difference 2σ̃ − 1 is 0 or ≥ 2^-54 in magnitude),
      and 2σ̃ is exact."""
    if z.shape != out.shape or z.ndim not in (1, 2):
        raise ValueError("tanh_grid_block needs z and out of one shape, 1 or 2 dimensions")
    if z.size:  # the kernel takes (rows, columns) views, any strides
        _tanh_grid_kernel(
            z if z.ndim == 2 else z[None, :],
            pow2(scale_bits - 5),
            pow2(out_bits + 1),
            pow2(out_bits),
            out if out.ndim == 2 else out[None, :],
        )
    return out


_TANH_COEFFICIENTS: Final[np.ndarray] = np.array(_INV_FACTORIALS, dtype=np.float64)


@ieee_njit
def _tanh_grid_kernel(
    z: np.ndarray, scale: float, numerator: float, half: float, out: np.ndarray
) -> None:  # pragma: no cover - compiled (numba runs this source as machine code)
    """:func:`tanh_grid_block`'s operations, element by element in one compiled loop
    (worker/ieee_jit.py: each line below one IEEE operation, no FMA, the same bits as
    one numpy pass per operation; tests/unit/test_exact_net.py compares them): |z|·2^(s−5),
    min(·, 1) (NaN kept: the comparison is false), −v, Horner from (−v)·(1/18!) + 1/17!
    down to 1/0!, six squarings, 1 + e, the numerator 2^(o+1) where z ≥ 0 else e·2^(o+1),
    the quotient, − 2^o, round half to even. ``scale``, ``numerator`` and ``half`` are
    2^(s−5), 2^(o+1) and 2^o."""
    c = _TANH_COEFFICIENTS
    rows, columns = z.shape
    for r in range(rows):
        for k in range(columns):
            x = z[r, k]
            v = abs(x) * scale
            if v > 1.0:
                v = 1.0
            neg = -v
            p = neg * c[18]
            p = p + c[17]
            for j in range(16, -1, -1):
                p = p * neg
                p = p + c[j]
            for _ in range(6):
                p = p * p
            one_plus = p + 1.0
            top = numerator if x >= 0.0 else p * numerator
            q = top / one_plus
            q = q - half
            out[r, k] = np.rint(q)


@ieee_njit
def _sigmoid_kernel(z: np.ndarray, out: np.ndarray) -> bool:  # pragma: no cover - compiled
    """:func:`_sigmoid_block`'s operations, element by element in one compiled loop
    (worker/ieee_jit.py: each line below one IEEE operation, no FMA, the same bits as one
    numpy pass per operation; tests/unit/test_exact_net.py compares them with that
    sequence, ±0, NaN and ±inf included): |z|, min(·, 64) (NaN kept: the comparison is
    false, as np.minimum keeps it), × 2^-6, −v, Horner p = 1/18!, then p·(−v) + 1/j! for
    j = 17 … 0, six squarings, 1 + e, the numerator 1 where z ≥ 0 else e, the quotient.
    :func:`exp_neg_basic`'s max(p, 0) after the squarings is left out: a square is +0,
    positive, +inf or NaN, which max(·, 0) returns unchanged (np.maximum propagates NaN),
    so no bit changes. The coefficients are :data:`_TANH_COEFFICIENTS` (1/j!, j ≤ 18).
    A NaN z is copied to out unchanged (a load and a store) and the return value says
    there was one: :func:`_sigmoid_block` then writes its value."""
    nan = False
    for i in range(z.shape[0]):
        x = z[i]
        is_nan = x != x
        nan |= is_nan
        out[i] = x if is_nan else sigmoid_element(x)
    return nan


@ieee_njit
def sigmoid_element(x: float) -> float:  # pragma: no cover - compiled
    """σ̃(x) of one float64 that is not NaN, the operations :func:`_sigmoid_kernel` lists
    (|x|, min(·, 64), × 2^-6, −v, Horner from 1/18! down to 1/0!, six squarings, 1 + e, the
    numerator 1 where x ≥ 0 else e, the quotient), each one IEEE operation (no FMA:
    worker/ieee_jit.py), for compiled loops to call (numba inlines it): the one copy of
    these operations in compiled code. A NaN's value is the caller's to write."""
    c = _TANH_COEFFICIENTS
    v = abs(x)
    if v > 64.0:
        v = 64.0
    v = v * 0.015625  # × 2^-6, exact
    neg = -v
    p = c[18]
    for j in range(17, -1, -1):
        p = p * neg
        p = p + c[j]
    for _ in range(6):
        p = p * p
    one_plus = p + 1.0
    top = 1.0 if x >= 0.0 else p
    return top / one_plus


def tanh_basic(z: torch.Tensor) -> torch.Tensor:
    """tanh̃(z) = 2σ̃(2z) − 1 ∈ [−1, 1], elementwise from basic operations (2z and 2σ̃ are
    exact; the subtraction is one correctly rounded operation)."""
    return 2.0 * sigmoid_basic(2.0 * z).to(z.device) - 1.0


def tanh_on_grid(
    z: torch.Tensor, *, scale_bits: int, out_bits: int, append: float | None = None
) -> torch.Tensor:
    """round(tanh̃(z·2^scale_bits)·2^out_bits) elementwise, integer-valued float64: the
    operations of ``torch.round(tanh_basic(z * pow2(scale_bits)) * pow2(out_bits))`` in the
    same order (× 2^s, × 2, σ̃, × 2, − 1, × 2^o, round half to even: numpy's rint and
    torch.round are both IEEE roundToIntegralTiesToEven), on the CPU fused block by block
    (whole rows, about :data:`_BLOCK` elements) so each block stays in cache. Result in
    [−2^o, 2^o] (tanh̃ ∈ [−1, 1]) or NaN. With ``append`` (z of shape (rows, d)), the result
    is (rows, d + 1) with ``append`` in the last column, which saves the caller a copy."""
    if z.device.type != "cpu":
        out_z = torch.round(tanh_basic(z * pow2(scale_bits)) * pow2(out_bits))
        if append is None:
            return out_z
        column = torch.full((z.shape[0], 1), append, dtype=out_z.dtype, device=out_z.device)
        return torch.cat((out_z, column), dim=1)
    source = np.ascontiguousarray(z.detach().double().numpy())
    shape = source.shape
    if append is not None and source.ndim != 2:
        raise ValueError("append needs a (rows, d) tensor")
    matrix = source if source.ndim == 2 else source.reshape(-1, 1)  # blocks of whole rows
    rows, width = matrix.shape
    out = np.empty((rows, width + (append is not None)), dtype=np.float64)
    if append is not None:
        out[:, width] = append
    step = max(1, _BLOCK // max(width, 1))
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        tanh_grid_block(
            matrix[start:stop],
            scale_bits=scale_bits,
            out_bits=out_bits,
            out=out[start:stop, :width],
        )
    if append is not None:
        return torch.from_numpy(out)
    return torch.from_numpy(out.reshape(shape))


@ieee_njit
def _row_maxima_and_squares(
    v: np.ndarray, w: np.ndarray, top: np.ndarray, v_sq: np.ndarray, w_sq: np.ndarray, both: bool
) -> None:  # pragma: no cover - compiled (numba runs this source as machine code)
    """Per row r of v: ``top[r]`` = max_k |v| with np.maximum.reduce's NaN rule (NaN where a
    v is NaN, else the largest |v|, +0 for a row of ±0) and ``v_sq[r]`` = Σ_k v², and where
    ``both``, ``w_sq[r]`` = Σ_k w² for w of v's shape. The sums run in four interleaved
    partial sums (lanes k mod 4, then (s0 + s1) + (s2 + s3)); a caller uses them only where
    every term and partial sum is an integer below 2^53, exact in any order ((ii) of
    exact_net), i.e. np.vecdot's bits. The NaN rule: a NaN v makes its square and the row's
    sum NaN, and no finite or infinite v can (squares are ≥ 0, +inf + +inf = +inf), so the row
    has a NaN exactly when its sum is NaN; the lanes' maxima skip NaN (a comparison with NaN
    is false) and give the largest |v| of the others."""
    rows, columns = v.shape
    for r in range(rows):
        m0 = 0.0
        m1 = 0.0
        m2 = 0.0
        m3 = 0.0
        s0 = 0.0
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        g0 = 0.0
        g1 = 0.0
        g2 = 0.0
        g3 = 0.0
        k = 0
        while k + 4 <= columns:
            x0 = v[r, k]
            x1 = v[r, k + 1]
            x2 = v[r, k + 2]
            x3 = v[r, k + 3]
            s0 += x0 * x0
            s1 += x1 * x1
            s2 += x2 * x2
            s3 += x3 * x3
            a0 = abs(x0)
            a1 = abs(x1)
            a2 = abs(x2)
            a3 = abs(x3)
            m0 = a0 if a0 > m0 else m0
            m1 = a1 if a1 > m1 else m1
            m2 = a2 if a2 > m2 else m2
            m3 = a3 if a3 > m3 else m3
            if both:
                h0 = w[r, k]
                h1 = w[r, k + 1]
                h2 = w[r, k + 2]
                h3 = w[r, k + 3]
                g0 += h0 * h0
                g1 += h1 * h1
                g2 += h2 * h2
                g3 += h3 * h3
            k += 4
        while k < columns:
            x0 = v[r, k]
            s0 += x0 * x0
            a0 = abs(x0)
            m0 = a0 if a0 > m0 else m0
            if both:
                h0 = w[r, k]
                g0 += h0 * h0
            k += 1
        total = (s0 + s1) + (s2 + s3)
        v_sq[r] = total
        top[r] = np.nan if total != total else max(max(m0, m1), max(m2, m3))
        if both:
            w_sq[r] = (g0 + g1) + (g2 + g3)


@ieee_njit
def _tanh_backward_kernel(
    t: np.ndarray,
    upper: np.ndarray,
    weight: np.ndarray,
    outer: bool,
    h: np.ndarray,
    full: float,
    scale: float,
    top: np.ndarray,
    t_sq: np.ndarray,
    h_sq: np.ndarray,
) -> None:  # pragma: no cover - compiled (numba runs this source as machine code)
    """exact_net's tanh backward for one block of rows in one compiled loop (worker/ieee_jit.py:
    each line below one IEEE operation, no FMA, the same bits as the numpy passes it replaces;
    tests/unit/test_exact_net.py compares them): T = B·W (``outer``: upper[r]·weight[k], one
    product per element; else ``t`` holds the matrix product already), then
    T = round(T·(2^32 − H²)·2^-(b + 32)) with ``full`` = 2^32 and ``scale`` = 2^-(b + 32), in
    the numpy order (H·H, full − H², T·factor, ·scale, round half to even), written to ``t``;
    then per row, by :func:`_row_maxima_and_squares`, ``top`` = max_k |T| (np.maximum.reduce's
    NaN rule), ``t_sq`` = Σ_k T² and ``h_sq`` = Σ_k H² (exact where the caller uses them)."""
    rows, columns = t.shape
    for r in range(rows):
        for k in range(columns):
            x = upper[r] * weight[k] if outer else t[r, k]
            hv = h[r, k]
            factor = hv * hv
            factor = full - factor
            x = x * factor
            x = x * scale
            t[r, k] = np.rint(x)
    _row_maxima_and_squares(t, h, top, t_sq, h_sq, True)


@ieee_njit
def _scale_rows_kernel(
    g: np.ndarray, w: np.ndarray, scale: float, out: np.ndarray, top: np.ndarray, sq: np.ndarray
) -> None:  # pragma: no cover - compiled (numba runs this source as machine code)
    """exact_net's V = round(B·w·2^-20) for one block of rows in one compiled loop
    (worker/ieee_jit.py; the numpy order: B·w_r, ·``scale`` (2^-20), round half to even),
    written to ``out``; then per row, by :func:`_row_maxima_and_squares`, ``top`` = max_k |V|
    (np.maximum.reduce's NaN rule) and ``sq`` = Σ_k V² (exact where the caller uses it)."""
    rows, columns = g.shape
    for r in range(rows):
        wr = w[r]
        for k in range(columns):
            x = g[r, k] * wr
            x = x * scale
            out[r, k] = np.rint(x)
    _row_maxima_and_squares(out, out, top, sq, sq, False)
