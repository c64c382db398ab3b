"""DP-SGD's plans (method ``dpsgd``): the public schedule from the row count, the constant,
decaying-noise and JL variants, each calibrated with the integer-noise sampler's slack.
The worker's side is worker/mechanisms/dpsgd.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.methods.common import MethodPlan, PlanError, PlanFacts, calibrate_with_slack
from service.modelspec import parameter_count
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
)
from service.privacy.jl import jl_bound
from service.privacy.sampling import GRID_BITS, noise_slack
from service.privacy.schedules import (
    calibrate_sigma0,
    decaying_event,
    epoch_noise_multipliers,
    tcdp_estimate,
)
from service.schemas import DpsgdOptions, Guarantee, JobRequest


@dataclass(frozen=True)
class DpsgdSchedule:
    """What DP-SGD's accounting depends on, from public values only.

    ``n_public`` is the dataset's public row count (a DP noisy count released at
    registration, see worker/registration.py), never the number of rows the worker loads.
    Each row is included in a step independently with probability
    q = batch_size / n_public (so ``batch_size`` is the *expected* batch), for
    T = epochs · ⌈n_public / batch_size⌉ steps. The worker's own Poisson sampler runs
    exactly this q and exactly T steps, for any batch size, so no admitted plan can fail
    for a schedule mismatch.
    """

    sampling_rate: float
    steps_per_epoch: int
    steps: int
    batch_size: int
    epochs: int


# Defaults derived from the public row count (issue 12: a 750-row dataset got 9 steps from
# fixed defaults). Measured on 750-row samples of Adult at (1, 1e-5), 8 samples each:
# fixed 256 × 3 epochs (T = 9) median AUC 0.797; derived 37 × 15 (T = 315) 0.816. On the full
# Adult they give the fixed defaults' plan (256 × 3, T = 354).
DEFAULT_STEPS = 300
DEFAULT_BATCH_RANGE = (16, 256)
DEFAULT_MIN_EPOCHS = 3


def resolve_dpsgd_options(options: DpsgdOptions, *, n_rows: int) -> DpsgdOptions:
    """Fill batch_size and epochs the request left out, from the public row count only:
    batch n̂/20 clamped to [16, 256] (never above n̂), epochs for ≈ 300 steps (≥ 3, ≤ 100)."""
    batch = options.batch_size
    if batch is None:
        low, high = DEFAULT_BATCH_RANGE
        batch = max(1, min(n_rows, max(low, min(high, n_rows // 20))))
    epochs = options.epochs
    if epochs is None:
        per_epoch = math.ceil(n_rows / batch)
        epochs = min(100, max(DEFAULT_MIN_EPOCHS, math.ceil(DEFAULT_STEPS / per_epoch)))
    return options.model_copy(update={"batch_size": batch, "epochs": epochs})


def dpsgd_schedule(*, n_rows: int, options: DpsgdOptions) -> DpsgdSchedule:
    """The public schedule (raises :class:`PlanError` when batch_size exceeds the count)."""
    options = resolve_dpsgd_options(options, n_rows=n_rows)
    assert options.batch_size is not None and options.epochs is not None
    if options.batch_size > n_rows:
        raise PlanError(
            f"batch_size {options.batch_size} exceeds the dataset's public row count {n_rows}"
        )
    steps_per_epoch = math.ceil(n_rows / options.batch_size)
    return DpsgdSchedule(
        sampling_rate=options.batch_size / n_rows,
        steps_per_epoch=steps_per_epoch,
        steps=steps_per_epoch * options.epochs,
        batch_size=options.batch_size,
        epochs=options.epochs,
    )


# Models whose parameters all sit in Linear layers applied to one vector per example: the
# ghost norm ‖g_i‖² = Σ_layers ‖b_i‖²·(‖a_i‖² + 1) is exact for them, which the 'ghost'
# engine needs, and the 'jl' engine for its hard cap (worker/mechanisms/grad_engines.py).
LINEAR_ENGINE_MODELS = ("logistic", "mlp")
# The integer-noise sampler's largest scale σ·2^grid_bits (worker/noise.py, MAX_SCALE).
NOISE_SCALE_MAX = 2.0**40


def _options_fields(options: DpsgdOptions, *, exclude: set[str]) -> dict[str, Any]:
    """The options as plan keys. The engine keys are left out for the default engine, so that
    exact-engine plans stay identical, key for key, to those stored before engines existed
    (the worker compares)."""
    if options.engine == "exact":
        exclude = exclude | {"engine", "jl_projections"}
    elif options.engine == "ghost":
        exclude = exclude | {"jl_projections"}
    return options.model_dump(exclude=exclude)


def _check_engine(request: JobRequest, options: DpsgdOptions) -> None:
    if options.engine == "exact":
        return
    if request.model.kind not in LINEAR_ENGINE_MODELS:
        raise PlanError(
            f"engine {options.engine!r} needs a model whose parameters all sit in Linear layers "
            f"({', '.join(LINEAR_ENGINE_MODELS)}); use engine 'exact' for {request.model.kind!r}"
        )
    if options.engine == "jl" and options.noise_schedule != "constant":
        raise PlanError("engine 'jl' supports the constant noise schedule only")


# The models and engines whose worker sum is exact fixed-point arithmetic, proven from
# IEEE-754 alone (worker/mechanisms/exact_net.py, issue 25). GRU-D's float per-example
# gradients and the JL engine's float projections rest on a measured assumption (A1 in
# worker/mechanisms/grad_engines.py), so their releases are labelled nominal.
PROVEN_MODELS = ("logistic", "mlp")
PROVEN_ENGINES = ("exact", "ghost")


def dpsgd_guarantee(request: JobRequest) -> Guarantee:
    """ "proven" for logistic regression and MLPs (tanh or ReLU) in the exact and ghost
    engines; "nominal" otherwise (GRU-D; the jl engine)."""
    engine = (request.dpsgd or DpsgdOptions()).engine
    proven = request.model.kind in PROVEN_MODELS and engine in PROVEN_ENGINES
    return "proven" if proven else "nominal"


def _dpsgd_plan(
    request: JobRequest, *, n_rows: int, n_features: int
) -> tuple[DpEvent, dict[str, Any], str]:
    options = resolve_dpsgd_options(request.dpsgd or DpsgdOptions(), n_rows=n_rows)
    if request.delta <= 0:
        raise PlanError("dpsgd needs delta > 0 (it is an approximate-DP mechanism)")
    _check_engine(request, options)
    schedule = dpsgd_schedule(n_rows=n_rows, options=options)
    try:
        parameters = parameter_count(request.model, n_features)
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    # One noise coordinate per parameter per step; the floating-point gap of the
    # integer-noise sampler is charged, not ignored (service/privacy/sampling.py).
    slack = noise_slack(draws=parameters * schedule.steps)
    public = {
        "public_n_rows": n_rows,
        "expected_batch_size": float(schedule.batch_size),  # = q·n̂ by construction
        "sampling_rate": schedule.sampling_rate,
        "steps_per_epoch": schedule.steps_per_epoch,
        "steps": schedule.steps,
        "parameters": parameters,
        "grid_bits": GRID_BITS,
        "noise": "rounded Gaussian on the grid C·2^-grid_bits, exact integer sum",
    }
    if options.noise_schedule == "exponential":
        return _decaying_dpsgd_plan(
            request, options=options, schedule=schedule, slack=slack, public=public
        )
    if options.engine == "jl":
        return _jl_dpsgd_plan(
            request, options=options, schedule=schedule, slack=slack, public=public
        )
    sigma = calibrate_with_slack(
        request,
        sampling_rate=schedule.sampling_rate,
        steps=schedule.steps,
        slack=slack,
        accountant=options.accountant,
        what="DP-SGD",
    )
    gaussian = PoissonSubsampledGaussianEvent(
        sampling_rate=schedule.sampling_rate, noise_multiplier=sigma, steps=schedule.steps
    )
    mechanism = {
        # The schedule keys are left out of a constant plan so that it stays identical,
        # key for key, to the plans stored before schedules existed (the worker compares).
        **_options_fields(options, exclude={"noise_schedule", "noise_decay"}),
        **public,
        "noise_multiplier": sigma,
    }
    return ComposedEvent(events=(gaussian, slack)), mechanism, options.accountant


def _jl_dpsgd_plan(
    request: JobRequest,
    *,
    options: DpsgdOptions,
    schedule: DpsgdSchedule,
    slack: PmfSlackEvent,
    public: dict[str, Any],
) -> tuple[DpEvent, dict[str, Any], str]:
    """DP-SGD with JL-estimated norms (service/privacy/jl.py for the proof).

    Each example's contribution is capped at κ·C, so the run is the Poisson-subsampled
    Gaussian with sensitivity κ·C: with noise σ·C it is charged at noise multiplier
    σ_eff = σ/κ. σ_eff is calibrated at δ_g = δ − e^ε·β (β = T·q·p, the probability that the
    differing example's cap is ever active), so the uncapped algorithm of Bu et al. is also
    (ε, δ)-DP; the worker adds noise σ = κ·σ_eff ("noise_multiplier"), the event charges
    σ_eff ("charged_noise_multiplier"). Never charged less than the exact engine at the same σ.
    """
    assert options.jl_projections is not None  # the schema's validator
    q, steps = schedule.sampling_rate, schedule.steps
    try:
        bound = jl_bound(
            projections=options.jl_projections,
            epsilon=request.epsilon,
            delta=request.delta,
            sampling_rate=q,
            steps=steps,
        )
    except ValueError as exc:
        raise PlanError(f"cannot bound the JL estimate: {exc}") from exc
    sigma_eff = calibrate_with_slack(
        request,
        sampling_rate=q,
        steps=steps,
        slack=slack,
        accountant=options.accountant,
        what="DP-SGD-JL",
        delta=bound.delta_gaussian,
    )
    sigma = bound.kappa * sigma_eff
    if sigma * 2.0 ** public["grid_bits"] > NOISE_SCALE_MAX:
        raise PlanError(
            f"engine 'jl' with {options.jl_projections} projection(s) needs κ = {bound.kappa:.3g} "
            f"times the noise (σ = {sigma:.3g}), beyond the noise sampler's range: use more "
            "projections, a larger ε, or engine 'ghost'"
        )
    gaussian = PoissonSubsampledGaussianEvent(
        sampling_rate=q, noise_multiplier=sigma_eff, steps=steps
    )
    mechanism = {
        **_options_fields(options, exclude={"noise_schedule", "noise_decay"}),
        **public,
        "noise_multiplier": sigma,
        "charged_noise_multiplier": sigma_eff,
        "jl_kappa": bound.kappa,
        "jl_tail_probability": bound.tail_probability,
        "jl_cap_active_probability": bound.beta,
        "jl_proof": (
            "each example is capped at κ·C with its exact norm, so the run is the subsampled "
            "Gaussian with noise multiplier σ/κ (charged); without the cap it would be "
            "(ε, δ_g + e^ε·β)-DP with β = T·q·p (service/privacy/jl.py)"
        ),
    }
    return ComposedEvent(events=(gaussian, slack)), mechanism, options.accountant


def _decaying_dpsgd_plan(
    request: JobRequest,
    *,
    options: DpsgdOptions,
    schedule: DpsgdSchedule,
    slack: PmfSlackEvent,
    public: dict[str, Any],
) -> tuple[DpEvent, dict[str, Any], str]:
    """DP-SGD with σ_e = σ₀·R^{e/2} in epoch e (service/privacy/schedules.py).

    σ₀ is calibrated on the step-by-step composition of the whole heterogeneous history
    plus the sampler's slack, by the request's accountant; the event (and so the charge)
    is that history's RDP curve. ``tcdp_estimate_epsilon`` is the closed-form tCDP
    estimate (Zhang et al. 2021) for display only: never calibrated on, never charged,
    even where it is lower. The worker runs step k (1-based) with
    ``noise_multipliers[(k − 1) // steps_per_epoch]``.
    """
    decay = options.noise_decay
    if decay is None:  # the schema's validator forbids it; kept for a direct caller
        raise PlanError("noise_schedule 'exponential' needs noise_decay")
    q, spe, epochs = schedule.sampling_rate, schedule.steps_per_epoch, schedule.epochs
    try:
        sigma0 = calibrate_sigma0(
            sampling_rate=q,
            decay=decay,
            steps_per_epoch=spe,
            epochs=epochs,
            epsilon=request.epsilon,
            delta=request.delta,
            accountant=options.accountant,
            slack=slack,
        )
    except ValueError as exc:
        raise PlanError(f"cannot calibrate DP-SGD noise: {exc}") from exc
    estimate = tcdp_estimate(
        sampling_rate=q,
        sigma0=sigma0,
        decay=decay,
        steps_per_epoch=spe,
        epochs=epochs,
        delta=request.delta,
    )
    mechanism = {
        **_options_fields(options, exclude=set()),
        **public,
        "noise_multiplier": sigma0,
        "noise_multipliers": list(
            epoch_noise_multipliers(sigma0=sigma0, decay=decay, epochs=epochs)
        ),
        "tcdp_estimate_epsilon": estimate.epsilon if math.isfinite(estimate.epsilon) else None,
        "tcdp_estimate_conditions_hold": estimate.conditions_hold,
    }
    history = decaying_event(
        sampling_rate=q, sigma0=sigma0, decay=decay, steps_per_epoch=spe, epochs=epochs
    )
    return ComposedEvent(events=(history, slack)), mechanism, options.accountant


def plan_dpsgd(request: JobRequest, facts: PlanFacts) -> MethodPlan:
    """The registry's entry for ``dpsgd`` (proven)."""
    return _dpsgd_plan(request, n_rows=facts.n_rows, n_features=facts.n_features)
