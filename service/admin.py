"""Admin operations as plain functions over a session: shared by the admin API routes
(service/api/routes/admin.py) and the dashboard's forms, which only translate their errors
(:class:`NotFound` → 404, :class:`InvalidLedgerOperation` → 409 for the API; a message on
the page for the dashboard). The caller owns the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.auth import expiry, hash_api_key, key_is_live, new_api_key, revoke_key, rotate_key
from service.datasets.kinds import parse_dataset_schema
from service.job_pages import DEFAULT_LIMIT, JobFilters, job_page
from service.jobs import admin_job, as_utc, job_public
from service.ledger.accounting import ledger_entry_public, refund_is_information_only
from service.ledger.budgets import set_analyst_cap, set_dataset_budget, set_nominal_policy
from service.ledger.errors import InvalidLedgerOperation, LedgerError
from service.ledger.filter_view import cap_filter, dataset_filter
from service.ledger.locks import lock_job
from service.ledger.refunds import refund_job
from service.ledger.tables import (
    Analyst,
    AnalystCap,
    Dataset,
    EntryKind,
    Job,
    JobStatus,
    LedgerEntry,
    Role,
)
from service.methods.common import ResourceEstimate
from service.privacy.amounts import from_micro
from service.resources import plan_resources
from service.schemas import (
    AdminJob,
    AnalystCreate,
    AnalystCreated,
    BudgetUpdate,
    BudgetView,
    CapUpdate,
    JobPublic,
    KeyRotate,
    LedgerEntryPublic,
    RefundRequest,
)


class NotFound(LedgerError):
    """No dataset, analyst or job of that name."""


def dataset_named(s: Session, name: str) -> Dataset:
    ds = s.scalars(select(Dataset).where(Dataset.name == name)).one_or_none()
    if ds is None:
        raise NotFound(f"no dataset named {name!r}")
    return ds


def analyst_named(s: Session, name: str) -> Analyst:
    a = s.scalars(select(Analyst).where(Analyst.name == name)).one_or_none()
    if a is None:
        raise NotFound(f"no analyst named {name!r}")
    return a


def _created(a: Analyst, key: str) -> AnalystCreated:
    return AnalystCreated(
        id=a.id, name=a.name, role=a.role, api_key=key, expires_at=a.key_expires_at
    )


def create_analyst(s: Session, body: AnalystCreate) -> AnalystCreated:
    """A new analyst (or admin); the key is in the result, once."""
    if s.scalars(select(Analyst).where(Analyst.name == body.name)).first():
        raise InvalidLedgerOperation(f"an analyst named {body.name!r} exists")
    key = new_api_key()
    a = Analyst(
        name=body.name,
        key_hash=hash_api_key(key),
        role=Role(body.role),
        key_expires_at=expiry(body.expires_in_days),
    )
    s.add(a)
    s.flush()
    return _created(a, key)


def rotated_key_expiry(
    a: Analyst, body: KeyRotate, *, now: datetime | None = None
) -> datetime | None:
    """When the rotated key expires: after ``expires_in_days`` if given; never with
    ``no_expiry``; else (the lifetime left blank) when the current key expires, so a
    rotation never lifts an expiry the admin once set. A key already past its expiry has
    none left to keep: that rotation is refused and asks for a lifetime (or no expiry)."""
    if body.expires_in_days is not None:
        return expiry(body.expires_in_days)
    if body.no_expiry:
        return None
    current = as_utc(a.key_expires_at)
    if current is not None and current <= (now or datetime.now(UTC)):
        raise InvalidLedgerOperation(
            f"{a.name}'s key expired on {current:%Y-%m-%d %H:%M} UTC, so there is no expiry "
            "to keep: give the new key a lifetime in days, or choose no expiry"
        )
    return current


def rotate_analyst_key(s: Session, name: str, body: KeyRotate) -> AnalystCreated:
    """A new key for the analyst (returned once); the old one stops working at once. Its
    expiry: :func:`rotated_key_expiry` (a blank lifetime keeps the current one)."""
    a = analyst_named(s, name)
    return _created(a, rotate_key(a, expires_at=rotated_key_expiry(a, body)))


class LastAdminKey(InvalidLedgerOperation):
    """Revoking this key would leave no live admin key: nobody could administer the
    service (nor issue a new admin key) through the API or the dashboard."""


def revocable_analyst(s: Session, name: str) -> Analyst:
    """The analyst whose key may be revoked: :class:`NotFound` if none, :class:`LastAdminKey`
    if theirs is the last live admin key (checked before asking for confirmation, and again
    when revoking)."""
    a = analyst_named(s, name)
    if Role(a.role) == Role.admin and key_is_live(a):
        admins = s.scalars(select(Analyst).where(Analyst.role == Role.admin, Analyst.id != a.id))
        if not any(key_is_live(other) for other in admins):
            raise LastAdminKey(
                f"{a.name}'s key is the last live admin key: revoking it would lock every "
                "admin out; create or re-key another admin first"
            )
    return a


def revoke_analyst_key(s: Session, name: str) -> None:
    """Revoke the analyst's key at once; never the last live admin key (:class:`LastAdminKey`)."""
    revoke_key(revocable_analyst(s, name))


