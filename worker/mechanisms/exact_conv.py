"""DP-SGD's clipped sum for CNNs (``kind: cnn``, issue 20) from IEEE-754 arithmetic alone
(issue 25): every row's clipped contribution is a function of that row and the public
parameters, bit for bit, whatever else is in the batch and wherever the row sits, and the
sum over rows is an exact int64 sum. The sensitivity proof assumes only that float64 +,
−, ×, ÷, √ are correctly rounded (IEEE-754), with no measured property of a kernel.

The route is :mod:`worker.mechanisms.exact_net`'s (route (a) of issue 25: exact fixed-point
arithmetic through the network), with the facts (i)-(iv) its docstring states: (i)
elementwise basic operations, exact power-of-two scalings (``pow2``, ``pow2_tensor``),
rounding to an integer, max/min and comparisons give the same bits in any lane, position
or batch (IEEE-754 §5; eager torch runs each as its own kernel, no FMA joins two); (ii) a
sum of integer-valued float64 terms whose partial sums all stay ≤ 2^52 in magnitude is
exact in any order and association, so a matrix product, a fold or a row sum of such
terms is the same whatever kernel, blocking or thread split computes it; (iii) a maximum
is exact in any order; (iv) int64 sums are exact below 2^63. A "grid value" is an
integer-valued float64 n standing for n·2^-g on a public grid 2^-g.

* **Convolution as unfold + matrix product.** Layer l's input A_l (rows, C, H, W) holds
  grid values on 2^-c_l with |A_l| ≤ 2^(c_l + r_l). Unfolding (im2col: :func:`_patches`,
  a strided view of the zero-padded maps copied into place) copies entries and zeros
  (padding) into patches (rows, L, C·k²) — no arithmetic — and a column 2^c_l is
  appended for the bias. The public weights and bias are on the grid 2^-b_l with
  |W_int| ≤ 2^m_l (:func:`conv_grids`, exact_net's fixed_point.parameters_on_grid), so
  Z = [P, 2^c]·[W_int, b_int]ᵀ has partial sums ≤ (C·k² + 1)·2^(c_l + r_l + m_l) ≤ 2^52:
  exact (ii). The head is the same with one "position" (L = 1) on the flattened maps.
* **ReLU, exact.** a = round(max(Z, 0)·2^(16 − c_l − b_l)) on 2^-16 (elementwise, i);
  the decision Z > 0 is on the exact numerator, so a row on a unit's boundary decides the
  same way in every batch (issue 25's construction). A row with an activation above
  2^(16 + 8) is *invalid* (below). Features: x ∈ [0, 1] clamped, A_0 = trunc(x·2^18)
  (c_0 = 18, r_0 = 0); later layers r_l = 8.
* **Average pooling by an exact power-of-two scale.** The 2 × 2 mean of four activations
  on 2^-16 is their integer sum read on the grid 2^-18: four integers ≤ 2^24, a sum
  ≤ 2^26, exact (ii), and the division by 4 is the change of grid, no rounding. The next
  layer's c = 18 (16 without pooling) and its inputs are ≤ 2^(c + 8) either way.
* **Output.** Logits z = Z_head·2^-(c + b) (exact scaling). Binary: σ̃(z) by
  fixed_point.sigmoid_basic (elementwise, basic operations only); K ≥ 3 classes: p̃ by
  fixed_point.softmax_basic (row maximum (iii), exp from basic operations, a sum in the
  fixed class order, one quotient per entry: a per-row sequence whose order never depends
  on the batch). Residual B_head = round((p̃ − e_y)·2^20) (GRAD_BITS), |B_head| ≤ 2^20.
* **Backward.** Through a layer with output gradients B (grid 2^-20, |B| ≤ 2^26 on a valid
  row): T = B·W_int (partial sums ≤ c_out·2^(26 + m)), then for a convolution folding
  (col2im: :func:`_fold`, k² shifted adds into a zeroed map) adds the ≤ k² patch entries
  that cover each input position: in all a sum of ≤ c_out·k² integer products
  ≤ 2^(26 + m), so m ≤ 52 − 26 − ⌈log₂(c_out·k²)⌉ (the
  backward room of :func:`conv_grids`) keeps it exact (ii) in any order. Pooling's
  backward copies each entry to its four inputs (no arithmetic) and scales by 2^-2 (the
  mean's 1/4, folded into the next rounding); a position dropped by the floor of pooling
  gets 0. The previous layer's B = round(T·2^-(b + 2·pool))·[Z > 0] (elementwise, i); a
  row with |B| > 2^26 is invalid. Rounding treats the grids' rounding as the identity
  (as exact_net does): the result is the gradient of the float network up to the grids.
* **Per-row gradients, exact.** A convolution's gradient for row i is
  Σ_pos B[pos] ⊗ [P, 2^c][pos]·2^-(20 + c), not of rank one, so it is materialised per row.
  Its terms reach 2^52 and L of them would not be exact, so each row's B and patches are
  moved to a coarser power-of-two grid *of that row's own*: s = max(0, e − h) with
  max |v_row| < 2^e (frexp, exact), v' = round(v·2^-s) with |v'| ≤ 2^h, h_B + h_P ≤
  52 − ⌈log₂ L⌉; then G' = B'ᵀ·P' is a per-row matrix product (``bmm``) with partial sums
  ≤ L·2^(h_B + h_P) ≤ 2^52: exact (ii). The shifts are functions of the row alone (iii),
  so G' and its scale 2^(s_B + s_P − 20 − c) are too. (Precision: about 2^-h relative,
  h ≈ (52 − ⌈log₂ L⌉)/2: 2^-23 for the digits' 64 positions.)
* **Invalid rows** (a non-finite feature, a label outside {0, 1} or [0, K), a bound above
  exceeded) are decided by exact comparisons on the row's own exact values; their
  activations and gradients are zeroed as soon as they are found and their contribution
  is exactly 0.
* **Clipping and rounding to the integer grid, row by row.** N̂_i = √(Σ_l U(G'_l)·
  4^(s_B + s_P)·2^-2(20 + c_l))·(1 + 2^-40) ≥ ‖g_i‖ (U = exact_net.norm_sq_upper, an
  upper bound from exact integer sums; a few correctly rounded operations of relative
  error 2^-53, which 1 + 2^-40 covers). w_i = min(2^k/C, (2^k·(1 − 2^-20) − √P)/N̂_i)
  (0 for an invalid row), and row i's contribution in noise-grid units is the integer
  vector z_i = round(G'_l·(w_i·2^(s_B + s_P − 20 − c_l))) per layer (elementwise, i), so
  ‖z_i‖ ≤ w_i·‖g_i‖ + √P/2 < 2^k. This is *checked exactly* on the integers, whatever
  the floats above did: max |z_i| ≤ 2^k (iii), then Σ_j z_ij² in int64 (each term
  ≤ 2^2k ≤ 2^40, P ≤ 2^20 terms: < 2^63, exact, iv) ≤ 2^2k, else the job fails
  (GuardFailed: only a wrong weight could do it, whatever the data).
* **Sum.** S = Σ_i z_i in int64, exact (iv): |z_ij| ≤ 2^20 and at most 2^24 rows.

**Sensitivity.** z_i depends on row i and the public parameters alone (every step above
is elementwise, a per-row sequence of fixed order, or an exact integer sum), and
‖z_i‖₂ ≤ 2^k is enforced exactly. S is their exact sum, so adding one row x* changes S by
exactly z_*: ‖S(D + x*) − S(D)‖₂ = ‖z_*‖₂ ≤ 2^k, i.e. ≤ C in gradient units, with no
rounding term (the rounding happened row by row). The noise stage
(worker/mechanisms/dpsgd.py) adds integer Gaussian noise of scale σ·2^k: the Gaussian
mechanism with sensitivity 2^k, post-processed. No drift term, no float-summation term,
no assumption beyond (i)-(iv).

Ghost clipping and JL for convolutions are not built (the plan refuses them, 422);
normalisation layers are refused by the model spec (batchnorm mixes rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import torch
from torch.nn import functional as F

from service.modelspec import MAX_CNN_PARAMETERS
from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.exact_net import FEATURE_BITS, GRAD_BITS, norm_sq_upper
from worker.mechanisms.fixed_point import (
    parameters_on_grid,
    pow2,
    pow2_tensor,
    sigmoid_basic,
    softmax_basic,
)
from worker.mechanisms.guards import GuardFailed, positive_finite
from worker.models.cnn import Cnn

__all__ = ["ConvRows", "ExactConvClipper", "LayerGrid", "conv_grids", "conv_rows", "row_gradients"]

HIDDEN_BITS: Final[int] = 16
"""ReLU activations on the grid 2^-16 (2^-18 after 2 × 2 pooling)."""
POOL_BITS: Final[int] = 2
"""2 × 2 average pooling: the sum of four read on a grid 2^2 finer."""
RELU_RANGE_BITS: Final[int] = 8
"""A ReLU activation above 2^8 makes its row invalid."""
GRAD_RANGE_BITS: Final[int] = 6
"""An output gradient above 2^6 in magnitude makes its row invalid."""
ROW_LIMIT: Final[int] = 1 << 24
CHUNK_ELEMENTS: Final[int] = 1 << 24
"""Float64 values one chunk of rows may hold at once (service.methods.dpsgd's estimate)."""
_EXACT: Final[int] = 52  # partial sums of integers ≤ 2^52 < 2^53: exact in any order
_UP: Final[float] = 1.0 + 2.0**-40  # covers a few roundings of relative error 2^-53
_MARGIN: Final[float] = 2.0**-20


def _ceil_log2(n: int) -> int:
    return max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class LayerGrid:
    """One layer's public parameters on their grid: [W_int, b_int] (c_out, fan_in + 1)
    integer-valued float64 on 2^-bits; its inputs on 2^-in_bits; a convolution's
    ``kernel``, ``stride`` and ``padding`` (kernel 0 for the head) and ``pool``, whether
    2 × 2 pooling follows it."""

    theta: torch.Tensor
    bits: int
    in_bits: int
    kernel: int
    stride: int
    padding: int
    pool: bool


def conv_grids(module: Cnn) -> list[LayerGrid]:
    """Each layer's parameters on the grid 2^-b_l with |θ_int| ≤ 2^m_l, m_l from the forward
    room (fan_in + 1)·2^(c_l + r_l + m_l) ≤ 2^52 and, for every layer but the first (the
    backward passes through it to the layer below), c_out·k²·2^(20 + 6 + m_l) ≤ 2^52 (k = 1
    for the head). Public: a function of the parameters alone."""
    shapes = [(g.kernel, g.stride, g.padding, g.pool) for g in module.geometry]
    layers = [*zip(module.convs, shapes, strict=True), (module.head, (0, 1, 0, False))]
    grids = []
    in_bits, in_range, previous_pool = FEATURE_BITS, 0, False
    for index, (layer, (kernel, stride, padding, pool)) in enumerate(layers):
        if index > 0:
            in_bits = HIDDEN_BITS + (POOL_BITS if previous_pool else 0)
            in_range = RELU_RANGE_BITS
        weight, bias = layer.weight, layer.bias
        assert isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor)
        c_out = int(weight.shape[0])
        weight = weight.detach().reshape(c_out, -1)
        fan_in = int(weight.shape[1])
        room = _EXACT - (in_bits + in_range + _ceil_log2(fan_in + 1))
        if index > 0:
            spread = c_out * max(kernel, 1) ** 2
            room = min(room, _EXACT - (GRAD_BITS + GRAD_RANGE_BITS + _ceil_log2(spread)))
        w_int, b_int, bits = parameters_on_grid(weight, bias, range_bits=room)
        assert b_int is not None
        theta = torch.cat((w_int, b_int.unsqueeze(1)), dim=1)
        grids.append(
            LayerGrid(
                theta=theta,
                bits=bits,
                in_bits=in_bits,
                kernel=kernel,
                stride=stride,
                padding=padding,
                pool=pool,
            )
        )
        previous_pool = pool
    return grids


