"""ExpM+NF's plan (method ``expm_nf``, nominal): the exponential mechanism's ε and the flow
sampler's sizes, and its resource estimate (the flow training's memory; no time estimate).
The worker's side is worker/mechanisms/expm_nf.py."""

from __future__ import annotations

from typing import Any

from service.methods.common import (
    FLOAT_BYTES,
    WITH_GRAD_AND_ADAM,
    MethodPlan,
    PlanError,
    PlanFacts,
    ResourceEstimate,
    ResourceFacts,
    grud_floats_per_pair_step,
)
from service.modelspec import MODEL_SPEC, GrudSpec, MlpSpec, ModelSpec, parameter_count
from service.privacy.events import DpEvent, ExponentialMechanismEvent
from service.schemas import ExpmNfOptions, JobRequest, PrivacyPlan

# ExpM+NF's sampler defaults per model family: (steps, θ samples per step, rows per step).
# Tabular: tuned on Adult (benchmarks/expm_adult.py). GRU-D keeps T hidden states per
# (θ, row) pair (≈ 55 KiB at T = 48, H = 16, benchmarks/results/grud_memory.md): 32 × 64
# pairs a step, ≈ 0.35 s on one CPU thread for the bundled ICU sample (8 variables, 48 h);
# the whole default job at ε = 1 took 228 s on a shared 2-core machine (one run, holdout
# AUC 0.847, as DP-SGD's default job). Not tuned for utility.
EXPM_NF_DEFAULTS = {"tabular": (1500, 64, 1024), "grud": (300, 32, 64)}


def resolve_expm_nf_options(options: ExpmNfOptions, *, model_kind: str) -> ExpmNfOptions:
    """Fill the sampler sizes the request left out, by the model's family (public)."""
    steps, samples, batch = EXPM_NF_DEFAULTS["grud" if model_kind == "grud" else "tabular"]
    return options.model_copy(
        update={
            "steps": options.steps or steps,
            "n_samples_per_step": options.n_samples_per_step or samples,
            "batch_size": options.batch_size or batch,
        }
    )


def resolve_expm_nf_request(request: JobRequest, _facts: PlanFacts) -> JobRequest:
    """``request`` with its ExpM+NF options as its plan uses them (the sampler sizes of
    :func:`resolve_expm_nf_options`)."""
    options = resolve_expm_nf_options(
        request.expm_nf or ExpmNfOptions(), model_kind=request.model.kind
    )
    return request.model_copy(update={"expm_nf": options})


def _expm_plan(request: JobRequest) -> tuple[DpEvent, dict[str, Any], str]:
    options = resolve_expm_nf_options(
        request.expm_nf or ExpmNfOptions(), model_kind=request.model.kind
    )
    if request.delta != 0:
        raise PlanError("expm_nf is a pure ε-DP mechanism: send delta = 0")
    # u = −Σ(ŷ−y)² − λ‖θ‖² with ŷ = sigmoid(·) ∈ [0,1], y ∈ [0,1]: adding or removing one
    # row changes u by a(θ) ∈ [0,1], always with the same sign (monotone), so a density
    # ∝ exp(ε·u/s), s = 1, is ε-DP and ε-bounded-range under add/remove (proof:
    # worker/mechanisms/expm_nf.py; McSherry & Talwar 2007). Not valid under replace-one.
    mechanism = {
        # The domain key is left out when unset, so that plans stay identical, key for
        # key, to those stored before domains existed (the worker compares).
        **options.model_dump(exclude={"domain_radius"} if options.domain_radius is None else None),
        "epsilon": request.epsilon,
        "sensitivity": 1.0,
        "calibration": "monotone",
    }
    return ExponentialMechanismEvent(epsilon=request.epsilon), mechanism, "pure-composition"


def plan_expm_nf(request: JobRequest, facts: PlanFacts) -> MethodPlan:
    """The registry's entry for ``expm_nf`` (nominal)."""
    return _expm_plan(request)


_REFLECTIONS = 8  # Householder reflections per Sylvester layer (worker default)


def expm_memory_bytes(
    plan: PrivacyPlan, *, n_features: int, series_steps: int | None = None
) -> int | None:
    """Peak bytes of an expm_nf plan's flow training, or None where no estimate exists.
    ``n_features`` is the model's width (V for GRU-D); ``series_steps`` the time grid's T
    (GRU-D only). Issue 11: an MLP [256, 256, 256] with Sylvester layers passed planning
    and then tried to allocate ~100 GB after its data was touched."""
    spec: ModelSpec = MODEL_SPEC.validate_python(plan.model)
    if isinstance(spec, GrudSpec) and series_steps is None:
        return None
    d = parameter_count(spec, n_features)
    m = plan.mechanism
    layers, samples, batch = int(m["layers"]), int(m["n_samples_per_step"]), int(m["batch_size"])
    if m["flow"] == "sylvester":
        # two dense D×D triangular factors, the reflections, diagonals and bias per layer,
        # plus Q (D×D) and the masked factors rebuilt in each forward pass
        per_layer = WITH_GRAD_AND_ADAM * (2 * d * d + (_REFLECTIONS + 3) * d) + 3 * 3 * d * d
    else:  # planar: w, u (D each) and a scalar
        per_layer = WITH_GRAD_AND_ADAM * (2 * d + 1)
    flow = layers * per_layer + WITH_GRAD_AND_ADAM * 2 * d  # + the affine layer
    # N sampled parameter vectors through every layer, and the batched model evaluation
    if isinstance(spec, GrudSpec):
        assert series_steps is not None
        per_pair = series_steps * grud_floats_per_pair_step(hidden=spec.hidden, n_vars=n_features)
    else:
        widths = n_features + (sum(spec.hidden) if isinstance(spec, MlpSpec) else 0) + 1
        per_pair = 3 * widths
    evaluation = 3 * samples * (layers + 2) * d + samples * batch * per_pair
    return FLOAT_BYTES * (flow + evaluation)


def expm_nf_resources(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    """The registry's estimate for ``expm_nf``: the flow's memory; no time estimate exists
    for the flow (the worker's hard time limit is the backstop)."""
    memory = expm_memory_bytes(plan, n_features=facts.n_features, series_steps=facts.series_steps)
    return ResourceEstimate(
        memory_bytes=memory,
        memory_hint="use the planar flow, fewer layers, a smaller model or fewer samples per step",
    )
