"""Requests become privacy plans: a pure function of the request and public metadata.

The worker calls :func:`build_plan` again with the stored request and refuses to run a
job whose stored plan differs from the recomputed one ("a plan it cannot reproduce").
"""

from __future__ import annotations

import math
from typing import Any

from service.privacy.calibrate import calibrate_noise_multiplier
from service.privacy.events import (
    DpEvent,
    ExponentialMechanismEvent,
    PoissonSubsampledGaussianEvent,
    SelfComposedEvent,
)
from service.privacy.orders import ORDERS
from service.schemas import DpsgdOptions, ExpmNfOptions, Guarantee, JobRequest, PrivacyPlan


class PlanError(ValueError):
    """The request cannot be turned into a plan (a 4xx for the caller, nothing charged)."""


def _repeat(event: DpEvent, k: int) -> DpEvent:
    return event if k == 1 else SelfComposedEvent(event=event, count=k)


def dpsgd_schedule(*, n_rows: int, options: DpsgdOptions) -> tuple[float, int, int]:
    """(sampling rate q, steps per epoch, total steps) exactly as Opacus's Poisson loader runs.

    Opacus uses q = 1/len(loader) with len(loader) = ceil(n / batch_size).
    """
    if options.batch_size > n_rows:
        raise PlanError(f"batch_size {options.batch_size} exceeds the dataset's {n_rows} rows")
    steps_per_epoch = math.ceil(n_rows / options.batch_size)
    return 1.0 / steps_per_epoch, steps_per_epoch, steps_per_epoch * options.epochs


def _dpsgd_plan(request: JobRequest, *, n_rows: int) -> tuple[DpEvent, dict[str, Any], str]:
    options = request.dpsgd or DpsgdOptions()
    if request.delta <= 0:
        raise PlanError("dpsgd needs delta > 0 (it is an approximate-DP mechanism)")
    q, steps_per_epoch, steps = dpsgd_schedule(n_rows=n_rows, options=options)
    try:
        sigma = calibrate_noise_multiplier(
            sampling_rate=q,
            steps=steps,
            epsilon=request.epsilon,
            delta=request.delta,
            accountant=options.accountant,
        )
    except ValueError as exc:
        raise PlanError(f"cannot calibrate DP-SGD noise: {exc}") from exc
    event = PoissonSubsampledGaussianEvent(sampling_rate=q, noise_multiplier=sigma, steps=steps)
    mechanism = {
        **options.model_dump(),
        "sampling_rate": q,
        "steps_per_epoch": steps_per_epoch,
        "steps": steps,
        "noise_multiplier": sigma,
    }
    return event, mechanism, options.accountant


def _expm_plan(request: JobRequest) -> tuple[DpEvent, dict[str, Any], str]:
    options = request.expm_nf or ExpmNfOptions()
    if request.delta != 0:
        raise PlanError("expm_nf is a pure ε-DP mechanism: send delta = 0")
    # Sensitivity 1 of u = −Σ(ŷ−y)² − λ·r(θ) holds because every target model ends in a
    # sigmoid (ŷ ∈ [0, 1]) and targets are encoded in {0, 1}; the regulariser does not
    # depend on the data (Bridges, Tombs, Stanley: ExpM+NF).
    mechanism = {**options.model_dump(), "epsilon": request.epsilon, "sensitivity": 1.0}
    return ExponentialMechanismEvent(epsilon=request.epsilon), mechanism, "pure-composition"


def build_plan(request: JobRequest, *, n_rows: int, dataset_kind: str = "tabular") -> PrivacyPlan:
    """Turn a validated request into its privacy plan (raises :class:`PlanError`)."""
    if n_rows < 1:
        raise PlanError("the dataset has no rows")
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
        one, mechanism, accountant = _dpsgd_plan(request, n_rows=n_rows)
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