def update_budget(s: Session, name: str, body: BudgetUpdate) -> BudgetView:
    ds = set_dataset_budget(
        s,
        dataset=dataset_named(s, name),
        epsilon_total=body.epsilon_total,
        delta_total=body.delta_total,
    )
    return dataset_filter(ds).view()


def update_cap(s: Session, dataset: str, analyst: str, body: CapUpdate) -> BudgetView:
    ds = dataset_named(s, dataset)
    a = analyst_named(s, analyst)
    cap = set_analyst_cap(s, analyst=a, dataset=ds, epsilon=body.epsilon, delta=body.delta)
    return cap_filter(cap).view()


def set_nominal(s: Session, name: str, *, allow_nominal: bool) -> Dataset:
    """Set the dataset's nominal policy; written to the ledger as budget changes are."""
    return set_nominal_policy(s, dataset=dataset_named(s, name), allow_nominal=allow_nominal)


def refund_failed_job(s: Session, job_id: str, body: RefundRequest) -> JobPublic:
    """Refund a failed job's charge with a reason; see the API route's description."""
    job = lock_job(s, job_id) if len(job_id) <= 36 else None
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    if job.status != JobStatus.failed:
        raise InvalidLedgerOperation(f"only failed jobs can be refunded (this one is {job.status})")
    if job.data_touched and not body.override:
        raise InvalidLedgerOperation(
            "this job read private rows before it failed, so its charge stays; with "
            "override: true the refund is recorded as information only (no budget back)"
        )
    refund_job(s, job=job, reason=body.reason, override=job.data_touched)
    return job_public(job, s.get_one(Dataset, job.dataset_id).name)


def refund_is_information_only_for(s: Session, job_id: str) -> bool:
    """Whether the job's refund (if any) is an information-only one (its charge stays)."""
    events = s.scalars(
        select(LedgerEntry.event).where(
            LedgerEntry.job_id == job_id, LedgerEntry.kind == EntryKind.refund
        )
    )
    return any(refund_is_information_only(e) for e in events)


@dataclass(frozen=True)
class JobRow:
    """A job as the admin sees it: with what the worker recorded of the run and the
    analyst who submitted it."""

    job: AdminJob
    analyst: str
    refunded: bool = False
    #: The refund is an admin's information-only override (the job had read private rows):
    #: recorded in the ledger, but the charge stays.
    information_only: bool = False
    #: The plan's quote-time estimate of worker time and memory (public values only), as
    #: the jobs page shows it: set by :func:`jobs_page`; :func:`job_row`'s callers read
    #: the job alone and leave it empty.
    estimate: ResourceEstimate = field(default_factory=ResourceEstimate)


@dataclass(frozen=True)
class JobRows:
    """A page of :class:`JobRow` and the next page's cursor (None on the last page)."""

    rows: list[JobRow]
    next_cursor: str | None


