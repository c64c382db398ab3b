"""DP-SGD's clipped sum for logistic regression and MLPs from IEEE-754 arithmetic alone
(issue 25): every row's contribution is a function of that row and the public parameters,
bit for bit, whatever else is in the batch and wherever the row sits; the sum over rows is
exact. Its sensitivity proof assumes only that float64 +, −, ×, ÷, √ are correctly rounded
(IEEE-754), with no measured property of a kernel.

Route (a) of the issue, exact fixed-point arithmetic through the network. Notation: a
"grid value" is an integer-valued float64 n standing for n·2^-g on a public grid 2^-g.

* **Which operations, and why each is batch-independent.** (i) Elementwise +, −, ×, ÷, √,
  |·|, max/min, comparisons, rounding to an integer, and scaling by an exact power of two
  (``math.ldexp``, or an integer shift converted to float64): each element's result is a
  correctly rounded (or exact) function of that element's operands alone (IEEE-754 §5), so
  the same bits in any lane, position or batch; eager torch and numpy run every such
  operation as its own kernel, so no FMA joins two of them. Transcendentals come only from
  :func:`fixed_point.sigmoid_basic` and :func:`fixed_point.tanh_on_grid` (tanh_basic's
  operations, fused block by block on the CPU: the same operations per element), built
  from these.
  (ii) Reductions (matrix products, row sums, the sum over rows) only ever add integers
  whose partial sums, in any order and any association, stay below 2^53 in magnitude:
  every such sum is exact in float64 (each partial sum is an integer of at most 53 bits,
  so representable, and its rounding is the identity), hence the same whatever order a
  BLAS kernel picks. Each bound is below. (iii) A row maximum is exact in any order. (iv)
  The final sum over rows is in int64 (exact below 2^63).
* **Forward.** Features x ∈ [0, 1] (the schema's encoding; clamped) on 2^-18
  (FEATURE_BITS); layer l's weights and bias on 2^-b_l with |W_int| ≤ 2^m_l, b_l chosen from
  the public parameters' largest magnitude (:func:`layer_grids`,
  fixed_point.parameters_on_grid), m_l so that a row whose inputs have |A| ≤ 2^(c_l + r_l)
  gives a pre-activation numerator Z = A·W_intᵀ + 2^c_l·b_int whose partial sums are
  ≤ (d_in + 1)·2^(c_l + r_l + m_l) ≤ 2^52: exact (ii). Hidden activations on 2^-16
  (HIDDEN_BITS): tanh as fixed_point.tanh_basic = 2σ̃(2z) − 1 ∈ [−1, 1] rounded to the grid
  (r = 0), ReLU as round(max(Z, 0)·2^(16 − c_l − b_l)) (r = 8, RELU_RANGE_BITS: a row with a
  hidden activation above 2^8 is *invalid*, below). ReLU's decision Z > 0 is on the exact
  numerator, so a row on a unit's boundary decides the same way in every batch (the
  audit's construction, issue 25).
* **Backward.** Output gradient B_L = round((σ̃(z) − y)·2^20) (GRAD_BITS; BCE with logits);
  through layer l: T = B_l·W_int,l (partial sums ≤ d_out·2^(20 + 6 + m_l) ≤ 2^52 for a row
  with |B| ≤ 2^26: exact), then elementwise (i): tanh δ = round(fl(T·(2^32 − H²))·
  2^-(b_l + 32)) (H² ≤ 2^32 exact), ReLU δ = round(T·2^-b_l)·[Z > 0]. A row with
  |δ| > 2^26 (|∂ℓ/∂a| > 2^6, GRAD_RANGE_BITS) is invalid.
* **K classes** (an MLP whose head has K ≥ 3 logits, softmax and cross-entropy; issue 20):
  the head's numerators Z (rows, K) are K exact dot products as above, the logits
  z = Z·2^-(c + b) (an exact scaling), p̃ = fixed_point.softmax_basic(z) (the row maximum
  (iii), exp from basic operations, a sum in the fixed class order, one quotient per
  entry: exact_softmax.py's docstring), and the output gradient is
  B_L = round((p̃ − e_y)·2^20) (:func:`softmax_residuals`), the cross-entropy gradient
  (p − e_y) with respect to the logits on the grid. p̃_k ∈ [0, 1], so |B_L,k| ≤ 2^20 ≤ 2^26
  and the backward's room m_L already counts ⌈log₂ K⌉ (T = B_L·W_int,L sums K terms);
  ‖B_L‖² ≤ K·2^40 ≤ 2^52, so norm_sq_upper(B_L) sums it exactly. The bound
  ‖p − e_y‖² ≤ 2 of exact probabilities (langevin.py proves it for the grid residuals,
  where it is the sensitivity) is not needed here, as in exact_softmax.py: the weight w_i
  is aimed from the row's own norm bound and the a-posteriori integer check enforces
  ‖z_i‖ ≤ c_row whatever B_L is. A label that is not an integer in [0, K) makes its row
  invalid (:func:`class_labels_valid`: exact comparisons). A binary MLP (one logit) is
  computed exactly as before, operation for operation.
* **Invalid rows** (a bound above exceeded, a non-finite feature or label) are decided
  from that row's exact values by exact comparisons, so the decision is itself
  batch-independent, and contribute exactly 0. (A row's float results never mix with
  another row's: row i of a matrix product depends on row i's operands only.)
* **Clipping, row by row.** Row i's gradient for layer l is B_l ⊗ [A_l, 1]·2^-(20 + c_l).
  :func:`norm_sq_upper` gives an upper bound on ‖v‖² of a grid vector by exact integer
  sums (ii) after rounding |v| *up* to a coarser per-row power-of-two grid. From them a
  weight w_i = min(2^k/C, (c − R_i)/N̂_i) (N̂_i ≥ ‖g_i‖, R_i ≥ the rounding term below;
  for the jl engine also ≤ c/(κ·M̂_i), :func:`jl_estimates`), and the row's contribution
  in noise-grid units is V_l ⊗ [A_l, 1]·2^-c_l with V_l = round(w_i·B_l·2^-20). Its norm is
  checked a posteriori from the integers: U_i = (1 + 2^-40)·Σ_l norm_sq_upper(V_l)·
  norm_sq_upper([A_l, 1])·2^-2c_l (≤ 12 rounded operations of relative error 2^-53 each, so
  U_i ≥ ‖contribution‖²); a row with U_i > c_row² fails the job (GuardFailed: it can only
  happen if the weights above are wrong, whatever the data, since w_i aims at
  c_row·(1 − 2^-20) less the rounding term).
* **Sum.** Σ_i V_l,iᵀ[A_l, 1]_i per chunk of rows as a float64 matrix product of integers:
  |V_j·A_j'| ≤ ‖V‖·‖A‖ ≤ c_row·2^c_l, and the chunk holds at most 2^(52 − ⌈log₂ c_row⌉ − 18)
  rows (≤ 1024), so its partial sums stay ≤ 2^52: exact (ii). Each chunk's integer total t
  is split exactly as t = h·2^c + l (0 ≤ l < 2^c, floor division in int64), the h and l
  parts are summed over chunks in int64 (no overflow below 2^24 rows), and
  S = H + ⌊(L + 2^(c−1))/2^c⌋, the exact sum rounded once; a batch of one chunk gets the
  same integer as ⌊(t + 2^(c−1))·2^-c⌋ in float64 (every step exact: |t| ≤ 2^52, c ≤ 18).
* **Speed without other bits** (issue 25): the CPU kernels for σ̃ and tanh̃ run block by
  block in cache (fixed_point._BLOCK) with each element's operations unchanged; the
  norms of inputs known to be small (features ≤ 2^18, tanh activations ≤ 2^16) skip
  norm_sq_upper's per-row scaling, whose shift is then 0; scalings, roundings and masks
  run in place. Logistic regression (one layer, one logit, d + 1 ≤ 2^14) on the CPU takes
  :meth:`ExactNetClipper._logistic_sum`: the same operations per element in numpy, whose
  per-call cost suits a step's few hundred rows better than torch's, with fewer passes
  where two routes give the same bits (each argued beside it). MLPs on the CPU take
  :meth:`ExactNetClipper._mlp_sum`: the same operations per element in numpy, a chunk
  worked through in blocks of rows (every value before the chunk's sum is a function of
  its row alone, so blocking changes no bit) with each block's forward, backward, norms
  and weights in cache, tanh̃ by fixed_point.tanh_grid_block (fewer passes, the same
  bits: argued there); the tanh backward (fixed_point._tanh_backward_kernel) and the
  clipped rows' scaling V = round(B·w·2^-20) (fixed_point._scale_rows_kernel) are compiled
  loops (worker/ieee_jit.py: each source operation one IEEE operation, no FMA, no
  fast-math) with the numpy passes' operations in their order, and they also form the row
  maxima (iii) and the rows' sums of squares, used only where those are exact integer
  sums (ii). Each is argued where it is made; tests/unit/test_exact_net.py's
  golden sha256 pins the sums to those of the code before (cb078aa), and tests compare
  the logistic and MLP paths with the general one.

**Sensitivity.** With z_i the exact contribution of row i (batch-independent, ‖z_i‖ ≤ c_row)
and S = round(Σ_i z_i) coordinatewise, adding one row x* changes each coordinate of the
exact sum by z_*,j and its rounding by at most |z_*,j| + 1, so
‖S(D + x*) − S(D)‖₂ ≤ ‖z_*‖₂ + √P ≤ c_row + √P = κ·2^k with c_row = κ·2^k − √P (κ = 1
but for jl). No drift term
and no float-summation term: nothing but (i)–(iv).

The grids change what is computed from the float network only by rounding public
parameters and activations (|Δz| ≲ (d_in + 1)·2^-b_l + ‖W‖₁·2^-c_l per unit), the same
kind of public pre-processing as the schema's encoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
import torch

from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.fixed_point import (
    MAX_GRID_BITS,
    _scale_rows_kernel,
    _sigmoid_block,
    _tanh_backward_kernel,
    parameters_on_grid,
    pow2,
    pow2_tensor,
    sigmoid_basic,
    softmax_basic,
    tanh_grid_block,
    tanh_on_grid,
)
from worker.mechanisms.guards import GuardFailed, positive_finite
from worker.models import Logistic, Mlp

__all__ = [
    "FEATURE_BITS",
    "ExactNetClipper",
    "RowSignals",
    "class_labels_valid",
    "exact_net_supports",
    "layer_grids",
    "norm_sq_upper",
    "row_signals",
    "softmax_residuals",
]

FEATURE_BITS: Final[int] = 18
"""c_0: features ∈ [0, 1] read on the grid 2^-18."""
HIDDEN_BITS: Final[int] = 16
"""c_l (l ≥ 1): hidden activations on the grid 2^-16."""
GRAD_BITS: Final[int] = 20
"""Output gradients ∂ℓ/∂(layer output) on the grid 2^-16."""
RELU_RANGE_BITS: Final[int] = 8
"""A ReLU activation above 2^8 makes its row invalid (tanh is within [−1, 1])."""
GRAD_RANGE_BITS: Final[int] = 6
"""An output gradient above 2^6 in magnitude makes its row invalid."""
ROW_LIMIT: Final[int] = 1 << 24
CHUNK: Final[int] = 1024
_EXACT: Final[int] = 52  # partial sums of integers ≤ 2^52 < 2^53: exact in any order
_UP: Final[float] = 1.0 + 2.0**-40  # covers ≤ 12 roundings of relative error 2^-53
_MARGIN: Final[float] = 2.0**-20  # the weights aim at c_row·(1 − 2^-20)
#: Values per block of rows in the MLP path (:meth:`ExactNetClipper._mlp_chunk`): 64 rows
#: at width 1024, the whole batch of 256 at width 256. A block costs well over 100 numpy calls
#: whatever its size (plus the logit's σ̃ on a handful of values), so fixed_point._BLOCK's
#: 16384 (16 rows at 1024) spent more in per-call cost than it saved in cache: on 20
#: Adult batches (thread CPU time, shared machine) 65536 took 0.74x-0.93x the time of
#: 16384 at widths 64-1024, the same sums (benchmarks/results/dpsgd_widths.md).
_MLP_BLOCK: Final[int] = 1 << 16
_NO_VALUES: Final[npt.NDArray[np.float64]] = np.empty(0)
"""The compiled tanh backward's unused operands (its ``upper``/``weight`` when T is given)."""
# Exact powers of two of the logistic path (ExactNetClipper._logistic_sum).
_P_C: Final[float] = math.ldexp(1.0, FEATURE_BITS)
_P_INV_C: Final[float] = math.ldexp(1.0, -FEATURE_BITS)
_P_GRAD: Final[float] = math.ldexp(1.0, GRAD_BITS)
_P_INV_GRAD: Final[float] = math.ldexp(1.0, -GRAD_BITS)


