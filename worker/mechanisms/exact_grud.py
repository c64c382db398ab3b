"""DP-SGD's clipped sum for GRU-D from IEEE-754 arithmetic alone (issue 25): each row's
per-example gradient is computed by a hand-written forward and backward through time in
fixed-point arithmetic, so it is a function of that row and the public parameters alone,
bit for bit; rows are clipped and rounded to the noise grid one by one, and the sum over
rows is an exact int64 sum.

The rules are those of worker/mechanisms/exact_net.py (read its docstring first):
elementwise basic operations (+, −, ×, ÷, √, rounding, comparisons, exact power-of-two
scalings, and exp/σ/tanh built from them in worker/mechanisms/fixed_point.py) give the same
bits for an element wherever it sits; every reduction (matrix product, sum over time steps,
row norm) adds integers whose partial sums stay ≤ 2^51 < 2^53, so it is exact in any order.

GRU-D (Che et al. 2018, worker/models/grud.py), per row, on grids (a grid value n stands
for n·2^-g):

* inputs: x̂ = m·v + (1 − m)(γ_x·x_last + (1 − γ_x)·x̄) elementwise, with
  γ_x = exp(−max(0, δ·w_x + b_x)), rounded onto 2^-16 (clamped to [0, 1], where the schema
  puts values and means); masks m·2^16; deltas δ (hours) rounded onto 2^-6;
* each Linear layer's parameters on 2^-b with |W_int| ≤ 2^20 (b from the public largest
  magnitude, as exact_net.layer_grids);
* γ_h = exp(−max(0, Wγ·δ + bγ)); per step ĥ = round(γ_h ⊙ h), r, z = σ̃(·) of the exact
  gate numerators, rh = round(r ⊙ ĥ), n = tanh̃(·), h = round((1 − z) ⊙ ĥ + z ⊙ n), all
  hidden states on 2^-16 (|h| ≤ 1); the logit from an exact product;
* backward through time by the chain rule of the same forward (σ' = σ(1 − σ),
  tanh' = 1 − tanh², exp' = −exp, max(0, ·)' = [· > 0]), every signal entering a matrix
  product (the gates' pre-activation gradients, dĥ's parts) rounded onto 2^-16 first;
  the parameter gradients are sums over time of integer outer products: exact.

**K classes** (an outcome of K ≥ 3 classes, worker/models/grud.py's head of K logits,
softmax and cross-entropy; issue 20). The forward above is unchanged up to the last
hidden state; the head and the start of the backward are K-class MLP's, by the same code
(worker/mechanisms/exact_net.py ``softmax_residuals`` on fixed_point.softmax_basic, as
worker/mechanisms/exact_softmax.py and exact_net's K-logit head use it):

* the K logit numerators Z = h_int·W_intᵀ + b_int·2^16 are an exact integer product
  ((H + 1)·2^16·2^20 ≤ 2^51 for H ≤ 128), the logits z = Z·2^-(16 + b) exact scalings;
* p̃ = softmax_basic(z): the row maximum (exact), one subtraction, exp_neg_basic and one
  quotient per class, and the sum over classes in the fixed order ((e_0 + e_1) + e_2) + …
  — a per-row sequence whose order never depends on the batch, so p̃ is a function of the
  row alone; the residual d_k = round((p̃_k − [k = y])·2^20), |d_k| ≤ 2^20 (p̃_k ∈ [0, 1]);
* the head's gradients d ⊗ h (grid 2^-(20 + 16), each an exact product ≤ 2^36) and d
  (bias, 2^-20); the signal into the recurrence dh = (d·W_int)·2^-(20 + b), an integer
  product of K terms d_k·W_int[k, j] (each ≤ 2^40, exact), exact when Σ_k |d_k|·2^20 ≤ 2^51:
  every partial sum, in any order, is an integer no larger than that. Checked per row
  (Σ_k |d_k| is itself an exact sum of K ≤ 2^12 integers ≤ 2^20); it holds for every row
  and every K ≤ MAX_CLASSES, as Σ_k |p̃_k − [k = y]| ≤ 2 (+ rounding), so Σ_k |d_k| ≲
  2^21 + K/2. (K·max|d|·2^20 ≤ 2^51, the per-reduction form below, fails for K > 2^11);
* a label that is not an integer in [0, K) (exact_net.class_labels_valid: NaN, ±inf,
  −1, K, 1.5) makes its row invalid, as a non-finite label does for the binary head.

The binary proof used nothing about the head but these three facts (the head's products
are exact, its signal into the recurrence is exact, and the row's validity is decided on
the row alone): it never bounds |σ(z) − y| or ‖p − e_y‖, because the clipping below is
aimed by the row's own norm and enforced a posteriori on the integers. So nothing else
changes for K logits; everything from dh on is the binary backward, bit for bit the same
operations.

**Validity.** Each reduction's exactness needs, per row, (terms)·max|left|·max|right| ≤
2^51, checked on the row's own exact values (a row maximum is exact in any order) against
the public |W_int| ≤ 2^20. A row failing any check, or with a non-finite input or label, is
invalid and contributes exactly 0; the decision is a function of the row alone.

**Clipping and sum.** With G the row's gradient blocks (grid values) and N̂ ≥ ‖g‖ from
exact_net.norm_sq_upper, w = min(2^k/C, (c − ½√P)/N̂), c = 2^k(1 − 2^-20); the row's
contribution V = round(w·g) in noise units, an integer vector; a posteriori
‖V‖² ≤ norm_sq_upper(V) ≤ 4^k(1 − 2^-40) is checked on the real batch (GuardFailed
otherwise: only wrong weights, never the data, can trigger it). S = Σ_i V_i in int64 is
exact, so S(D + x*) − S(D) = V_* and ‖S(D + x*) − S(D)‖ ≤ 2^k: the sensitivity proof
assumes only IEEE-754.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import torch

from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.exact_net import (
    GRAD_BITS,
    class_labels_valid,
    norm_sq_upper,
    softmax_residuals,
)
from worker.mechanisms.fixed_point import (
    exp_neg_basic,
    parameters_on_grid,
    pow2,
    sigmoid_basic,
    tanh_basic,
)
from worker.mechanisms.guards import GuardFailed, positive_finite
from worker.models.grud import Grud

__all__ = ["GrudExactClipper", "grud_row_gradients"]

STATE_BITS: Final[int] = 16
"""x̂, masks, hidden states and gradient signals on 2^-16."""
DELTA_BITS: Final[int] = 6
"""Deltas (hours) on 2^-6."""
WEIGHT_BITS: Final[int] = 20
"""|W_int| ≤ 2^20 for every layer."""
_FIT: Final[float] = 2.0**51
_ROWS_PER_CHUNK: Final[int] = 256


@dataclass(frozen=True)
class _Layer:
    weight: torch.Tensor  # W_int, integer-valued float64
    bias: torch.Tensor | None
    bits: int

    def real(self) -> float:
        return pow2(-self.bits)


def _grid(weight: torch.Tensor, bias: torch.Tensor | None) -> _Layer:
    w_int, b_int, bits = parameters_on_grid(weight, bias, range_bits=WEIGHT_BITS)
    return _Layer(weight=w_int, bias=b_int, bits=bits)


def _fits(left: torch.Tensor, terms: int) -> torch.Tensor:
    """(rows,) bool: terms·max|left_row|·2^20 ≤ 2^51 (left: (rows, …) grid values)."""
    top = left.abs().reshape(left.shape[0], -1).amax(dim=1)
    return top * (terms * pow2(WEIGHT_BITS)) <= _FIT  # NaN compares false


def _round_to(x: torch.Tensor, bits: int) -> torch.Tensor:
    return torch.round(x * pow2(bits))


@dataclass(frozen=True)
class RowGradients:
    """Per-example gradient blocks in parameters() order as grid values, each with its
    grid exponent (block value = G·2^-bits), and the rows that met every bound."""

    blocks: tuple[torch.Tensor, ...]
    bits: tuple[int, ...]
    valid: torch.Tensor


def grud_row_gradients(module: Grud, x: torch.Tensor, y: torch.Tensor) -> RowGradients:
    """The module docstring's forward and backward for a batch (x, y)."""
    c = STATE_BITS
    one = pow2(c)
    with torch.no_grad():
        values, masks, deltas = (t.double() for t in module.split(x))
        rows, steps, n_vars = values.shape
        hidden = module.hidden
        y64 = y.double()
        valid = torch.isfinite(values).flatten(1).all(1) & torch.isfinite(masks).flatten(1).all(1)
        valid &= torch.isfinite(deltas).flatten(1).all(1)
        classes = module.classes
        if classes is None:
            valid &= torch.isfinite(y64)
        else:  # a class index: an integer in [0, K), exact comparisons on the row's label
            valid &= class_labels_valid(y64, classes)
        values = torch.nan_to_num(values)
        masks = torch.nan_to_num(masks)
        deltas = torch.nan_to_num(deltas)
        x_mean = module.x_mean.double()
        wx = module.gamma_x_weight.detach().double()
        bx = module.gamma_x_bias.detach().double()
        g_h = _grid(module.gamma_h.weight, module.gamma_h.bias)
        g_in = _grid(module.input_gates.weight, module.input_gates.bias)
        g_rz = _grid(module.hidden_rz.weight, None)
        g_c = _grid(module.hidden_candidate.weight, None)
        g_head = _grid(module.head.weight, module.head.bias)

        # Inputs (elementwise), then onto their grids.
        d_int = _round_to(deltas, DELTA_BITS)
        d_grid = d_int * pow2(-DELTA_BITS)
        x_last = module.last_observed(values, masks).double()
        a_x = d_grid * wx + bx
        gamma_x = exp_neg_basic(a_x).to(values.device)
        x_hat = masks * values + (1.0 - masks) * (gamma_x * x_last + (1.0 - gamma_x) * x_mean)
        x_int = _round_to(x_hat.clamp(0.0, 1.0), c)
        m_int = masks * one
        inputs = torch.cat((x_int, m_int), dim=2)  # (rows, T, 2V)
        valid &= _fits(d_int, n_vars) & _fits(inputs, 2 * n_vars)

        # Hidden decay for every step: exact numerators, then exp(−max(0, ·)).
        z_gamma = d_int @ g_h.weight.T + g_h.bias * pow2(DELTA_BITS)  # type: ignore[operator]
        a_gamma = z_gamma * pow2(-(DELTA_BITS + g_h.bits))
        gamma_h = exp_neg_basic(a_gamma).to(values.device)  # (rows, T, H)
        gates = (inputs @ g_in.weight.T + g_in.bias * one) * pow2(-(c + g_in.bits))  # type: ignore[operator]

        h_int = torch.zeros(rows, hidden, dtype=torch.float64, device=values.device)
        saved: list[tuple[torch.Tensor, ...]] = []
        for t in range(steps):
            h_prev = h_int * pow2(-c)
            hh = _round_to(gamma_h[:, t] * h_prev, c)  # ĥ on the grid
            rz = (hh @ g_rz.weight.T) * pow2(-(c + g_rz.bits))
            r = sigmoid_basic(gates[:, t, :hidden] + rz[:, :hidden]).to(hh.device)
            z = sigmoid_basic(gates[:, t, hidden : 2 * hidden] + rz[:, hidden:]).to(hh.device)
            rh = torch.round(r * hh)
            cand = (rh @ g_c.weight.T) * pow2(-(c + g_c.bits))
            n = tanh_basic(gates[:, t, 2 * hidden :] + cand)
            hh_real = hh * pow2(-c)
            h_int = _round_to((1.0 - z) * hh_real + z * n, c)
            saved.append((h_prev, hh, r, z, rh, n))
        head_numerators = h_int @ g_head.weight.T + g_head.bias * one  # type: ignore[operator]

        # Backward through time.
        if classes is None:
            logit = head_numerators[:, 0] * pow2(-(c + g_head.bits))
            d_logit = _round_to(sigmoid_basic(logit).to(logit.device) - y64, c)  # (rows,)
            head_w = d_logit.unsqueeze(1) * h_int  # grid 2^-2c, exact (≤ 2^32)
            head_b = d_logit.unsqueeze(1)
            dh = d_logit.unsqueeze(1) * pow2(-c) * (g_head.weight[0] * g_head.real())
            head_bits = (2 * c, c)
        else:  # K logits: the module docstring's "K classes"
            logits = head_numerators * pow2(-(c + g_head.bits))
            d_k = softmax_residuals(logits, y64, valid)  # (rows, K) on 2^-20, |·| ≤ 2^20
            # dh's integer product below: every partial sum ≤ Σ_k |d_k|·2^20 ≤ 2^51, exact
            valid &= d_k.abs().sum(dim=1) * pow2(WEIGHT_BITS) <= _FIT  # NaN: false
            head_w = (d_k.unsqueeze(2) * h_int.unsqueeze(1)).reshape(rows, -1)  # ≤ 2^36
            head_b = d_k
            dh = (d_k @ g_head.weight) * pow2(-(GRAD_BITS + g_head.bits))
            head_bits = (GRAD_BITS + c, GRAD_BITS)
        d_r_all, d_z_all, d_n_all, d_g_all, d_xhat = [], [], [], [], []
        for t in range(steps - 1, -1, -1):
            h_prev, hh, r, z, rh, n = saved[t]
            hh_real = hh * pow2(-c)
            d_z = dh * (n - hh_real)
            d_hh = dh * (1.0 - z)
            dn = _round_to(dh * z * (1.0 - n * n), c)
            valid &= _fits(dn, hidden)
            d_rh = (dn @ g_c.weight) * pow2(-(c + g_c.bits))
            d_hh = d_hh + d_rh * r
            dr = _round_to(d_rh * hh_real * r * (1.0 - r), c)
            dz = _round_to(d_z * z * (1.0 - z), c)
            drz = torch.cat((dr, dz), dim=1)
            valid &= _fits(drz, 2 * hidden)
            d_hh = d_hh + (drz @ g_rz.weight) * pow2(-(c + g_rz.bits))
            dgates = torch.cat((dr, dz, dn), dim=1)
            valid &= _fits(dgates, 3 * hidden)
            d_xhat.append((dgates @ g_in.weight[:, :n_vars]) * pow2(-(c + g_in.bits)))
            gh = gamma_h[:, t]
            dg = _round_to(-(d_hh * h_prev) * gh * (a_gamma[:, t] > 0), c)
            d_r_all.append(dr)
            d_z_all.append(dz)
            d_n_all.append(dn)
            d_g_all.append(dg)
            dh = d_hh * gh
        for seq in (d_r_all, d_z_all, d_n_all, d_g_all, d_xhat):
            seq.reverse()
        d_r = torch.stack(d_r_all, 1)
        d_z = torch.stack(d_z_all, 1)
        d_n = torch.stack(d_n_all, 1)
        d_g = torch.stack(d_g_all, 1)  # (rows, T, H)
        dx = torch.stack(d_xhat, 1)  # (rows, T, V)
        d_ax = _round_to(-(dx * (1.0 - masks) * (x_last - x_mean)) * gamma_x * (a_x > 0), c)
        hh_seq = torch.stack([s[1] for s in saved], 1)  # ĥ (rows, T, H)
        rh_seq = torch.stack([s[4] for s in saved], 1)
        d_gates = torch.cat((d_r, d_z, d_n), dim=2)  # (rows, T, 3H)
        d_rz = torch.cat((d_r, d_z), dim=2)
        for left in (d_ax, d_g, d_gates):  # their plain sums over t: steps·max|left| ≤ 2^51
            valid &= left.abs().flatten(1).amax(1) * float(steps) <= _FIT
        for left, right in ((d_ax, d_int), (d_g, d_int), (d_gates, inputs), (d_rz, hh_seq)):
            # Σ_t over outer products: steps·max|left|·max|right| ≤ 2^51 per row.
            lt = left.abs().flatten(1).amax(1)
            rt = right.abs().flatten(1).amax(1)
            valid &= lt * rt * float(steps) <= _FIT
        valid &= d_n.abs().flatten(1).amax(1) * rh_seq.abs().flatten(1).amax(1) * steps <= _FIT

        def outer(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
            return torch.einsum("bto,bti->boi", left, right)  # exact integer sums over t

        blocks = (
            (d_ax * d_int).sum(dim=1),  # w_x: grid 2^-(c + 6)
            d_ax.sum(dim=1),  # b_x: 2^-c
            outer(d_g, d_int).reshape(rows, -1),  # γ_h weight: 2^-(c + 6)
            d_g.sum(dim=1),  # γ_h bias: 2^-c
            outer(d_gates, inputs).reshape(rows, -1),  # input gates: 2^-2c
            d_gates.sum(dim=1),
            outer(d_rz, hh_seq).reshape(rows, -1),  # hidden r, z: 2^-2c
            outer(d_n, rh_seq).reshape(rows, -1),  # candidate: 2^-2c
            head_w,
            head_b,
        )
        bits = (
            c + DELTA_BITS,
            c,
            c + DELTA_BITS,
            c,
            2 * c,
            c,
            2 * c,
            2 * c,
            *head_bits,
        )
        mask = valid.unsqueeze(1)
        return RowGradients(
            blocks=tuple(torch.where(mask, b, 0.0) for b in blocks), bits=bits, valid=valid
        )


class GrudExactClipper:
    """The exact engine for GRU-D: (x, y) → S = Σ_i V_i as int64 (parameters,), sensitivity
    ≤ 2^k by the module docstring's proof."""

    def __init__(
        self, module: Grud, *, grid_bits: int, max_grad_norm: float, parameters: int
    ) -> None:
        if not 0 < grid_bits <= 30:
            raise PlanMismatch("the integer grid does not fit this model")
        positive_finite("dpsgd exact grud", max_grad_norm=max_grad_norm)
        self.module = module
        self.parameters = parameters
        self._units = pow2(grid_bits) / max_grad_norm
        self.row_cap = pow2(grid_bits)
        self._target = self.row_cap * (1.0 - 2.0**-20) - 0.5 * math.sqrt(parameters)
        if self._target <= 0:
            raise PlanMismatch("the grid is too coarse for this many parameters")

    def contributions(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(rows, parameters) float64 integer-valued V_i, a function of row i alone."""
        g = grud_row_gradients(self.module, x, y)
        n_sq = torch.zeros(g.valid.shape[0], dtype=torch.float64, device=g.valid.device)
        for block, bits in zip(g.blocks, g.bits, strict=True):
            n_sq = n_sq + norm_sq_upper(block) * pow2(-2 * bits)
        norm = torch.sqrt(n_sq) * (1.0 + 2.0**-40)  # ≥ ‖g_i‖
        w = torch.clamp(self._target / norm, max=self._units)
        w = torch.where(g.valid, w, 0.0)
        parts = [
            torch.round(w.unsqueeze(1) * (b * pow2(-bits)))
            for b, bits in zip(g.blocks, g.bits, strict=True)
        ]
        v = torch.cat(parts, dim=1)
        if v.shape[1] != self.parameters:
            raise PlanMismatch("the model's parameter count differs from the plan's")
        bound = norm_sq_upper(v) * (1.0 + 2.0**-40)
        if bool((bound > self.row_cap * self.row_cap * (1.0 - 2.0**-40)).any()):
            raise GuardFailed("dpsgd exact grud: a row's contribution exceeds its bound")
        return v

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(self.parameters, dtype=torch.int64, device=x.device)
        for start in range(0, x.shape[0], _ROWS_PER_CHUNK):
            v = self.contributions(
                x[start : start + _ROWS_PER_CHUNK], y[start : start + _ROWS_PER_CHUNK]
            )
            total += v.to(torch.int64).sum(dim=0)  # integers ≤ 2^k each: exact
        return total
