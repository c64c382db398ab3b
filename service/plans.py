"""Requests become privacy plans: a pure function of the request and public metadata.

The worker calls :func:`build_plan` again with the stored request and refuses to run a
job whose stored plan differs from the recomputed one ("a plan it cannot reproduce").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.dataschema import CategoricalColumn, TabularSchema, parse_schema
from service.modelspec import ModelSpec, parameter_count
from service.privacy.calibrate import Accountant, calibrate_noise_multiplier
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    ExponentialMechanismEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
    SelfComposedEvent,
)
from service.privacy.jl import jl_bound
from service.privacy.orders import ORDERS
from service.privacy.sampling import GRID_BITS, noise_slack
from service.privacy.schedules import (
    calibrate_sigma0,
    decaying_event,
    epoch_noise_multipliers,
    tcdp_estimate,
)
from service.schemas import (
    MCMC_ONLY_FIELDS,
    DpsgdOptions,
    ExpmNfOptions,
    ExpmOptions,
    Guarantee,
    JobRequest,
    PrivacyPlan,
)
from service.timeseries import TimeSeriesSchema


class PlanError(ValueError):
    """The request cannot be turned into a plan (a 4xx for the caller, nothing charged)."""


def _repeat(event: DpEvent, k: int) -> DpEvent:
    return event if k == 1 else SelfComposedEvent(event=event, count=k)


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


def _calibrate_with_slack(
    request: JobRequest,
    *,
    sampling_rate: float,
    steps: int,
    slack: PmfSlackEvent,
    accountant: Accountant,
    what: str,
    delta: float | None = None,
) -> float:
    """σ of a (subsampled) Gaussian history that, with the integer-noise sampler's slack,
    stays within the request's (ε, δ) (or ``delta`` where given; raises :class:`PlanError`).

    RDP: the slack adds τ(2α−1)/(α−1) ≤ 12τ at every calibration order (α ≥ 1.1);
    PLD: pointwise e^{±τ} closeness turns (ε', δ') into (ε' + 2τ, δ'·e^{τ}).
    """
    try:
        return calibrate_noise_multiplier(
            sampling_rate=sampling_rate,
            steps=steps,
            epsilon=request.epsilon - 12.0 * slack.tau,
            delta=(request.delta if delta is None else delta) * math.exp(-slack.tau),
            accountant=accountant,
        )
    except ValueError as exc:
        raise PlanError(f"cannot calibrate {what} noise: {exc}") from exc


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
    sigma = _calibrate_with_slack(
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
    sigma_eff = _calibrate_with_slack(
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


# Fixed-point grid of the Langevin sampler's exact gradient sum (worker/mechanisms/langevin.py):
# residuals p − y ∈ [−1, 1] and features x ∈ [0, 1] are truncated onto 2^-a and 2^-c with
# a + c ≤ 32, so a row's integer gradient r·x has entries ≤ 2^32 and every partial sum of
# ≤ 2^20 rows is an integer below 2^53, exact in float64. The grid is coarsened when the
# noise is large, so the integer noise's scale σ·2^(a+c)·√B stays ≤ 2^40 (the sampler's
# range, worker/noise.py); its resolution is then still far below the noise.
LANGEVIN_MAX_GRID_BITS = 32
LANGEVIN_MAX_NOISE_SCALE = 2.0**40


def langevin_grid_bits(*, noise_multiplier: float, norm_sq_bound: int) -> tuple[int, int]:
    """(a, c): residual and feature bits of the Langevin grid for this σ and B."""
    room = math.floor(
        math.log2(LANGEVIN_MAX_NOISE_SCALE / (noise_multiplier * math.sqrt(norm_sq_bound)))
    )
    total = min(LANGEVIN_MAX_GRID_BITS, room)
    if total < 2:
        raise PlanError(
            f"the Langevin noise (σ = {noise_multiplier:.3g}) is too large for the sampler's "
            "grid: use fewer steps or a larger ε"
        )
    return (total + 1) // 2, total // 2


def row_norm_sq_bound(schema: TabularSchema) -> int:
    """B with ‖(x, 1)‖² ≤ B for every encoded row x of this schema, from the schema alone:
    each numeric column contributes at most 1 (scaled to [0, 1]), each categorical column
    exactly one 1 (one-hot over declared levels), and the bias 1."""
    numeric = sum(1 for c in schema.columns if not isinstance(c, CategoricalColumn))
    categorical = len(schema.columns) - numeric
    return numeric + categorical + 1


# Default Langevin steps by ε (benchmarks/results/expm_proven.md: on Adult, 100 steps gave
# median AUC 0.870 against 0.857 for 300 at ε = 0.1, and 0.740 against 0.702 at ε = 0.01;
# 300 gave 0.893 against 0.890 at ε = 1). Chosen on Adult, a public choice elsewhere.
DEFAULT_LANGEVIN_STEPS = 300
DEFAULT_LANGEVIN_STEPS_SMALL_EPSILON = 100


# Defaults of the MCMC sampler (asymptotic). l2 = 30 is the regulariser with which exact
# sampling of this target reached test AUC 0.892 at ε = 1 on Adult (issue 13's HMC
# measurement, tuned there without accounting: a public choice elsewhere).
DEFAULT_MCMC_STEPS = 500
DEFAULT_MCMC_CHAINS = 8
DEFAULT_MCMC_LEAPFROG_STEPS = 16
DEFAULT_MCMC_STEP_SIZE = 0.05
DEFAULT_MCMC_L2 = 30.0
DEFAULT_LANGEVIN_L2 = 1.0


def resolve_expm_options(options: ExpmOptions, *, epsilon: float) -> ExpmOptions:
    """Fill the values the request left out, from its ε and sampler (public)."""
    update: dict[str, Any] = {}
    if options.sampler == "langevin":
        if options.steps is None:
            steps = DEFAULT_LANGEVIN_STEPS if epsilon >= 1 else DEFAULT_LANGEVIN_STEPS_SMALL_EPSILON
            update["steps"] = steps
        if options.l2 is None:
            update["l2"] = DEFAULT_LANGEVIN_L2
        return options.model_copy(update=update)
    steps = options.steps if options.steps is not None else DEFAULT_MCMC_STEPS
    defaults = {
        "steps": steps,
        "l2": DEFAULT_MCMC_L2,
        "chains": DEFAULT_MCMC_CHAINS,
        "warmup": steps,
        "leapfrog_steps": DEFAULT_MCMC_LEAPFROG_STEPS,
        "step_size": DEFAULT_MCMC_STEP_SIZE,
    }
    update = {k: v for k, v in defaults.items() if getattr(options, k) is None}
    return options.model_copy(update=update)


def _expm_langevin_plan(
    request: JobRequest, *, n_rows: int, n_features: int, norm_sq_bound: int
) -> tuple[DpEvent, dict[str, Any], str]:
    """The regularised ExpM for logistic regression, sampled by unadjusted Langevin steps
    whose privacy is proven by composition (see :class:`ExpmOptions` and
    worker/mechanisms/langevin.py).

    Step t releases (to the next step only) G_t + N_t, the exact sum over the rows of the
    fixed-point per-row gradients of the logistic loss (entries r·x on the grid) plus
    integer noise round(σ·Δ·Z): add/remove-one changes G_t by one row's vector, whose ℓ2
    norm is at most Δ = 2^(a+c)·√B (|r| ≤ 1, ‖(x, 1)‖² ≤ B from the public schema, checked
    exactly in the worker). So each step is the Gaussian mechanism with noise multiplier σ
    post-processed, the T steps are their adaptive composition (the full-batch, q = 1 case
    of the subsampled Gaussian event), and the last iterate is a post-processing of the
    whole history: (ε, δ)-DP by the accountant, whatever the chain's mixing.
    """
    options = resolve_expm_options(request.expm or ExpmOptions(), epsilon=request.epsilon)
    steps = options.steps
    assert steps is not None
    if request.model.kind != "logistic":
        raise PlanError(
            "the proven ExpM sampler (expm, sampler 'langevin') is for logistic regression: "
            "its sensitivity bound needs the convex, Lipschitz logistic loss"
        )
    if request.delta <= 0:
        raise PlanError(
            "expm with the 'langevin' sampler is (ε, δ)-DP by Gaussian composition: send delta > 0"
        )
    parameters = n_features + 1
    slack = noise_slack(draws=parameters * steps)
    accountant: Accountant = "pld"  # exact for q = 1 up to its proven discretisation
    sigma = _calibrate_with_slack(
        request,
        sampling_rate=1.0,
        steps=steps,
        slack=slack,
        accountant=accountant,
        what="Langevin",
    )
    gaussian = PoissonSubsampledGaussianEvent(
        sampling_rate=1.0, noise_multiplier=sigma, steps=steps
    )
    # ULA θ' = θ − η·k·∇F + √(2η)·ξ with η·k = lr/n̂ and noise σ·√B on the gradient sum:
    # √(2η) = (lr/n̂)·σ·√B, so k = 2n̂ / (lr·σ²·B) (descriptive: the proof does not use it).
    inverse_temperature = 2.0 * n_rows / (options.learning_rate * sigma**2 * norm_sq_bound)
    residual_bits, feature_bits = langevin_grid_bits(
        noise_multiplier=sigma, norm_sq_bound=norm_sq_bound
    )
    mechanism = {
        **options.model_dump(exclude=set(MCMC_ONLY_FIELDS)),
        "public_n_rows": n_rows,
        "parameters": parameters,
        "row_norm_sq_bound": norm_sq_bound,
        "residual_bits": residual_bits,
        "feature_bits": feature_bits,
        "noise_multiplier": sigma,
        "inverse_temperature": inverse_temperature,
        "target": "π(θ) ∝ exp(−k·(Σ logistic loss + l2·‖θ‖²/2)), k = inverse_temperature",
        "proof": "Gaussian mechanism composed over the T full-batch steps that ran (q = 1)",
        "noise": "rounded Gaussian on the fixed-point grid, exact integer sum",
    }
    return ComposedEvent(events=(gaussian, slack)), mechanism, accountant


def _expm_mcmc_plan(
    request: JobRequest, *, n_rows: int, n_features: int, norm_sq_bound: int
) -> tuple[DpEvent, dict[str, Any], str]:
    """The regularised ExpM for logistic regression, sampled by MCMC (asymptotic label).

    Accounting of the exact target (Gopi, Lee & Liu 2022, "Private Convex Optimization via
    Exponential Mechanism", COLT; their Gaussian-DP bound for strongly log-concave
    densities): if π_D ∝ exp(−k·(F_D + l2·‖θ‖²/2)) with F_D a sum of convex per-row losses,
    the log-densities of neighbours differ by k·ℓᵢ, a (k·G)-Lipschitz function, and both
    are (k·l2)-strongly log-concave; then one draw from π_D is μ-GDP with
    μ = k·G/√(k·l2) = G·√(k/l2). Here ℓᵢ is the logistic loss of row (xᵢ, 1), whose
    gradient (σ(θ·x) − y)·(x, 1) has norm ≤ G = √B (B: the public schema's bound on
    ‖(x, 1)‖², checked in the worker), under add/remove one row.

    μ-GDP is the Gaussian mechanism with noise multiplier 1/μ, i.e. the q = 1, one-step
    subsampled Gaussian event: its RDP is α·μ²/2 (exact), and the plan picks the largest μ
    whose (ε, δ) meets the request by calibrating that event (PLD, an upper bound on the
    exact conversion δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) of Dong, Roth & Su 2022,
    Cor. 2.13), then k = l2·μ²/B.

    Caveat: this is exact for an exact draw from π only. The finite MCMC run is not proven
    close to π (no total-variation or Rényi bound for the steps the plan fixes), so the
    release is labelled asymptotic, not proven.
    """
    options = resolve_expm_options(request.expm or ExpmOptions(), epsilon=request.epsilon)
    assert options.chains is not None and options.l2 is not None
    if request.model.kind != "logistic":
        raise PlanError(
            "ExpM with the 'mcmc' sampler is for logistic regression: its Gaussian-DP bound "
            "needs the convex, Lipschitz logistic loss"
        )
    if request.delta <= 0:
        raise PlanError(
            "expm with the 'mcmc' sampler is Gaussian-DP, (ε, δ)-DP only for delta > 0: "
            "send delta > 0"
        )
    if options.l2 <= 0:
        raise PlanError(
            "expm with the 'mcmc' sampler needs l2 > 0 (its Gaussian-DP bound needs a "
            "strongly log-concave target)"
        )
    if request.samples > options.chains:
        raise PlanError(
            f"samples = {request.samples} needs at least as many chains (chains = "
            f"{options.chains}): each release is the final state of its own chain"
        )
    accountant: Accountant = "pld"
    try:
        sigma = calibrate_noise_multiplier(
            sampling_rate=1.0,
            steps=1,
            epsilon=request.epsilon,
            delta=request.delta,
            accountant=accountant,
        )
    except ValueError as exc:
        raise PlanError(f"cannot calibrate the Gaussian-DP parameter: {exc}") from exc
    gdp_mu = 1.0 / sigma
    inverse_temperature = options.l2 * gdp_mu**2 / norm_sq_bound
    mechanism = {
        **options.model_dump(exclude={"learning_rate"}),
        "parameters": n_features + 1,
        "row_norm_sq_bound": norm_sq_bound,
        "gdp_mu": gdp_mu,
        "inverse_temperature": inverse_temperature,
        "target": "π(θ) ∝ exp(−k·(Σ logistic loss + l2·‖θ‖²/2)), k = inverse_temperature",
        "proof": (
            "an exact draw from π is μ-GDP, μ = √(B·k/l2) (Gopi, Lee & Liu 2022); the finite "
            "MCMC run is not proven close to π (asymptotic)"
        ),
        "algorithm": (
            "HMC; in the warm-up a dense metric (the inverse of the target's Hessian at the "
            "chains' states) and the step size (dual averaging) are adapted, then frozen; "
            "the release is the final state of one chain per sample"
        ),
    }
    return (
        PoissonSubsampledGaussianEvent(sampling_rate=1.0, noise_multiplier=sigma, steps=1),
        mechanism,
        accountant,
    )


def _model_json(model: ModelSpec) -> dict[str, Any]:
    """The plan's model field. The default tanh activation is left out so that an MLP plan
    stays identical, key for key, to the plans stored before activations existed (the
    worker compares stored and re-derived plans)."""
    out = model.model_dump()
    if out.get("activation") == "tanh":
        del out["activation"]
    return out


def build_plan(
    request: JobRequest,
    *,
    n_rows: int,
    n_features: int,
    dataset_kind: str = "tabular",
    norm_sq_bound: int | None = None,
) -> PrivacyPlan:
    """Turn a validated request into its privacy plan (raises :class:`PlanError`).

    Public inputs only: ``n_rows`` is the dataset's public (DP noisy) row count,
    ``n_features`` the encoded width its public schema implies (for a time-series
    dataset the number of variables V, GRU-D's width), ``dataset_kind`` its kind,
    ``norm_sq_bound`` its bound on ‖(x, 1)‖² (:func:`row_norm_sq_bound`; tabular only).
    """
    if n_rows < 1:
        raise PlanError("the dataset has no rows")
    if request.samples * request.delta >= 1:
        raise PlanError(
            f"samples × delta = {request.samples * request.delta:g}: the job's δ must be below 1"
        )
    if (request.model.kind == "grud") != (dataset_kind == "timeseries"):
        raise PlanError(
            f"model {request.model.kind!r} does not fit a {dataset_kind} dataset "
            "(GRU-D is for time-series datasets, the others for tabular ones)"
        )
    if request.method == "selection":
        raise PlanError("selection jobs are submitted through POST /v1/selections")
    given = {
        name
        for name in ("dpsgd", "expm_nf", "expm")
        if getattr(request, name) is not None and name != request.method
    }
    if given:
        raise PlanError(f"{', '.join(sorted(given))} options given for method {request.method}")
    guarantee: Guarantee
    if request.method == "dpsgd":
        one, mechanism, accountant = _dpsgd_plan(request, n_rows=n_rows, n_features=n_features)
        guarantee = "proven"
    elif request.method == "expm":
        if norm_sq_bound is None:
            raise PlanError("expm needs a tabular dataset (its sensitivity bound is the schema's)")
        if request.expm is not None and request.expm.sampler == "mcmc":
            one, mechanism, accountant = _expm_mcmc_plan(
                request, n_rows=n_rows, n_features=n_features, norm_sq_bound=norm_sq_bound
            )
            guarantee = "asymptotic"
        else:
            one, mechanism, accountant = _expm_langevin_plan(
                request, n_rows=n_rows, n_features=n_features, norm_sq_bound=norm_sq_bound
            )
            guarantee = "proven"
    else:
        one, mechanism, accountant = _expm_plan(request)
        guarantee = "nominal"
    k = request.samples
    event = _repeat(one, k)
    curve = event.rdp(ORDERS)
    return PrivacyPlan(
        method=request.method,
        dataset=request.dataset,
        n_rows=n_rows,
        model=_model_json(request.model),
        # k releases: basic composition of k (ε, δ) guarantees (Dwork & Roth 2014, Thm 3.16).
        epsilon=k * request.epsilon,
        delta=k * request.delta,
        guarantee=guarantee,
        accountant=accountant,
        samples=k,
        event=event.to_json(),
        rdp_orders=list(ORDERS),
        rdp_curve=[float(v) for v in curve],
        mechanism=mechanism,
    )


def plan_for_dataset(
    request: JobRequest, *, n_rows: int, public_schema: dict[str, Any]
) -> PrivacyPlan:
    """:func:`build_plan` with the public facts read off a registered dataset: its public
    row count and its public schema (kind, encoded width). The API (quote, admission) and
    the worker (re-derivation before it reads data) both call this."""
    kind = str(public_schema.get("kind", "tabular"))
    if kind == "timeseries":
        series = TimeSeriesSchema.model_validate(public_schema)
        return build_plan(request, n_rows=n_rows, n_features=series.n_features, dataset_kind=kind)
    if kind != "tabular":
        raise PlanError(f"unknown dataset kind {kind!r}")
    schema = parse_schema(public_schema)
    return build_plan(
        request,
        n_rows=n_rows,
        n_features=schema.n_features,
        dataset_kind=kind,
        norm_sq_bound=row_norm_sq_bound(schema),
    )


def progress_total(plan: PrivacyPlan) -> int:
    """T of a job's progress "step k of T", from its plan alone (data-independent): the
    steps the worker's mechanism counts. DP-SGD and the Langevin sampler count each
    released sample's steps (``steps × samples``); ``expm_nf`` trains one flow for all its
    samples (``steps``). Set on the job at admission, so it reads "0 of T" while queued."""
    if plan.method == "selection":
        # Trainings of a fixed-size search; 1 when their number is random (random
        # stopping: K is never shown, so progress is 0 of 1 until the release).
        return int(plan.mechanism.get("trainings") or 1)
    steps = int(plan.mechanism["steps"])
    return steps if plan.method == "expm_nf" else steps * plan.samples
