"""ExpM+NF's plan (method ``expm_nf``, nominal): the exponential mechanism's ε and the flow
sampler's sizes, and its resource estimate (the flow training's memory and time).
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
from service.methods.expm import MCMC_ELEMENTS_PER_S
from service.modelspec import (
    MODEL_SPEC,
    GrudSpec,
    LogisticSpec,
    MlpSpec,
    ModelSpec,
    parameter_count,
)
from service.privacy.events import DpEvent, ExponentialMechanismEvent
from service.schemas import ExpmNfOptions, JobRequest, PrivacyPlan

# ExpM+NF's sampler defaults per model family: (steps, θ samples per step, rows per step).
# Tabular: tuned on Adult (benchmarks/expm_adult.py); at ε = 1 within 0.012 AUC of a grid's
# best (steps × l2) on the five sets of benchmarks/results/defaults_study_expm_nf.md, so
# they stay constants (issue 21, point 2). GRU-D keeps T hidden states per
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


# Time (issue: the release hold needs a public estimate of every job's run, service/
# release_hold.py). One flow step evaluates the model for N sampled θ on b rows (N·b
# pairs) and pushes N draws through the flow; a logistic flow is then checked against
# MCMC reference chains on all n̂ rows (worker/mechanisms/fidelity.py, enclave-only
# diagnostic). Rates measured by benchmarks/job_estimates.py
# (benchmarks/results/job_estimates.md) on this shared 2-core machine under load, and set
# below them: the estimate is a ceiling for a busy machine, as DP-SGD's.
# Measured at load 4-12: ~2.5e7 pair elements/s (logistic and MLP [16], planar), 4.6e7-8e7
# for GRU-D (H = 16, T = 48); the constants sit 2.3-2.5x below the slowest run seen (GRU-D
# not further: the bundled ICU default, 300 steps, is estimated ~2,600 s, under the 1 h
# limit).
EXPM_NF_STEP_OVERHEAD_S = 0.01
EXPM_NF_PAIR_ELEMENTS_PER_S = 1e7  # N·b pairs × the model's parameters
EXPM_NF_GRUD_PAIR_ELEMENTS_PER_S = 2e7  # N·b pairs × parameters × T (GRU-D)
EXPM_NF_FLOW_ELEMENTS_PER_S = 2e7  # N draws × the flow's per-draw work
# The fidelity diagnostic's MCMC reference (worker/mechanisms/fidelity.py's REFERENCE_*):
# chains × (warm-up + draws) × leapfrog steps, each a gradient over n̂ rows × parameters,
# by the HMC sampler of ExpM's ``mcmc`` (its rate, service/methods/expm.py).
_REFERENCE_PASSES = 8 * (300 + 400) * 8


def expm_nf_training_seconds(
    spec: ModelSpec, m: Any, *, n_rows: int, n_features: int, series_steps: int | None = None
) -> float:
    """Estimated worker time (s) of one ExpM+NF flow training of ``spec`` with mechanism
    ``m``, from public values only (``n_rows`` the public row count): steps × (a step's
    overhead + N·b·P [× T for GRU-D] model elements + N × the flow's per-draw elements),
    plus, for a binary logistic model on R^P, the fidelity check's MCMC reference over n̂
    rows. Selections count one per candidate training."""
    d = parameter_count(spec, n_features)
    steps, samples = int(m["steps"]), int(m["n_samples_per_step"])
    batch = min(int(m["batch_size"]), max(1, n_rows))
    grud = isinstance(spec, GrudSpec)
    per_pair = d * (series_steps or 1) if grud else d
    pair_rate = EXPM_NF_GRUD_PAIR_ELEMENTS_PER_S if grud else EXPM_NF_PAIR_ELEMENTS_PER_S
    layers = int(m["layers"])
    if m["flow"] == "sylvester":  # triangular products per draw, Q rebuilt per step
        per_draw = layers * 2 * d * d
        per_step_flow = layers * _REFLECTIONS * d * d
    else:
        per_draw, per_step_flow = layers * 4 * d, 0
    per_step = (
        EXPM_NF_STEP_OVERHEAD_S
        + samples * batch * per_pair / pair_rate
        + (samples * per_draw + per_step_flow) / EXPM_NF_FLOW_ELEMENTS_PER_S
    )
    seconds = steps * per_step
    linear = isinstance(spec, LogisticSpec) and spec.classes is None
    if linear and m.get("domain_radius") is None:
        seconds += _REFERENCE_PASSES * n_rows * d / MCMC_ELEMENTS_PER_S
    return seconds


def expm_nf_seconds(
    plan: PrivacyPlan, *, n_features: int, series_steps: int | None = None
) -> float | None:
    """Estimated worker time of an ``expm_nf`` plan (one flow for all its samples; see
    :func:`expm_nf_training_seconds`), or None where no estimate exists (GRU-D without T)."""
    spec: ModelSpec = MODEL_SPEC.validate_python(plan.model)
    if isinstance(spec, GrudSpec) and series_steps is None:
        return None
    return expm_nf_training_seconds(
        spec, plan.mechanism, n_rows=plan.n_rows, n_features=n_features, series_steps=series_steps
    )


def expm_nf_resources(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    """The registry's estimate for ``expm_nf``: the flow's memory and time."""
    memory = expm_memory_bytes(plan, n_features=facts.n_features, series_steps=facts.series_steps)
    return ResourceEstimate(
        seconds=expm_nf_seconds(plan, n_features=facts.n_features, series_steps=facts.series_steps),
        memory_bytes=memory,
        time_hint="use fewer steps, fewer samples per step, a smaller batch or model",
        memory_hint="use the planar flow, fewer layers, a smaller model or fewer samples per step",
    )
