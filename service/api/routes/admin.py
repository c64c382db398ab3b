"""Admin endpoints: analysts, budgets, caps, refunds and the ledger.

Each handler translates HTTP only; the operations are the plain functions of
:mod:`service.admin`, which the dashboard's forms call too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from service import admin as ops
from service.api.deps import AdminDep, EngineDep
from service.api.errors import ProblemError
from service.api.openapi import AUTHENTICATED, JSON_BODY, problem_responses
from service.api.paging import (
    AnalystName,
    Cursor,
    FiltersDep,
    Limit,
    cursor_problems,
    link_next,
    paged_responses,
)
from service.audit_gate import gate_days, set_audit_gate
from service.db import transaction
from service.job_pages import DEFAULT_LIMIT
from service.ledger.accounting import AccountingSummary, accounting_summary
from service.ledger.audit import check_totals, verify_all
from service.ledger.errors import InvalidLedgerOperation
from service.schemas import (
    AdminJob,
    AnalystCreate,
    AnalystCreated,
    BudgetUpdate,
    BudgetView,
    CapUpdate,
    ChainCheck,
    JobPublic,
    KeyRotate,
    LedgerEntryPublic,
    LedgerVerification,
    NominalPolicy,
    NominalUpdate,
    RefundRequest,
    TotalMismatch,
)
from service.schemas.admin import AuditGatePolicy, AuditGateUpdate

router = APIRouter(
    prefix="/v1/admin",
    tags=["admin"],
    responses={**AUTHENTICATED, **problem_responses(403)},
)


@contextmanager
def problems() -> Iterator[None]:
    """The admin operations' refusals as problems: unknown names 404, refusals 409."""
    try:
        yield
    except ops.NotFound as exc:
        raise ProblemError(404, "not-found", str(exc)) from exc
    except InvalidLedgerOperation as exc:
        raise ProblemError(409, "conflict", str(exc)) from exc


@router.post(
    "/analysts",
    response_model=AnalystCreated,
    status_code=201,
    operation_id="createAnalyst",
    responses={**JSON_BODY, **problem_responses(409)},
)
def create_analyst(body: AnalystCreate, _: AdminDep, engine: EngineDep) -> AnalystCreated:
    """Create an analyst (or another admin). The API key is returned once."""
    with problems(), transaction(engine) as s:
        return ops.create_analyst(s, body)


@router.post(
    "/analysts/{name}/key",
    response_model=AnalystCreated,
    operation_id="rotateAnalystKey",
    responses={**JSON_BODY, **problem_responses(404, 409)},
)
def rotate_analyst_key(
    name: str, body: KeyRotate, _: AdminDep, engine: EngineDep
) -> AnalystCreated:
    """Rotate an analyst's API key: the new key is returned once, the old one stops working
    at once (API and dashboard). Also re-enables a revoked analyst. The new key expires
    after `expires_in_days`, never with `no_expiry: true`, and otherwise when the current
    key does (a rotation never lifts an expiry); if the current key has already expired
    there is no expiry to keep, and the rotation is refused (409) until one is given."""
    with problems(), transaction(engine) as s:
        return ops.rotate_analyst_key(s, name, body)


@router.delete(
    "/analysts/{name}/key",
    status_code=204,
    operation_id="revokeAnalystKey",
    responses=problem_responses(404, 409, 422),
)
def revoke_analyst_key(name: str, _: AdminDep, engine: EngineDep) -> None:
    """Revoke an analyst's API key, effective at once (API and dashboard). The last live
    admin key is never revoked (409): nobody could administer the service any more."""
    with problems(), transaction(engine) as s:
        ops.revoke_analyst_key(s, name)


@router.put(
    "/datasets/{name}/budget",
    response_model=BudgetView,
    operation_id="setDatasetBudget",
    responses={**JSON_BODY, **problem_responses(404, 409)},
)
def put_budget(name: str, body: BudgetUpdate, _: AdminDep, engine: EngineDep) -> BudgetView:
    """Set or raise a dataset's (ε_total, δ_total). Lowering below what is spent is refused."""
    with problems(), transaction(engine) as s:
        return ops.update_budget(s, name, body)


@router.put(
    "/datasets/{name}/caps/{analyst}",
    response_model=BudgetView,
    operation_id="setAnalystCap",
    responses={**JSON_BODY, **problem_responses(404, 409)},
)
def put_cap(name: str, analyst: str, body: CapUpdate, _: AdminDep, engine: EngineDep) -> BudgetView:
    """Set an analyst's cap on a dataset. Lowering below what they spent is refused."""
    with problems(), transaction(engine) as s:
        return ops.update_cap(s, name, analyst, body)


@router.put(
    "/datasets/{name}/nominal",
    response_model=NominalPolicy,
    operation_id="setNominalPolicy",
    responses={**JSON_BODY, **problem_responses(404)},
)
def put_nominal(name: str, body: NominalUpdate, _: AdminDep, engine: EngineDep) -> NominalPolicy:
    """Allow or forbid methods whose guarantee is not proven on this dataset: nominal ones
    (expm_nf) and asymptotic ones (expm with the mcmc sampler)."""
    with problems(), transaction(engine) as s:
        ds = ops.set_nominal(s, name, allow_nominal=body.allow_nominal)
        return NominalPolicy(dataset=ds.name, allow_nominal=ds.allow_nominal)