def _ceil_log2(n: int) -> int:
    return max(0, (n - 1).bit_length())


def exact_net_supports(module: torch.nn.Module) -> bool:
    """Logistic regression and MLPs (tanh or ReLU): the models this module computes."""
    return isinstance(module, (Logistic, Mlp))


def _linears(module: torch.nn.Module) -> tuple[list[torch.nn.Linear], Literal["tanh", "relu"]]:
    if isinstance(module, Logistic):
        return [module.linear], "tanh"
    if isinstance(module, Mlp):
        layers = [m for m in module.net if isinstance(m, torch.nn.Linear)]
        relu = any(isinstance(m, torch.nn.ReLU) for m in module.net)
        return layers, "relu" if relu else "tanh"
    raise PlanMismatch("the exact fixed-point engine computes logistic regression and MLPs")


def class_labels_valid(label: torch.Tensor, classes: int) -> torch.Tensor:
    """Which rows' labels (float64) are class indices: integers in [0, K), decided by exact
    comparisons on the row's own label (NaN and ±inf compare false or fall outside)."""
    return (label == torch.floor(label)) & (label >= 0) & (label < classes)


def softmax_residuals(
    logits: torch.Tensor, label: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """B = round((p̃ − e_y)·2^20) (rows, K), the cross-entropy gradient with respect to the
    K logits on the grid 2^-20 (GRAD_BITS), p̃ = fixed_point.softmax_basic of the (exact)
    logits; ``label`` the class indices (float64), read only on ``valid`` rows (class 0
    elsewhere, whose residual the caller zeroes). p̃_k ∈ [0, 1], so |p̃_k − [k = y]| ≤ 1
    (one correctly rounded subtraction, exact for k ≠ y) and |B_k| ≤ 2^20; every step is
    elementwise or softmax_basic's per-row fixed-order sequence, so a row's B is the same
    bits in any batch."""
    p = softmax_basic(logits).to(logits.device)
    index = torch.where(valid, label, 0.0).to(torch.int64)
    target = torch.zeros_like(p).scatter_(1, index.unsqueeze(1), 1.0)
    return torch.round((p - target) * pow2(GRAD_BITS))


@dataclass(frozen=True)
class LayerGrid:
    """One Linear layer's public parameters on their grid: W_int, b_int (integer-valued
    float64), b (the grid 2^-b) and c (the grid 2^-c of the layer's inputs)."""

    weight: torch.Tensor
    bias: torch.Tensor
    bits: int
    in_bits: int


def layer_grids(module: torch.nn.Module) -> tuple[list[LayerGrid], Literal["tanh", "relu"]]:
    """Each layer's parameters on the grid 2^-b_l with |W_int|, |b_int| ≤ 2^m_l: m_l from
    the forward bound (d_in + 1)·2^(c_l + r_l + m_l) ≤ 2^52 and, for a layer the backward
    passes through (every layer but the first), d_out·2^(20 + 6 + m_l) ≤ 2^52; b_l = m_l − e
    with max|θ_l| < 2^e (frexp's exponent), so rounding keeps |θ_int| ≤ 2^m_l. Public: a
    function of the parameters alone."""
    layers, activation = _linears(module)
    grids = []
    for index, (layer, room) in enumerate(zip(layers, _rooms(module), strict=True)):
        d_out = layer.weight.shape[0]
        in_bits = FEATURE_BITS if index == 0 else HIDDEN_BITS
        w_int, b_int, bits = parameters_on_grid(layer.weight, layer.bias, range_bits=room)
        if b_int is None:
            b_int = torch.zeros(d_out, dtype=torch.float64, device=w_int.device)
        grids.append(
            LayerGrid(
                weight=w_int,
                bias=b_int,
                bits=bits,
                in_bits=in_bits,
            )
        )
    return grids, activation


def _rooms(module: torch.nn.Module) -> list[int]:
    """:func:`layer_grids`' m_l per layer, a function of the layers' shapes alone."""
    layers, activation = _linears(module)
    relu_range = RELU_RANGE_BITS if activation == "relu" else 0
    rooms = []
    for index, layer in enumerate(layers):
        d_out, d_in = layer.weight.shape
        in_bits = FEATURE_BITS if index == 0 else HIDDEN_BITS
        in_range = 0 if index == 0 else relu_range
        room = _EXACT - (in_bits + in_range + _ceil_log2(d_in + 1))
        if index > 0:
            room = min(room, _EXACT - (GRAD_BITS + GRAD_RANGE_BITS + _ceil_log2(d_out)))
        rooms.append(room)
    return rooms


@dataclass(frozen=True)
class RowSignals:
    """Per layer: inputs [A_l, 2^c_l] (rows, d_in + 1) and output gradients B_l (rows,
    d_out), grid values; ``valid`` rows met every bound (the others contribute 0)."""

    inputs: tuple[torch.Tensor, ...]
    grads: tuple[torch.Tensor, ...]
    in_bits: tuple[int, ...]
    valid: torch.Tensor


def row_signals(
    module: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    grids: tuple[list[LayerGrid], Literal["tanh", "relu"]] | None = None,
) -> RowSignals:
    """The forward and backward of the module docstring, for a batch (x, y); ``grids`` is
    :func:`layer_grids` of the module when the caller has it already."""
    grids_, activation = grids if grids is not None else layer_grids(module)
    with torch.no_grad():
        a = torch.trunc(x.double().clamp(0.0, 1.0) * pow2(FEATURE_BITS))
        valid = torch.isfinite(a).all(dim=1) & torch.isfinite(y.double())
        inputs: list[torch.Tensor] = []
        numerators: list[torch.Tensor] = []
        hidden: list[torch.Tensor] = []
        one = torch.full((a.shape[0], 1), pow2(FEATURE_BITS), dtype=torch.float64)
        layer_input = torch.cat((a, one.to(a.device)), dim=1)  # [A_0, 2^c_0]
        for index, grid in enumerate(grids_):
            inputs.append(layer_input)
            # [A, 2^c]·[W_int, b_int]ᵀ = A·W_intᵀ + 2^c·b_int: one product of integers with
            # partial sums ≤ (d_in + 1)·2^(c + r + m) ≤ 2^52, exact in any order (ii).
            z_num = layer_input @ _with_bias(grid).T
            numerators.append(z_num)
            if index == len(grids_) - 1:
                break
            shift = -(grid.in_bits + grid.bits)
            next_one = pow2(grids_[index + 1].in_bits)
            if activation == "tanh":
                # tanh̃ ∈ [−1, 1] for a finite z, so |a| ≤ 2^16 on every row whose features
                # are finite (the others are invalid already): no check to make.
                layer_input = tanh_on_grid(
                    z_num, scale_bits=shift, out_bits=HIDDEN_BITS, append=next_one
                )
                a = layer_input[:, :-1]
            else:
                a = torch.round(torch.clamp(z_num, min=0.0) * pow2(shift + HIDDEN_BITS))
                # a ≥ 0 (or NaN: max propagates it, and NaN compares false: invalid)
                valid &= a.amax(dim=1) <= pow2(HIDDEN_BITS + RELU_RANGE_BITS)
                one = torch.full((a.shape[0], 1), next_one, dtype=torch.float64)
                layer_input = torch.cat((a, one.to(a.device)), dim=1)
            hidden.append(a)
        last = grids_[-1]
        classes = last.weight.shape[0]  # 1 logit (binary), or K ≥ 3 (softmax)
        if classes == 1:
            logit = numerators[-1][:, 0] * pow2(-(last.in_bits + last.bits))
            residual = sigmoid_basic(logit).to(logit.device) - y.double()
            b = torch.round(residual * pow2(GRAD_BITS)).unsqueeze(1)
        else:  # K classes: the labels are class indices; the logits' scaling is exact
            label = y.double()
            valid &= class_labels_valid(label, classes)
            logits = numerators[-1] * pow2(-(last.in_bits + last.bits))
            b = softmax_residuals(logits, label, valid)
        grads = [b]
        grad_limit = pow2(GRAD_BITS + GRAD_RANGE_BITS)
        for index in range(len(grids_) - 1, 0, -1):
            grid = grids_[index]
            t = b @ grid.weight  # exact (ii) for a valid row
            # In place, the same operations in the same order as
            # round(t·(2^32 − H²)·2^-(b + 32)) and round(t·2^-b)·[Z > 0].
            if activation == "tanh":
                h = hidden[index - 1]
                factor = torch.mul(h, h).neg_().add_(pow2(2 * HIDDEN_BITS))  # exact: |h| ≤ 2^16
                b = t.mul_(factor).mul_(pow2(-(grid.bits + 2 * HIDDEN_BITS))).round_()
            else:
                b = t.mul_(pow2(-grid.bits)).round_().mul_(numerators[index - 1] > 0)
            # max |b| ≤ L ⇔ max b ≤ L and min b ≥ −L (NaN: both compare false)
            valid &= (b.amax(dim=1) <= grad_limit) & (b.amin(dim=1) >= -grad_limit)
            grads.append(b)
        grads.reverse()
        invalid = ~valid.unsqueeze(1)
        return RowSignals(  # where(valid, v, 0.0), in place on these fresh tensors
            inputs=tuple(v.masked_fill_(invalid, 0.0) for v in inputs),
            grads=tuple(v.masked_fill_(invalid, 0.0) for v in grads),
            in_bits=tuple(g.in_bits for g in grids_),
            valid=valid,
        )


def _with_bias(grid: LayerGrid) -> torch.Tensor:
    """[W_int, b_int] (d_out, d_in + 1)."""
    return torch.cat((grid.weight, grid.bias.unsqueeze(1)), dim=1)


def norm_sq_upper(v: torch.Tensor, *, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """(rows,) float64 U with U ≥ Σ_j v_ij² for grid values v (rows, width), from exact
    operations only: per row, s = max(0, e − h) with max_j |v_ij| < 2^e (frexp) and
    h = ⌊(52 − ⌈log₂ width⌉)/2⌋; q = ⌈|v|·2^-s⌉ ≤ 2^h (exact scaling and ceiling), so
    Σ q² ≤ width·2^2h ≤ 2^52 is an exact integer sum (ii) and U = Σ q²·4^s (exact). The
    squares are written over q (each q·q an exact integer) and summed per row: every
    partial sum is an integer below 2^53, the same value in any order. ``scratch``, a
    float64 tensor of v's shape, receives |v| (then q, then q²) instead of a fresh one."""
    width = v.shape[1]
    half = _half_bits(width)
    magnitude = torch.abs(v, out=scratch) if scratch is not None else v.abs()
    largest = magnitude.amax(dim=1) if width else v.new_zeros(v.shape[0])
    _, exponent = torch.frexp(largest)
    shift = torch.clamp(exponent.to(torch.int64) - half, min=0)
    if v.shape[0] and int(shift.max()) > 31:  # 4^s must stay an exact int64 shift
        raise PlanMismatch("a value exceeded the exact engine's range")
    q = magnitude.mul_(pow2_tensor(-shift).unsqueeze(1)).ceil_()  # exact scaling, ceiling
    return q.mul_(q).sum(dim=1) * pow2_tensor(2 * shift)


def _half_bits(width: int) -> int:
    return (_EXACT - _ceil_log2(max(width, 1))) // 2


_COLUMN_RANGE: Final[float] = math.ldexp(1.0, _half_bits(1))
"""2^26: one column's norm_sq_upper scales no value below it."""


def _norm_sq_bounded(v: torch.Tensor, *, bound_bits: int) -> torch.Tensor:
    """:func:`norm_sq_upper` of integer-valued v whose entries are known, from how v was
    built, to satisfy |v_ij| ≤ 2^bound_bits with bound_bits + 1 ≤ h: then every row's
    max |v_ij| < 2^(bound_bits + 1), so s = 0, q = |v| and U = Σ_j v_ij², the same bits,
    computed without the per-row scaling. Refused (PlanMismatch) where the width leaves
    h < bound_bits + 1 (the caller then uses norm_sq_upper)."""
    if bound_bits + 1 > _half_bits(v.shape[1]):
        raise PlanMismatch("the layer is too wide for the static norm bound")
    return torch.linalg.vecdot(v, v)  # integers: products ≤ 2^2h, sums ≤ 2^52, exact


def _input_norm_sq(a: torch.Tensor, *, index: int, in_bits: int, relu: bool) -> torch.Tensor:
    """norm_sq_upper of a layer's inputs [A_l, 2^c_l] (invalid rows zeroed): features are in
    [0, 2^18] (clamp, trunc) and tanh activations in [−2^16, 2^16] (tanh̃ ∈ [−1, 1]), so
    :func:`_norm_sq_bounded` gives its bits whenever the width allows; ReLU activations
    (≤ 2^24 on a valid row) take the general path."""
    bound = in_bits + (RELU_RANGE_BITS if relu and index > 0 else 0)
    if bound + 1 <= _half_bits(a.shape[1]):
        return _norm_sq_bounded(a, bound_bits=bound)
    return norm_sq_upper(a)


JL_DIRECTION_RANGE: Final[int] = 3
"""Directions are clamped to ±2^3 before their grid (a standard normal beyond 8 has
probability < 1.3e-15; the estimate is any public function of the directions, the hard
cap alone bounds the sensitivity)."""


def jl_estimates(grids: list[LayerGrid], s: RowSignals, directions: torch.Tensor) -> torch.Tensor:
    """M̂_i = √((1/r) Σ_j ⟨g_i, v_j⟩²) (Bu et al. 2021, "Fast and Memory Efficient
    Differentially Private-SGD via JL Projections") from exact operations, (rows,): per
    layer l and direction j, the slice V_j,l (d_out, d_in + 1) of v_j on the grid 2^-e_l
    (clamped to ±8, e_l = min(24, 52 − 3 − c_l − r_l − ⌈log₂(d_in + 1)⌉)), T = [A_l, 1]·V_j,lᵀ is an
    exact integer product (partial sums ≤ 2^52), each row's T is moved onto a coarser
    per-row power-of-two grid 2^s (exact scaling, rounding) with |T'| ≤ 2^h,
    h = 52 − (20 + 6) − ⌈log₂ d_out⌉, so Σ_o B_o·T'_o is an exact integer sum, and
    ⟨g_i, v_j⟩ ≈ Σ_l that·2^(s − 20 − c_l − e_l) (exact scalings; layers and directions
    added in a fixed order, elementwise). Every step is a function of row i and the public
    directions alone, so M̂_i is the same bits in any batch."""
    r = directions.shape[0]
    rows = s.valid.shape[0]
    dots = torch.zeros(r, rows, dtype=torch.float64, device=s.valid.device)
    offset = 0
    for index, (grid, a, b) in enumerate(zip(grids, s.inputs, s.grads, strict=True)):
        d_out, d_in = grid.weight.shape
        relu_bits = 0 if index == 0 else RELU_RANGE_BITS  # the tanh case needs less
        e = min(24, _EXACT - JL_DIRECTION_RANGE - grid.in_bits - relu_bits - _ceil_log2(d_in + 1))
        w_part = directions[:, offset : offset + d_out * d_in].reshape(r, d_out, d_in)
        b_part = directions[:, offset + d_out * d_in : offset + d_out * (d_in + 1)]
        offset += d_out * (d_in + 1)
        v = torch.cat((w_part, b_part.unsqueeze(2)), dim=2).to(a.device, torch.float64)
        limit = float(1 << JL_DIRECTION_RANGE)
        vq = torch.round(v.clamp(-limit, limit) * pow2(e))  # (r, d_out, d_in + 1)
        t = (a @ vq.reshape(r * d_out, d_in + 1).T).reshape(rows, r, d_out)  # exact
        h = _EXACT - (GRAD_BITS + GRAD_RANGE_BITS) - _ceil_log2(d_out)
        _, top = torch.frexp(t.abs().amax(dim=2))  # (rows, r): max |T| < 2^top
        shift = torch.clamp(top.to(torch.int64) - h, min=0)
        t_coarse = torch.round(t * pow2_tensor(-shift).unsqueeze(2))
        summed = (b.unsqueeze(1) * t_coarse).sum(dim=2)  # exact: integers, ≤ 2^52
        scaled = summed * pow2_tensor(shift) * pow2(-(GRAD_BITS + grid.in_bits + e))
        dots = dots + scaled.T
    if offset != directions.shape[1]:
        raise PlanMismatch("the JL directions do not match the model's parameters")
    total = torch.zeros(rows, dtype=torch.float64, device=dots.device)
    for j in range(r):  # a fixed order, elementwise
        total = total + dots[j] * dots[j]
    return torch.sqrt(total * (1.0 / r))


class ExactNetClipper:
    """The DP-SGD sum for one run of logistic regression or an MLP (one logit, or K ≥ 3
    with softmax), engines ``exact`` and ``ghost`` alike: (x, y) → S as int64
    (parameters,), ‖S(D + x*) − S(D)‖ ≤ 2^k by the module docstring's proof (no
    assumption beyond IEEE-754)."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        grid_bits: int,
        max_grad_norm: float,
        parameters: int,
        kappa: float = 1.0,
    ) -> None:
        if not 0 < grid_bits <= 20:
            raise PlanMismatch("the integer grid does not fit the exact engine's bounds")
        positive_finite("dpsgd exact", max_grad_norm=max_grad_norm, kappa=kappa)
        if kappa < 1.0:
            raise PlanMismatch("κ must be ≥ 1")
        _linears(module)
        self.module = module
        self.parameters = parameters
        self.kappa = kappa
        self._units = pow2(grid_bits) / max_grad_norm  # noise-grid units per gradient unit
        # Δ = κ·2^k; the JL engine's estimate clips at ≈ C, its hard cap at κ·C.
        self.row_cap = kappa * pow2(grid_bits) - math.sqrt(parameters)
        if self.row_cap <= 0:
            raise PlanMismatch("the grid is too coarse for this many parameters")
        self._target = self.row_cap * (1.0 - _MARGIN)
        self._jl_level = self._target / kappa  # the JL clip level C in noise units (≈ 2^k)
        # Rows per chunk so that a chunk's integer products stay ≤ 2^52 (|V·A| ≤ c_row·2^c).
        cap_bits = math.ceil(math.log2(self.row_cap)) + FEATURE_BITS
        self._chunk = min(CHUNK, 1 << max(0, _EXACT - cap_bits))
        if _EXACT - cap_bits < 0:
            raise PlanMismatch("κ·2^k is too large for the exact engine")
        self.label = "dpsgd exact" if kappa == 1.0 else "dpsgd jl"
        # a row's U_i·(1 + 2^-40) above fl(c_row²)·(1 − 2^-40) < c_row² fails the job
        self._limit = self.row_cap * self.row_cap * (1.0 - 2.0**-40)
        # Logistic regression whose input norms take _norm_sq_bounded's exact sum (d + 1 ≤
        # 2^14; wider inputs take norm_sq_upper's coarser bound): :meth:`_logistic_sum`.
        d_in = module.linear.weight.shape[1] if isinstance(module, Logistic) else 1 << 20
        self._logistic = _half_bits(d_in + 1) >= FEATURE_BITS + 1
        self._room = _EXACT - (FEATURE_BITS + _ceil_log2(d_in + 1))  # layer_grids' m_0
        self._mlp = _mlp_numpy_supports(module)

    def contributions(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        grids: tuple[list[LayerGrid], Literal["tanh", "relu"]] | None = None,
        directions: torch.Tensor | None = None,
    ) -> tuple[tuple[torch.Tensor, ...], RowSignals]:
        """(V_l per layer, signals): row i's contribution is V_l,i ⊗ [A_l, 1]_i·2^-c_l in
        noise-grid units, a function of row i, the parameters and (JL) the step's public
        directions alone; a row's weight is min(2^k/C, (c − R_i)/N̂_i) and, with
        ``directions``, also ≤ c/(κ·M̂_i) (:func:`jl_estimates`)."""
        grids = grids if grids is not None else layer_grids(self.module)
        s = row_signals(self.module, x, y, grids=grids)
        with torch.no_grad():
            relu = grids[1] == "relu"
            in_sq = [
                _input_norm_sq(a, index=i, in_bits=c, relu=relu)
                for i, (a, c) in enumerate(zip(s.inputs, s.in_bits, strict=True))
            ]
            grad_sq = [norm_sq_upper(b) for b in s.grads]
            n_sq = torch.zeros_like(in_sq[0])
            r_sq = torch.zeros_like(in_sq[0])
            for a2, b2, b_out, c in zip(in_sq, grad_sq, s.grads, s.in_bits, strict=True):
                n_sq = n_sq + b2 * a2 * pow2(-2 * (GRAD_BITS + c))
                r_sq = r_sq + a2 * (0.25 * b_out.shape[1]) * pow2(-2 * c)
            norm = torch.sqrt(n_sq) * _UP  # ≥ ‖g_i‖ (gradient units)
            slack = torch.sqrt(r_sq) * _UP  # ≥ ½·√(Σ_l d_out·‖A_l‖²·2^-2c_l) (rounding)
            w = torch.clamp((self._target - slack) / norm, min=0.0, max=self._units)
            if directions is not None:
                estimate = jl_estimates(grids[0], s, directions)
                w = torch.minimum(w, self._jl_level / estimate)  # M̂ = 0: no JL limit
            w = torch.where(s.valid, w, 0.0)  # 0/0 → NaN above; an invalid row has weight 0
            # round(w·B·2^-20), the same operations in place on one fresh tensor
            scaled = [torch.mul(b, w.unsqueeze(1)).mul_(pow2(-GRAD_BITS)).round_() for b in s.grads]
            total = torch.zeros_like(in_sq[0])
            for v, a2, c in zip(scaled, in_sq, s.in_bits, strict=True):
                total = total + norm_sq_upper(v) * a2 * pow2(-2 * c)
            # The proof's precondition on the real batch: every row's contribution ≤ c_row
            # (invalid rows have w = 0, so V = 0). fl(c_row²)·(1 − 2^-40) < c_row².
            limit = self.row_cap * self.row_cap * (1.0 - 2.0**-40)
            if bool((total * _UP > limit).any()):
                raise GuardFailed(f"{self.label}: a row's contribution exceeds its bound")
            return tuple(scaled), s

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, directions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """S = round(Σ_i z_i) as int64 (parameters,). Each chunk's exact integer sum t
        (|t| ≤ 2^52, float64) is split exactly as t = h·2^c + l with 0 ≤ l < 2^c (floor
        division), the h and l parts summed in int64 over chunks (no overflow below 2^24
        rows), and S = H + ⌊(L + 2^(c−1))/2^c⌋ = ⌊(Σ t + 2^(c−1))/2^c⌋, the exact sum
        rounded once. A batch of one chunk gets the same integer as ⌊(t + 2^(c−1))·2^-c⌋
        in float64: t + 2^(c−1) is an integer of magnitude < 2^53 (c ≤ 18), so exact, and
        the scaling by 2^-c and the floor are exact."""
        if x.shape[0] > ROW_LIMIT:
            raise PlanMismatch("a batch exceeded the exact engine's row limit")
        if self._logistic and directions is None and x.device.type == "cpu":
            return self._logistic_sum(x, y)
        if self._mlp and directions is None and x.device.type == "cpu":
            return self._mlp_sum(x, y)
        return self._general_sum(x, y, directions)

    def _general_sum(
        self, x: torch.Tensor, y: torch.Tensor, directions: torch.Tensor | None
    ) -> torch.Tensor:
        """__call__ through :meth:`contributions`, for every model and engine."""
        grids = layer_grids(self.module)
        bits = [g.in_bits for g in grids[0]]
        totals: list[list[torch.Tensor]] = []
        for start in range(0, x.shape[0], self._chunk):
            stop = start + self._chunk
            v, s = self.contributions(
                x[start:stop], y[start:stop], grids=grids, directions=directions
            )
            # exact integer products and sums (ii)
            totals.append([vl.T @ al for vl, al in zip(v, s.inputs, strict=True)])
        if not totals:
            return torch.zeros(self.parameters, dtype=torch.int64, device=x.device)
        if len(totals) == 1:
            rounded = [
                t.add_(pow2(c - 1)).mul_(pow2(-c)).floor_().to(torch.int64)
                for t, c in zip(totals[0], bits, strict=True)
            ]
        else:
            rounded = [
                _round_chunk_sums([t[layer] for t in totals], c) for layer, c in enumerate(bits)
            ]
        flat: list[torch.Tensor] = []
        for layer in rounded:
            flat += [layer[:, :-1].reshape(-1), layer[:, -1]]
        out = torch.cat(flat)
        if out.shape != (self.parameters,):
            raise PlanMismatch("the model's parameter count differs from the plan's")
        return out

    def _logistic_sum(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """:meth:`_general_sum` for logistic regression (one Linear layer, one logit) on the
        CPU, in numpy (a step's arrays are a few hundred rows, where torch's per-operation
        overhead is most of the time): every element goes through the same IEEE operations
        in the same order as :func:`row_signals` and :meth:`contributions`, so the int64 S
        is the same (tests/unit/test_exact_net.py compares the two paths and pins the
        golden sums). Where it takes a shorter route to the same bits, the comment says why
        they are equal. Rows are processed in the same chunks, so a refusal (PlanMismatch,
        GuardFailed) is raised by the same chunk."""
        if not isinstance(self.module, Logistic):
            raise PlanMismatch("the logistic path needs logistic regression")
        wb, bits = _layer_grid_np(self.module.linear, room=self._room)
        rows = x.shape[0]
        if rows == 0:
            return torch.zeros(self.parameters, dtype=torch.int64)
        # float32 (the data's type) or float64 as they are; anything else widened first
        if x.dtype not in (torch.float32, torch.float64):
            x = x.double()
        features = x.detach().numpy()
        labels = y.detach().double().numpy()
        scale = pow2(-(FEATURE_BITS + bits))  # row_signals' logit scaling 2^-(c + b)
        chunk_sums = [
            self._logistic_chunk(
                features[start : start + self._chunk],
                labels[start : start + self._chunk],
                wb,
                scale,
            )
            for start in range(0, rows, self._chunk)
        ]
        out = _round_np_chunk_sums(chunk_sums, FEATURE_BITS)
        if out.shape != (self.parameters,):
            raise PlanMismatch("the model's parameter count differs from the plan's")
        return out

    def _logistic_chunk(
        self,
        features: npt.NDArray[np.floating],
        labels: npt.NDArray[np.float64],
        wb: npt.NDArray[np.float64],
        scale: float,
    ) -> npt.NDArray[np.float64]:
        """One chunk's exact Σ_i V_i·[A_i, 2^18] (float64 integers, (d + 1,)) for
        :meth:`_logistic_sum`, ``scale`` = 2^-(18 + b) for the parameters' grid 2^-b."""
        d = features.shape[1]
        # The column 2^18 of [A, 2^18] is kept apart (contiguous arrays: numpy's fast
        # loops); the sums below that include it are exact integer sums, the same in any
        # order or grouping (ii).
        a = _features_on_grid(features)
        # ‖[A, 2^18]‖² = Σ_j A_j² + 2^36, an exact integer sum (≤ 2^14·2^36 < 2^52: (ii)),
        # as _norm_sq_bounded. clamp maps ±inf into [0, 1], so a row's only non-finite
        # value is NaN, and its squared norm is NaN exactly when one of its entries is (the
        # others are bounded): finite(a2) is row_signals' isfinite(A).all(1).
        a2 = np.vecdot(a, a)
        a2 += _P_C * _P_C
        valid = np.isfinite(a2)
        valid &= np.isfinite(labels)
        invalid = None if np.logical_and.reduce(valid) else ~valid
        if invalid is not None:  # masked_fill(invalid, 0): zero rows (2^18 too), zero norms
            a[invalid] = 0.0
            a2[invalid] = 0.0
        ones = None if invalid is None else np.where(valid, _P_C, 0.0)
        # Z = A·W_int + 2^18·b_int: integers, partial sums ≤ 2^52, exact in any order.
        logit = a @ wb[:d]
        logit += _P_C * wb[d] if ones is None else ones * wb[d]
        logit *= scale
        # σ̃: fixed_point's CPU kernel for one block (a chunk's ≤ 1024 rows are one block
        # of sigmoid_basic's loop: the same operations), in place
        b = _sigmoid_block(logit, logit)
        b -= labels  # b = round((σ̃ − y)·2^20), torch.round and rint: half to even
        b *= _P_GRAD
        np.rint(b, out=b)
        if invalid is not None:
            b[invalid] = 0.0
        # contributions(): n² = b2·a2·2^-2(20+c) and r² = a2·(¼·1)·2^-2c (0 + u = u for
        # u ≥ 0); a2·¼·2^-36 = a2·2^-38, both scalings exact (a2 = 0 or a2 ≥ 2^36).
        norm = _column_norm_sq(b)
        norm *= a2
        norm *= _P_INV_GRAD * _P_INV_GRAD * _P_INV_C * _P_INV_C  # 2^-76, exact
        np.sqrt(norm, out=norm)
        norm *= _UP
        slack = a2 * (0.25 * _P_INV_C * _P_INV_C)  # 2^-38, exact
        np.sqrt(slack, out=slack)
        slack *= _UP
        # w = clamp((t − slack)/norm, 0, units) = min(max(·, 0), units), NaN kept by both
        w = np.subtract(self._target, slack, out=slack)
        with np.errstate(divide="ignore", invalid="ignore"):
            w /= norm
        np.maximum(w, 0.0, out=w)
        np.minimum(w, self._units, out=w)
        if invalid is not None:  # where(valid, w, 0)
            w[invalid] = 0.0
        v = np.multiply(b, w, out=w)  # V = round(b·w·2^-20)
        v *= _P_INV_GRAD
        np.rint(v, out=v)
        total = _column_norm_sq(v)
        total *= a2
        total *= _P_INV_C * _P_INV_C  # 2^-36, exact
        total *= _UP
        if np.logical_or.reduce(total > self._limit):
            raise GuardFailed(f"{self.label}: a row's contribution exceeds its bound")
        # Σ_i V_i·[A_i, 2^18]: exact integer products and sums (ii); the last entry as
        # 2^18·Σ_i V_i (valid rows) is the same exact integer.
        total_ones = np.add.reduce(v) * _P_C if ones is None else v @ ones
        return np.concatenate((v @ a, [total_ones]))

    def _mlp_sum(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """:meth:`_general_sum` for MLPs (tanh or ReLU, any depth, 1 or K logits) on the CPU, in
        numpy, as :meth:`_logistic_sum` is for logistic regression: every element goes
        through the same IEEE operations in the same order as :func:`row_signals` and
        :meth:`contributions` (tanh̃ through fixed_point.tanh_grid_block, whose shorter
        route is argued there), so the int64 S is the same bits
        (tests/unit/test_exact_net.py compares the two paths on awkward rows and pins the
        golden sums). Why it is faster: up to the chunk's sum every quantity of a row is
        a function of that row alone (the module docstring), so a chunk is worked through
        in blocks of rows of about `_MLP_BLOCK` values (:meth:`_mlp_rows`), each
        block's forward, backward, norms and weights in L2/L3 cache, with numpy's lower
        per-call cost; blocking changes no bit, since no value of one row enters another
        row's. Chunks, their sums and the rounding are :meth:`_general_sum`'s, and the
        refusals (PlanMismatch, GuardFailed) come from the same chunk."""
        linears, activation = _linears(self.module)
        layers = [
            _NpLayer.of(layer, room=room, in_bits=FEATURE_BITS if index == 0 else HIDDEN_BITS)
            for index, (layer, room) in enumerate(zip(linears, _rooms(self.module), strict=True))
        ]
        rows = x.shape[0]
        if rows == 0:
            return torch.zeros(self.parameters, dtype=torch.int64)
        if x.dtype not in (torch.float32, torch.float64):
            x = x.double()
        features = x.detach().numpy()
        labels = y.detach().double().numpy()
        relu = activation == "relu"
        chunk_sums = [
            self._mlp_chunk(
                features[start : start + self._chunk],
                labels[start : start + self._chunk],
                layers,
                relu=relu,
            )
            for start in range(0, rows, self._chunk)
        ]
        out = torch.cat(
            [
                _round_np_chunk_sums([sums[index] for sums in chunk_sums], layer.in_bits)
                for index, layer in enumerate(layers)
            ]
        )
        if out.shape != (self.parameters,):
            raise PlanMismatch("the model's parameter count differs from the plan's")
        return out

    def _mlp_chunk(
        self,
        features: npt.NDArray[np.floating],
        labels: npt.NDArray[np.float64],
        layers: list[_NpLayer],
        *,
        relu: bool,
    ) -> list[npt.NDArray[np.float64]]:
        """One chunk's exact Σ_i V_l,i ⊗ [A_l, 2^c_l]_i per layer, flattened as
        :meth:`_general_sum` flattens it (the weights row by row, then the bias column):
        float64 integers."""
        a = _features_on_grid(features)
        rows = a.shape[0]
        # ‖[A, 2^18]‖² = Σ_j A_j² + 2^36, an exact integer sum (_norm_sq_bounded; d + 1 ≤
        # 2^14 by _mlp_numpy_supports); finite exactly where row_signals' isfinite(A).all(1)
        # is (clamp leaves NaN as the only non-finite value: _logistic_chunk)
        a2 = np.vecdot(a, a)
        a2 += _P_C * _P_C
        valid = np.isfinite(a2)
        valid &= np.isfinite(labels)
        classes = layers[-1].weight.shape[0]
        if classes > 1:  # row_signals' class_labels_valid: the same exact comparisons
            valid &= labels == np.floor(labels)
            valid &= labels >= 0
            valid &= labels < classes
        # The columns of A that are 0 on every row of the chunk (most one-hot features of a
        # few hundred rows) are left out of both products with A: each of their terms is
        # 0·W = ±0 in an exact integer sum, so every sum is the same integer; a zero sum may
        # flip the sign of its 0, which nothing after sees (|·|, squares and the tests
        # ≥ 0, > 0 agree on ±0; a ±0 term in a later exact sum is the same case again; the
        # final ⌊(t + 2^(c−1))·2^-c⌋ is 0 for both). NaN ≠ 0: a NaN column is kept.
        used = np.flatnonzero(np.logical_or.reduce(a != 0, axis=0))
        compact = a[:, used]
        first = _matmul(compact, layers[0].weight[:, used].T)
        first += layers[0].bias  # [A, 2^18]·[W_int, b_int]ᵀ: the same exact integers (ii)
        hidden = [np.empty((rows, layer.weight.shape[0])) for layer in layers[:-1]]
        scaled = [np.empty((rows, layer.weight.shape[0])) for layer in layers]
        total = np.empty(rows)
        step = max(1, _MLP_BLOCK // max(layer.weight.shape[0] for layer in layers))
        for start in range(0, rows, step):
            block = slice(start, start + step)
            with np.errstate(all="ignore"):  # NaN/inf only on rows found invalid
                self._mlp_rows(
                    first[block],
                    a2[block],
                    valid[block],
                    labels[block],
                    layers,
                    relu=relu,
                    hidden=[h[block] for h in hidden],
                    scaled=[v[block] for v in scaled],
                    total=total[block],
                )
        # contributions()' check, after every norm of the chunk as there
        if np.logical_or.reduce(total * _UP > self._limit):
            raise GuardFailed(f"{self.label}: a row's contribution exceeds its bound")
        if not np.logical_and.reduce(valid):  # masked_fill(invalid, 0) of the features
            compact[~valid] = 0.0  # (the hidden values are zeroed already)
        sums = []
        for index, (v, layer) in enumerate(zip(scaled, layers, strict=True)):
            # Σ_i V_i ⊗ [A_i, 2^c]: exact integer products and sums (ii); the last column
            # as 2^c·Σ_i V_i (V_i = 0 on invalid rows) is the same exact integer: its
            # partial sums are those of the products V_i·2^c divided by 2^c.
            if index == 0:  # the columns left out above sum to 0
                weights = np.zeros(layer.weight.shape)
                weights[:, used] = _outer_sum(v, compact)
            else:
                weights = _outer_sum(v, hidden[index - 1])
            bias = np.add.reduce(v, axis=0)
            bias *= pow2(layer.in_bits)
            sums.append(np.concatenate((weights.reshape(-1), bias)))
        return sums

    def _mlp_rows(
        self,
        first: npt.NDArray[np.float64],
        a2: npt.NDArray[np.float64],
        valid: npt.NDArray[np.bool_],
        labels: npt.NDArray[np.float64],
        layers: list[_NpLayer],
        *,
        relu: bool,
        hidden: list[npt.NDArray[np.float64]],
        scaled: list[npt.NDArray[np.float64]],
        total: npt.NDArray[np.float64],
    ) -> None:
        """One block of rows of :meth:`_mlp_chunk`: row_signals then contributions, in
        numpy, writing the hidden activations (zeroed on invalid rows), the V_l and the
        rows' U_i/(1 + 2^-40) into the chunk's arrays and updating ``valid`` and ``a2`` (views
        of the chunk's); ``first`` holds the block's layer-0 numerators Z (the chunk's one
        product). Each step names the general path's operation it repeats; the tanh
        backward and the scaling of the clipped rows run as compiled loops of the same
        operations (fixed_point._tanh_backward_kernel, _scale_rows_kernel)."""
        last = len(layers) - 1
        z = inputs = first
        numerators = []
        for index, layer in enumerate(layers):
            if index > 0:
                # [A, 2^c]·[W_int, b_int]ᵀ as A·W_intᵀ + 2^c·b_int: the same exact integer (ii);
                # one output (the logit) as each row's dot product with the weight row, the
                # same exact integer again (any order, (ii)), in ≈ 5 µs per block of 16 rows
                # of 1024 instead of MKL's ≈ 18 µs for the (16, 1024)·(1024, 1) product
                if layer.weight.shape[0] == 1:
                    z = np.vecdot(inputs, layer.weight[0])[:, None]
                else:
                    z = _matmul(inputs, layer.weight.T)
                z += layer.bias
            if index == last:
                break
            numerators.append(z)
            shift = -(layer.in_bits + layer.bits)
            h = hidden[index]
            if relu:  # round(clamp(Z, min=0)·2^(shift + 16)); max ≤ 2^24 (NaN: invalid)
                np.maximum(z, 0.0, out=h)
                h *= pow2(shift + HIDDEN_BITS)
                np.rint(h, out=h)
                valid &= np.maximum.reduce(h, axis=1) <= pow2(HIDDEN_BITS + RELU_RANGE_BITS)
            else:
                tanh_grid_block(z, scale_bits=shift, out_bits=HIDDEN_BITS, out=h)
            inputs = h
        out_layer = layers[last]
        scale = pow2(-(out_layer.in_bits + out_layer.bits))
        grads: list[npt.NDArray[np.float64]]
        if z.shape[1] == 1:
            logit = z[:, 0] * scale
            b = _sigmoid_block(logit, logit)  # σ̃ (one block, the same operations), in place
            b -= labels  # round((σ̃ − y)·2^20), half to even
            b *= _P_GRAD
            np.rint(b, out=b)
            grads = [b[:, None]]
        else:  # K classes: row_signals' softmax_residuals itself, on these rows (no copy)
            b = softmax_residuals(
                torch.from_numpy(z * scale), torch.from_numpy(labels), torch.from_numpy(valid)
            ).numpy()
            grads = [b]
        largest: list[npt.NDArray[np.float64]] = []
        grad_limit = pow2(GRAD_BITS + GRAD_RANGE_BITS)
        rows = first.shape[0]
        # tanh: each layer's Σ_k T² and each hidden layer's Σ_k H², per row, from the
        # backward kernel (used below where they are exact integer sums)
        grad_sums: list[npt.NDArray[np.float64]] = []
        hidden_sums: list[npt.NDArray[np.float64]] = []
        for index in range(last, 0, -1):
            layer = layers[index]
            upper = grads[0]
            # T = B·W_int: for one output a single product per element (one rounding, as
            # the matrix product's; exact on a valid row), else a product of integers (ii)
            outer = upper.shape[1] == 1
            if relu:  # round(T·2^-b)·[Z > 0]
                t = upper * layer.weight if outer else _matmul(upper, layer.weight)
                t *= pow2(-layer.bits)
                np.rint(t, out=t)
                t *= numerators[index - 1] > 0
                # max|B| ≤ L ⇔ max B ≤ L and min B ≥ −L (NaN compares false both ways);
                # the row maxima serve norm_sq_upper below
                top = np.maximum.reduce(np.abs(t), axis=1)
            else:
                # round(T·(2^32 − H²)·2^-(b + 32)); 2^32 − H² exact (|H| ≤ 2^16), the row
                # maxima of |T| and the sums Σ T², Σ H² in one compiled loop
                # (fixed_point._tanh_backward_kernel: the same IEEE operations per element)
                h = hidden[index - 1]
                t = np.empty(h.shape) if outer else _matmul(upper, layer.weight)
                top = np.empty(rows)
                t_sq = np.empty(rows)
                h_sq = np.empty(rows)
                _tanh_backward_kernel(
                    t,
                    upper[:, 0] if outer else _NO_VALUES,
                    layer.weight[0] if outer else _NO_VALUES,
                    outer,
                    h,
                    pow2(2 * HIDDEN_BITS),
                    pow2(-(layer.bits + 2 * HIDDEN_BITS)),
                    top,
                    t_sq,
                    h_sq,
                )
                grad_sums.insert(0, t_sq)
                hidden_sums.insert(0, h_sq)
            valid &= top <= grad_limit
            grads.insert(0, t)
            largest.insert(0, top)
        invalid = None if np.logical_and.reduce(valid) else ~valid
        if invalid is not None:  # masked_fill(invalid, 0)
            a2[invalid] = 0.0
            for v in (*hidden, *grads, *largest):
                v[invalid] = 0.0
        # contributions(): the inputs' norms (_input_norm_sq), the grads' (norm_sq_upper)
        in_sq = [a2]
        for index, h in enumerate(hidden):
            if relu:
                column = (
                    pow2(HIDDEN_BITS)
                    if invalid is None
                    else np.where(valid, pow2(HIDDEN_BITS), 0.0)
                )
                in_sq.append(
                    _norm_sq_upper_np(np.column_stack((h, np.broadcast_to(column, valid.shape))))
                )
            else:  # ‖[H, 2^16]‖² = Σ H² + 2^32, exact (_norm_sq_bounded)
                # Σ H² from the backward kernel: on a valid row an exact integer sum
                # (|H| ≤ 2^16, width + 1 ≤ 2^18: _mlp_numpy_supports), so np.vecdot's bits
                # in any order; the invalid rows' H are zeroed, as their sums here
                h2 = hidden_sums[index]
                if invalid is not None:
                    h2[invalid] = 0.0
                h2 += (
                    pow2(2 * HIDDEN_BITS)
                    if invalid is None
                    else np.where(valid, pow2(2 * HIDDEN_BITS), 0.0)
                )
                in_sq.append(h2)
        if relu:
            grad_sq = [
                _norm_sq_upper_np(g, top) for g, top in zip(grads[:-1], largest, strict=True)
            ]
        else:
            grad_sq = [
                _norm_sq_from_sums(g, top, sq, invalid)
                for g, top, sq in zip(grads[:-1], largest, grad_sums, strict=True)
            ]
        grad_sq.append(_column_norm_sq(b) if b.ndim == 1 else _norm_sq_upper_np(b))
        n_sq = np.zeros_like(a2)
        r_sq = np.zeros_like(a2)
        for a_sq, b_sq, g, layer in zip(in_sq, grad_sq, grads, layers, strict=True):
            c = layer.in_bits
            n_sq = n_sq + b_sq * a_sq * pow2(-2 * (GRAD_BITS + c))
            r_sq = r_sq + a_sq * (0.25 * g.shape[1]) * pow2(-2 * c)
        norm = np.sqrt(n_sq) * _UP
        slack = np.sqrt(r_sq) * _UP
        with np.errstate(divide="ignore", invalid="ignore"):
            w = (self._target - slack) / norm
        np.maximum(w, 0.0, out=w)  # clamp(·, 0, units), NaN kept
        np.minimum(w, self._units, out=w)
        if invalid is not None:
            w[invalid] = 0.0
        sums = np.zeros_like(a2)
        for index, (g, a_sq, layer) in enumerate(zip(grads, in_sq, layers, strict=True)):
            # round(B·w·2^-20) with the row maxima of |V| and Σ V² in one compiled loop
            # (fixed_point._scale_rows_kernel: the same IEEE operations per element)
            v = scaled[index]
            top = np.empty(rows)
            sq = np.empty(rows)
            _scale_rows_kernel(g, w, _P_INV_GRAD, v, top, sq)
            one_logit = index == last and v.shape[1] == 1
            v_sq = _column_norm_sq(v[:, 0]) if one_logit else _norm_sq_from_sums(v, top, sq, None)
            sums = sums + v_sq * a_sq * pow2(-2 * layer.in_bits)
        total[:] = sums


@dataclass(frozen=True)
class _NpLayer:
    """A :class:`LayerGrid` for :meth:`ExactNetClipper._mlp_sum`: W_int (d_out, d_in) and
    2^c·b_int (exact: a power-of-two scaling of an integer ≤ 2^m) as numpy arrays."""

    weight: npt.NDArray[np.float64]
    bias: npt.NDArray[np.float64]
    bits: int
    in_bits: int

    @classmethod
    def of(cls, layer: torch.nn.Linear, *, room: int, in_bits: int) -> _NpLayer:
        """:func:`layer_grids`' grid of one layer (``room``: its m_l), in numpy."""
        d_out, d_in = layer.weight.shape
        theta, bits = _layer_grid_np(layer, room=room)
        bias = theta[d_out * d_in :] * pow2(in_bits)
        return cls(theta[: d_out * d_in].reshape(d_out, d_in), bias, bits, in_bits)


def _matmul(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """a @ b through torch (no copies): torch's BLAS keeps torch's thread setting, where
    numpy's OpenBLAS spins its own threads (≈ 100× slower on small products on a busy
    machine). The operands are integer-valued with partial sums ≤ 2^52, so the product is
    the same exact integers whatever kernel computes it (ii)."""
    return (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()


def _outer_sum(v: npt.NDArray[np.float64], a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Σ_i v_i ⊗ a_i = vᵀ·a for v (rows, d_out) and a (rows, d_in), computed as (aᵀ·v)ᵀ: the
    same exact integers (every term and partial sum an integer ≤ 2^52, so any order gives
    them, (ii)), a transposed view of a C-ordered (d_in, d_out) product. Why: vᵀ of a
    C-ordered v whose width is a power of two (256, 1024) is a column-major operand with a
    power-of-two leading dimension, on which MKL's kernel measured 8-40 ms for one
    1024 × 256 × 72 product on this machine (cache-set conflicts) against ≈ 4 ms for the
    same product as aᵀ·v (benchmarks/results/dpsgd_widths.md)."""
    return _matmul(a.T, v).T


def _mlp_numpy_supports(module: torch.nn.Module) -> bool:
    """Whether :meth:`ExactNetClipper._mlp_sum` computes ``module``: an MLP (one logit or K)
    whose feature norms take _norm_sq_bounded (d + 1 ≤ 2^14) and, for tanh, whose hidden
    layers' too (width + 1 ≤ 2^18); the general path takes the others."""
    if not isinstance(module, Mlp):
        return False
    layers, activation = _linears(module)
    if len(layers) < 2:
        return False
    if _half_bits(layers[0].weight.shape[1] + 1) < FEATURE_BITS + 1:
        return False
    return activation == "relu" or all(
        _half_bits(layer.weight.shape[0] + 1) >= HIDDEN_BITS + 1 for layer in layers[:-1]
    )


def _norm_sq_upper_np(
    v: npt.NDArray[np.float64], largest: npt.NDArray[np.float64] | None = None
) -> npt.NDArray[np.float64]:
    """:func:`norm_sq_upper` of integer-valued v (rows, width) in numpy, the same operations
    (``largest``: the row maxima of |v| when the caller has them). When every row's
    maximum is below 2^h, every shift s is 0, q = |v| and U = Σ q²·1 = Σ v², the same exact
    integer sum, without the scaling (a NaN maximum takes the general branch)."""
    rows, width = v.shape
    half = _half_bits(width)
    magnitude = None
    if largest is None:
        magnitude = np.abs(v)
        largest = np.maximum.reduce(magnitude, axis=1) if width else np.zeros(rows)
    if not rows or np.maximum.reduce(largest) < pow2(half):
        return np.vecdot(v, v)
    _, exponent = np.frexp(largest)
    shift = np.maximum(exponent.astype(np.int64) - half, 0)
    if int(shift.max()) > 31:  # 4^s must stay an exact int64 shift
        raise PlanMismatch("a value exceeded the exact engine's range")
    magnitude = np.abs(v) if magnitude is None else magnitude
    q = np.ceil(np.ldexp(magnitude, -shift[:, None]))  # exact scaling, ceiling
    return np.ldexp(np.vecdot(q, q), 2 * shift)


def _norm_sq_from_sums(
    v: npt.NDArray[np.float64],
    largest: npt.NDArray[np.float64],
    sums: npt.NDArray[np.float64],
    invalid: npt.NDArray[np.bool_] | None,
) -> npt.NDArray[np.float64]:
    """:func:`_norm_sq_upper_np` (v, largest) for integer-valued v (rows ≥ 1, width) whose
    row sums Σ_k v² a compiled kernel has already formed (``sums``; ``invalid``: the rows
    zeroed in v and ``largest`` after the kernel ran, whose sums are set to 0 here, in
    place). Where every row's maximum is below 2^h, _norm_sq_upper_np returns np.vecdot(v, v):
    every square is an integer ≤ 2^2h and every partial sum ≤ width·2^2h ≤ 2^52, exact in any
    order, so the kernel's sums are those bits. Otherwise (or a NaN maximum) the general
    branch, unchanged."""
    if np.maximum.reduce(largest) < pow2(_half_bits(v.shape[1])):
        if invalid is not None:
            sums[invalid] = 0.0
        return sums
    return _norm_sq_upper_np(v, largest)


def _features_on_grid(features: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """A = trunc(clamp(x, 0, 1)·2^18) as float64, computed in the features' own type
    (float32, the data's, or float64) then widened: clamp (min(max(x, 0), 1), NaN kept, as
    torch.clamp), the product by 2^18 (no overflow after the clamp) and the truncation are
    exact in float32 as in float64, and the widening is exact, so the values are
    row_signals'. A fresh array."""
    low = np.maximum(features, 0.0)
    np.minimum(low, 1.0, out=low)
    np.multiply(low, _P_C, out=low)
    np.trunc(low, out=low)
    return low.astype(np.float64, copy=False)


def _layer_grid_np(layer: torch.nn.Linear, *, room: int) -> tuple[npt.NDArray[np.float64], int]:
    """[W_int, b_int] as one float64 vector (d_out·d_in + d_out,: W row by row, then b)
    and the grid's b: :func:`layer_grids`' layer for ``room`` (its m_l; logistic
    regression's 52 − 18 − ⌈log₂(d + 1)⌉) and
    :func:`~worker.mechanisms.fixed_point.parameters_on_grid`'s operations (widening, |·|,
    max, frexp, ×2^b, round half to even), in numpy."""
    weight = layer.weight.detach().numpy().reshape(-1)
    bias = (
        layer.bias.detach().numpy() if layer.bias is not None else np.zeros(layer.weight.shape[0])
    )
    theta = np.concatenate((weight, bias), dtype=np.float64)  # widening: exact
    largest = float(np.maximum.reduce(np.abs(theta)))
    if not math.isfinite(largest):
        raise PlanMismatch("the model's parameters are not finite")
    exponent = math.frexp(largest)[1] if largest > 0 else -MAX_GRID_BITS
    bits = min(room - exponent, MAX_GRID_BITS)
    theta *= pow2(bits)
    return np.rint(theta, out=theta), bits


def _column_norm_sq(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """:func:`norm_sq_upper` of one column (rows, 1) of grid values, in numpy: h = 26,
    s = max(0, e − 26) per row (frexp's e: |v| < 2^e), q = ⌈|v|·2^-s⌉, U = q²·4^s (q² ≤ 2^52,
    exact). When every |v| < 2^26, every s is 0, q = |v| (an integer) and U = v·v, the same
    bits (a NaN or ±inf has frexp exponent 0: s = 0 and U = v·v too, but a NaN hides the
    other values' maximum, so a NaN or any |v| ≥ 2^26 takes the general branch)."""
    magnitude = np.abs(v)
    if not v.shape[0] or np.maximum.reduce(magnitude) < _COLUMN_RANGE:
        return v * v
    _, exponent = np.frexp(magnitude)
    shift = np.maximum(exponent.astype(np.int64) - _half_bits(1), 0)
    if int(shift.max()) > 31:  # 4^s must stay an exact int64 shift
        raise PlanMismatch("a value exceeded the exact engine's range")
    q = np.ceil(np.ldexp(magnitude, -shift))
    return np.ldexp(q * q, 2 * shift)


def _round_np_chunk_sums(chunks: list[npt.NDArray[np.float64]], c: int) -> torch.Tensor:
    """:meth:`ExactNetClipper._general_sum`'s rounding of the numpy paths' chunk sums (exact
    integers, float64): one chunk as ⌊(t + 2^(c−1))·2^-c⌋ in float64, in place, each step
    exact (__call__), several through :func:`_round_chunk_sums`."""
    if len(chunks) == 1:
        t = chunks[0]
        t += pow2(c - 1)
        t *= pow2(-c)
        return torch.from_numpy(np.floor(t, out=t).astype(np.int64))
    return _round_chunk_sums([torch.from_numpy(t) for t in chunks], c)


def _round_chunk_sums(chunks: list[torch.Tensor], c: int) -> torch.Tensor:
    """⌊(Σ t + 2^(c−1))/2^c⌋ in int64 for chunk sums t (exact integers, |t| ≤ 2^52):
    t = h·2^c + l with 0 ≤ l < 2^c, H = Σ h and L = Σ l in int64, then H + ⌊(L + 2^(c−1))/2^c⌋."""
    high = torch.zeros(chunks[0].shape, dtype=torch.int64, device=chunks[0].device)
    low = torch.zeros_like(high)
    for t_float in chunks:
        t = t_float.to(torch.int64)
        h = torch.div(t, 1 << c, rounding_mode="floor")
        high += h
        low += t - h * (1 << c)
    return high + torch.div(low + (1 << (c - 1)), 1 << c, rounding_mode="floor")
