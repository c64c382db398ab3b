"""Per-example gradient engines of DP-SGD: one interface, three members.

Every engine maps a Poisson batch (x, y) to the int64 vector S that DP-SGD's noise stage
adds integer noise to (worker/mechanisms/dpsgd.py), and guarantees that adding or removing
one example changes S by at most Δ = κ·2^k in ℓ2 (k = the plan's grid_bits; κ = 1 except
for JL). The noise stage adds rounded Gaussian noise of scale σ·2^k, so the step is the
Gaussian mechanism with noise multiplier σ/κ on a quantity of sensitivity Δ, post-processed.

* ``exact`` (:class:`IntegerClipper`): per-example gradients materialised in float64 (the
  closed form for logistic regression, the Linear signals below for MLPs, torch.func vmap
  for any other model such as GRU-D), example i weighted by min(2^k/C, c/‖g_i‖) and the
  weighted rows summed by the same reduction as ghost and jl. Memory O(rows × parameters).
  Any model.
* ``ghost`` (Li, Tramèr, Liang & Hashimoto 2021, "Large Language Models Can Be Strong
  Differentially Private Learners", ghost clipping; Bu, Mao & Xu 2022, "Scalable and
  Efficient Training of Large Convolutional Neural Networks with Differential Privacy"):
  for a model whose parameters all sit in Linear layers applied to one vector per example,
  example i's gradient for layer l is b_i â_iᵀ (b_i = ∂ℓ_i/∂(layer output), â_i = [input, 1]
  with the bias), a rank-one matrix, so ‖g_i‖² = Σ_l ‖b_i^l‖²·‖â_i^l‖² exactly, from the
  activations and output gradients a backward keeps anyway. The clipped sum is then
  Σ_l Σ_i (w_i b_i^l) â_i^lᵀ, one GEMM per layer over the rows: per-example gradients are
  never materialised. Memory O(rows × Σ layer widths). Logistic regression and MLPs.
* ``jl`` (Bu, Gopi, Kulkarni, Lee, Shen & Tantipongpipat 2021, "Fast and Memory Efficient
  Differentially Private-SGD via JL Projections"): the norm is estimated from r forward-mode
  Jacobian-vector products with Gaussian directions v_j drawn from the server-side
  generator, M̂_i² = (1/r) Σ_j ⟨g_i, v_j⟩², and example i is weighted by
  min(1, C/M̂_i, κC/‖g_i‖): the last term is a hard cap with the exact ghost norm, which
  makes the sensitivity κC surely (accounting and proof: service/privacy/jl.py). Same
  models as ghost (the cap needs the exact norm), and the same reduction.

The sound reduction (every engine). No engine rounds a row on its own: each only holds the
float64 sum of the weighted contributions, rounded once. (Issue 12: the exact engine used
to truncate each row to the grid and sum integers, which assumed a row's integer vector did
not depend on the other rows; it does, since float kernels depend on the batch, and adding
one row moved three others' vectors, exceeding 2^k.) Claim: :func:`reduced_integer_sum`
(through :func:`capped_integer_sum` for ghost and jl, :class:`IntegerClipper` for exact)
returns S with ‖S(D') − S(D)‖₂ ≤ Δ when D' is D plus one example in the batch, under
assumptions A1–A3:

  A1 (row stability) a row's float64 signals (layer inputs, output gradients, JL
     projections; for the exact engine its per-example gradient g_i), as computed inside
     any batch, are within relative ε_row = 2^-40 (ℓ2, per layer) of batch-independent
     values. Row *invariance* (bit-identical results whatever the other rows) is false on
     this machine: MKL/oneDNN pick kernels by batch size and a row's float32 result
     changes with its batch and its position in it (measured, issue 12), so every engine
     computes the model's forward and backward in float64. There the measured deviation is
     ≤ 2.1e-16 relative (unit tests check ≤ 2^-40 over batch sizes and positions, for the
     signals and for the exact engine's gradients of logistic regression, MLP and GRU-D);
     the dot-product bound γ_d·|W||a| supports it, but it is not proven for the network.
  A2 (IEEE float64) each float64 operation below is correctly rounded (unit roundoff
     u = 2^-53), and a matrix product computes every entry as a sum of its products in
     some order, with or without FMA (no Strassen-type algorithm; true of MKL/OpenBLAS
     dgemm and dgemv; the exact engine's GEMV wᵀG, and, when a chunk's gradients are
     materialised in slices, the slices' GEMVs added in turn, are such sums). Then an
     entry of a chunk's product over m rows has error at most γ_m·Σ_i |products|
     (Higham 2002, "Accuracy and Stability of Numerical Algorithms", eq. (3.5),
     γ_m = m·u/(1 − m·u)), and a pairwise (tree) sum of K partials adds γ_⌈log₂K⌉
     (Higham §4.2), so every entry of the reduced sum is within γ_G·Σ_i |z_i| of the exact
     Σ_i z_i, G = m + ⌈log₂ K⌉ (Higham Lemma 3.3).
  A3 at most ROW_LIMIT = 2^24 rows per batch (a larger batch raises before reducing).

Proof. Let z_i ∈ R^P (integer units, i.e. gradient · 2^k/C) be row i's contribution as the
reduction sees it. Exact engine: z_i = w_i·g_i, ‖z_i‖ = w_i‖g_i‖ ≤ c_row(1 − 2^-20)·‖g_i‖/N̂_i
≤ c_row with N̂_i the float64 norm of g_i (within γ_P of ‖g_i‖), the GEMV's product
roundings being inside γ_m below; a row with a non-finite entry or norm gets w_i = 0 and
its entries are zeroed: z_i = 0. Ghost and jl: per layer fl(w_i·b_i) ⊗ â_i, of norm
√(Σ_l ‖fl(w_i b_i^l)‖²‖â_i^l‖²) ≤ (1 + u)·w_i·N_i with N_i the exact ghost norm of the
computed signals, and the weights make w_i·N̂_i ≤ c_row·(1 − 2^-20) with N̂_i the float64
ghost norm; 2^-20 covers (1 + u)·N_i/N̂_i ≤ 1 + 1e-12, so ‖z_i‖ ≤ c_row. By A1, z_i (its
weight, which is a min of ratios of signals' norms, and the signals) moves by at most
η = 8·ε_row relative when the batch around row i changes: ‖z_i(D') − z_i(D)‖ ≤ 2η·c_row.
The computed sum is Ŝ = Σ_i z_i + E with
‖E‖₂ ≤ γ_G·‖Σ_i |z_i|‖₂ ≤ γ_G·Σ_i ‖z_i‖₂ ≤ γ_G·n·c_row (A2, triangle inequality), and
S = round(Ŝ) = Ŝ + ρ with |ρ_j| ≤ ½. For D' = D + x*:

    S(D') − S(D) = z_* + Σ_{i∈D} (z_i(D') − z_i(D)) + E' − E + ρ' − ρ,
    ‖S(D') − S(D)‖ ≤ c_row·(1 + 2η·n + γ_G·(2n + 1)) + √P ≤ Δ   for n + 1 ≤ ROW_LIMIT, with

    c_row = (Δ − √P) / (1 + 2·(η + γ_G)·(ROW_LIMIT + 1)),  G = 1024 + ⌈log₂(ROW_LIMIT/1024)⌉. ∎

The price: c_row/Δ ≈ 1 − √P/Δ − 2.5e-4 (clipping at 0.9997·C instead of C·(1 − 2^-20)
for P = 10⁴ at k = 20). Every engine's forward/backward runs in float64 for A1 (twice the
activation memory of float32).

Logistic regression in the exact engine (the default engine) needs no A1 (issue 25):
:class:`ExactLogisticClipper` computes each row's gradient and norm bound from the row and
the parameters alone, bit for bit, with IEEE-754 basic operations on fixed-point grids
(:func:`exact_logistic_rows`, worker/mechanisms/fixed_point.py), so η = 0 above and the
proof of its sum assumes only A2 (IEEE float64) and A3.

What is NOT proven here: A1 for the other models and engines (MLPs in every engine, GRU-D,
logistic regression in ghost and jl): measured, not derived, and false in general (issue
25: a ReLU row on a unit's boundary moves by more than its own norm); on other CPUs/GPUs
it should be re-measured: the unit tests do so wherever they run. GRU-D (recurrent layers, whose
per-example gradient is a sum over time steps, and elementwise decay parameters) is not
supported by ghost or jl: the plan refuses it (422); the JL estimator itself
(:func:`jl_projections`) runs on GRU-D and is tested there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import torch
from torch.func import functional_call, grad, jvp, vmap

from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.fixed_point import quantised_theta, sigmoid_basic, theta_bits
from worker.mechanisms.guards import positive_finite, row_contributions_within
from worker.models import Logistic
from worker.models.functional import ParamLayout

__all__ = [
    "ROW_LIMIT",
    "IntegerClipper",
    "LinearSignals",
    "capped_integer_sum",
    "clipped_integer_sum",
    "exact_clipper",
    "ghost_integer_sum",
    "gradient_engine",
    "jl_integer_sum",
    "jl_norm_estimates",
    "jl_projections",
    "linear_layers",
    "linear_signals",
    "per_example_grads",
    "row_cap",
]

ROW_LIMIT: Final[int] = 1 << 24
"""Most rows one batch may hold, any engine (assumption A3)."""
REDUCE_CHUNK: Final[int] = 1024
"""Rows per float64 GEMM of the reduction (m in the proof)."""
_UNIT_ROUNDOFF: Final[float] = 2.0**-53
_MARGIN: Final[float] = 2.0**-20
ROW_STABILITY: Final[float] = 2.0**-40
"""ε_row of assumption A1: relative drift of a row's float64 signals with its batch."""
_CHUNK_ELEMENTS: Final[int] = 1 << 24
"""Most per-example gradient entries the exact engine materialises at once (memory)."""

