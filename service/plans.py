"""Requests become privacy plans: a pure function of the request and public metadata.

The worker calls :func:`build_plan` again with the stored request and refuses to run a
job whose stored plan differs from the recomputed one ("a plan it cannot reproduce").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.dataschema import parse_schema
from service.modelspec import parameter_count
from service.privacy.calibrate import calibrate_noise_multiplier
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    ExponentialMechanismEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
    SelfComposedEvent,
)
from service.privacy.orders import ORDERS
from service.privacy.sampling import GRID_BITS, noise_slack
from service.privacy.schedules import (
    calibrate_sigma0,
    decaying_event,
    epoch_noise_multipliers,
    tcdp_estimate,
)
from service.schemas import DpsgdOptions, ExpmNfOptions, Guarantee, JobRequest, PrivacyPlan


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
    exactly this q (rounded down, by at most 0.4% of it) and exactly T steps, for any
    batch size, so no admitted plan can fail for a schedule mismatch.
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


def _dpsgd_plan(
    request: JobRequest, *, n_rows: int, n_features: int
) -> tuple[DpEvent, dict[str, Any], str]:
    options = resolve_dpsgd_options(request.dpsgd or DpsgdOptions(), n_rows=n_rows)
    if request.delta <= 0:
        raise PlanError("dpsgd needs delta > 0 (it is an approximate-DP mechanism)")
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
    # Calibrate the Gaussian part so that it plus the slack stays within (ε, δ):
    # RDP: the slack adds τ(2α−1)/(α−1) ≤ 12τ at every calibration order (α ≥ 1.1);
    # PLD: pointwise e^{±τ} closeness turns (ε', δ') into (ε' + 2τ, δ'·e^{τ}).
    try:
        sigma = calibrate_noise_multiplier(
            sampling_rate=schedule.sampling_rate,
            steps=schedule.steps,
            epsilon=request.epsilon - 12.0 * slack.tau,
            delta=request.delta * math.exp(-slack.tau),
            accountant=options.accountant,
        )
    except ValueError as exc:
        raise PlanError(f"cannot calibrate DP-SGD noise: {exc}") from exc
    gaussian = PoissonSubsampledGaussianEvent(
        sampling_rate=schedule.sampling_rate, noise_multiplier=sigma, steps=schedule.steps
    )
    mechanism = {
        # The schedule keys are left out of a constant plan so that it stays identical,
        # key for key, to the plans stored before schedules existed (the worker compares).
        **options.model_dump(exclude={"noise_schedule", "noise_decay"}),
        **public,
        "noise_multiplier": sigma,
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
        **options.model_dump(),
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


def _expm_plan(request: JobRequest) -> tuple[DpEvent, dict[str, Any], str]:
    options = request.expm_nf or ExpmNfOptions()
    if request.delta != 0:
        raise PlanError("expm_nf is a pure ε-DP mechanism: send delta = 0")
    # u = −Σ(ŷ−y)² − λ‖θ‖² with ŷ = sigmoid(·) ∈ [0,1], y ∈ [0,1]: adding or removing one
    # row changes u by a(θ) ∈ [0,1], always with the same sign (monotone), so a density
    # ∝ exp(ε·u/s), s = 1, is ε-DP and ε-bounded-range under add/remove (proof:
    # worker/mechanisms/expm_nf.py; McSherry & Talwar 2007). Not valid under replace-one.
    mechanism = {
        **options.model_dump(),
        "epsilon": request.epsilon,
        "sensitivity": 1.0,
        "calibration": "monotone",
    }
    return ExponentialMechanismEvent(epsilon=request.epsilon), mechanism, "pure-composition"


def build_plan(
    request: JobRequest, *, n_rows: int, n_features: int, dataset_kind: str = "tabular"
) -> PrivacyPlan:
    """Turn a validated request into its privacy plan (raises :class:`PlanError`).

    Public inputs only: ``n_rows`` is the dataset's public (DP noisy) row count,
    ``n_features`` the encoded width its public schema implies, ``dataset_kind`` its kind.
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
    guarantee: Guarantee
    if request.method == "dpsgd":
        if request.expm_nf is not None:
            raise PlanError("expm_nf options given for method dpsgd")
        if request.model.kind == "grud":
            raise PlanError("dpsgd does not support the grud model yet")
        one, mechanism, accountant = _dpsgd_plan(request, n_rows=n_rows, n_features=n_features)
        guarantee = "proven"
    else:
        if request.dpsgd is not None:
            raise PlanError("dpsgd options given for method expm_nf")
        one, mechanism, accountant = _expm_plan(request)
        guarantee = "nominal"
    k = request.samples
    event = _repeat(one, k)
    curve = event.rdp(ORDERS)
    return PrivacyPlan(
        method=request.method,
        dataset=request.dataset,
        n_rows=n_rows,
        model=request.model.model_dump(),
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
    n_features = parse_schema(public_schema).n_features if kind == "tabular" else 0
    return build_plan(request, n_rows=n_rows, n_features=n_features, dataset_kind=kind)
