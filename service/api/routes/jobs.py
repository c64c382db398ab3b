"""Analyst endpoints: datasets, quotes, jobs and releases. HTTP translation only."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import FileResponse
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.api.deps import CallerDep, EngineDep, PlanningDep, SettingsDep
from service.api.errors import ProblemError
from service.api.lookups import dataset_or_404, visible_job_or_404
from service.api.openapi import AUTHENTICATED, JSON_BODY, problem_responses
from service.api.paging import (
    Cursor,
    FiltersDep,
    Limit,
    cursor_problems,
    link_next,
    paged_responses,
)
from service.audit_gate import (
    GateCheck,
    check_gate,
    gate_days,
    recheck_under_lock,
    record_job_audit,
)
from service.config import Settings
from service.datasets.kinds import parse_dataset_schema
from service.db import transaction
from service.evaluations import (
    evaluations_of,
    trained_evaluation_plan,
    training_part,
    with_evaluation,
)
from service.job_pages import DEFAULT_LIMIT, job_page
from service.jobs import UnreadableRecord, enqueue, job_public, readable_jobs
from service.ledger.accounting import dataset_guarantee
from service.ledger.admission import BudgetExceeded, admit_job
from service.ledger.charges import charge_for
from service.ledger.errors import IdempotencyConflict, InvalidLedgerOperation, NominalNotAllowed
from service.ledger.filter_view import Evaluation, cap_filter, dataset_filter, evaluate
from service.ledger.locks import lock_job
from service.ledger.nominal import nominal_refusal
from service.ledger.refunds import cancel_job
from service.ledger.tables import AnalystCap, Dataset, Job, JobStatus, Release
from service.methods.common import ResourceEstimate
from service.plans import PlanError, plan_for_dataset, resolve_defaults
from service.privacy.amounts import from_micro
from service.privacy.deadline import PlanningTimeout, planning_deadline
from service.privacy.rdp import epsilon_from_rdp
from service.releases import release_paths
from service.resources import ResourceLimits, limits_refusal, plan_resources, work_twin
from service.schemas import (
    DatasetPublic,
    JobPublic,
    JobRequest,
    ModelCard,
    PrivacyPlan,
    QuoteResponse,
    weakest_guarantee,
)
from service.schemas.common import TRAINING_METHODS
from service.schemas.estimates import ResourceQuote
from service.schemas.stored import unreadable

log = logging.getLogger("enclave.api")

router = APIRouter(prefix="/v1", tags=["analyst"], responses=AUTHENTICATED)

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        description="Repeat a POST safely: the same key and body return the first job.",
    ),
]


def _dataset_view(s: Session, ds: Dataset, analyst_id: int) -> DatasetPublic:
    cap = s.get(AnalystCap, (analyst_id, ds.id))
    return DatasetPublic(
        name=ds.name,
        n_rows=ds.n_rows,
        holdout_rows=ds.holdout_rows,
        count_epsilon=None
        if ds.count_epsilon_micro is None
        else from_micro(ds.count_epsilon_micro),
        public_schema=ds.public_schema,
        allow_nominal=ds.allow_nominal,
        budget=dataset_filter(ds).view(guarantee=dataset_guarantee(s, ds.id)),
        analyst_budget=cap_filter(cap).view() if cap else None,
    )


@router.get("/datasets", response_model=list[DatasetPublic], operation_id="listDatasets")
def list_datasets(caller: CallerDep, engine: EngineDep) -> list[DatasetPublic]:
    """Datasets with their public schema and remaining budgets (the dataset's and yours)."""
    with transaction(engine) as s:
        return [
            _dataset_view(s, ds, caller.id)
            for ds in s.scalars(select(Dataset).order_by(Dataset.name))
        ]


@router.get(
    "/datasets/{name}",
    response_model=DatasetPublic,
    operation_id="getDataset",
    responses=problem_responses(404, 422),
)
def get_dataset(name: str, caller: CallerDep, engine: EngineDep) -> DatasetPublic:
    with transaction(engine) as s:
        return _dataset_view(s, dataset_or_404(s, name), caller.id)


@dataclass(frozen=True)
class Planned:
    plan: PrivacyPlan
    dataset_id: int  # datasets are never deleted: admission may lock it by id
    estimate: ResourceEstimate  # the worker time and memory the limits were checked on
    # The request with its plan's defaults written out (service.plans.resolve_defaults),
    # stored for the worker's plan check; None: the request as sent (evaluations).
    resolved: JobRequest | None = None
    # The release gate as planning read it (training jobs: service/audit_gate.py).
    gate: GateCheck | None = None


def _plan_for(engine: EngineDep, settings: Settings, body: JobRequest) -> Planned:
    """The plan, computed before any transaction that locks the budget (planning and the
    RDP curve are the expensive part of a submission)."""
    with transaction(engine) as s:
        ds = dataset_or_404(s, body.dataset)
        n_rows, public_schema, dataset_id = ds.n_rows, ds.public_schema, ds.id
        holdout_rows = ds.holdout_rows
        gated = gate_days(s, dataset_id) is not None
    training = training_part(body)  # the request without its `evaluate` block, if any
    try:
        with planning_deadline(settings.planning_time_limit_s):
            if body.evaluate is not None:  # no holdout, bad metrics: refused before training
                trained_evaluation_plan(
                    body, holdout_rows=holdout_rows, public_schema=public_schema
                )
            twin = work_twin(training)
            if twin is not None:  # refuse work over the limits before a costly calibration
                try:
                    cheap = plan_for_dataset(twin, n_rows=n_rows, public_schema=public_schema)
                except PlanError:
                    cheap = None  # the real plan decides (and explains) below
                if cheap is not None:
                    refuse_over_limits(cheap, public_schema, settings)
            trained = plan_for_dataset(training, n_rows=n_rows, public_schema=public_schema)
            # With `evaluate`: the training and the evaluation composed, one plan, one charge.
            plan = with_evaluation(
                trained, body, holdout_rows=holdout_rows, public_schema=public_schema
            )
    except (PlanError, PlanningTimeout) as exc:
        raise ProblemError(422, "invalid-plan", str(exc)) from exc
    estimate = refuse_over_limits(plan, public_schema, settings)
    resolved = resolve_defaults(body, n_rows=n_rows, public_schema=public_schema)
    # The release gate audits trainings: it reads the training's own request and plan.
    gate = _gate(engine, dataset_id, training, trained) if gated else GateCheck(None)
    return Planned(plan, dataset_id, estimate, resolved, gate)


def _gate(engine: EngineDep, dataset_id: int, body: JobRequest, plan: PrivacyPlan) -> GateCheck:
    """The release gate's decision (service/audit_gate.py): 422, nothing charged, when it
    is on and no recent passing audit covers the job's configuration."""
    with transaction(engine) as s:
        seen, refused = check_gate(s, dataset_id=dataset_id, request=body, plan=plan)
    if refused:
        raise ProblemError(422, "audit-gate", refused)
    return seen


def refuse_over_limits(
    plan: PrivacyPlan, public_schema: dict[str, Any], settings: Settings
) -> ResourceEstimate:
    """422 (nothing charged) where the worker could not run ``plan`` within its limits;
    otherwise the estimate the limits were checked on (a quote shows it)."""
    estimate = plan_resources(plan, schema=parse_dataset_schema(public_schema))
    refused = limits_refusal(
        estimate, ResourceLimits(settings.job_time_limit_s, settings.worker_memory_bytes)
    )
    if refused:
        raise ProblemError(422, "invalid-plan", refused)
    return estimate


def _budget_problem(ev: Evaluation) -> ProblemError:
    return ProblemError(
        409,
        "budget-exceeded",
        ev.reason or "budget exceeded",
        remaining={
            "dataset": ev.dataset_before.view().model_dump(),
            "analyst": ev.analyst_before.view().model_dump() if ev.analyst_before else None,
        },
    )


@router.post(
    "/quote",
    response_model=QuoteResponse,
    operation_id="quote",
    responses={**JSON_BODY, **problem_responses(404)},
)
def quote(
    body: JobRequest,
    caller: CallerDep,
    engine: EngineDep,
    settings: SettingsDep,
    _slot: PlanningDep,
) -> QuoteResponse:
    """The cost of a prospective request and the budgets after it. Charges nothing.

    Uses the same evaluation as admission, on the ledger's current state.
    """
    return quote_for(engine, caller, body.dataset, _plan_for(engine, settings, body))


def quote_for(
    engine: EngineDep, caller: CallerDep, dataset: str, planned: Planned
) -> QuoteResponse:
    """The quote of a planned job on the ledger's current state (POST /v1/quote and
    POST /v1/selections/quote)."""
    plan = planned.plan
    with transaction(engine) as s:
        ds = dataset_or_404(s, dataset)
        cap = s.get(AnalystCap, (caller.id, ds.id))
        ev = evaluate(dataset_filter(ds), cap_filter(cap) if cap else None, charge_for(plan))
        # Admission checks the nominal policy first, then the filters: so does the quote.
        reason = nominal_refusal(ds, plan) or ev.reason
        now = dataset_guarantee(s, ds.id)
        # Once this job runs, the dataset's guarantee is at most the plan's.
        after = weakest_guarantee(now, plan.guarantee)
        return QuoteResponse(
            admitted=reason is None,
            reason=reason,
            plan=plan,
            charged_epsilon=(
                epsilon_from_rdp(rdp=plan.rdp_curve, orders=plan.rdp_orders, delta=plan.delta)
                if plan.delta > 0
                else None
            ),
            dataset_before=ev.dataset_before.view(guarantee=now),
            dataset_after=ev.dataset_after.view(guarantee=after) if ev.dataset_after else None,
            analyst_before=ev.analyst_before.view() if ev.analyst_before else None,
            analyst_after=ev.analyst_after.view() if ev.analyst_after else None,
            estimate=ResourceQuote(
                seconds=planned.estimate.seconds, memory_bytes=planned.estimate.memory_bytes
            ),
        )


@router.post(
    "/jobs",
    response_model=JobPublic,
    status_code=202,
    operation_id="createJob",
    responses={
        202: {"description": "Admitted, charged and queued."},
        200: {"model": JobPublic, "description": "Idempotent replay: the first job with this key."},
        **JSON_BODY,
        **problem_responses(403, 404, 409),
    },
)
def create_job(
    body: JobRequest,
    caller: CallerDep,
    engine: EngineDep,
    settings: SettingsDep,
    response: Response,
    _slot: PlanningDep,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    """Submit a training job. Its plan is charged to the ledger at admission, before any
    private row is read. A job cancelled while queued is refunded; a failed job keeps its
    charge unless the admin refunds it (its failure is itself an output)."""
    return admit_and_enqueue(
        engine, settings, caller, response, body, _plan_for(engine, settings, body), idempotency_key
    )


def admit_and_enqueue(
    engine: EngineDep,
    settings: Settings,
    caller: CallerDep,
    response: Response,
    body: JobRequest,
    planned: Planned,
    idempotency_key: str | None,
) -> JobPublic:
    """Admit (charge) a planned job and enqueue it: POST /v1/jobs and POST /v1/selections."""
    try:
        with engine.begin() as conn:  # Core: the admission path (service.ledger.admission)
            admitted = admit_job(
                conn,
                analyst_id=caller.id,
                dataset_id=planned.dataset_id,
                request=body,
                plan=planned.plan,
                idempotency_key=idempotency_key,
                resolved_request=planned.resolved,
            )
            gate = planned.gate
            if gate is not None and gate.max_age_days is not None and admitted.created:
                if refused := recheck_under_lock(conn, planned.dataset_id, gate):
                    raise ProblemError(422, "audit-gate", refused)  # rolls the charge back
                record_job_audit(conn, admitted.job.id, gate)
            view = job_public(admitted.job, admitted.dataset_name)
    except BudgetExceeded as exc:
        raise _budget_problem(exc.evaluation) from exc
    except IdempotencyConflict as exc:
        raise ProblemError(422, "idempotency-conflict", str(exc)) from exc
    except NominalNotAllowed as exc:
        raise ProblemError(403, "nominal-not-allowed", str(exc)) from exc
    except IntegrityError as exc:
        # Same key raced on another dataset: the unique constraint is the backstop.
        raise ProblemError(422, "idempotency-conflict", "this Idempotency-Key is in use") from exc
    if admitted.created:
        enqueue(engine, settings, view.id)
    else:
        response.status_code = 200
    return view


@router.get(
    "/jobs",
    response_model=list[JobPublic],
    operation_id="listJobs",
    responses={
        **paged_responses("Your jobs, newest first: one page of them."),
        **problem_responses(422),
    },
)
def list_jobs(
    request: Request,
    response: Response,
    caller: CallerDep,
    engine: EngineDep,
    filters: FiltersDep,
    limit: Limit = DEFAULT_LIMIT,
    cursor: Cursor = None,
) -> list[JobPublic]:
    """Your jobs that the filters match, newest first (by creation time, then id), a page
    at a time: the next page's cursor is in the `X-Next-Cursor` header and the next page's
    URL in `Link: <…>; rel="next"`; both are absent on the last page. A job whose stored
    record does not match its documented type is left out (GET /v1/jobs/{job_id} answers
    409 unreadable-record for it; the service logs it)."""
    with cursor_problems(), transaction(engine) as s:
        page = job_page(s, filters, analyst_id=caller.id, limit=limit, cursor=cursor)
        jobs = readable_jobs((job, name) for job, name, _ in page.rows)
    link_next(request, response, page.next_cursor)
    return jobs


@router.get(
    "/jobs/{job_id}",
    response_model=JobPublic,
    operation_id="getJob",
    responses=problem_responses(404, 409, 422),
)
def get_job(job_id: str, caller: CallerDep, engine: EngineDep) -> JobPublic:
    with transaction(engine) as s:
        job = visible_job_or_404(s, caller, job_id)
        return job_public(job, s.get_one(Dataset, job.dataset_id).name)


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobPublic,
    operation_id="cancelJob",
    responses=problem_responses(404, 409, 422),
)
def cancel(job_id: str, caller: CallerDep, engine: EngineDep) -> JobPublic:
    """Cancel a queued job. It is refunded: no private row was read."""
    with transaction(engine) as s:
        visible_job_or_404(s, caller, job_id)
        job = lock_job(s, job_id)
        assert job is not None
        try:
            cancel_job(s, job=job)
        except InvalidLedgerOperation as exc:
            raise ProblemError(409, "conflict", str(exc)) from exc
        return job_public(job, s.get_one(Dataset, job.dataset_id).name)


def _release_or_409(s: Session, caller: CallerDep, job_id: str) -> Release:
    job = visible_job_or_404(s, caller, job_id)
    release = s.get(Release, job.id)
    if job.status != JobStatus.released or release is None:
        raise ProblemError(
            409, "release-not-ready", f"job {job_id} has no release (status {job.status})"
        )
    return release


@router.get(
    "/jobs/{job_id}/release",
    response_model=ModelCard,
    operation_id="getModelCard",
    responses=problem_responses(404, 409, 422),
)
def get_release_card(job_id: str, caller: CallerDep, engine: EngineDep) -> ModelCard:
    """The model card: model, preprocessing, mechanism, (ε, δ), accountant and whether the
    guarantee is proven, asymptotic or nominal. A training job's card lists, under
    ``evaluations``, the released private evaluations made with it (POST /v1/evaluations);
    an evaluation's card holds its noisy results under ``evaluation``."""
    with transaction(engine) as s:
        card = dict(_release_or_409(s, caller, job_id).card)
        job = s.get_one(Job, job_id)
        if job.plan.get("method") in TRAINING_METHODS:
            card["evaluations"] = evaluations_of(s, job)
        try:
            return ModelCard.model_validate(card)
        except ValidationError as exc:
            raise UnreadableRecord(f"card of job {job_id}", unreadable("card", exc)) from exc


@router.get(
    "/jobs/{job_id}/release/weights",
    response_class=FileResponse,
    operation_id="getWeights",
    responses={
        200: {
            "description": "The weights file (safetensors).",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        },
        **problem_responses(404, 409, 422),
    },
)
def get_release_weights(
    job_id: str, caller: CallerDep, engine: EngineDep, settings: SettingsDep
) -> FileResponse:
    """The released weights (safetensors). Their SHA-256 is in the model card."""
    with transaction(engine) as s:
        release = _release_or_409(s, caller, job_id)
        path = release_paths(
            settings.resolved_release_dir, job_id, release.card["run_token"]
        ).weights
    if not path.is_file():
        # The worker wrote it elsewhere: the API and the worker do not share one release
        # folder (ENCLAVE_RELEASE_DIR / ENCLAVE_HOME). The path stays in the server's log.
        log.error("job %s: released weights not found at %s", job_id, path)
        raise ProblemError(
            404,
            "not-found",
            f"the weights of job {job_id} are not in this API's release folder; ask the "
            "admin to give the API and the worker the same ENCLAVE_RELEASE_DIR",
        )
    return FileResponse(
        path, media_type="application/octet-stream", filename=f"{job_id}.safetensors"
    )