def jobs_page(
    s: Session,
    filters: JobFilters | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> JobRows:
    """Every analyst's jobs that ``filters`` match, newest first, a page after ``cursor``
    (:mod:`service.job_pages`; :class:`BadCursor` for a cursor not issued here)."""
    page = job_page(s, filters or JobFilters(), limit=limit, cursor=cursor)
    refunds = {
        job_id: refund_is_information_only(event)
        for job_id, event in s.execute(
            select(LedgerEntry.job_id, LedgerEntry.event).where(
                LedgerEntry.kind == EntryKind.refund,
                LedgerEntry.job_id.in_([j.id for j, _, _ in page.rows]),
            )
        ).tuples()
    }
    schemas: dict[str, dict[str, Any]] = {
        name: schema
        for name, schema in s.execute(
            select(Dataset.name, Dataset.public_schema).where(
                Dataset.name.in_({ds for _, ds, _ in page.rows})
            )
        ).tuples()
    }
    rows = []
    for j, ds, a in page.rows:
        job = admin_job(j, ds)  # flagged (``unreadable``) where its stored JSON fails its type
        estimate = ResourceEstimate() if job.unreadable else _estimate(job, schemas.get(ds))
        rows.append(JobRow(job, a, j.id in refunds, refunds.get(j.id, False), estimate))
    return JobRows(rows, page.next_cursor)


def _estimate(job: AdminJob, public_schema: dict[str, Any] | None) -> ResourceEstimate:
    """The job's quote-time estimate; none where the schema is gone or no longer parses
    (an estimate is information for the admin, never a reason to fail the page)."""
    if public_schema is None:
        return ResourceEstimate()
    try:
        return plan_resources(job.plan, schema=parse_dataset_schema(public_schema))
    except (KeyError, TypeError, ValueError):
        return ResourceEstimate()


def job_row(s: Session, job_id: str) -> JobRow:
    """One job as the admin sees it (:class:`NotFound` if there is none)."""
    found = (
        s.execute(
            select(Job, Dataset.name, Analyst.name)
            .join(Dataset, Dataset.id == Job.dataset_id)
            .join(Analyst, Analyst.id == Job.analyst_id)
            .where(Job.id == job_id)
        ).first()
        if len(job_id) <= 36
        else None
    )
    if found is None:
        raise NotFound(f"no job {job_id!r}")
    job, dataset, analyst = found
    refunded = s.scalar(
        select(func.count())
        .select_from(LedgerEntry)
        .where(LedgerEntry.kind == EntryKind.refund, LedgerEntry.job_id == job_id)
    )
    return JobRow(admin_job(job, dataset), analyst, bool(refunded))


def signed_delta(kind: EntryKind, epsilon_micro: int, delta: str) -> str:
    """A ledger entry's δ with the sign its ε has.

    The ledger stores a refund's ε negative (the amount returned) but its δ as the
    charge's unsigned decimal string; the stored row is hashed into the chain and stays
    as it is. Every view of the ledger (``GET /v1/admin/ledger``, ``enclave ledger
    show``, the dashboard) shows a refund that returned budget with both amounts
    negative; an information-only refund returns nothing and shows ε = 0, δ = 0.
    """
    if (
        kind == EntryKind.refund
        and epsilon_micro < 0
        and delta not in ("0", "")
        and not (delta.startswith("-"))
    ):
        return "-" + delta
    return delta


def ledger_entry_shown(entry: LedgerEntry, dataset_name: str) -> LedgerEntryPublic:
    """A ledger entry as every view shows it: :func:`signed_delta`'s sign convention."""
    public = ledger_entry_public(entry, dataset_name)
    delta = float(signed_delta(EntryKind(entry.kind), entry.epsilon_micro, entry.delta))
    return public if delta == public.delta else public.model_copy(update={"delta": delta})


def ledger_in_order(
    s: Session, *, dataset: str | None = None, after_id: int = 0, limit: int
) -> list[LedgerEntryPublic]:
    """Ledger entries in append order after ``after_id`` (of one dataset, if named)."""
    stmt = (
        select(LedgerEntry, Dataset.name)
        .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
        .where(LedgerEntry.id > after_id)
        .order_by(LedgerEntry.id)
        .limit(limit)
    )
    if dataset is not None:
        stmt = stmt.where(Dataset.id == dataset_named(s, dataset).id)
    return [ledger_entry_shown(e, name) for e, name in s.execute(stmt).all()]


def ledger_newest_first(s: Session, *, limit: int, offset: int = 0) -> list[LedgerEntryPublic]:
    """A page of the ledger entries of all datasets, newest first."""
    rows = s.execute(
        select(LedgerEntry, Dataset.name)
        .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
        .order_by(LedgerEntry.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return [ledger_entry_shown(e, name) for e, name in rows]


def count_ledger_entries(s: Session) -> int:
    return int(s.scalar(select(func.count()).select_from(LedgerEntry)) or 0)


@dataclass(frozen=True)
class AnalystSpending:
    """One analyst on one dataset: Σε of their charges in force (nats, refunds deducted)
    and their cap, if the admin set one (its filter view says what it admits)."""

    dataset: str
    epsilon_sum: float
    cap: BudgetView | None


@dataclass(frozen=True)
class AnalystRow:
    name: str
    role: str
    key_state: str
    key_expires_at: datetime | None
    created_at: datetime | None
    spending: list[AnalystSpending] = field(default_factory=list)


def analysts_overview(s: Session) -> list[AnalystRow]:
    """Every analyst with their key's state, spending and caps per dataset."""
    names = dict(s.execute(select(Dataset.id, Dataset.name)).tuples().all())
    sums = {
        (a, d): eps
        for a, d, eps in s.execute(
            select(
                LedgerEntry.analyst_id, LedgerEntry.dataset_id, func.sum(LedgerEntry.epsilon_micro)
            )
            .where(LedgerEntry.kind.in_([EntryKind.charge, EntryKind.refund]))
            .group_by(LedgerEntry.analyst_id, LedgerEntry.dataset_id)
        ).tuples()
    }
    caps = {(c.analyst_id, c.dataset_id): c for c in s.scalars(select(AnalystCap))}
    out = []
    for a in s.scalars(select(Analyst).order_by(Analyst.name)):
        keys = sorted({d for (x, d) in sums if x == a.id} | {d for (x, d) in caps if x == a.id})
        spending = [
            AnalystSpending(
                dataset=names[d],
                epsilon_sum=from_micro(int(sums.get((a.id, d)) or 0)),
                cap=cap_filter(caps[(a.id, d)]).view() if (a.id, d) in caps else None,
            )
            for d in keys
        ]
        state = (
            "live" if key_is_live(a) else ("revoked" if a.key_revoked_at is not None else "expired")
        )
        out.append(
            AnalystRow(
                name=a.name,
                role=Role(a.role).value,
                key_state=state,
                key_expires_at=as_utc(a.key_expires_at),
                created_at=as_utc(a.created_at),
                spending=sorted(spending, key=lambda x: x.dataset),
            )
        )
    return out
