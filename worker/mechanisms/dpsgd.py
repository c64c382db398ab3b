"""DP-SGD (Abadi et al. 2016): Poisson sampling, per-example clipping, Gaussian noise, run
as the named stages of one step, each depending only on the plan's public values.

What the ledger charged (service/plans.py) is the Poisson-subsampled Gaussian mechanism
with the plan's q, σ, C and T, under add/remove-one neighbours. The run below is exactly
that mechanism, post-processed:

1. **Sample** (:class:`PoissonSampler`): every loaded row is included independently with
   probability q' = ⌊q·2^b⌋/2^b ≤ q (a b-bit integer compared with an integer
   threshold, b ≤ 32 chosen so q' is within 0.4% of q; a smaller rate is never worse
   for privacy, by joint convexity of exp((α−1)D_α)), for exactly T steps. Empty
   batches take their noise step. Nothing here looks at how many rows were loaded
   except to draw one coin per row.
2. **Clip and quantise** (:func:`clipped_integer_sum`): per-example gradients (torch.func
   vmap of grad) are scaled to ℓ2 norm ≤ C·(1 − 2^−20) in float64, divided by C, scaled
   by 2^k (k = the plan's grid_bits) and rounded toward zero, so every example's integer
   vector has ℓ2 norm ≤ 2^k; this is checked exactly in integer arithmetic. The sum over
   the batch is an exact int64 sum: the quantity whose sensitivity is 2^k.
3. **Noise** (:func:`worker.noise.rounded_gaussian`): integer noise N = round(s·Z),
   s = σ·2^k, added in exact integer arithmetic. S + round(s·Z) = round(S + s·Z) for an
   integer S, so the output is a deterministic post-processing of the Gaussian mechanism
   on S with sensitivity 2^k and noise s = σ·2^k: every accountant's curve for the
   subsampled Gaussian applies unchanged. The support of the output is all integers
   whatever the data, which closes the floating-point attacks on Gaussian sampling
   (Mironov 2012; Jin et al. 2022); the sampler's own floating-point gap (relative pmf
   error η) is charged in the plan as a PmfSlackEvent.
4. **Scale and step**: θ ← θ − lr · (S + N)·C·2^−k / (q·n̂), where q·n̂ is the *expected*
   batch size from the public row count n̂. It was q·n with the loaded n before, which
   made the released weights' scale depend on the private row count (an audit measured
   ε ≥ 3.56 at claimed ε = 1 from that alone).

Timing side channels (a step's duration grows with the sampled batch) are out of scope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from service.modelspec import ModelSpec
from worker.mechanisms.base import MechanismOutput, ProgressFn, TabularTrainingSet
from worker.models import build_module
from worker.noise import rounded_gaussian, secure_rng

# Rows per vmap chunk: bounds the (rows × parameters) per-example gradient buffer.
_CHUNK_ELEMENTS = 1 << 24
# Noise coordinates drawn per call of the sampler (amortises its per-call overhead).
_NOISE_BLOCK_ELEMENTS = 1 << 20
_COIN_WIDTHS: tuple[tuple[int, type[np.unsignedinteger]], ...] = (
    (8, np.uint8),
    (16, np.uint16),
    (32, np.uint32),
)


@dataclass(frozen=True)
class DpsgdParams:
    """The plan's public values that the run may depend on (and nothing else)."""

    noise_multiplier: float
    sampling_rate: float
    steps: int
    expected_batch_size: float
    max_grad_norm: float
    learning_rate: float
    grid_bits: int
    parameters: int
    steps_per_epoch: int
    # σ for each epoch (a decaying schedule); empty: noise_multiplier throughout.
    noise_multipliers: tuple[float, ...] = ()
    # Per-example gradient engine (worker/mechanisms/grad_engines.py); JL's r and κ.
    engine: str = "exact"
    jl_projections: int = 0
    jl_kappa: float = 1.0

    def sigma_at(self, step: int) -> float:
        """σ of step ``step`` (1-based), as the plan's event accounts it."""
        if not self.noise_multipliers:
            return self.noise_multiplier
        return self.noise_multipliers[self._epoch(step)]

    def _epoch(self, step: int) -> int:
        return min((step - 1) // self.steps_per_epoch, len(self.noise_multipliers) - 1)

    def steps_with_same_sigma(self, step: int) -> int:
        """How many steps from ``step`` on (itself included) use σ_at(step)."""
        if not self.noise_multipliers or self._epoch(step) == len(self.noise_multipliers) - 1:
            return self.steps - step + 1
        return (self._epoch(step) + 1) * self.steps_per_epoch - step + 1

    @classmethod
    def from_plan(cls, mechanism: dict[str, Any]) -> DpsgdParams:
        return cls(
            steps_per_epoch=int(mechanism["steps_per_epoch"]),
            noise_multipliers=tuple(float(v) for v in mechanism.get("noise_multipliers", ())),
            noise_multiplier=float(mechanism["noise_multiplier"]),
            sampling_rate=float(mechanism["sampling_rate"]),
            steps=int(mechanism["steps"]),
            expected_batch_size=float(mechanism["expected_batch_size"]),
            max_grad_norm=float(mechanism["max_grad_norm"]),
            learning_rate=float(mechanism["learning_rate"]),
            grid_bits=int(mechanism["grid_bits"]),
            parameters=int(mechanism["parameters"]),
            engine=str(mechanism.get("engine", "exact")),
            jl_projections=int(mechanism.get("jl_projections") or 0),
            jl_kappa=float(mechanism.get("jl_kappa", 1.0)),
        )


class PlanMismatch(RuntimeError):
    """The run would not be the mechanism the ledger charged."""


class NoiseStream:
    """Integer noise for one step at a time, drawn in blocks of many steps (the noise does not
    depend on the data, so drawing it early changes nothing but the per-call overhead)."""

    def __init__(self, *, rng: np.random.Generator, size: int, steps: int) -> None:
        self.rng, self.size, self.left = rng, size, steps
        self.block = max(1, _NOISE_BLOCK_ELEMENTS // max(size, 1))
        self._scale: float | None = None
        self._buffer = np.empty((0, size), dtype=np.int64)
        self._next = 0

    def draw(self, *, scale: float, same_scale_ahead: int) -> np.ndarray:
        """Noise for one step; ``same_scale_ahead`` (≥ 1) steps, this one included, share
        ``scale``, so a refill never draws noise no step will use."""
        if scale != self._scale or self._next >= len(self._buffer):
            rows = max(1, min(self.block, same_scale_ahead, self.left))
            flat = rounded_gaussian(self.rng, scale=scale, size=rows * self.size)
            self._buffer = flat.reshape(rows, self.size)
            self._scale, self._next = scale, 0
        out = self._buffer[self._next]
        self._next += 1
        self.left -= 1
        return out


class PoissonSampler:
    """Independent inclusion of each row with probability q' = ⌊q·2^b⌋/2^b ≤ q per step (or
    exactly 1 when q = 1): each row's coin is a uniform b-bit integer compared with an
    integer threshold, so no floating point enters the draw. b is the narrowest of 8, 16 and
    32 bits that keeps q·2^b ≥ 256, i.e. q' within 0.4% below q (never above: a smaller
    rate only lowers the privacy loss), which cuts the random bytes per step 2–4×."""

    def __init__(self, *, sampling_rate: float, rng: np.random.Generator) -> None:
        if not 0.0 < sampling_rate <= 1.0:
            raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
        self.bits, self.dtype = next(
            ((b, t) for b, t in _COIN_WIDTHS if sampling_rate * 2.0**b >= 256), _COIN_WIDTHS[-1]
        )
        # q·2^b is exact in binary floating point (a power-of-two scaling).
        self.threshold = math.floor(sampling_rate * 2.0**self.bits)
        self.rng = rng

    @property
    def rate(self) -> float:
        """The inclusion probability actually used."""
        return self.threshold / 2.0**self.bits

    def indices(self, n: int) -> np.ndarray:
        if self.threshold >= 1 << self.bits:
            return np.arange(n)
        coins = self.rng.integers(0, 1 << self.bits, size=n, dtype=self.dtype)
        return np.flatnonzero(coins < self.threshold)


def _vmap_per_example_grads(
    module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """(rows, parameters): gradients of each row's BCE loss by torch.func (any model)."""
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss_one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        logit = functional_call(module, p, (xi.unsqueeze(0),))
        return torch.nn.functional.binary_cross_entropy_with_logits(
            logit, yi.reshape(logit.shape), reduction="sum"
        )

    grads = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([grads[k].reshape(x.shape[0], -1) for k in params], dim=1)


def _linear_layers(module: torch.nn.Module) -> list[torch.nn.Linear] | None:
    """The module's Linear layers, if they hold every parameter in parameters() order."""
    layers = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    owned = [p for m in layers for p in (m.weight, m.bias) if p is not None]
    mine = list(module.parameters())
    if len(owned) != len(mine) or any(a is not b for a, b in zip(owned, mine, strict=True)):
        return None
    return layers


def _linear_per_example_grads(
    module: torch.nn.Module, layers: list[torch.nn.Linear], x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """(rows, parameters): exact per-example gradients of a model whose parameters all sit
    in Linear layers (logistic regression, the MLPs): one forward, one backward of the summed
    loss to each layer's output, then grad_W[i] = δ_i ⊗ a_i and grad_b[i] = δ_i (the hook
    method of Goodfellow 2015 / Opacus, without per-row autograd)."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep(_m: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        seen.append((inputs[0].detach(), out))

    handles = [layer.register_forward_hook(keep) for layer in layers]
    try:
        logit = module(x)
    finally:
        for h in handles:
            h.remove()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y, reduction="sum")
    deltas = torch.autograd.grad(loss, [out for _, out in seen])
    parts: list[torch.Tensor] = []
    for layer, (a, _), d in zip(layers, seen, deltas, strict=True):
        parts.append(torch.einsum("bo,bi->boi", d, a).reshape(x.shape[0], -1))
        if layer.bias is not None:
            parts.append(d)
    return torch.cat(parts, dim=1)


def per_example_grads(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(rows, parameters) float64 per-example gradients, in parameters() order: the Linear
    fast path where it applies, torch.func otherwise (both exact; tested equal)."""
    layers = _linear_layers(module)
    if layers is not None:
        return _linear_per_example_grads(module, layers, x, y).double()
    return _vmap_per_example_grads(module, x, y).double()


def clipped_integer_sum(
    module: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    grid_bits: int,
    max_grad_norm: float,
    parameters: int,
) -> torch.Tensor:
    """Σ over rows of trunc(2^k · clip_C(g_i)/C) as int64 (shape (parameters,)).

    Every summand has ℓ2 norm ≤ 2^k, checked exactly; zero rows give the zero vector.
    """
    device = x.device
    total = torch.zeros(parameters, dtype=torch.int64, device=device)
    if x.shape[0] == 0:
        return total
    limit = 1.0 - 2.0**-20  # float64 norm errors are ~1e-16·√d: far inside this margin
    scale = 2.0**grid_bits
    bound = 1 << (2 * grid_bits)
    chunk = max(1, _CHUNK_ELEMENTS // max(parameters, 1))
    for start in range(0, x.shape[0], chunk):
        g = per_example_grads(module, x[start : start + chunk], y[start : start + chunk])
        if g.shape[1] != parameters:
            raise PlanMismatch("the model's parameter count differs from the plan's")
        unit = g / max_grad_norm
        norms = torch.linalg.vector_norm(unit, dim=1, keepdim=True)
        factor = torch.clamp(limit / torch.clamp(norms, min=1e-300), max=1.0)
        ints = torch.trunc(unit * factor * scale).to(torch.int64)
        if bool(((ints * ints).sum(dim=1) > bound).any()):
            raise PlanMismatch("a quantised per-example gradient exceeded the clipping norm")
        total += ints.sum(dim=0)
    return total


def _train_one(
    *,
    spec: ModelSpec,
    params: DpsgdParams,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
    done: int,
    total: int,
) -> dict[str, torch.Tensor]:
    # The model's width is d (tabular) or V (GRU-D's (n, 3, T, V) inputs), never the size
    # of x's second axis; GRU-D's imputation means are the schema's public ones.
    module = build_module(spec, data.n_features, public_means=data.public_means).to(device)
    shapes = [p.shape for _, p in module.named_parameters()]
    rng = secure_rng()
    sampler = PoissonSampler(sampling_rate=params.sampling_rate, rng=rng)
    noise = NoiseStream(rng=rng, size=params.parameters, steps=params.steps)
    # Integer units → gradient units, then the average over the *expected* batch.
    unit = params.max_grad_norm * 2.0**-params.grid_bits / params.expected_batch_size
    # The plan's engine (exact: clipped_integer_sum); imported here, it imports this module.
    from worker.mechanisms.grad_engines import integer_sum_for

    integer_sum = integer_sum_for(params, rng=rng)
    for step in range(1, params.steps + 1):
        idx = torch.as_tensor(sampler.indices(data.n), device=device)
        summed = integer_sum(module, data.x.index_select(0, idx), data.y.index_select(0, idx))
        scale = params.sigma_at(step) * 2.0**params.grid_bits
        ahead = params.steps_with_same_sigma(step)
        step_noise = torch.as_tensor(noise.draw(scale=scale, same_scale_ahead=ahead), device=device)
        noisy = (summed + step_noise).double() * unit
        with torch.no_grad():
            offset = 0
            for p, shape in zip(module.parameters(), shapes, strict=True):
                size = p.numel()
                step_ = noisy[offset : offset + size].reshape(shape).to(p.dtype)
                p.sub_(params.learning_rate * step_)
                offset += size
        progress(done + step, total)
    # Parameters and buffers (GRU-D's public means), so the release loads on its own.
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def run_dpsgd(
    *,
    spec: ModelSpec,
    mechanism: dict[str, Any],
    samples: int,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    """Train `samples` independent DP-SGD models (each charged by the plan)."""
    params = DpsgdParams.from_plan(mechanism)
    per = params.steps
    total = per * samples
    releases = [
        _train_one(
            spec=spec,
            params=params,
            data=data,
            device=device,
            progress=progress,
            done=i * per,
            total=total,
        )
        for i in range(samples)
    ]
    return MechanismOutput(releases=releases)
