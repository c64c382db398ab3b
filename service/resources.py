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

from service.modelspec import LogisticSpec, MlpSpec, ModelSpec, parameter_count
from service.schemas import PrivacyPlan

_FLOAT = 4
_WITH_GRAD_AND_ADAM = 4  # the value, its gradient, Adam's first and second moments
_REFLECTIONS = 8  # Householder reflections per Sylvester layer (worker default)


def expm_memory_bytes(plan: PrivacyPlan, *, n_features: int) -> int | None:
    """Peak bytes of an expm_nf plan's flow training, or None where no estimate exists
    (GRU-D: see worker/mechanisms/expm_nf.py's note, ≈ 55 KiB per (θ, row) pair)."""
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(plan.model)
    if not isinstance(spec, LogisticSpec | MlpSpec):
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
    widths = n_features + (sum(spec.hidden) if isinstance(spec, MlpSpec) else 0) + 1
    evaluation = 3 * samples * (layers + 2) * d + 3 * samples * batch * widths
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
