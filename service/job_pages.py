"""Job listings: filters and keyset (cursor) paging, newest first (issue 26).

Shared by ``GET /v1/jobs`` (an analyst's own jobs), ``GET /v1/admin/jobs``, the admin's
``enclave admin jobs`` and the dashboard's jobs page. Jobs are ordered by
``(created_at, id)`` descending; a page's cursor is an opaque token for the last job it
shows, and the next page starts strictly after it, so paging visits every job exactly once
(ties in ``created_at`` are broken by the id) however many jobs are added meanwhile (new
ones are newer: they appear on the first page, never shift a later one). A cursor is a
position only: the filters, and the analyst an analyst's listing is restricted to, apply
to every page, so a cursor never reveals another analyst's jobs.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session

from service.jobs import as_utc
from service.ledger.tables import Analyst, Dataset, Job
from service.schemas.common import Guarantee, Method
from service.vocabulary import JobStatus

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_CURSOR_LENGTH = 200


class BadCursor(ValueError):
    """A cursor this service did not issue (or one mangled on the way)."""


class JobFilters(BaseModel):
    """Which jobs a listing shows; every field left out matches every job. Times are
    ISO 8601; one without a UTC offset is read as UTC. ``created_after`` is inclusive,
    ``created_before`` exclusive."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: JobStatus | None = None
    dataset: str | None = Field(default=None, min_length=1, max_length=64)
    method: Method | None = None
    guarantee: Guarantee | None = None
    analyst: str | None = Field(default=None, min_length=1, max_length=64)
    created_after: datetime | None = None
    created_before: datetime | None = None

    @field_validator("created_after", "created_before")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    def query_params(self) -> dict[str, str]:
        """The filters as query parameters (for next-page links)."""
        out: dict[str, str] = {}
        for name, value in self.model_dump(exclude_none=True).items():
            out[name] = value.isoformat() if isinstance(value, datetime) else str(value)
        return out


def encode_cursor(created_at: datetime, job_id: str) -> str:
    """The opaque cursor of a job's position: base64url of ``[created_at, id]``."""
    ts = (as_utc(created_at) or created_at).astimezone(UTC)
    raw = json.dumps([ts.isoformat(timespec="microseconds"), job_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor names; :class:`BadCursor` for anything else."""
    if not cursor or len(cursor) > MAX_CURSOR_LENGTH:
        raise BadCursor("the cursor is empty or too long")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ts_text, job_id = json.loads(raw.decode())
        ts = datetime.fromisoformat(ts_text)
    except (binascii.Error, UnicodeError, ValueError, TypeError) as exc:
        raise BadCursor("the cursor is not one this service issued") from exc
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 36 or ts.tzinfo is None:
        raise BadCursor("the cursor is not one this service issued")
    return ts.astimezone(UTC), job_id


@dataclass(frozen=True)
class JobPage:
    """One page: (job, dataset name, analyst name) rows and the next page's cursor (None on
    the last page)."""

    rows: list[tuple[Job, str, str]]
    next_cursor: str | None


def _filtered(stmt: Select, filters: JobFilters, analyst_id: int | None) -> Select:  # type: ignore[type-arg]
    conditions = []
    if analyst_id is not None:
        conditions.append(Job.analyst_id == analyst_id)
    if filters.status is not None:
        conditions.append(Job.status == filters.status)
    if filters.dataset is not None:
        conditions.append(Dataset.name == filters.dataset)
    if filters.analyst is not None:
        conditions.append(Analyst.name == filters.analyst)
    if filters.method is not None:
        conditions.append(Job.plan["method"].as_string() == filters.method)
    if filters.guarantee is not None:
        conditions.append(Job.plan["guarantee"].as_string() == filters.guarantee)
    if filters.created_after is not None:
        conditions.append(Job.created_at >= filters.created_after)
    if filters.created_before is not None:
        conditions.append(Job.created_at < filters.created_before)
    return (
        stmt.join(Dataset, Dataset.id == Job.dataset_id)
        .join(Analyst, Analyst.id == Job.analyst_id)
        .where(*conditions)
    )


def job_page(
    s: Session,
    filters: JobFilters,
    *,
    analyst_id: int | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> JobPage:
    """A page of the jobs ``filters`` match (only ``analyst_id``'s, if given), newest
    first, after ``cursor``'s position. :class:`BadCursor` for a cursor not issued here."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be in [1, {MAX_LIMIT}]")
    stmt = _filtered(select(Job, Dataset.name, Analyst.name), filters, analyst_id)
    if cursor:
        ts, job_id = decode_cursor(cursor)
        stmt = stmt.where(
            Job.created_at <= ts,
            or_(Job.created_at < ts, and_(Job.created_at == ts, Job.id < job_id)),
        )
    stmt = stmt.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    rows = [(job, ds, who) for job, ds, who in s.execute(stmt).tuples()]
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1][0] if more else None
    return JobPage(rows, encode_cursor(last.created_at, last.id) if last is not None else None)


def count_matching(s: Session, filters: JobFilters, *, analyst_id: int | None = None) -> int:
    """How many jobs ``filters`` match (the dashboard says so above its table)."""
    stmt = _filtered(select(func.count()).select_from(Job), filters, analyst_id)
    return int(s.scalar(stmt) or 0)
