"""Admin endpoints: analysts, budgets, caps, refunds and the ledger."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from service.api.deps import AdminDep, EngineDep
from service.api.errors import ProblemError
from service.api.lookups import analyst_or_404, dataset_or_404, visible_job_or_404
from service.auth import expiry, hash_api_key, new_api_key, revoke_key, rotate_key
from service.db import transaction
from service.jobs import job_public
from service.ledger.accounting import accounting_summary, ledger_entry_public
from service.ledger.admission import (
    InvalidLedgerOperation,
    cap_filter,
    dataset_filter,
    lock_job,
    refund_job,
    set_analyst_cap,
    set_dataset_budget,
)
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import Analyst, Dataset, Job, JobStatus, LedgerEntry, Role
from service.schemas import (
    AnalystCreate,
    AnalystCreated,
    BudgetUpdate,
    BudgetView,
    CapUpdate,
    JobPublic,
    KeyRotate,
    LedgerEntryPublic,
    NominalUpdate,
    RefundRequest,
)

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/analysts", response_model=AnalystCreated, status_code=201)
def create_analyst(body: AnalystCreate, _: AdminDep, engine: EngineDep) -> AnalystCreated:
    """Create an analyst (or another admin). The API key is returned once."""
    key = new_api_key()
    with transaction(engine) as s:
        if s.scalars(select(Analyst).where(Analyst.name == body.name)).first():
            raise ProblemError(409, "conflict", f"an analyst named {body.name!r} exists")
        a = Analyst(
            name=body.name,
            key_hash=hash_api_key(key),
            role=Role(body.role),
            key_expires_at=expiry(body.expires_in_days),
        )
        s.add(a)
        s.flush()
        return AnalystCreated(
            id=a.id, name=a.name, role=a.role.value, api_key=key, expires_at=a.key_expires_at
        )


@router.post("/analysts/{name}/key", response_model=AnalystCreated)
def rotate_analyst_key(
    name: str, body: KeyRotate, _: AdminDep, engine: EngineDep
) -> AnalystCreated:
    """Rotate an analyst's API key: the new key is returned once, the old one stops working
    at once (API and dashboard). Also re-enables a revoked analyst."""
    with transaction(engine) as s:
        a = analyst_or_404(s, name)
        key = rotate_key(a, expires_in_days=body.expires_in_days)
        return AnalystCreated(
            id=a.id, name=a.name, role=a.role.value, api_key=key, expires_at=a.key_expires_at
        )


@router.delete("/analysts/{name}/key", status_code=204)
def revoke_analyst_key(name: str, _: AdminDep, engine: EngineDep) -> None:
    """Revoke an analyst's API key, effective at once (API and dashboard)."""
    with transaction(engine) as s:
        revoke_key(analyst_or_404(s, name))


@router.put("/datasets/{name}/budget", response_model=BudgetView)
def put_budget(name: str, body: BudgetUpdate, _: AdminDep, engine: EngineDep) -> BudgetView:
    """Set or raise a dataset's (ε_total, δ_total). Lowering below what is spent is refused."""
    with transaction(engine) as s:
        ds = dataset_or_404(s, name)
        try:
            ds = set_dataset_budget(
                s, dataset=ds, epsilon_total=body.epsilon_total, delta_total=body.delta_total
            )
        except InvalidLedgerOperation as exc:
            raise ProblemError(409, "conflict", str(exc)) from exc
        return dataset_filter(ds).view()


@router.put("/datasets/{name}/caps/{analyst}", response_model=BudgetView)
def put_cap(name: str, analyst: str, body: CapUpdate, _: AdminDep, engine: EngineDep) -> BudgetView:
    """Set an analyst's cap on a dataset. Lowering below what they spent is refused."""
    with transaction(engine) as s:
        ds = dataset_or_404(s, name)
        a = analyst_or_404(s, analyst)
        try:
            cap = set_analyst_cap(s, analyst=a, dataset=ds, epsilon=body.epsilon, delta=body.delta)
        except InvalidLedgerOperation as exc:
            raise ProblemError(409, "conflict", str(exc)) from exc
        return cap_filter(cap).view()


