"""Admin endpoints for privacy audits (issue 22): run one, list them, read one. HTTP
translation only; the audits are service/audits.py's, run by the worker (Celery task
``enclave.run_audit``) on a public dataset bundled with the product, never charged to any
budget, and shown to the admin only."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Query

from service import audits as ops
from service.api.deps import AdminDep, EngineDep, PlanningDep, SettingsDep
from service.api.errors import ProblemError
from service.api.openapi import AUTHENTICATED, JSON_BODY, problem_responses
from service.db import transaction
from service.plans import PlanError
from service.privacy.deadline import PlanningTimeout, planning_deadline
from service.queue import RUN_AUDIT_TASK, send_run_job
from service.schemas.audits import AuditRequest, AuditView

log = logging.getLogger("enclave.api")

router = APIRouter(
    prefix="/v1/admin",
    tags=["admin"],
    responses={**AUTHENTICATED, **problem_responses(403)},
)

QUEUE_FAILURE = "the worker's queue could not be reached; nothing ran: submit the audit again"


@router.post(
    "/audits",
    response_model=AuditView,
    status_code=202,
    operation_id="createAudit",
    responses={
        202: {"description": "Stored and sent to a worker (or failed to send: see status)."},
        **JSON_BODY,
    },
)
def create_audit(
    body: AuditRequest,
    admin: AdminDep,
    engine: EngineDep,
    settings: SettingsDep,
    _slot: PlanningDep,
) -> AuditView:
    """Run a one-run privacy audit (Steinke, Nasr & Jagielski 2023) of a configuration: one
    training run on a public dataset bundled with the product, with m canaries each
    included with probability 1/2; when done, the ε lower bound of their Theorem 3.1 and
    the ceiling the same test could show (with every guess right). A lower bound, not a
    proof: a small bound does not show the configuration is private. Nothing is charged to
    any budget. With ``attack: "lira"``, LiRA membership inference (Carlini et al. 2022)
    instead: ``shadow_models`` logistic-regression models by dpsgd, expm (Langevin) or
    expm_nf on random halves of a pool of ``pool`` public Adult rows; when done, TPR at
    0.1% and 1% FPR, AUC, an ε lower bound beside its ceiling, and the one-run bound of one
    held-out target. A method the audit cannot run, a model it cannot score, m above 10% of
    the dataset's rows, r above m, an unknown dataset, a field of the other attack, M
    trainings past the worker's time limit or a configuration that cannot be planned are
    refused (422)."""
    try:
        with planning_deadline(settings.planning_time_limit_s), transaction(engine) as s:
            audit = ops.create_audit(
                s, body, requested_by=admin.id, time_limit_s=settings.job_time_limit_s
            )
            audit_id = audit.id
    except ops.AuditRefused as exc:
        issue = {"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}
        raise ProblemError(422, "validation-error", str(exc), errors=[issue]) from exc
    except (PlanError, PlanningTimeout) as exc:
        raise ProblemError(422, "invalid-plan", str(exc)) from exc
    try:
        send_run_job(settings, audit_id, RUN_AUDIT_TASK)
    except Exception:
        log.warning("could not enqueue audit %s", audit_id, exc_info=True)
        with transaction(engine) as s:
            ops.finish_audit(s, audit_id, failure=QUEUE_FAILURE)
    with transaction(engine) as s:
        view = ops.audit_by_id(s, audit_id)
    assert view is not None
    return view


@router.get(
    "/audits",
    response_model=list[AuditView],
    operation_id="listAudits",
    responses=problem_responses(422),
)
def list_audits(
    _: AdminDep,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> list[AuditView]:
    """Audits, newest first: status, configuration, and when done the bound beside its
    ceiling, m, r, the right guesses and the run's duration."""
    with transaction(engine) as s:
        return ops.audits_newest_first(s, limit=limit, offset=offset)


@router.get(
    "/audits/{audit_id}",
    response_model=AuditView,
    operation_id="getAudit",
    responses=problem_responses(404, 422),
)
def get_audit(audit_id: str, _: AdminDep, engine: EngineDep) -> AuditView:
    """One audit: its status and, when done, the ε lower bound, its ceiling, m, the
    configuration and the duration."""
    with transaction(engine) as s:
        view = ops.audit_by_id(s, audit_id)
    if view is None:
        raise ProblemError(404, "not-found", f"no audit {audit_id!r}")
    return view
