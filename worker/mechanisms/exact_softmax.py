"""DP-SGD's clipped sum for multinomial logistic regression (K ≥ 3 classes, softmax and
cross-entropy) from IEEE-754 arithmetic alone (issue 20): the K-class counterpart of
:mod:`worker.mechanisms.exact_net`'s logistic path, on the same grids. Every row's
contribution is a function of that row and the public parameters, bit for bit, whatever
else is in the batch and wherever the row sits; the sum over rows is exact; the proof
assumes only that float64 +, −, ×, ÷, √ are correctly rounded, with no measured property
of a kernel. exact_net's docstring states the operations (i)-(iv) it relies on: (i)
elementwise basic operations, exact power-of-two scalings, rounding and comparisons are
the same bits in any lane, position or batch; (ii) sums of integers whose partial sums stay
below 2^53 are exact in any order; (iii) a row maximum is exact; (iv) int64 sums are exact.

Notation: a "grid value" is an integer-valued float64 n standing for n·2^-g.

* **Forward.** Features x ∈ [0, 1] (clamped) on 2^-18: A = trunc(x·2^18), Ã = [A, 2^18]
  (the bias input), ‖Ã‖² ≤ (d + 1)·2^36. The public parameters (W, b) ∈ R^(K×(d+1)) on the
  grid 2^-β with |W_int|, |b_int| ≤ 2^m, m = 52 − 18 − ⌈log₂(d + 1)⌉ (fixed_point.
  parameters_on_grid), so the logit numerators Z = Ã·[W_int, b_int]ᵀ (rows, K) have
  partial sums ≤ (d + 1)·2^(18 + m) ≤ 2^52: exact (ii). Logits z = Z·2^-(18 + β) (exact).
* **Softmax from basic operations** (fixed_point.softmax_basic). μ = max_k z_k (exact,
  iii); u_k = μ − z_k ≥ 0 (one correctly rounded subtraction); e_k =
  fixed_point.exp_neg_basic(u_k) (basic operations only, elementwise; e_k = 1 exactly where
  u_k = 0); s = ((e_0 + e_1) + e_2) + … in the fixed class order (each addition correctly
  rounded: a per-row sequence of operations whose order never depends on the batch);
  p̃_k = e_k / s ∈ [0, 1] (0 ≤ e_k ≤ s, as adding non-negative floats never decreases a
  sum). Every step is elementwise (i) or a per-row fixed-order sequence, so p̃ is the same
  bits for a row in any batch.
* **Residual** (exact_net.softmax_residuals). r_k = round((p̃_k − [k = y])·2^20)
  (GRAD_BITS), an integer K-vector with |r_k| ≤ 2^20, so ‖r‖² ≤ K·2^40. The cross-entropy
  gradient of row i is exactly (p − e_y) ⊗ (x, 1); here it is g_i = r ⊗ Ã·2^-(20 + 18)
  (grid values, exact).
* **Invalid rows** (a non-finite feature, a label that is not an integer in [0, K)) are
  decided by exact comparisons on the row's own values and contribute exactly 0.
* **Clipping, row by row, in exact arithmetic.** N̂_i = √(U(r)·U(Ã)·2^-76)·(1 + 2^-40)
  ≥ ‖g_i‖ and R_i = √(U(Ã)·(K/4)·2^-36)·(1 + 2^-40) ≥ ½√K·‖Ã‖·2^-18 (U = exact_net.
  norm_sq_upper, an upper bound on a squared norm from exact integer sums; each bound is a
  few correctly rounded operations of relative error ≤ 2^-53, which 1 + 2^-40 covers).
  The weight w_i = min(2^k/C, (c − R_i)/N̂_i) (0 for an invalid row or a NaN), c =
  c_row·(1 − 2^-20), and V_i = round(w_i·r_i·2^-20) (integer K-vector): row i's
  contribution in noise-grid units is z_i = V_i ⊗ Ã_i·2^-18, its squared norm exactly
  ‖V_i‖²·‖Ã_i‖²·2^-36. The bound ‖z_i‖ ≤ c_row is checked a posteriori on these integers:
  U_i = U(V_i)·U(Ã_i)·2^-36·(1 + 2^-40) ≥ ‖z_i‖², and a row with U_i > c_row² fails the
  job (GuardFailed) whatever the floats above did: the weights only aim at the bound, the
  integer check enforces it. It never fires for a well-aimed weight: ‖V_i‖·‖Ã_i‖·2^-18 ≤ c
  and ‖Ã_i‖ ≥ 2^18 (the bias input) give max|V_i| < c_row < 2^20 ≤ 2^h
  (h = ⌊(52 − ⌈log₂ K⌉)/2⌋ ≥ 20 for K ≤ 4096), so U(V_i) = ‖V_i‖² exactly (no rounding up)
  and U_i exceeds ‖z_i‖² by the (1 + 2^-40) factor and a few roundings only, far inside
  the 2^-20 margin: a job's failure would say nothing about a row.
* **Sum.** Σ_i V_iᵀ Ã_i per chunk of rows, a float64 product of integers: each term
  |V_ik·Ã_ij| ≤ ‖V_i‖·‖Ã_i‖ ≤ c_row·2^18, a chunk holds ≤ 2^(52 − ⌈log₂ c_row⌉ − 18) rows
  (≤ 1024), so every partial sum is ≤ 2^52: exact (ii) in any order. Chunk totals t are
  split exactly as t = h·2^18 + l (0 ≤ l < 2^18) in int64, H and L summed over chunks
  (iv), and S = H + ⌊(L + 2^17)/2^18⌋: the exact sum rounded once, as int64 (K, d + 1),
  flattened in parameters() order (the K×d weight row-major, then the K biases).

**Sensitivity.** The floats (the softmax, the weights w_i) may be any values at all: the
proof needs only that (a) z_i is a function of row i and the public parameters alone
(determinism per row: every operation above is elementwise or a per-row sequence of fixed
order, and matrix products of integers below 2^53 are exact), and (b) ‖z_i‖ ≤ c_row, which
the exact integer check enforces. The sum Σ_i z_i is exact, so adding a row x* changes it
by z_* exactly, and rounding once adds at most 1 per coordinate:
‖S(D + x*) − S(D)‖₂ ≤ ‖z_*‖₂ + √P ≤ c_row + √P = 2^k with c_row = 2^k − √P and
P = K·(d + 1). The noise stage (worker/mechanisms/dpsgd.py) then adds integer Gaussian
noise of scale σ·2^k: the Gaussian mechanism with sensitivity 2^k, post-processed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import torch

from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.exact_net import (
    FEATURE_BITS,
    GRAD_BITS,
    class_labels_valid,
    norm_sq_upper,
    softmax_residuals,
)
from worker.mechanisms.fixed_point import parameters_on_grid, pow2, softmax_basic
from worker.mechanisms.guards import GuardFailed, positive_finite
from worker.models.softmax import Softmax

__all__ = [
    "ExactSoftmaxClipper",
    "SoftmaxRows",
    "softmax_basic",  # fixed_point's, where it lived before
    "softmax_rows",
]

ROW_LIMIT: Final[int] = 1 << 24
CHUNK: Final[int] = 1024
_EXACT: Final[int] = 52  # partial sums of integers ≤ 2^52 < 2^53: exact in any order
_UP: Final[float] = 1.0 + 2.0**-40  # covers a few roundings of relative error 2^-53
_MARGIN: Final[float] = 2.0**-20  # the weights aim at c_row·(1 − 2^-20)
MAX_CLASSES: Final[int] = 1 << 12  # ‖r‖² ≤ K·2^40 ≤ 2^52


def _ceil_log2(n: int) -> int:
    return max(0, (n - 1).bit_length())


def softmax_grid(module: Softmax) -> tuple[torch.Tensor, int]:
    """([W_int, b_int] (K, d + 1) integer-valued float64, β): the public parameters on the
    grid 2^-β with |θ_int| ≤ 2^m, m = 52 − 18 − ⌈log₂(d + 1)⌉ (the module docstring)."""
    layer = module.linear
    d = layer.weight.shape[1]
    room = _EXACT - (FEATURE_BITS + _ceil_log2(d + 1))
    w_int, b_int, bits = parameters_on_grid(layer.weight, layer.bias, range_bits=room)
    assert b_int is not None
    return torch.cat((w_int, b_int.unsqueeze(1)), dim=1), bits


@dataclass(frozen=True)
class SoftmaxRows:
    """One batch's per-row signals: Ã (rows, d + 1), r (rows, K), ``valid`` (rows,); the
    invalid rows' Ã and r are zero."""

    inputs: torch.Tensor
    residuals: torch.Tensor
    valid: torch.Tensor


