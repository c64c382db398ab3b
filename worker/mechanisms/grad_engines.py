"""Per-example gradient engines of DP-SGD: one interface, three members.

Every engine maps a Poisson batch (x, y) to the int64 vector S that DP-SGD's noise stage
adds integer noise to (worker/mechanisms/dpsgd.py), and guarantees that adding or removing
one example changes S by at most Δ = κ·2^k in ℓ2 (k = the plan's grid_bits; κ = 1 except
for JL). The noise stage adds rounded Gaussian noise of scale σ·2^k, so the step is the
Gaussian mechanism with noise multiplier σ/κ on a quantity of sensitivity Δ, post-processed.

**Proven (IEEE-754 only): logistic regression and MLPs in every engine.** ``exact``,
``ghost`` and ``jl`` compute :class:`~worker.mechanisms.exact_net.ExactNetClipper`: every
row's clipped contribution is a function of the row and the public parameters alone, bit
for bit (fixed-point grids, exact integer sums, a sigmoid from basic operations), the sum
over rows is exact, and the proof (in worker/mechanisms/exact_net.py) assumes only
correctly rounded float64 operations. ``ghost`` (Li, Tramèr, Liang & Hashimoto 2021,
"Large Language Models Can Be Strong Differentially Private Learners"; Bu, Mao & Xu 2022,
"Scalable and Efficient Training of Large Convolutional Neural Networks with Differential
Privacy") is what that sum already is: per layer, row i's gradient is the rank-one
b_i â_iᵀ, its norm ‖b_i‖·‖â_i‖, and the clipped sum one matrix product Σ_i (w_i b_i) â_iᵀ
per layer, with no per-example gradient materialised; ``exact`` and ``ghost`` give the same
sum. ``jl`` (Bu, Gopi, Kulkarni, Lee, Shen & Tantipongpipat 2021, "Fast and Memory
Efficient Differentially Private-SGD via JL Projections") adds a weight min(…, C/M̂_i) from
r Gaussian directions drawn from the server-side generator each step, M̂_i computed in the
same exact arithmetic (:func:`~worker.mechanisms.exact_net.jl_estimates`), with the hard
cap at κ·C by the exact norm: sensitivity κ·2^k (accounting: service/privacy/jl.py).
An MLP with K ≥ 3 logits (softmax, cross-entropy) takes ``exact`` and ``ghost``, the same
sum (exact_net.py's docstring, "K classes"); ``jl`` refuses it, as the plan does.

**GRU-D** (``exact`` only; ghost and jl refuse it) is proven the same way by
:class:`~worker.mechanisms.exact_grud.GrudExactClipper` (fixed-point forward and backward
through time).

**The float path below is no plan's any more** (:class:`IntegerClipper` with float64
per-example gradients; the float signals :func:`linear_signals` and projections
:func:`jl_projections`): it is the fallback of the exact engine for a model without an
exact path (whose plans service.methods.dpsgd labels nominal; ghost and jl refuse such a
model) and the float reference the tests compare the exact sums with. Its proof rests on
assumption A1, a measured property of float kernels that issue 25's audit showed false in
general (a ReLU row on a unit's boundary moved by more than its own norm).

Their float reduction's claim: ‖S(D') − S(D)‖₂ ≤ Δ for D' = D plus one example, under

  A1 (row stability, measured) a row's float64 signals (layer inputs, output gradients,
     JL projections; for the exact engine its per-example gradient g_i), as computed
     inside any batch, are within relative ε_row = 2^-40 (ℓ2, per layer) of
     batch-independent values (unit tests measure ≤ 2^-40 wherever they run);
  A2 (float64 matrix products) every entry of a matrix product is a sum of its products
     in some order, each operation correctly rounded (u = 2^-53), so an entry over m rows
     has error ≤ γ_m·Σ_i |products| (Higham 2002, "Accuracy and Stability of Numerical
     Algorithms", eq. (3.5), γ_m = m·u/(1 − m·u)), and a pairwise sum of K partials adds
     γ_⌈log₂K⌉ (Higham §4.2);
  A3 at most ROW_LIMIT = 2^24 rows per batch.

Proof sketch. Row i's contribution z_i (integer units) has ‖z_i‖ ≤ c_row by its weight (a
row with a non-finite gradient is zeroed); by A1 it moves by ≤ 2η·c_row (η = 8·ε_row) when
the batch around it changes; the computed sum has error ≤ γ_G·Σ_i ‖z_i‖ (A2,
G = m + ⌈log₂ K⌉), and rounding once adds ≤ √P, so

    ‖S(D') − S(D)‖ ≤ c_row·(1 + 2η·n + γ_G·(2n + 1)) + √P ≤ Δ   for n + 1 ≤ ROW_LIMIT, with
    c_row = (Δ − √P) / (1 + 2·(η + γ_G)·(ROW_LIMIT + 1))   (:func:`row_cap`). ∎

GRU-D (recurrent layers, elementwise decay parameters) is not supported by ghost or jl: the
plan refuses it (422); the JL estimator itself (:func:`jl_projections`) runs on GRU-D and
is tested there.

Why one module (over 500 lines): the float engines (exact, ghost, jl) share the reduction
whose proof (A1-A3 and :func:`row_cap` above) covers them all, next to the one interface and
the dispatch (:func:`exact_clipper`) that picks each model's path, so the proof stays with
the code it covers; the exact paths themselves are already their own modules
(exact_net.py, exact_grud.py).
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
from worker.mechanisms.exact_conv import ExactConvClipper
from worker.mechanisms.exact_grud import GrudExactClipper
from worker.mechanisms.exact_net import ExactNetClipper, exact_net_supports
from worker.mechanisms.exact_softmax import ExactSoftmaxClipper
from worker.mechanisms.guards import positive_finite, row_contributions_within
from worker.models import Cnn, Logistic, Softmax
from worker.models.functional import ParamLayout
from worker.models.grud import Grud

__all__ = [
    "ROW_LIMIT",
    "IntegerClipper",
    "LinearSignals",
    "clipped_integer_sum",
    "exact_clipper",
    "ghost_clipper",
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


def ghost_clipper(
    module: torch.nn.Module, *, grid_bits: int, max_grad_norm: float, parameters: int
) -> ExactNetClipper:
    """Ghost clipping for logistic regression and MLPs: per layer, row i's contribution is
    (w_i·b_i) ⊗ â_i and the clipped sum one matrix product per layer, never a materialised
    per-example gradient, which is what :class:`~worker.mechanisms.exact_net.ExactNetClipper`
    computes, exactly (IEEE-754 only). Sensitivity ≤ 2^k. Any other model is refused."""
    positive_finite("dpsgd ghost", max_grad_norm=max_grad_norm)
    if not exact_net_supports(module):
        raise PlanMismatch("ghost needs logistic regression or an MLP")
    return ExactNetClipper(
        module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
    )


def ghost_integer_sum(
    module: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    grid_bits: int,
    max_grad_norm: float,
    parameters: int,
) -> torch.Tensor:
    """One batch's ghost-clipped int64 sum (:func:`ghost_clipper`)."""
    clip = ghost_clipper(
        module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
    )
    return clip(x, y)


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
    """DP-SGD-JL with the hard cap: weights min(1, C/M̂_i, κC/‖g_i‖), computed by
    :class:`~worker.mechanisms.exact_net.ExactNetClipper` (M̂_i by
    :func:`~worker.mechanisms.exact_net.jl_estimates`). Sensitivity ≤ κ·2^k."""
    positive_finite("dpsgd jl", max_grad_norm=max_grad_norm, kappa=kappa)
    device = x.device
    # Fresh directions every step, drawn even for an empty batch (the draw is data-free).
    directions = gaussian_directions(rng, count=projections, size=parameters)
    if x.shape[0] == 0:
        return torch.zeros(parameters, dtype=torch.int64, device=device)
    if not exact_net_supports(module):  # the plan refuses jl for any other model
        raise PlanMismatch("jl needs logistic regression or an MLP")
    if getattr(module, "classes", None) is not None:  # so does it for K classes
        raise PlanMismatch("jl takes a binary target only (one logit)")
    exact = ExactNetClipper(
        module,
        grid_bits=grid_bits,
        max_grad_norm=max_grad_norm,
        parameters=parameters,
        kappa=kappa,
    )
    return exact(x, y, directions=directions)


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
) -> IntegerSum:
    """The exact engine for ``module``, IEEE-754 only (issue 25):
    :class:`~worker.mechanisms.exact_net.ExactNetClipper` for logistic regression and MLPs,
    :class:`~worker.mechanisms.exact_grud.GrudExactClipper` for GRU-D,
    :class:`~worker.mechanisms.exact_softmax.ExactSoftmaxClipper` for multinomial logistic
    regression (K ≥ 3 classes), :class:`~worker.mechanisms.exact_conv.ExactConvClipper`
    for CNNs; any other model falls back to :class:`IntegerClipper`
    (assumption A1), which no plan reaches today."""
    if isinstance(module, Cnn):
        return ExactConvClipper(
            module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
        )
    if isinstance(module, Softmax):
        return ExactSoftmaxClipper(
            module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
        )
    if exact_net_supports(module):
        return ExactNetClipper(
            module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
        )
    if isinstance(module, Grud):
        return GrudExactClipper(
            module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
        )
    return IntegerClipper(
        module, grid_bits=grid_bits, max_grad_norm=max_grad_norm, parameters=parameters
    )