@router.put("/datasets/{name}/nominal")
def put_nominal(name: str, body: NominalUpdate, _: AdminDep, engine: EngineDep) -> dict[str, Any]:
    """Allow or forbid methods whose guarantee is not proven on this dataset: nominal ones
    (expm_nf) and asymptotic ones (expm with the mcmc sampler)."""
    with transaction(engine) as s:
        ds = dataset_or_404(s, name)
        ds.allow_nominal = body.allow_nominal
        return {"dataset": ds.name, "allow_nominal": ds.allow_nominal}


@router.post("/jobs/{job_id}/refund", response_model=JobPublic)
def refund(job_id: str, body: RefundRequest, admin: AdminDep, engine: EngineDep) -> JobPublic:
    """Refund a failed job's charge, with a reason (a new ledger entry).

    A job that failed before reading any private row never started as far as the privacy
    filter is concerned, so its charge returns to the dataset's and the analyst's budgets.
    A job that had read private rows keeps its charge: its failure was itself an output.
    With `override: true` the refund is recorded for it, as information only (zero amount,
    no budget returned, the guarantee unchanged). Released jobs cannot be refunded.
    """
    with transaction(engine) as s:
        visible_job_or_404(s, admin, job_id)
        job = lock_job(s, job_id)
        assert job is not None
        if job.status != JobStatus.failed:
            raise ProblemError(
                409, "conflict", f"only failed jobs can be refunded (this one is {job.status})"
            )
        if job.data_touched and not body.override:
            raise ProblemError(
                409,
                "conflict",
                "this job read private rows before it failed, so its charge stays; with "
                "override: true the refund is recorded as information only (no budget back)",
            )
        try:
            refund_job(s, job=job, reason=body.reason, override=job.data_touched)
        except InvalidLedgerOperation as exc:
            raise ProblemError(409, "conflict", str(exc)) from exc
        return job_public(job, s.get_one(Dataset, job.dataset_id).name)


@router.get("/jobs", response_model=list[JobPublic])
def all_jobs(
    _: AdminDep, engine: EngineDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[JobPublic]:
    with transaction(engine) as s:
        rows = s.execute(
            select(Job, Dataset.name)
            .join(Dataset, Dataset.id == Job.dataset_id)
            .order_by(Job.created_at.desc())
            .limit(limit)
        ).all()
        return [job_public(j, n) for j, n in rows]


@router.get("/ledger", response_model=list[LedgerEntryPublic])
def ledger(
    _: AdminDep,
    engine: EngineDep,
    dataset: str | None = None,
    after_id: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[LedgerEntryPublic]:
    """Ledger entries in order (append-only; each carries the previous entry's hash)."""
    with transaction(engine) as s:
        stmt = (
            select(LedgerEntry, Dataset.name)
            .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
            .where(LedgerEntry.id > after_id)
            .order_by(LedgerEntry.id)
            .limit(limit)
        )
        if dataset is not None:
            stmt = stmt.where(Dataset.id == dataset_or_404(s, dataset).id)
        return [ledger_entry_public(e, name) for e, name in s.execute(stmt).all()]


@router.get("/ledger/verify")
def verify(_: AdminDep, engine: EngineDep) -> dict[str, Any]:
    """Walk every hash chain and recompute every running total from the entries."""
    with transaction(engine) as s:
        chains = verify_all(s)
        mismatches = check_totals(s)
    return {
        "ok": all(c.ok for c in chains) and not mismatches,
        "chains": [c.__dict__ for c in chains],
        "mismatches": [m.__dict__ for m in mismatches],
    }


@router.get("/datasets/{name}/accounting")
def accounting(name: str, _: AdminDep, engine: EngineDep) -> dict[str, Any]:
    """What each composition rule says about the dataset's spending so far.

    Only the admission rule (pure sum or RDP filter) decides; the PLD figure is shown as
    information because PLD composition is not proven valid under adaptive choice.
    """
    with transaction(engine) as s:
        return accounting_summary(s, dataset_or_404(s, name)).model_dump()