def softmax_rows(
    module: Softmax, x: torch.Tensor, y: torch.Tensor, *, grid: tuple[torch.Tensor, int]
) -> SoftmaxRows:
    """The forward and the residuals of the module docstring for a batch (x, y), y the class
    index (any float or integer dtype); ``grid`` is :func:`softmax_grid` of the module."""
    theta, bits = grid
    classes = theta.shape[0]
    with torch.no_grad():
        a = torch.trunc(x.double().clamp(0.0, 1.0) * pow2(FEATURE_BITS))
        label = y.double()
        valid = torch.isfinite(a).all(dim=1) & class_labels_valid(label, classes)
        one = torch.full((a.shape[0], 1), pow2(FEATURE_BITS), dtype=torch.float64)
        inputs = torch.cat((a, one.to(a.device)), dim=1)
        numerators = inputs @ theta.T  # exact: partial sums ≤ 2^52 (ii)
        logits = numerators * pow2(-(FEATURE_BITS + bits))
        residuals = softmax_residuals(logits, label, valid)
        invalid = ~valid.unsqueeze(1)
        return SoftmaxRows(
            inputs=inputs.masked_fill_(invalid, 0.0),
            residuals=residuals.masked_fill_(invalid, 0.0),
            valid=valid,
        )


class ExactSoftmaxClipper:
    """The DP-SGD sum for one run of multinomial logistic regression (engine ``exact``):
    (x, y) → S as int64 (parameters,), ‖S(D + x*) − S(D)‖ ≤ 2^k by the module docstring's
    proof (no assumption beyond IEEE-754)."""

    label = "dpsgd exact softmax"

    def __init__(
        self, module: torch.nn.Module, *, grid_bits: int, max_grad_norm: float, parameters: int
    ) -> None:
        if not isinstance(module, Softmax):
            raise PlanMismatch("the exact softmax engine computes multinomial logistic regression")
        if not 0 < grid_bits <= 20:
            raise PlanMismatch("the integer grid does not fit the exact engine's bounds")
        if module.classes > MAX_CLASSES:
            raise PlanMismatch(f"the exact softmax engine takes at most {MAX_CLASSES} classes")
        positive_finite(self.label, max_grad_norm=max_grad_norm)
        self.module = module
        self.classes = module.classes
        self.parameters = parameters
        self._units = pow2(grid_bits) / max_grad_norm  # noise-grid units per gradient unit
        self.row_cap = pow2(grid_bits) - math.sqrt(parameters)  # c_row = 2^k − √P
        if self.row_cap <= 0:
            raise PlanMismatch("the grid is too coarse for this many parameters")
        self._target = self.row_cap * (1.0 - _MARGIN)
        cap_bits = math.ceil(math.log2(self.row_cap)) + FEATURE_BITS
        if _EXACT - cap_bits < 0:
            raise PlanMismatch("2^k is too large for the exact engine")
        self._chunk = min(CHUNK, 1 << (_EXACT - cap_bits))

    def contributions(
        self, x: torch.Tensor, y: torch.Tensor, *, grid: tuple[torch.Tensor, int] | None = None
    ) -> tuple[torch.Tensor, SoftmaxRows]:
        """(V (rows, K) integer-valued float64, signals): row i's contribution is
        V_i ⊗ Ã_i·2^-18 in noise-grid units, checked ≤ c_row exactly (GuardFailed
        otherwise)."""
        grid = grid if grid is not None else softmax_grid(self.module)
        s = softmax_rows(self.module, x, y, grid=grid)
        with torch.no_grad():
            a2 = norm_sq_upper(s.inputs)  # ≥ ‖Ã‖² (exact integer sums)
            r2 = norm_sq_upper(s.residuals)  # ≥ ‖r‖²
            scale = pow2(-2 * (GRAD_BITS + FEATURE_BITS))
            norm = torch.sqrt(r2 * a2 * scale) * _UP  # ≥ ‖g_i‖ (gradient units)
            slack = torch.sqrt(a2 * (0.25 * self.classes) * pow2(-2 * FEATURE_BITS)) * _UP
            w = torch.clamp((self._target - slack) / norm, min=0.0, max=self._units)
            w = torch.where(s.valid & ~torch.isnan(w), w, 0.0)
            v = torch.mul(s.residuals, w.unsqueeze(1)).mul_(pow2(-GRAD_BITS)).round_()
            bound = norm_sq_upper(v) * a2 * pow2(-2 * FEATURE_BITS) * _UP  # ≥ ‖z_i‖²
            limit = self.row_cap * self.row_cap * (1.0 - 2.0**-40)  # < c_row²
            if bool((bound > limit).any()):
                raise GuardFailed(f"{self.label}: a row's contribution exceeds its bound")
            return v, s

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """S = round(Σ_i z_i) as int64 (parameters,): chunk sums of integers (exact), split
        as t = h·2^18 + l and summed in int64, rounded once (module docstring)."""
        if x.shape[0] > ROW_LIMIT:
            raise PlanMismatch("a batch exceeded the exact engine's row limit")
        grid = softmax_grid(self.module)
        c = FEATURE_BITS
        d1 = grid[0].shape[1]
        high = torch.zeros((self.classes, d1), dtype=torch.int64, device=x.device)
        low = torch.zeros_like(high)
        for start in range(0, x.shape[0], self._chunk):
            stop = start + self._chunk
            v, s = self.contributions(x[start:stop], y[start:stop], grid=grid)
            t = (v.T @ s.inputs).to(torch.int64)  # exact integers ≤ 2^52 (ii)
            h = torch.div(t, 1 << c, rounding_mode="floor")
            high += h
            low += t - h * (1 << c)
        total = high + torch.div(low + (1 << (c - 1)), 1 << c, rounding_mode="floor")
        out = torch.cat((total[:, :-1].reshape(-1), total[:, -1]))
        if out.shape != (self.parameters,):
            raise PlanMismatch("the model's parameter count differs from the plan's")
        return out
