"""Analyst endpoints for private evaluations (issue 21): quote and submit. HTTP
translation only; the request becomes a job (method ``evaluation``) in
service/evaluations.py and is admitted, charged, queued and released like any job (read,
cancelled and its results downloaded through the /v1/jobs routes)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import CallerDep, EngineDep, PlanningDep, SettingsDep
from service.api.errors import ProblemError
from service.api.openapi import AUTHENTICATED, JSON_BODY, problem_responses
from service.api.routes.jobs import (
    IdempotencyKey,
    Planned,
    admit_and_enqueue,
    quote_for,
    refuse_over_limits,
)
from service.config import Settings
from service.db import transaction
from service.evaluations import EvaluationRefused, evaluation_job_request, plan_evaluation_job
from service.ledger.tables import Dataset, Job, Release
from service.plans import PlanError
from service.privacy.deadline import PlanningTimeout, planning_deadline
from service.schemas import JobPublic, JobRequest, QuoteResponse
from service.schemas.evaluations import EvaluationRequest

router = APIRouter(prefix="/v1", tags=["analyst"], responses=AUTHENTICATED)


def _planned(
    engine: EngineDep, settings: Settings, caller: CallerDep, body: EvaluationRequest
) -> tuple[JobRequest, Planned]:
    """The stored job request and its plan, before any transaction that locks the budget.
    Another analyst's job, or none → 404; not released → 409; bad input, a dataset
    without a holdout, a metric the ledger cannot charge → 422. Nothing is charged."""
    with transaction(engine) as s:
        job = s.get(Job, body.job_id)
        if job is None or job.analyst_id != caller.id:
            raise ProblemError(404, "not-found", f"no job {body.job_id!r}")
        ds = s.get_one(Dataset, job.dataset_id)
        release = s.get(Release, job.id)
        samples = int(release.card.get("samples", 0)) if release is not None else 0
        try:
            request = evaluation_job_request(
                body,
                evaluated_request=job.request,
                evaluated_model=job.plan["model"],
                evaluated_status=str(job.status),
                evaluated_samples=samples,
                dataset_name=ds.name,
                holdout_rows=ds.holdout_rows,
            )
        except EvaluationRefused as exc:
            raise ProblemError(exc.status, exc.kind, str(exc)) from exc
        holdout_rows, public_schema, dataset_id = ds.holdout_rows, ds.public_schema, ds.id
    try:
        with planning_deadline(settings.planning_time_limit_s):
            plan = plan_evaluation_job(
                request, holdout_rows=holdout_rows, public_schema=public_schema
            )
    except (PlanError, PlanningTimeout) as exc:
        raise ProblemError(422, "invalid-plan", str(exc)) from exc
    return request, Planned(plan, dataset_id, refuse_over_limits(plan, public_schema, settings))


@router.post(
    "/evaluations/quote",
    response_model=QuoteResponse,
    operation_id="quoteEvaluation",
    responses={**JSON_BODY, **problem_responses(404, 409)},
)
def quote_evaluation(
    caller: CallerDep,
    engine: EngineDep,
    settings: SettingsDep,
    _slot: PlanningDep,
    body: EvaluationRequest,
) -> QuoteResponse:
    """The evaluation's cost, charging nothing: its (ε, δ), the split over the metrics
    (``plan.mechanism.metrics``: each metric's share, sensitivity and noise scale) and the
    budgets after it."""
    request, planned = _planned(engine, settings, caller, body)
    return quote_for(engine, caller, request.dataset, planned)


@router.post(
    "/evaluations",
    response_model=JobPublic,
    status_code=202,
    operation_id="createEvaluation",
    responses={
        202: {"description": "Admitted, charged and queued: a job with method 'evaluation'."},
        200: {"model": JobPublic, "description": "Idempotent replay: the first job with this key."},
        **JSON_BODY,
        **problem_responses(403, 404, 409),
    },
)
def create_evaluation(
    caller: CallerDep,
    engine: EngineDep,
    settings: SettingsDep,
    response: Response,
    _slot: PlanningDep,
    body: EvaluationRequest,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    """Score one of your released training jobs on its dataset's private holdout under a
    stated (ε, δ), charged to the ledger at admission like any job. The worker adds the
    noise; the release (GET /v1/jobs/{id}/release) holds only the noisy metrics and their
    confidence intervals (sampling and DP noise together), and the evaluated job's model
    card lists the evaluations made with it. AUC (binary or macro one-vs-rest) is its
    noisy Mann–Whitney count 2U and noisy class counts, both charged."""
    request, planned = _planned(engine, settings, caller, body)
    return admit_and_enqueue(engine, settings, caller, response, request, planned, idempotency_key)