IntegerSum = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _gamma(n: int) -> float:
    """γ_n = n·u/(1 − n·u) (Higham 2002, Lemma 3.1), float64."""
    nu = n * _UNIT_ROUNDOFF
    return nu / (1.0 - nu)


def row_cap(*, parameters: int, sensitivity: float, drift: float | None = None) -> float:
    """c_row (integer units): the norm each row's contribution may have so that the rounded
    float sum has sensitivity ≤ ``sensitivity`` (the module docstring's proof). ``drift``
    is η, a row's contribution's relative drift with its batch: 8·ε_row under A1 (the
    default), 0 where the contribution is batch-independent bit for bit (exact logistic)."""
    depth = math.ceil(math.log2(ROW_LIMIT / REDUCE_CHUNK))
    if drift is None:
        drift = 8.0 * ROW_STABILITY  # η: a row's contribution's drift with its batch (A1)
    slack = 2.0 * (drift + _gamma(REDUCE_CHUNK + depth)) * (ROW_LIMIT + 1)
    cap = (sensitivity - math.sqrt(parameters)) / (1.0 + slack)
    if cap <= 0:
        raise PlanMismatch("the grid is too coarse for this many parameters")
    return cap


def linear_layers(module: torch.nn.Module) -> list[torch.nn.Linear] | None:
    """The module's Linear layers, if they hold every parameter in parameters() order."""
    layers = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    owned = [p for m in layers for p in (m.weight, m.bias) if p is not None]
    mine = list(module.parameters())
    if len(owned) != len(mine) or any(a is not b for a, b in zip(owned, mine, strict=True)):
        return None
    return layers


