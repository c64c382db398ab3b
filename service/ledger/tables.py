"""ORM tables of the ledger database. ORM objects never cross the API boundary.

Amounts are integers in micro-nats (see :mod:`service.privacy.amounts`); δ values are
stored as exact decimal strings. Ledger entries are append-only; the running totals on
`datasets` and `analyst_caps` are caches that `enclave ledger check` recomputes.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The ledger's vocabularies live in their own module so that the API's schemas can name
# them without importing the ORM (issue 23); re-exported here for the tables' users.
from service.vocabulary import EntryKind as EntryKind
from service.vocabulary import FailureCategory as FailureCategory
from service.vocabulary import JobStage as JobStage
from service.vocabulary import JobStatus as JobStatus
from service.vocabulary import Role as Role


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        list[int]: JSON,
        datetime: DateTime(timezone=True),
    }


def _enum(cls: type[enum.Enum]) -> Enum:
    return Enum(cls, native_enum=False, length=16, validate_strings=True)


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    public_schema: Mapped[dict[str, Any]]
    # The public row count: a DP noisy count released at registration (its ε in
    # count_epsilon_micro, charged to the budget); NULL ε: an exact count published
    # before noisy counts existed (migration 0002).
    n_rows: Mapped[int] = mapped_column(BigInteger)
    count_epsilon_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The public size n_h of the private evaluation holdout (issue 21, migration 0008):
    # floor(F·n̂) of the noisy count n̂, stored apart from the training rows; n_rows is then
    # n̂ − n_h. NULL: no holdout.
    holdout_rows: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    epsilon_total_micro: Mapped[int] = mapped_column(BigInteger)
    delta_total: Mapped[str] = mapped_column(String(40))
    allow_nominal: Mapped[bool] = mapped_column(Boolean, default=False)
    orders_version: Mapped[int] = mapped_column(Integer)
    spent_epsilon_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    spent_rdp_micro: Mapped[list[int]]
    head_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Analyst(Base):
    __tablename__ = "analysts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[Role] = mapped_column(_enum(Role))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Key lifecycle (migration 0003): a revoked key, or one past its expiry, authenticates
    # nobody; rotation replaces key_hash (the old key stops working at once).
    key_expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    key_revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class AnalystCap(Base):
    __tablename__ = "analyst_caps"

    analyst_id: Mapped[int] = mapped_column(ForeignKey("analysts.id"), primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), primary_key=True)
    epsilon_cap_micro: Mapped[int] = mapped_column(BigInteger)
    delta_cap: Mapped[str] = mapped_column(String(40))
    spent_epsilon_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    spent_rdp_micro: Mapped[list[int]]


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("analyst_id", "idempotency_key", name="uq_jobs_idempotency"),
        # Keyset paging of job listings, newest first (migration 0005, service/job_pages.py).
        Index("ix_jobs_created_at_id", "created_at", "id"),
        Index("ix_jobs_analyst_created_at_id", "analyst_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    analyst_id: Mapped[int] = mapped_column(ForeignKey("analysts.id"), index=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]]
    plan: Mapped[dict[str, Any]]
    # The request with every default its plan filled in written out (migration 0010;
    # service.plans.resolve_defaults): what the worker re-plans, so that a default rule
    # changed by an upgrade after admission leaves the plan reproducible. ``request`` stays
    # as the analyst sent it (served, digested). NULL: nothing to resolve, or a job older
    # than the column (the worker re-plans ``request``).
    resolved_request: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus), index=True)
    progress_step: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    run_token: Mapped[str | None] = mapped_column(String(36))
    data_touched: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    charge_entry_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    enqueued_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # The public release time's first grid point, started_at + D (migration 0012,
    # service/release_hold.py), set at the claim when the release hold is on; NULL: no hold.
    release_at: Mapped[datetime | None]
    # What the worker recorded of the run, for the admin only (issue 26, migration 0007;
    # worker/runner.py). NULL: a job older than the record. data_read is set in the same
    # update as data_touched, just before the first private byte is read.
    stage_reached: Mapped[JobStage | None] = mapped_column(
        _enum(JobStage), nullable=True, default=JobStage.queued
    )
    data_read: Mapped[bool | None] = mapped_column(Boolean, nullable=True, default=False)
    failure_category: Mapped[FailureCategory | None] = mapped_column(
        _enum(FailureCategory), nullable=True
    )


class LedgerEntry(Base):
    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    analyst_id: Mapped[int | None] = mapped_column(ForeignKey("analysts.id"))
    job_id: Mapped[str | None] = mapped_column(String(36), index=True)
    kind: Mapped[EntryKind] = mapped_column(_enum(EntryKind))
    # The mechanism description (a serialised DP event) or the budget change, as data.
    event: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    epsilon_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    rdp_micro: Mapped[list[int] | None] = mapped_column(JSON)
    delta: Mapped[str] = mapped_column(String(40), default="0")
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(String(40))
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)


class Release(Base):
    __tablename__ = "releases"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    weights_sha256: Mapped[str] = mapped_column(String(64))
    card: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DashboardSession(Base):
    """A signed-in admin's dashboard session (migration 0004).

    The cookie holds a random token; only its SHA-256 hash is stored. ``key_hash`` is the
    admin's key hash at sign-in: rotating the key changes the analyst's hash, so the
    session stops matching at once; revocation and key expiry end it through the same
    check as API calls (:func:`service.auth.key_is_live`).
    """

    __tablename__ = "dashboard_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    analyst_id: Mapped[int] = mapped_column(ForeignKey("analysts.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
