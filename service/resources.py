"""What a plan will cost the worker, estimated from public values before anything is
charged (issue 11: an expm_nf MLP [256, 256, 256] with Sylvester layers passed planning
and then tried to allocate ~100 GB after its data was touched, keeping its charge).

The estimate is deliberately simple and on the high side: float32 tensors, parameters
counted with their gradients and Adam's two moments, autograd activations counted three
times. It is used to refuse at quote time what the worker cannot hold; it is not a
guarantee that an admitted plan fits.
"""

from __future__ import annotations

from pydantic import TypeAdapter

from service.modelspec import GrudSpec, MlpSpec, ModelSpec, parameter_count
from service.schemas import PrivacyPlan

_FLOAT = 4
_WITH_GRAD_AND_ADAM = 4  # the value, its gradient, Adam's first and second moments
_REFLECTIONS = 8  # Householder reflections per Sylvester layer (worker default)


# GRU-D keeps its gates' activations for every (θ, row) pair and grid step: measured
# ≈ 1.4 KiB per pair and step at H = 16, V = 8 (4.37 MiB per θ for 64 rows × 48 steps,
# forward and backward, benchmarks/results/grud_memory.md), i.e. ≈ 360 floats; counted
# here as 3·(12·H + 10·V) floats (816 at H = 16, V = 8), on the high side.
def _grud_floats_per_pair_step(*, hidden: int, n_vars: int) -> int:
    return 3 * (12 * hidden + 10 * n_vars)


def expm_memory_bytes(
    plan: PrivacyPlan, *, n_features: int, series_steps: int | None = None
) -> int | None:
    """Peak bytes of an expm_nf plan's flow training, or None where no estimate exists.
    ``n_features`` is the model's width (V for GRU-D); ``series_steps`` the time grid's T
    (GRU-D only)."""
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(plan.model)
    if isinstance(spec, GrudSpec) and series_steps is None:
        return None
    d = parameter_count(spec, n_features)
    m = plan.mechanism
    layers, samples, batch = int(m["layers"]), int(m["n_samples_per_step"]), int(m["batch_size"])
    if m["flow"] == "sylvester":
        # two dense D×D triangular factors, the reflections, diagonals and bias per layer,
        # plus Q (D×D) and the masked factors rebuilt in each forward pass
        per_layer = _WITH_GRAD_AND_ADAM * (2 * d * d + (_REFLECTIONS + 3) * d) + 3 * 3 * d * d
    else:  # planar: w, u (D each) and a scalar
        per_layer = _WITH_GRAD_AND_ADAM * (2 * d + 1)
    flow = layers * per_layer + _WITH_GRAD_AND_ADAM * 2 * d  # + the affine layer
    # N sampled parameter vectors through every layer, and the batched model evaluation
    if isinstance(spec, GrudSpec):
        assert series_steps is not None
        per_pair = series_steps * _grud_floats_per_pair_step(hidden=spec.hidden, n_vars=n_features)
    else:
        widths = n_features + (sum(spec.hidden) if isinstance(spec, MlpSpec) else 0) + 1
        per_pair = 3 * widths
    evaluation = 3 * samples * (layers + 2) * d + samples * batch * per_pair
    return _FLOAT * (flow + evaluation)


# Worst-case rate of the Langevin sampler's work, in (row × parameter) elements per second:
# measured ≈ 2.3e9 on Adult (30,162 rows × 105 parameters × 300 steps in 0.41 s, 2 CPU
# threads, benchmarks/results/expm_proven.md); 2e8 leaves a 10× margin for slower or
# busier machines.
LANGEVIN_ELEMENTS_PER_S = 2e8


def expm_langevin_seconds(plan: PrivacyPlan) -> float:
    """Estimated worker time of an ``expm`` (Langevin) plan: each of the T steps of each
    released chain touches every (row, parameter) element a few times (two matrix-vector
    products and the fixed-point quantisation), at :data:`LANGEVIN_ELEMENTS_PER_S`."""
    m = plan.mechanism
    elements = int(m["public_n_rows"]) * int(m["parameters"]) * int(m["steps"]) * plan.samples
    return elements / LANGEVIN_ELEMENTS_PER_S