@dataclass(frozen=True)
class LinearSignals:
    """Per layer, in parameters() order: â (rows, d_in [+ 1 with a bias]) and
    b = ∂(Σ losses)/∂(layer output) (rows, d_out), float64 copies of what the backward saw."""

    inputs: tuple[torch.Tensor, ...]
    grads: tuple[torch.Tensor, ...]
    bias: tuple[bool, ...]

    def norms(self) -> torch.Tensor:
        """Exact per-example gradient norms (the ghost norm), float64 (rows,)."""
        sq = sum(
            (b * b).sum(dim=1) * (a * a).sum(dim=1)
            for a, b in zip(self.inputs, self.grads, strict=True)
        )
        assert isinstance(sq, torch.Tensor)
        return torch.sqrt(sq)


def linear_signals(
    module: torch.nn.Module, layers: list[torch.nn.Linear], x: torch.Tensor, y: torch.Tensor
) -> LinearSignals:
    """One float64 forward and one backward of the summed loss to each Linear layer's output
    (float64 so that a row's signals move by far less than 2^-40 relative with the batch
    around it: assumption A1 of the module docstring)."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep(_m: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        seen.append((inputs[0].detach(), out))

    params = {k: v.detach().double().requires_grad_() for k, v in module.named_parameters()}
    buffers = {k: v.double() for k, v in module.named_buffers()}
    handles = [layer.register_forward_hook(keep) for layer in layers]
    try:
        logit = functional_call(module, (params, buffers), (x.double(),))
    finally:
        for h in handles:
            h.remove()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y.double(), reduction="sum")
    deltas = torch.autograd.grad(loss, [out for _, out in seen])
    inputs, grads = [], []
    for layer, (a, _), d in zip(layers, seen, deltas, strict=True):
        a64 = a
        if layer.bias is not None:
            a64 = torch.cat([a64, a64.new_ones(a64.shape[0], 1)], dim=1)
        inputs.append(a64)
        grads.append(d.detach().double())
    return LinearSignals(
        inputs=tuple(inputs), grads=tuple(grads), bias=tuple(la.bias is not None for la in layers)
    )


def _tree_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Pairwise sum (depth ⌈log₂ len⌉), the order the proof's γ bound assumes."""
    while len(parts) > 1:
        pairs = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def reduced_integer_sum(
    rows: int, chunk_sum: Callable[[int, int], torch.Tensor], *, parameters: int
) -> torch.Tensor:
    """round(Σ_i z_i) as int64 (parameters,), the one reduction every engine's proof
    assumes: ``chunk_sum(start, stop)`` returns the float64 sum of the contributions z_i of
    rows start … stop − 1 (≤ REDUCE_CHUNK rows, each entry a sum of its products in some
    order: a GEMM or GEMV), the chunks' partials are summed pairwise, and the result is
    rounded once. A non-finite result (impossible when every ‖z_i‖ ≤ c_row) fails the job."""
    if rows > ROW_LIMIT:
        raise PlanMismatch("a batch exceeded the reduction's row limit")
    parts = [chunk_sum(s, min(s + REDUCE_CHUNK, rows)) for s in range(0, rows, REDUCE_CHUNK)]
    if not parts:
        return torch.zeros(parameters, dtype=torch.int64)
    out = _tree_sum(parts)
    if out.shape != (parameters,):
        raise PlanMismatch("the model's parameter count differs from the plan's")
    if not bool(torch.isfinite(out).all()):
        raise PlanMismatch("a batch's clipped gradient sum was not finite")
    return torch.round(out).to(torch.int64)


