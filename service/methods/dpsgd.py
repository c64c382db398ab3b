"""DP-SGD's plans (method ``dpsgd``): the public schedule from the row count, the constant,
decaying-noise and JL variants, each calibrated with the integer-noise sampler's slack;
and its resource estimate (worker time and peak memory, from public values only). The
worker's side is worker/mechanisms/dpsgd.py.

Default settings (issue 21, point 2), functions of public values only. For logistic
regression: expected batch ⌊n̂/4⌋ clamped to [16, 256] (never above n̂), epochs
⌈300 / ⌈n̂/batch⌉⌉ (about 300 steps) clamped to [3, 20]; learning rate 1 and clip norm 1
(the schema's). n̂ is the public row count. Where n̂ ≥ 5,120 this is the previous rule's
plan (batch 256, about 300 steps, e.g. Adult's 256 × 3); below, batches are larger and
epochs fewer, which caps the noise a small dataset accumulates (σ·√T/batch, in units of
lr·C: 1.8 at 700 rows under the previous n̂/20 and 15 epochs, 0.47 now). Chosen on
benchmarks/results/defaults_study.md (Adult, 3,000 and 700 of its rows, scikit-learn's
breast cancer and digits; ε = 1, δ = 1e-5), where the previous rule lost 0.035 AUC to
the grid's best at 700 Adult rows and was within 0.02 elsewhere; the rule's figures are
in benchmarks/results/defaults_study_rule.md.

MLPs (model ``mlp``) take the same rule as logistic regression (batch ⌊n̂/4⌋ in
[16, 256], about 300 steps in 3 to 20 epochs, lr 1, C 1). The study's ``--methods
dpsgd_mlp`` (the default MLP, one hidden layer of 16 tanh units, engine exact; same
datasets, grid and two-stage protocol, ε = 1, δ = 1e-5) found the previous rule (⌊n̂/20⌋,
up to 100 epochs) 0.076 AUC below the grid's best at 700 Adult rows (0.766 against 0.842:
35 × 15, T = 300, σ 3.68) and 0.034 below on breast cancer (0.939 against 0.973), within
0.011 elsewhere (benchmarks/results/defaults_study_mlp_before.md, medians of 31 releases on
the small sets); the grid's best points there had batches of n̂/4 and 40 to 150 steps
(700 rows: 175 × 10 epochs; breast cancer: 99 × 30). With this rule the gap is at most
0.012 on every set (700 Adult rows 0.830 against 0.842, breast cancer 0.973 against
0.973, digits 0.955 against 0.953; benchmarks/results/defaults_study_mlp_rule.md, same
grid, again 31 releases); on three sets run only after the rule was chosen (1,500 and
10,000 Adult rows, digits "≥ 5") it is at most 0.003
(benchmarks/results/defaults_study_mlp_confirm_rule.md). Where
n̂ ≥ 5,120 both rules give the same plan (batch 256, about 300 steps), so MLP plans on
Adult-sized data are unchanged. K-class MLPs take it too, as K-class logistic regression
does; the study measured binary targets only.

GRU-D (model ``grud``) takes the same rule too. benchmarks/results/defaults_study_grud.md
(the synthetic ICU generator at 250–2,000 stays, ε = 1, δ = 1e-5, a learning rate × epochs
grid, scored on 4,000 fresh stays) found the previous rule (⌊n̂/20⌋, about 300 steps) within
0.02 of the grid's best on the 2,000-stay sample only and 0.09–0.20 AUC below it on the
smaller sets (500 stays: 0.534 against 0.731); this rule, chosen on tabular data before
that study (so out-of-sample there), scored 0.870 / 0.803 / 0.813 / 0.852 on the 2,000,
500, 1,000 (24 h) and 1,000-stay sets, at or within 0.02 of each grid best
(benchmarks/results/defaults_study_grud_candidates.md, medians of 3–5 releases). Not met:
250 stays, where every rule tried scores 0.55–0.59 and the grid reaches 0.698 with 32
steps. Other models (CNN, and callers that name no model) keep the previous rule (batch
⌊n̂/20⌋ in [16, 256], about 300 steps, 3 to 100 epochs): the study did not measure them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.methods.common import (
    FLOAT_BYTES,
    WITH_GRAD_AND_ADAM,
    MethodPlan,
    PlanError,
    PlanFacts,
    ResourceEstimate,
    ResourceFacts,
    calibrate_with_slack,
    grud_floats_per_pair_step,
)
from service.modelspec import (
    MODEL_SPEC,
    CnnSpec,
    GrudSpec,
    LogisticSpec,
    MlpSpec,
    ModelSpec,
    cnn_row_floats,
    parameter_count,
)
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
from service.schemas import DpsgdOptions, Guarantee, JobRequest, PrivacyPlan


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
# fixed defaults), then per model (issue 21: see the module docstring). Measured on 750-row
# samples of Adult at (1, 1e-5), 8 samples each: fixed 256 × 3 epochs (T = 9) median AUC
# 0.797; derived 37 × 15 (T = 315) 0.816; benchmarks/results/defaults_study.md has the
# logistic rule's figures. On the full Adult every rule gives 256 × 3 (T = 354).
DEFAULT_STEPS = 300
DEFAULT_BATCH_RANGE = (16, 256)
DEFAULT_MIN_EPOCHS = 3
# (batch divisor, epoch cap): batch n̂/divisor, epochs for ≈ DEFAULT_STEPS steps, at most cap.
LOGISTIC_DEFAULTS = (4, 20)
OTHER_MODEL_DEFAULTS = (20, 100)
# The model kinds that take LOGISTIC_DEFAULTS (the module docstring has the evidence).
LOGISTIC_RULE_MODELS = ("logistic", "mlp", "grud")


def resolve_dpsgd_options(
    options: DpsgdOptions, *, n_rows: int, model_kind: str | None = None
) -> DpsgdOptions:
    """Fill batch_size and epochs the request left out, from public values only: the public
    row count n̂ and the model's kind. Logistic regression, MLPs and GRU-D (``model_kind``
    ``"logistic"``, ``"mlp"`` or ``"grud"``): batch n̂/4 clamped to [16, 256] (never above n̂), epochs
    for ≈ 300 steps (≥ 3, ≤ 20). Other models (and callers that name none): batch n̂/20
    clamped the same way, epochs ≥ 3, ≤ 100. Values the request sent are kept as sent."""
    rule = model_kind in LOGISTIC_RULE_MODELS
    divisor, max_epochs = LOGISTIC_DEFAULTS if rule else OTHER_MODEL_DEFAULTS
    batch = options.batch_size
    if batch is None:
        low, high = DEFAULT_BATCH_RANGE
        batch = max(1, min(n_rows, max(low, min(high, n_rows // divisor))))
    epochs = options.epochs
    if epochs is None:
        per_epoch = math.ceil(n_rows / batch)
        epochs = min(max_epochs, max(DEFAULT_MIN_EPOCHS, math.ceil(DEFAULT_STEPS / per_epoch)))
    return options.model_copy(update={"batch_size": batch, "epochs": epochs})


def resolve_dpsgd_request(request: JobRequest, facts: PlanFacts) -> JobRequest:
    """``request`` with its DP-SGD options as its plan uses them (batch_size and epochs
    filled by :func:`resolve_dpsgd_options`): it plans identically, under these rules or
    any later ones (the job's admitted request, service.plans.resolve_defaults)."""
    options = resolve_dpsgd_options(
        request.dpsgd or DpsgdOptions(), n_rows=facts.n_rows, model_kind=request.model.kind
    )
    return request.model_copy(update={"dpsgd": options})


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
    if request.model.kind == "cnn":
        raise PlanError(
            f"engine {options.engine!r} is not built for convolutions yet (ghost clipping and "
            "JL for CNNs: issue 20); model 'cnn' trains with engine 'exact'"
        )
    if request.model.kind not in LINEAR_ENGINE_MODELS:
        raise PlanError(
            f"engine {options.engine!r} needs a model whose parameters all sit in Linear layers "
            f"({', '.join(LINEAR_ENGINE_MODELS)}); use engine 'exact' for {request.model.kind!r}"
        )
    if options.engine == "jl" and options.noise_schedule != "constant":
        raise PlanError("engine 'jl' supports the constant noise schedule only")


# The models whose worker sum is exact fixed-point arithmetic, proven from IEEE-754 alone
# (issue 25): logistic regression and MLPs in every engine (worker/mechanisms/exact_net.py),
# GRU-D in the exact engine, the only one it has (worker/mechanisms/exact_grud.py). A model
# kind added later is labelled nominal until its exact path exists.
# Multinomial logistic regression (a logistic model with K ≥ 3 classes) is proven in the
# exact engine (worker/mechanisms/exact_softmax.py), the only one that takes it; a K-class
# MLP in the exact and ghost engines (worker/mechanisms/exact_net.py, one sum for both)
# (service.plans.with_classes refuses the others before a plan is built).
# CNNs are proven in the exact engine (worker/mechanisms/exact_conv.py), the only one that
# takes them (_check_engine refuses ghost and jl).
PROVEN_MODELS = ("logistic", "mlp", "grud", "cnn")


def dpsgd_guarantee(request: JobRequest) -> Guarantee:
    """ "proven" for the models of PROVEN_MODELS (a K-class model with the exact engine, or
    a K-class MLP with the ghost engine, only); "nominal" for any other."""
    if getattr(request.model, "classes", None) is not None:
        engine = request.dpsgd.engine if request.dpsgd is not None else "exact"
        ghost_mlp = engine == "ghost" and request.model.kind == "mlp"
        return "proven" if engine == "exact" or ghost_mlp else "nominal"
    return "proven" if request.model.kind in PROVEN_MODELS else "nominal"


def _dpsgd_plan(
    request: JobRequest, *, n_rows: int, n_features: int
) -> tuple[DpEvent, dict[str, Any], str]:
    options = resolve_dpsgd_options(
        request.dpsgd or DpsgdOptions(), n_rows=n_rows, model_kind=request.model.kind
    )
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


# Resource estimate (worker/mechanisms/dpsgd.py). Work per step: the Poisson batch's
# per-example gradients (the Linear layers' hook formula for logistic and MLP models,
# torch.func's vmap of grad for GRU-D), their clipping and integer sum: ≈ B·P elements for a
# tabular model and ≈ B·P·T for GRU-D (its cell's parameters are used at each of the T grid
# steps); plus a per-step cost (the Poisson coins, P noise coordinates, the update) and,
# for GRU-D, a per-grid-step cost of the vmapped recurrence (Python-level ops whatever the
# batch). Measured with benchmarks/dpsgd_work.py (benchmarks/results/dpsgd_work.md) on
# this 2-core machine, quiet and shared (load 2-3.5 from other jobs, which made the same
# run 10-25x slower): element rates 3.5e7/s quiet, 1.6e7/s shared (Linear path, MLP
# [256]*3, B = 256); GRU-D 3e7-5e8/s quiet, 1e7-4.5e7/s shared (H = 16-64, T = 48);
# per-step costs 1-20 ms, per grid step ~1 ms quiet, up to ~50 ms shared. The constants
# sit at or below the shared machine's figures: the estimate is a ceiling for a busy
# machine, not a prediction (10-100x above a quiet machine's time; under the heaviest
# load a small GRU-D batch measured up to ~2.5x above it; the worker's hard time limit
# is the backstop).
DPSGD_STEP_OVERHEAD_S = 0.02
DPSGD_GRID_STEP_OVERHEAD_S = 0.01
DPSGD_ELEMENTS_PER_S = 5e6  # Linear path (logistic, MLP)
DPSGD_GRUD_ELEMENTS_PER_S = 1e7  # torch.func vmap over GRU-D, elements = B·P·T
# Elements per per-example-gradient slice: mirrors worker/mechanisms/grad_engines.py's
# _CHUNK_ELEMENTS (a unit test checks they agree; the worker's slice is also at most
# REDUCE_CHUNK rows, so this stays on the high side).
DPSGD_CHUNK_ELEMENTS = 1 << 24
# CNN (worker/mechanisms/exact_conv.py), issue 20: per step, a cost per layer (each
# convolution and the head) and the float64 values the exact engine holds per row
# (modelspec.cnn_row_floats: patches, maps, the row's gradient and contribution) times the
# expected batch, at a rate. The engine is a few dozen torch calls per layer and chunk of
# rows, each a pass over those values, so its time follows the floats, not the multiply-adds:
# measured with benchmarks/cnn_estimates.py (benchmarks/results/cnn_estimates.md; 8×8 digits,
# 28×28×1, 32×32×3, 2-3 convolutions, B = 32-256), the multiply-add rate spread 5.5-6×
# between shapes and the float rate 1.6-1.9×. Float rates: 2.4e8-4.6e8/s quiet (the fastest
# steps, 2 torch threads), 8e6-1.3e7/s shared (the slowest, 2 threads at load 4-9: each
# call waits on both threads' time slices, 10-50× slower; one thread at load 4-5 was 3-20×
# faster than two); per layer ~3 ms quiet, ~0.15 s shared (the 8×8 digits, whose 3 layers
# took 0.48 s per step with few floats). Set near the shared per-layer figure and below the
# slowest shared float rate: every measured shape's slowest step is under its estimate
# (1.5× at least) and its fastest 50-96× under it.
DPSGD_CNN_LAYER_OVERHEAD_S = 0.1
DPSGD_CNN_FLOATS_PER_S = 5e6


def dpsgd_work_twin(request: JobRequest) -> JobRequest | None:
    """A request whose plan costs the worker exactly what ``request``'s does but is cheap to
    plan, or None when planning ``request`` is cheap already (issue 19: four analysts held
    every planning slot with DP-SGD plans whose PLD or decaying-schedule calibration took
    ~20 s and then failed the work limit). The work and memory estimates of a DP-SGD plan
    depend on its steps, batch, model and engine, never on σ, its accountant or its noise
    schedule; the twin keeps those and calibrates one constant σ by RDP (milliseconds)."""
    options = request.dpsgd
    if options is None:
        return None
    if options.accountant == "rdp" and options.noise_schedule == "constant":
        return None
    cheap = options.model_copy(
        update={"accountant": "rdp", "noise_schedule": "constant", "noise_decay": None}
    )
    return request.model_copy(update={"dpsgd": cheap})


def _dpsgd_batch_ceiling(m: Mapping[str, Any]) -> int:
    """A Poisson batch size that is practically never exceeded: B + 10√B + 10 rows (B the
    expected batch), at most the public row count (``m``: a DP-SGD plan's mechanism)."""
    b = float(m["expected_batch_size"])
    n = int(m["public_n_rows"])
    return min(n, math.ceil(b + 10 * math.sqrt(b) + 10))


def dpsgd_seconds(plan: PrivacyPlan, *, series_steps: int | None = None) -> float:
    """Estimated worker time (s) of a ``dpsgd`` plan, from public values only: samples ×
    steps × (per-step cost [+ T × per-grid-step cost for GRU-D] + expected batch ×
    parameters [× T for GRU-D] / the path's element rate); for a CNN, samples × steps ×
    (per-step cost + layers × per-layer cost + expected batch × the exact engine's floats
    per row / its float rate)."""
    spec: ModelSpec = MODEL_SPEC.validate_python(plan.model)
    return plan.samples * dpsgd_training_seconds(spec, plan.mechanism, series_steps=series_steps)


def dpsgd_training_seconds(
    spec: ModelSpec, m: Mapping[str, Any], *, series_steps: int | None = None
) -> float:
    """One DP-SGD training of ``spec`` with mechanism ``m`` (see :func:`dpsgd_seconds`;
    selections count one per candidate training)."""
    elements = float(m["expected_batch_size"]) * int(m["parameters"])
    per_step = DPSGD_STEP_OVERHEAD_S
    if isinstance(spec, CnnSpec):
        layers = len(spec.conv) + 1  # the convolutions and the head
        floats = float(m["expected_batch_size"]) * cnn_row_floats(spec)
        per_step += layers * DPSGD_CNN_LAYER_OVERHEAD_S + floats / DPSGD_CNN_FLOATS_PER_S
    elif isinstance(spec, GrudSpec):
        t = series_steps or 1
        per_step += t * DPSGD_GRID_STEP_OVERHEAD_S + elements * t / DPSGD_GRUD_ELEMENTS_PER_S
    else:
        per_step += elements / DPSGD_ELEMENTS_PER_S
    return int(m["steps"]) * per_step


def dpsgd_memory_bytes(
    plan: PrivacyPlan, *, n_features: int, series_steps: int | None = None
) -> int:
    """Peak bytes of a ``dpsgd`` plan in the worker: the encoded rows (n̂ public rows of d
    floats, or 3·T·V for GRU-D), and per chunk of rows the float64 per-example gradients
    with their clipped and integer copies (4 buffers), plus GRU-D's autograd activations
    for every row and grid step (as for expm_nf). Rows per chunk: the worker's chunk
    (``DPSGD_CHUNK_ELEMENTS`` / P) or a batch ceiling, whichever is smaller."""
    spec: ModelSpec = MODEL_SPEC.validate_python(plan.model)
    return dpsgd_training_memory_bytes(
        spec, plan.mechanism, n_features=n_features, series_steps=series_steps
    )


def dpsgd_training_memory_bytes(
    spec: ModelSpec, m: Mapping[str, Any], *, n_features: int, series_steps: int | None
) -> int:
    """One DP-SGD training's peak bytes (see :func:`dpsgd_memory_bytes`)."""
    p = int(m["parameters"])
    n = int(m["public_n_rows"])
    rows = min(max(1, DPSGD_CHUNK_ELEMENTS // p), _dpsgd_batch_ceiling(m))
    grads = 4 * 8 * rows * p
    if isinstance(spec, CnnSpec):
        # the exact engine's chunk of rows (DPSGD_CHUNK_ELEMENTS float64 values at most),
        # three times over for the temporaries of its passes
        per_row = cnn_row_floats(spec)
        rows = min(max(1, DPSGD_CHUNK_ELEMENTS // per_row), _dpsgd_batch_ceiling(m))
        return (
            FLOAT_BYTES * n * n_features
            + 3 * 8 * rows * per_row
            + FLOAT_BYTES * WITH_GRAD_AND_ADAM * p
        )
    if isinstance(spec, GrudSpec):
        t = series_steps or 1
        data = FLOAT_BYTES * n * 3 * t * n_features
        activations = (
            FLOAT_BYTES
            * rows
            * t
            * grud_floats_per_pair_step(hidden=spec.hidden, n_vars=n_features)
        )
    else:
        data = FLOAT_BYTES * n * n_features
        hidden = sum(spec.hidden) if isinstance(spec, MlpSpec) else 0
        k_logits = isinstance(spec, (LogisticSpec, MlpSpec))
        outputs = (spec.classes or 1) if k_logits else 1  # K logits
        widths = n_features + hidden + outputs
        activations = FLOAT_BYTES * rows * 3 * widths
    return data + grads + activations + FLOAT_BYTES * WITH_GRAD_AND_ADAM * p


def dpsgd_resources(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    """The registry's estimate for ``dpsgd``: its worker time and peak memory."""
    return ResourceEstimate(
        seconds=dpsgd_seconds(plan, series_steps=facts.series_steps),
        memory_bytes=dpsgd_memory_bytes(
            plan, n_features=facts.n_features, series_steps=facts.series_steps
        ),
        time_hint="use fewer epochs, a smaller batch or a smaller model",
        memory_hint="use fewer samples per step or a smaller batch",
    )
