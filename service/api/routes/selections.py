"""Analyst endpoints for selection jobs: quote and submit. HTTP translation only.

A selection is a job (method ``selection``): once admitted it is read, listed, cancelled
and downloaded through the /v1/jobs routes.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import CallerDep, EngineDep, PlanningDep, SettingsDep
from service.api.errors import ProblemError
from service.api.lookups import dataset_or_404
from service.api.openapi import AUTHENTICATED, JSON_BODY, problem_responses
from service.api.routes.jobs import (
    IdempotencyKey,
    Planned,
    admit_and_enqueue,
    quote_for,
    refuse_over_limits,
)
from service.audit_gate import SELECTIONS_GATED, gate_days
from service.config import Settings
from service.db import transaction
from service.plans import PlanError
from service.privacy.deadline import PlanningTimeout, planning_deadline
from service.schemas import JobPublic, JobRequest, QuoteResponse
from service.selection.api_bodies import (
    SelectionRequest,
    job_request,
    plan_selection_job,
    resolve_training_defaults,
)

router = APIRouter(prefix="/v1", tags=["analyst"], responses=AUTHENTICATED)


def _planned(
    engine: EngineDep, settings: Settings, request_body: SelectionRequest
) -> tuple[JobRequest, Planned]:
    """The stored job request (per-candidate budget resolved) and its plan, before any
    transaction that locks the budget. Bad input, or a workflow the worker could not run
    within its limits (service.resources), → 422, nothing charged."""
    body = request_body.root
    with transaction(engine) as s:
        ds = dataset_or_404(s, body.dataset)
        n_rows, public_schema, dataset_id = ds.n_rows, ds.public_schema, ds.id
        if gate_days(s, dataset_id) is not None:  # no single audit covers a selection
            raise ProblemError(422, "audit-gate", SELECTIONS_GATED)
    try:
        with planning_deadline(settings.planning_time_limit_s):
            request = job_request(body, n_rows=n_rows, public_schema=public_schema)
            _, plan = plan_selection_job(request, n_rows=n_rows, public_schema=public_schema)
    except (PlanError, PlanningTimeout) as exc:
        raise ProblemError(422, "invalid-plan", str(exc)) from exc
    estimate = refuse_over_limits(plan, public_schema, settings)
    resolved = resolve_training_defaults(request, n_rows=n_rows)  # the worker re-plans it
    return request, Planned(plan, dataset_id, estimate, resolved)


@router.post(
    "/selections/quote",
    response_model=QuoteResponse,
    operation_id="quoteSelection",
    responses={**JSON_BODY, **problem_responses(404)},
)
def quote_selection(
    caller: CallerDep,
    engine: EngineDep,
    settings: SettingsDep,
    _slot: PlanningDep,
    body: SelectionRequest,
) -> QuoteResponse:
    """The whole workflow's cost, charging nothing: the stated (ε, δ) (``plan.epsilon``,
    ``plan.delta``), what the ledger charges (``charged_epsilon``, the plan's RDP curve),
    the split between stages (``plan.mechanism.stages``: each training's and each noisy
    score's ε), and the number of trainings (``plan.mechanism.trainings``) or, for random
    stopping, the law of their number (``plan.mechanism.runs``)."""
    _, planned = _planned(engine, settings, body)
    return quote_for(engine, caller, body.root.dataset, planned)


@router.post(
    "/selections",
    response_model=JobPublic,
    status_code=202,
    operation_id="createSelection",
    responses={
        202: {"description": "Admitted, charged and queued: a job with method 'selection'."},
        200: {"model": JobPublic, "description": "Idempotent replay: the first job with this key."},
        **JSON_BODY,
        **problem_responses(403, 404, 409),
    },
)
def create_selection(
    caller: CallerDep,
    engine: EngineDep,
    settings: SettingsDep,
    response: Response,
    _slot: PlanningDep,
    body: SelectionRequest,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    """Submit a selection (architecture search or hyperparameter tuning). The whole
    workflow is planned and charged as one event at admission, before any private row is
    read; the job is then followed through GET /v1/jobs/{id}, cancelled through
    POST /v1/jobs/{id}/cancel (refunded while queued) and its release (the selected
    candidate and, when there is one, its DP-SGD model) read from /v1/jobs/{id}/release.
    A failed job keeps its charge unless the admin refunds it."""
    request, planned = _planned(engine, settings, body)
    return admit_and_enqueue(engine, settings, caller, response, request, planned, idempotency_key)