def capped_integer_sum(
    signals: LinearSignals, weights: torch.Tensor, *, parameters: int
) -> torch.Tensor:
    """round(Σ_i weights_i · g_i) as int64 (parameters,), g_i from the signals; the caller
    makes weights_i·‖g_i‖ ≤ c_row(1 − 2^-20) (integer units). Float64 chunked GEMMs and a
    pairwise sum over chunks (:func:`reduced_integer_sum`), as the module docstring's proof
    needs."""
    scaled = [weights.unsqueeze(1) * b for b in signals.grads]

    def chunk_sum(start: int, stop: int) -> torch.Tensor:
        flat: list[torch.Tensor] = []
        for a, wb, has_bias in zip(signals.inputs, scaled, signals.bias, strict=True):
            total = wb[start:stop].T @ a[start:stop]
            flat += [total[:, :-1].reshape(-1), total[:, -1]] if has_bias else [total.reshape(-1)]
        return torch.cat(flat)

    return reduced_integer_sum(int(weights.shape[0]), chunk_sum, parameters=parameters)


def _signals(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> LinearSignals:
    layers = linear_layers(module)
    if layers is None:
        raise PlanMismatch("ghost and jl need a model whose parameters all sit in Linear layers")
    return linear_signals(module, layers, x, y)


def ghost_integer_sum(
    module: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    grid_bits: int,
    max_grad_norm: float,
    parameters: int,
) -> torch.Tensor:
    """Ghost clipping: exact norms, weights min(1, c/‖g_i‖), one reweighted reduction.
    Sensitivity ≤ 2^k (module docstring)."""
    positive_finite("dpsgd ghost", max_grad_norm=max_grad_norm)
    device = x.device
    if x.shape[0] == 0:
        return torch.zeros(parameters, dtype=torch.int64, device=device)
    signals = _signals(module, x, y)
    bound = row_cap(parameters=parameters, sensitivity=2.0**grid_bits)
    cap = bound * (1.0 - _MARGIN)
    units = 2.0**grid_bits / max_grad_norm  # integer units per gradient unit
    norms = signals.norms()
    weights = torch.minimum(torch.full_like(norms, units), cap / torch.clamp(norms, min=1e-300))
    row_contributions_within("dpsgd ghost", weights, norms, bound)
    return capped_integer_sum(signals, weights, parameters=parameters)


def jl_projections(
    module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, directions: torch.Tensor
) -> torch.Tensor:
    """⟨g_i, v_j⟩ as (r, rows) float64, for directions (r, P) in the flat parameters() order:
    one forward-mode Jacobian-vector product of the per-example losses per direction, no
    backward and no per-example gradient (any model, GRU-D included). In float64, as the
    signals (A1)."""
    layout = ParamLayout.of(module)
    params = {k: v.detach().double() for k, v in module.named_parameters()}
    buffers = {k: v.double() for k, v in module.named_buffers()}
    x64, y64 = x.double(), y.double()

    def losses(p: dict[str, torch.Tensor]) -> torch.Tensor:
        logit = functional_call(module, (p, buffers), (x64,))
        return torch.nn.functional.binary_cross_entropy_with_logits(logit, y64, reduction="none")

    dots = []
    for v in directions:
        tangent = layout.unflatten(v.to(device=x.device, dtype=torch.float64))
        dots.append(jvp(losses, (params,), (tangent,))[1])
    return torch.stack(dots) if dots else torch.zeros(0, x.shape[0], dtype=torch.float64)


def jl_norm_estimates(
    module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, directions: torch.Tensor
) -> torch.Tensor:
    """M̂_i = √((1/r) Σ_j ⟨g_i, v_j⟩²) (Bu et al. 2021), float64 (rows,)."""
    dots = jl_projections(module, x, y, directions)
    return torch.sqrt((dots * dots).mean(dim=0))


def gaussian_directions(rng: np.random.Generator, *, count: int, size: int) -> torch.Tensor:
    """(count, size) standard normal directions from the server-side generator."""
    return torch.from_numpy(rng.standard_normal((count, size)))


def jl_integer_sum(
    module: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    grid_bits: int,
    max_grad_norm: float,
    parameters: int,
    projections: int,
    kappa: float,
    rng: np.random.Generator,
) -> torch.Tensor:
    """DP-SGD-JL with the hard cap: weights min(1, C/M̂_i, κC/‖g_i‖). Sensitivity ≤ κ·2^k."""
    positive_finite("dpsgd jl", max_grad_norm=max_grad_norm, kappa=kappa)
    device = x.device
    # Fresh directions every step, drawn even for an empty batch (the draw is data-free).
    directions = gaussian_directions(rng, count=projections, size=parameters)
    if x.shape[0] == 0:
        return torch.zeros(parameters, dtype=torch.int64, device=device)
    signals = _signals(module, x, y)
    sensitivity = kappa * 2.0**grid_bits
    bound = row_cap(parameters=parameters, sensitivity=sensitivity)
    ratio = bound * (1.0 - _MARGIN)
    ratio /= sensitivity  # c_row/Δ: the clip level C becomes ratio·C
    units = 2.0**grid_bits / max_grad_norm
    estimates = jl_norm_estimates(module, x, y, directions)
    norms = signals.norms()
    clip = torch.minimum(
        ratio * max_grad_norm / torch.clamp(estimates, min=1e-300),
        ratio * kappa * max_grad_norm / torch.clamp(norms, min=1e-300),
    )
    weights = units * torch.clamp(clip, max=1.0)
    row_contributions_within("dpsgd jl", weights, norms, bound)
    return capped_integer_sum(signals, weights, parameters=parameters)


# ------------------------------------------------------------------ the exact engine


def _vmap_per_example_grads(
    module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """(rows, parameters) float64: gradients of each row's BCE loss by torch.func, the model
    run in float64 (any model)."""
    params = {k: v.detach().double() for k, v in module.named_parameters()}
    buffers = {k: v.double() for k, v in module.named_buffers()}

    def loss_one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        logit = functional_call(module, (p, buffers), (xi.unsqueeze(0),))
        return torch.nn.functional.binary_cross_entropy_with_logits(
            logit, yi.reshape(logit.shape), reduction="sum"
        )

    grads = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x.double(), y.double())
    return torch.cat([grads[k].reshape(x.shape[0], -1) for k in params], dim=1)


def _linear_per_example_grads(
    module: torch.nn.Module, layers: list[torch.nn.Linear], x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """(rows, parameters) float64 per-example gradients of a model whose parameters all sit
    in Linear layers, from the float64 signals: grad_W[i] = b_i ⊗ a_i, grad_b[i] = b_i (the
    hook method of Goodfellow 2015 / Opacus, without per-row autograd)."""
    signals = linear_signals(module, layers, x, y)
    parts: list[torch.Tensor] = []
    for a, b, has_bias in zip(signals.inputs, signals.grads, signals.bias, strict=True):
        g = torch.einsum("bo,bi->boi", b, a)
        parts += (
            [g[:, :, :-1].reshape(x.shape[0], -1), g[:, :, -1]]
            if has_bias
            else [g.reshape(x.shape[0], -1)]
        )
    return torch.cat(parts, dim=1)


def _logistic_per_example_grads(
    layer: torch.nn.Linear, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """(rows, d + 1) float64 per-example gradients of logistic regression in closed form,
    without autograd: row i's BCE-with-logits loss has gradient (σ(z_i) − y_i)·(x_i, 1),
    z_i = w·x_i + b, all in float64 (assumption A1)."""
    with torch.no_grad():
        x64 = x.double()
        logits = torch.addmv(layer.bias.double(), x64, layer.weight[0].double())
        residual = (torch.sigmoid(logits) - y.double()).unsqueeze(1)
        return torch.cat((x64 * residual, residual), dim=1)


GradientEngine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def gradient_engine(module: torch.nn.Module) -> GradientEngine:
    """(x, y) → (rows, parameters) float64 per-example gradients in parameters() order, by
    the cheapest method for ``module``, chosen once per run, every one computed in float64
    (A1): the closed form for logistic regression, the Linear signals where every parameter
    sits in a Linear layer, torch.func otherwise (all tested equal to a per-row reference)."""
    if isinstance(module, Logistic):
        layer = module.linear
        return lambda x, y: _logistic_per_example_grads(layer, x, y)
    layers = linear_layers(module)
    if layers is not None:
        return lambda x, y: _linear_per_example_grads(module, layers, x, y)
    return lambda x, y: _vmap_per_example_grads(module, x, y)


def per_example_grads(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(rows, parameters) float64 per-example gradients, in parameters() order."""
    return gradient_engine(module)(x, y)


class IntegerClipper:
    """The exact engine for one run: (x, y) → round(Σ_i w_i·g_i) as int64 (parameters,),
    g_i the materialised float64 per-example gradients, w_i = min(2^k/C, c/‖g_i‖) with
    c = c_row·(1 − 2^-20) (integer units), reduced by :func:`reduced_integer_sum`.
    Sensitivity ≤ 2^k by the module docstring's proof (z_i = w_i·g_i, ‖z_i‖ ≤ c_row).

    A row whose gradient is not finite (NaN, ±inf, or a norm that overflows) gets weight 0
    and is zeroed, so it contributes nothing and cannot break the bound. Memory: at most
    2^24 gradient entries at once; a chunk of the reduction whose rows do not fit is
    computed in slices whose GEMVs are added in turn (still a sum of the chunk's products
    in some order, as A2 needs)."""

    # η of the module docstring's proof: None is A1's drift; 0 for a subclass whose rows are
    # batch-independent bit for bit.
    drift: float | None = None

    def __init__(
        self, module: torch.nn.Module, *, grid_bits: int, max_grad_norm: float, parameters: int
    ) -> None:
        if not 0 < grid_bits <= 30:
            raise PlanMismatch("the integer grid does not fit this model")
        positive_finite("dpsgd exact", max_grad_norm=max_grad_norm)
        self.grads = gradient_engine(module)
        self.parameters = parameters
        self._units = 2.0**grid_bits / max_grad_norm  # integer units per gradient unit
        sensitivity = 2.0**grid_bits
        self._bound = row_cap(parameters=parameters, sensitivity=sensitivity, drift=self.drift)
        self._cap = self._bound * (1.0 - _MARGIN)
        self._slice = max(1, _CHUNK_ELEMENTS // max(parameters, 1))

    def weights(self, g: torch.Tensor) -> torch.Tensor:
        """(rows,) float64 weights min(2^k/C, c/‖g_i‖) (a zero norm gives c/0 = inf, so
        2^k/C); 0 where ‖g_i‖ is not finite, i.e. g_i has a NaN or ±inf entry or its norm
        overflows."""
        norms = torch.linalg.vector_norm(g, dim=1)
        w = torch.clamp(self._cap / norms, max=self._units)
        w = torch.where(torch.isfinite(norms), w, torch.zeros_like(w))
        row_contributions_within("dpsgd exact", w, norms, self._bound)
        return w

    def chunk_sum(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Σ_i w_i·g_i over the rows of (x, y) (≤ REDUCE_CHUNK rows), float64 (parameters,)."""
        total: torch.Tensor | None = None
        for s in range(0, x.shape[0], self._slice):
            g = self.grads(x[s : s + self._slice], y[s : s + self._slice])
            if g.shape[1] != self.parameters:
                raise PlanMismatch("the model's parameter count differs from the plan's")
            w = self.weights(g)  # > 0 exactly where the row's norm, so every entry, is finite
            if not bool((w > 0).all()):
                g = torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)  # 0·inf would be NaN
            part = w @ g
            total = part if total is None else total + part
        assert total is not None
        return total

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            return torch.zeros(self.parameters, dtype=torch.int64, device=x.device)
        return reduced_integer_sum(
            int(x.shape[0]),
            lambda s, e: self.chunk_sum(x[s:e], y[s:e]),
            parameters=self.parameters,
        )


LOGISTIC_FEATURE_BITS: Final[int] = 16
"""c: the exact logistic path reads each feature (in [0, 1]) on the grid 2^-16."""


def exact_logistic_rows(
    layer: torch.nn.Linear, x: torch.Tensor, y: torch.Tensor, *, theta_grid: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_int, r, N̂) for logistic regression, each row's a function of that row and the
    layer's parameters alone, bit for bit, from IEEE-754 basic operations (issue 25;
    worker/mechanisms/fixed_point.py). Row i's gradient is g_i = (r_i·x_int,i·2^-c, r_i):

    * x_int = trunc(clamp(x, 0, 1)·2^c); θ_int = θ on the grid 2^-b (``theta_grid`` =
      (b, m)): z_i = ((x_int,i, 2^c)·θ_int)·2^-(c+b) is an exact integer sum, any order
      (P·2^(c+m) ≤ 2^52);
    * r_i = σ̃(z_i) − y_i, σ̃ from basic operations only (fixed_point.sigmoid_basic);
    * N̂_i = fl(|r_i|·fl(√S_i)), S_i = ‖x_int,i‖²·2^-2c + 1 exact (integers below 2^53),
      so ‖g_i‖ = |r_i|·√S_i ≤ N̂_i/(1 − u)² and a row's contribution formed with one
      more rounded product per entry, (fl(a_i·x_int,ij)·2^-c, a_i) with a_i = fl(w_i·r_i),
      has norm ≤ w_i·N̂_i·(1 + u)²/(1 − u)² ≤ w_i·N̂_i·(1 + 5u).

    Differs from the float gradient at θ by the grids (|Δz| ≤ P·2^-b + ‖θ‖₁·2^-c), the
    same kind of public pre-processing as the schema's encoding. A NaN feature stays NaN
    through clamp and trunc and makes its row's bound NaN, which the row guard refuses."""
    c = LOGISTIC_FEATURE_BITS
    b, m = theta_grid
    with torch.no_grad():
        x_int = torch.trunc(x.double().clamp_(0.0, 1.0).mul_(2.0**c))
        theta = torch.cat((layer.weight[0].detach().double(), layer.bias.detach().double()))
        theta_int = quantised_theta(theta, bits=b, limit_bits=m)
        numerators = torch.mv(x_int, theta_int[:-1]).add_(theta_int[-1] * 2.0**c)  # exact
        residual = sigmoid_basic(numerators.mul_(2.0 ** -(c + b))).sub_(y.double())
        # Σ x_int² per row: integers below 2^53, exact in any order; × 2^-2c and + 1 exact.
        squares = (x_int * x_int).sum(dim=1).mul_(2.0 ** (-2 * c)).add_(1.0)
        return x_int, residual, torch.abs(residual).mul_(torch.sqrt(squares))


def exact_logistic_grads(
    layer: torch.nn.Linear, x: torch.Tensor, y: torch.Tensor, *, theta_grid: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, N̂): the per-example gradients of :func:`exact_logistic_rows` materialised."""
    x_int, r, norms = exact_logistic_rows(layer, x, y, theta_grid=theta_grid)
    g = torch.cat((r.unsqueeze(1) * x_int * 2.0**-LOGISTIC_FEATURE_BITS, r.unsqueeze(1)), 1)
    return g, norms


class ExactLogisticClipper(IntegerClipper):
    """The exact engine for logistic regression with no measured assumption (issue 25):
    each row's residual and norm bound come from :func:`exact_logistic_rows`, so a row's
    contribution (fl(a_i·x_int,i)·2^-c, a_i), a_i = fl(w_i·r_i), w_i = min(2^k/C, c/N̂_i),
    is the same bits whatever else is in the batch: η = 0 in the module docstring's proof
    (A1 is not used), and its norm is ≤ c·(1 + u)·(1 + 5u) ≤ c_row with
    c = c_row·(1 − 2^-20). The chunk's sum Σ_i a_i·x_int,i is one GEMV (its product
    roundings are inside A2's γ_m), then × 2^-c (exact); the bias entry Σ_i a_i."""

    drift = 0.0

    def __init__(
        self, module: Logistic, *, grid_bits: int, max_grad_norm: float, parameters: int
    ) -> None:
        super().__init__(
            module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
        )
        self.layer = module.linear
        self._grid = theta_bits(feature_bits=LOGISTIC_FEATURE_BITS, parameters=parameters)

    def chunk_sum(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x_int, r, norms = exact_logistic_rows(self.layer, x, y, theta_grid=self._grid)
        if x_int.shape[1] + 1 != self.parameters:
            raise PlanMismatch("the model's parameter count differs from the plan's")
        w = torch.clamp(self._cap / norms, max=self._units)  # N̂ = 0: 2^k/C (g_i = 0)
        row_contributions_within("dpsgd exact logistic", w, norms, self._bound)
        a = w * r
        weights_part = torch.mv(x_int.T, a).mul_(2.0**-LOGISTIC_FEATURE_BITS)
        return torch.cat((weights_part, a.sum().reshape(1)))


def clipped_integer_sum(
    module: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    grid_bits: int,
    max_grad_norm: float,
    parameters: int,
) -> torch.Tensor:
    """The exact engine's int64 sum for one batch; see :func:`exact_clipper`."""
    clip = exact_clipper(
        module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
    )
    return clip(x, y)


def exact_clipper(
    module: torch.nn.Module, *, grid_bits: int, max_grad_norm: float, parameters: int
) -> IntegerClipper:
    """The exact engine for ``module``: :class:`ExactLogisticClipper` for logistic
    regression (no assumption A1), :class:`IntegerClipper` for every other model."""
    if isinstance(module, Logistic):
        return ExactLogisticClipper(
            module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
        )
    return IntegerClipper(
        module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
    )