@router.put(
    "/datasets/{name}/audit-gate",
    response_model=AuditGatePolicy,
    operation_id="setAuditGate",
    responses={**JSON_BODY, **problem_responses(404)},
)
def put_audit_gate(
    name: str, body: AuditGateUpdate, _: AdminDep, engine: EngineDep
) -> AuditGatePolicy:
    """Turn the dataset's release gate on or off: while on, a training job is refused at
    quote time (422 audit-gate, nothing charged) unless an audit of its configuration
    (method, model family and architecture, engine, sampler, σ at most the job's) passed
    within ``max_age_days``. Written to the ledger as budget changes are."""
    with problems(), transaction(engine) as s:
        ds = set_audit_gate(s, dataset=ops.dataset_named(s, name), max_age_days=body.max_age_days)
        return AuditGatePolicy(dataset=ds.name, max_age_days=body.max_age_days)


@router.get(
    "/datasets/{name}/audit-gate",
    response_model=AuditGatePolicy,
    operation_id="getAuditGate",
    responses=problem_responses(404, 422),
)
def get_audit_gate(name: str, _: AdminDep, engine: EngineDep) -> AuditGatePolicy:
    """The dataset's release gate: the maximum audit age in days, or null (off)."""
    with problems(), transaction(engine) as s:
        ds = ops.dataset_named(s, name)
        return AuditGatePolicy(dataset=ds.name, max_age_days=gate_days(s, ds.id))


@router.post(
    "/jobs/{job_id}/refund",
    response_model=JobPublic,
    operation_id="refundJob",
    responses={**JSON_BODY, **problem_responses(404, 409)},
)
def refund(job_id: str, body: RefundRequest, _: AdminDep, engine: EngineDep) -> JobPublic:
    """Refund a failed job's charge, with a reason (a new ledger entry).

    A job that failed before reading any private row never started as far as the privacy
    filter is concerned, so its charge returns to the dataset's and the analyst's budgets.
    A job that had read private rows keeps its charge: its failure was itself an output.
    With `override: true` the refund is recorded for it, as information only (zero amount,
    no budget returned, the guarantee unchanged). Released jobs cannot be refunded.
    """
    with problems(), transaction(engine) as s:
        return ops.refund_failed_job(s, job_id, body)


@router.get(
    "/jobs",
    response_model=list[AdminJob],
    operation_id="adminListJobs",
    responses={
        **paged_responses("Every analyst's jobs, newest first: one page of them."),
        **problem_responses(422),
    },
)
def all_jobs(
    request: Request,
    response: Response,
    _: AdminDep,
    engine: EngineDep,
    filters: FiltersDep,
    analyst: AnalystName = None,
    limit: Limit = DEFAULT_LIMIT,
    cursor: Cursor = None,
) -> list[AdminJob]:
    """Every analyst's jobs that the filters match, newest first (by creation time, then
    id), a page at a time: the next page's cursor is in the `X-Next-Cursor` header and the
    next page's URL in `Link: <…>; rel="next"`; both are absent on the last page. Each
    job as the analyst sees it, with what the worker recorded of the run (the stage it
    reached, whether it read the private rows, why it failed): admin-only facts."""
    with cursor_problems(), transaction(engine) as s:
        page = ops.jobs_page(
            s, filters.model_copy(update={"analyst": analyst}), limit=limit, cursor=cursor
        )
    link_next(request, response, page.next_cursor)
    return [row.job for row in page.rows]


@router.get(
    "/jobs/{job_id}",
    response_model=AdminJob,
    operation_id="adminGetJob",
    responses=problem_responses(404, 422),
)
def one_job(job_id: str, _: AdminDep, engine: EngineDep) -> AdminJob:
    """Any analyst's job, with what the worker recorded of the run: the stage it reached,
    whether it read the private rows (recorded before the first read) and the category of
    a failure (from the error's type). The detail stays in the enclave's log."""
    with problems(), transaction(engine) as s:
        return ops.job_row(s, job_id).job


@router.get(
    "/ledger",
    response_model=list[LedgerEntryPublic],
    operation_id="listLedger",
    responses=problem_responses(404, 422),
)
def ledger(
    _: AdminDep,
    engine: EngineDep,
    dataset: str | None = None,
    after_id: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[LedgerEntryPublic]:
    """Ledger entries in order (append-only; each carries the previous entry's hash)."""
    with problems(), transaction(engine) as s:
        return ops.ledger_in_order(s, dataset=dataset, after_id=after_id, limit=limit)


@router.get("/ledger/verify", response_model=LedgerVerification, operation_id="verifyLedger")
def verify(_: AdminDep, engine: EngineDep) -> LedgerVerification:
    """Walk every hash chain and recompute every running total from the entries."""
    with transaction(engine) as s:
        chains = verify_all(s)
        mismatches = check_totals(s)
    return LedgerVerification(
        ok=all(c.ok for c in chains) and not mismatches,
        chains=[ChainCheck(**c.__dict__) for c in chains],
        mismatches=[TotalMismatch(**m.__dict__) for m in mismatches],
    )


@router.get(
    "/datasets/{name}/accounting",
    response_model=AccountingSummary,
    operation_id="getAccounting",
    responses=problem_responses(404, 422),
)
def accounting(name: str, _: AdminDep, engine: EngineDep) -> AccountingSummary:
    """What each composition rule says about the dataset's spending so far.

    Only the admission rule (pure sum or RDP filter) decides; the PLD figure is shown as
    information because PLD composition is not proven valid under adaptive choice.
    """
    with problems(), transaction(engine) as s:
        return accounting_summary(s, ops.dataset_named(s, name))