@dataclass(frozen=True)
class ConvRows:
    """One batch's per-row gradients: per layer G'_l (rows, c_out, fan_in + 1) exact
    integers, its per-row shift s_l (rows,) int64 (s_B + s_P, ≥ 0) and its inputs' grid
    bits c_l: g = G'·2^s·2^-(20 + c) in gradient units; ``valid`` (rows,) (invalid rows
    have G' = 0)."""

    grads: tuple[torch.Tensor, ...]
    shifts: tuple[torch.Tensor, ...]
    in_bits: tuple[int, ...]
    valid: torch.Tensor

    def scales(self, index: int, *, power: int = 1) -> torch.Tensor:
        """(rows,) float64 (2^s·2^-(20 + c))^power for layer ``index``, exactly: two exact
        power-of-two factors (every value is ≤ 2^26 on every row, zeroed where invalid, so
        each shift is ≤ 27 − 15 and power·s ≤ 62, pow2_tensor's range; beyond it the
        look-up fails the job)."""
        s, c = self.shifts[index], self.in_bits[index]
        return pow2_tensor(power * s) * pow2(-power * (GRAD_BITS + c))


def _row_shift(
    v: torch.Tensor, half: int, largest: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(v', s): each row of v (rows, …) on its own coarser grid, s = max(0, e − half) with
    max |v_row| < 2^e (frexp: exact), v' = round(v·2^-s), so |v'| ≤ 2^half (module
    docstring). Functions of the row alone. ``largest``, where the caller has it, is
    max |v_row| itself (the same value, so the same s), not recomputed."""
    rows = v.shape[0]
    if largest is None:
        largest = _largest_magnitude(v)
    _, exponent = torch.frexp(largest)
    shift = torch.clamp(exponent.to(torch.int64) - half, min=0)
    if rows == 0 or int(shift.max()) == 0:
        return v, shift  # round(v·2^0) = v for grid values, bit for bit (signed zeros too)
    scale = pow2_tensor(-shift).reshape(rows, *([1] * (v.dim() - 1)))
    return torch.round(v * scale), shift


def _largest_magnitude(v: torch.Tensor, *, dim: int = 0) -> torch.Tensor:
    """(rows,) max_j |v_ij| over each row of v, the rows along ``dim`` (a reduction over
    the other dimensions, whatever the layout), as max(max v, −min v) (no |v| written; the
    same value, exact (iii); NaN in a row gives NaN); 0 for an empty row."""
    others = tuple(i for i in range(v.dim()) if i != dim)
    if not v.numel():
        return v.new_zeros(v.shape[dim])
    return torch.maximum(v.amax(dim=others), -v.amin(dim=others))


def _per_row_gradient(
    b: torch.Tensor,
    p: torch.Tensor,
    b_largest: torch.Tensor | None = None,
    p_largest: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(G', s): Σ_pos B[pos] ⊗ P[pos] per row as an exact integer matrix G' (rows, c_out,
    fan_in + 1) times 2^-s (rows,), for B (rows, c_out, L) and P (rows, fan_in + 1, L)
    grid values (positions last; any strides: views of the channel-major maps), with
    their rows' max |·| where the caller has them (:func:`_row_shift`); G' is written
    into ``out`` (rows, c_out, fan_in + 1) where given."""
    budget = _EXACT - _ceil_log2(b.shape[2])
    b2, s_b = _row_shift(b, budget // 2, b_largest)
    p2, s_p = _row_shift(p, budget - budget // 2, p_largest)
    g = torch.bmm(b2, p2.transpose(1, 2), out=out)  # exact: partial sums ≤ L·2^budget ≤ 2^52
    return g, s_b + s_p


def _positive(z: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """[Z > 0] as float64 1.0/0.0 (a comparison written straight into ``out``, float64 of
    z's shape): the values a bool mask takes when a float64 product promotes it, so
    t·[Z > 0] is the same elementwise product (i), signed zeros included, without the
    promoting copy."""
    return torch.gt(z, 0.0, out=out)


def _unpool(t: torch.Tensor, relu: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Pooling's backward: each entry of t (c, rows, h, w) copied to its 2 × 2 inputs, +0
    on an edge the pooling dropped, times [Z > 0] (relu, :func:`_positive` of the layer's
    pre-activations: ×1 or ×0 elementwise, i). The copies are two broadcast copies
    (columns, then rows, the second fused into the product with the mask), not
    F.interpolate, whose nearest kernel converts (c, rows, ·, ·) to channels-last and
    back (two extra copies of the map). Written into ``out`` (relu's shape) where the
    pooling dropped no edge."""
    c, rows, ph, pw = t.shape
    height, width = relu.shape[2], relu.shape[3]
    wide = t.unsqueeze(4).expand(c, rows, ph, pw, 2).reshape(c, rows, ph, 2 * pw)
    tall = wide.unsqueeze(3).expand(c, rows, ph, 2, 2 * pw)  # (source ⌊i/2⌋, ⌊j/2⌋)
    if (2 * ph, 2 * pw) == (height, width):
        shape = (c, rows, ph, 2, 2 * pw)
        torch.mul(tall, relu.view(shape), out=out.view(shape))
        return out
    up = F.pad(tall.reshape(c, rows, 2 * ph, 2 * pw), (0, width - 2 * pw, 0, height - 2 * ph))
    return up * relu


def _patches(
    a: torch.Tensor, grid: LayerGrid, space: _Workspace, index: int
) -> tuple[torch.Tensor, int, int]:
    """im2col in the channel-major layout: a (C, rows, H, W) → (P, h, w) with P (C·k² + 1,
    rows, h, w): entry (c, i, j) of row n's patch at (y, x) is the zero-padded
    a[c, n, y·s + i, x·s + j], in Conv2d's weight order (c, i, j), and the last plane is
    2^c_l (the bias column). Copies and zeros only, no arithmetic; the padded maps and the
    patches are buffers of ``space`` (layer ``index``), wholly rewritten here."""
    channels, rows, height, width = a.shape
    k, s, p = grid.kernel, grid.stride, grid.padding
    if p:
        padded = space.get(f"padded{index}", (channels, rows, height + 2 * p, width + 2 * p), a)
        padded.zero_()
        padded[:, :, p : p + height, p : p + width] = a
    else:
        padded = a
    windows = padded.unfold(2, k, s).unfold(3, k, s)  # (C, rows, h, w, k, k), a view
    h, w = windows.shape[2], windows.shape[3]
    patch = space.get(f"patches{index}", (channels * k * k + 1, rows, h, w), a)
    patch[:-1].view(channels, k, k, rows, h, w).copy_(windows.permute(0, 4, 5, 1, 2, 3))
    patch[-1].fill_(pow2(grid.in_bits))
    return patch, h, w


def _patch_largest(a: torch.Tensor, grid: LayerGrid, h: int, w: int) -> torch.Tensor | None:
    """(rows,) the largest entry of each row's patches (:func:`_patches`) read from the maps
    a (C, rows, H, W) instead of the 9-fold larger patches: every entry is ≥ 0 (features
    and pooled ReLU activations are ≥ 0, padding is 0) and the bias plane is 2^c > 0, so
    max |P_row| = max P_row = max(2^c, max of a over the positions some patch covers),
    exact (iii); with stride ≤ kernel the covered positions are the block
    [0, (h − 1)·s + k − p) × [0, (w − 1)·s + k − p) of a. None for a stride above the
    kernel (the caller then reduces the patches)."""
    k, s, p = grid.kernel, grid.stride, grid.padding
    if s > k:
        return None
    bottom = min(a.shape[2], (h - 1) * s + k - p)
    right = min(a.shape[3], (w - 1) * s + k - p)
    covered = a[:, :, : max(bottom, 0), : max(right, 0)]
    if not covered.numel():
        return a.new_full((a.shape[1],), pow2(grid.in_bits))
    return torch.clamp(covered.amax(dim=(0, 2, 3)), min=pow2(grid.in_bits))


def _fold(
    below: torch.Tensor, grid: LayerGrid, size: tuple[int, int], out: torch.Tensor
) -> torch.Tensor:
    """col2im in the channel-major layout: below (C·k², rows, h, w) → (C, rows, H, W), each
    input position the sum of the ≤ k² patch entries that cover it (k² shifted adds into a
    zeroed padded map, ``out`` (C, rows, H + 2p, W + 2p), then the padding cut off): sums of
    exact integers, exact (ii)."""
    k, s, p = grid.kernel, grid.stride, grid.padding
    _, rows, h, w = below.shape
    channels = below.shape[0] // (k * k)
    parts = below.view(channels, k, k, rows, h, w)
    out.zero_()
    for i in range(k):
        for j in range(k):
            out[:, :, i : i + s * (h - 1) + 1 : s, j : j + s * (w - 1) + 1 : s] += parts[:, i, j]
    return out[:, :, p : p + size[0], p : p + size[1]]


class _Workspace:
    """Float64 buffers a clipper reuses from batch to batch (the patches, the padded maps,
    the backward's product and fold, the per-row gradients, scratch): writing into memory
    already mapped instead of fresh multi-MB allocations, which glibc hands back to the
    kernel and faults in again every step.
    Each request is a contiguous view of the first entries of one growing buffer per name;
    every caller overwrites all of it (or zeroes it) before reading, so no value depends
    on what a previous batch left there."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < size or buffer.device != like.device:
            buffer = torch.empty(size, dtype=torch.float64, device=like.device)
            self._buffers[name] = buffer
        return buffer[:size].view(shape)


def conv_rows(
    module: Cnn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    grids: list[LayerGrid],
    workspace: _Workspace | None = None,
) -> ConvRows:
    """The forward, backward and per-row gradients of the module docstring for a batch
    (x (rows, C·H·W) in [0, 1], y the label: 0/1 or a class index).

    Layouts (no value depends on them: every sum is of integers below 2^53, exact in any
    order, ii): the feature maps are channel-major (C, rows, H, W) and the patches
    (fan_in + 1, rows, L), so a layer's convolution is one matrix product θ·P over all
    rows and positions (c_out, rows·L), already the next maps' layout, and the backward's
    Wᵀ·B is one product (fan_in, rows·L) then folded (:func:`_fold`); the per-row
    gradients read the same buffers as (rows, ·, L) views. A mask whose rows are all
    valid is not applied (a fill of nothing). ``workspace`` (the clipper's) holds the
    patches, scratch and the convolutions' G' between batches (so the result is valid
    until the next call with that workspace); none gives fresh buffers."""
    rows = x.shape[0]
    classes = module.classes
    space = workspace if workspace is not None else _Workspace()
    with torch.no_grad():
        a = torch.trunc(x.double().clamp(0.0, 1.0) * pow2(FEATURE_BITS))
        label = y.double()
        valid = torch.isfinite(a).all(dim=1) & torch.isfinite(label)
        valid &= label == torch.floor(label)
        valid &= (label >= 0) & (label < (classes or 2))
        a = a.masked_fill(~valid.unsqueeze(1), 0.0).reshape(rows, *module.shape)
        a = a.transpose(0, 1)  # channel-major (C, rows, H, W), a view
        patches: list[torch.Tensor] = []  # (fan_in + 1, rows, L)
        patch_largest: list[torch.Tensor | None] = []  # (rows,) max |P_row|
        numerators: list[torch.Tensor] = []  # conv pre-activations (c_out, rows, h, w)
        for index, grid in enumerate(grids[:-1]):
            patch, h, w = _patches(a, grid, space, index)
            patch_largest.append(_patch_largest(a, grid, h, w))
            patches.append(patch.view(patch.shape[0], rows, h * w))
            z = space.get(f"numerators{index}", (grid.theta.shape[0], rows * h * w), patch)
            torch.matmul(grid.theta, patch.view(patch.shape[0], -1), out=z)  # exact (ii)
            z = z.view(-1, rows, h, w)
            numerators.append(z)
            # round(max(Z, 0)·2^(16 − c − b)), the same operations in place on one buffer
            act = torch.clamp(z, min=0.0, out=space.get(f"act{index}", tuple(z.shape), z))
            act.mul_(pow2(HIDDEN_BITS - grid.in_bits - grid.bits))
            act.round_()
            valid &= act.amax(dim=(0, 2, 3)) <= pow2(HIDDEN_BITS + RELU_RANGE_BITS)
            if not bool(valid.all()):
                act.masked_fill_(~valid.reshape(1, rows, 1, 1), 0.0)
            if grid.pool:  # the 2 × 2 sums (÷ 1), exact (ii): read on the grid 2^-(16 + 2)
                act = F.avg_pool2d(act, 2, divisor_override=1)  # floor: odd edge dropped
            a = act
        head = grids[-1]
        flat = a.transpose(0, 1).reshape(rows, -1)  # (rows, C·h·w), Conv2d's flatten order
        one = flat.new_full((rows, 1), pow2(head.in_bits))
        head_in = torch.cat((flat, one), dim=1)
        logits = (head_in @ head.theta.T) * pow2(-(head.in_bits + head.bits))  # exact (ii)
        if classes is None:
            residual = sigmoid_basic(logits[:, 0]).to(logits.device) - label
            residual = residual.unsqueeze(1)
        else:
            label_index = torch.where(valid, label, 0.0).to(torch.int64)
            target = torch.zeros_like(logits).scatter_(1, label_index.unsqueeze(1), 1.0)
            residual = softmax_basic(logits).to(logits.device) - target
        b = torch.round(residual * pow2(GRAD_BITS)).masked_fill(~valid.unsqueeze(1), 0.0)
        grads = [_per_row_gradient(b.unsqueeze(2), head_in.unsqueeze(2))]
        limit = pow2(GRAD_BITS + GRAD_RANGE_BITS)
        t = b @ head.theta[:, :-1]  # exact (ii): ∂ℓ/∂a on 2^-(20 + b), (rows, C·h·w)
        t = t.view(rows, a.shape[0], a.shape[2], a.shape[3]).transpose(0, 1)
        upper = head
        for index in range(len(grids) - 2, -1, -1):
            grid, z = grids[index], numerators[index]
            shift = upper.bits
            if grid.pool:  # each pooled gradient to its four inputs, × 1/4 in the rounding
                # (elementwise, i: rounded before the copies, the same values)
                t = (t * pow2(-(shift + POOL_BITS))).round_()
                mask = _positive(z, space.get("mask", tuple(z.shape), z))
                delta = _unpool(t, mask, space.get("delta", tuple(z.shape), z))  # on 2^-20
            else:
                mask = _positive(z, space.get("mask", tuple(z.shape), z))
                delta = (t * pow2(-shift)).round_().mul_(mask)  # on 2^-20
            largest = _largest_magnitude(delta, dim=1)
            valid &= largest <= limit  # NaN compares false: invalid
            if not bool(valid.all()):
                delta.masked_fill_(~valid.reshape(1, rows, 1, 1), 0.0)
                largest = torch.where(valid, largest, 0.0)  # the zeroed rows' max |·|
            positions = delta.reshape(delta.shape[0], rows, -1)  # (c, rows, L)
            shape = (rows, positions.shape[0], patches[index].shape[0])
            grads.append(
                _per_row_gradient(
                    positions.transpose(0, 1),
                    patches[index].transpose(0, 1),
                    largest,
                    patch_largest[index],
                    space.get(f"grads{index}", shape, positions),
                )
            )
            if index > 0:
                size = (numerators[index - 1].shape[2], numerators[index - 1].shape[3])
                if grids[index - 1].pool:
                    size = (size[0] // 2, size[1] // 2)
                flat = positions.reshape(positions.shape[0], -1)
                below = space.get("below", (grid.theta.shape[1] - 1, flat.shape[1]), flat)
                torch.matmul(grid.theta[:, :-1].T, flat, out=below)  # exact (ii)
                below = below.view(-1, rows, delta.shape[2], delta.shape[3])
                c, pad = below.shape[0] // grid.kernel**2, 2 * grid.padding
                folded = space.get("folded", (c, rows, size[0] + pad, size[1] + pad), below)
                t = _fold(below, grid, size, folded)  # col2im: sums of ≤ k² exact integers (ii)
            upper = grid
        grads.reverse()
        if not bool(valid.all()):
            mask = ~valid.reshape(rows, 1, 1)
            for g, _ in grads:
                g.masked_fill_(mask, 0.0)  # fresh bmm outputs
        return ConvRows(
            grads=tuple(g for g, _ in grads),
            shifts=tuple(s for _, s in grads),
            in_bits=tuple(g.in_bits for g in grids),
            valid=valid,
        )


def _flatten(per_layer: list[torch.Tensor]) -> torch.Tensor:
    """(rows, P) in parameters() order: each layer's weight (c_out × fan_in, row-major,
    as Conv2d's (c_out, c_in, k, k) flattens) then its bias."""
    parts: list[torch.Tensor] = []
    for g in per_layer:
        parts += [g[:, :, :-1].reshape(g.shape[0], -1), g[:, :, -1]]
    return torch.cat(parts, dim=1)


def row_gradients(module: Cnn, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(rows, P) float64: each row's gradient of the grid network's loss (BCE with logits,
    or cross-entropy for K ≥ 3 classes) in parameters() order, before clipping (for tests
    and diagnostics: G'·2^e, the scaling exact)."""
    r = conv_rows(module, x, y, grids=conv_grids(module))
    return _flatten([g * r.scales(i).reshape(-1, 1, 1) for i, g in enumerate(r.grads)])


class ExactConvClipper:
    """The DP-SGD sum for one run of a CNN (engine ``exact``): (x, y) → S as int64
    (parameters,), ‖S(D + x*) − S(D)‖ ≤ 2^k by the module docstring's proof (no assumption
    beyond IEEE-754)."""

    label = "dpsgd exact cnn"

    def __init__(
        self, module: torch.nn.Module, *, grid_bits: int, max_grad_norm: float, parameters: int
    ) -> None:
        if not isinstance(module, Cnn):
            raise PlanMismatch("the exact convolution engine computes CNNs")
        if not 0 < grid_bits <= 20:
            raise PlanMismatch("the integer grid does not fit the exact engine's bounds")
        if not 0 < parameters <= MAX_CNN_PARAMETERS:
            raise PlanMismatch("the CNN has more parameters than the exact engine takes")
        positive_finite(self.label, max_grad_norm=max_grad_norm)
        self.module = module
        self.parameters = parameters
        self.grid_bits = grid_bits
        self._units = pow2(grid_bits) / max_grad_norm  # noise-grid units per gradient unit
        # ‖round(w·g)‖ ≤ w‖g‖ + √P/2: aim at 2^k·(1 − 2^-20) − √P
        self._target = pow2(grid_bits) * (1.0 - _MARGIN) - math.sqrt(parameters)
        if self._target <= 0:
            raise PlanMismatch("the grid is too coarse for this many parameters")
        self._chunk = max(1, CHUNK_ELEMENTS // module.row_floats)
        self._workspace = _Workspace()  # patches and scratch, reused from batch to batch

    def contributions(
        self, x: torch.Tensor, y: torch.Tensor, *, grids: list[LayerGrid] | None = None
    ) -> torch.Tensor:
        """(rows, P) integer-valued float64: each row's clipped contribution z_i in
        noise-grid units, a function of that row and the public parameters alone, checked
        ‖z_i‖ ≤ 2^k exactly (GuardFailed otherwise). A fresh tensor."""
        grids = grids if grids is not None else conv_grids(self.module)
        return self._contributions(x, y, grids, reuse=False)

    def _contributions(
        self, x: torch.Tensor, y: torch.Tensor, grids: list[LayerGrid], *, reuse: bool
    ) -> torch.Tensor:
        """:meth:`contributions`, written into the workspace where ``reuse`` (then valid
        until the next call: :meth:`__call__` sums it at once)."""
        space = self._workspace
        r = conv_rows(self.module, x, y, grids=grids, workspace=space)
        with torch.no_grad():
            n_sq = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
            for index, g in enumerate(r.grads):
                flat = g.reshape(g.shape[0], -1)
                scratch = space.get("scratch", tuple(flat.shape), flat)
                u = norm_sq_upper(flat, scratch=scratch)  # ≥ ‖G'‖², exact sums
                n_sq = n_sq + u * r.scales(index, power=2)
            norm = torch.sqrt(n_sq) * _UP  # ≥ ‖g_i‖ (gradient units)
            w = torch.clamp(self._target / norm, max=self._units)  # 0/0 → NaN: zeroed below
            w = torch.where(r.valid & ~torch.isnan(w), w, 0.0)
            # round(G'·factor) in parameters() order, written in place (_flatten's layout)
            shape = (x.shape[0], sum(g.shape[1] * g.shape[2] for g in r.grads))
            z = space.get("z", shape, x) if reuse else x.new_empty(shape, dtype=torch.float64)
            offset = 0
            for index, g in enumerate(r.grads):
                c_out, width = g.shape[1], g.shape[2] - 1
                factor = (w * r.scales(index)).reshape(-1, 1, 1)
                weights = z[:, offset : offset + c_out * width].unflatten(1, (c_out, width))
                torch.mul(g[:, :, :-1], factor, out=weights)
                offset += c_out * width
                torch.mul(g[:, :, -1], factor[:, :, 0], out=z[:, offset : offset + c_out])
                offset += c_out
            z.round_()
            self._check(z, space.get("scratch", (z.numel(),), z))
            return z

    def _check(self, z: torch.Tensor, scratch: torch.Tensor | None = None) -> None:
        """‖z_i‖ ≤ 2^k for every row, decided exactly: max |z_ij| ≤ 2^k (as max z ≤ 2^k and
        min z ≥ −2^k: NaN compares false and fails), then Σ_j z_ij² ≤ 2^2k, the sum exact:
        in column blocks of width 2^(52 − 2k) (≥ 2^12 for k ≤ 20), each block's Σ z² is a
        row sum of the block's squares (written into ``scratch``, ≥ z.numel() float64, the
        workspace's; a fresh one where none is given): every product is an exact square (an
        integer ≤ 2^2k) and every partial sum an integer ≤ 2^52, exact in any order and
        association (ii), and the ≤ 2^8 block sums (P ≤ 2^20) are added in int64 (≤ 2^60,
        iv): the same integer as the int64 sum of squares, without converting z."""
        if z.shape[0] == 0:
            return
        top = pow2(self.grid_bits)
        high, low = z.amax(dim=1), z.amin(dim=1)  # NaN propagates to both (torch's
        # aminmax is one pass but about 8× slower than the two on (89, 6090), 1 thread)
        if not bool(((high <= top) & (low >= -top)).all()):
            raise GuardFailed(f"{self.label}: a row's contribution exceeds its bound")
        width = 1 << (_EXACT - 2 * self.grid_bits)
        squares = torch.zeros(z.shape[0], dtype=torch.int64, device=z.device)
        if scratch is None:
            scratch = z.new_empty(z.numel())
        for start in range(0, z.shape[1], width):
            block = z[:, start : start + width]
            sq = torch.mul(block, block, out=scratch[: block.numel()].view(block.shape))
            squares += sq.sum(dim=1).to(torch.int64)
        if not bool((squares <= (1 << (2 * self.grid_bits))).all()):
            raise GuardFailed(f"{self.label}: a row's contribution exceeds its bound")

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """S = Σ_i z_i as int64 (parameters,), exact (iv); rows are taken in chunks (each
        row's z_i does not depend on its chunk). A chunk's column sums are taken in float64:
        |z_ij| ≤ 2^k ≤ 2^20 (checked) and a chunk has ≤ ROW_LIMIT = 2^24 rows, so every
        partial sum is an integer ≤ 2^44, exact in any order (ii): the int64 sum's value."""
        if x.shape[0] > ROW_LIMIT:
            raise PlanMismatch("a batch exceeded the exact engine's row limit")
        grids = conv_grids(self.module)
        total = torch.zeros(self.parameters, dtype=torch.int64, device=x.device)
        for start in range(0, x.shape[0], self._chunk):
            stop = start + self._chunk
            z = self._contributions(x[start:stop], y[start:stop], grids, reuse=True)
            if z.shape[1] != self.parameters:
                raise PlanMismatch("the model's parameter count differs from the plan's")
            total += z.sum(dim=0).to(torch.int64)
        return total
