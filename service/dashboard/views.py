"""How the dashboard shows figures: signed ledger amounts, timestamps, guarantee labels and
paging. Display only; every figure comes from the ledger's query functions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from service.ledger.tables import EntryKind, JobStatus
from service.schemas import JobPublic, LedgerEntryPublic

PAGE_SIZE = 50
MAX_PAGE = 10**6


def signed_delta(entry: LedgerEntryPublic) -> str:
    """The entry's δ with the sign its ε has: a refund returns both (the ledger stores the
    refunded δ unsigned, as a decimal string, and its ε negative)."""
    if entry.kind == EntryKind.refund.value and entry.epsilon < 0 and entry.delta != "0":
        return "-" + entry.delta
    return entry.delta


def timestamp(value: str | datetime | None) -> str:
    """UTC, to the second."""
    if value is None:
        return ""
    ts = datetime.fromisoformat(value) if isinstance(value, str) else value
    return ts.strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def guarantee_label(job: JobPublic) -> str | None:
    """The guarantee of a job's release: only a released job has one. A queued or running
    job's plan names the guarantee it would carry; a cancelled or failed job released
    nothing, so it carries none."""
    return job.guarantee if job.status == JobStatus.released.value else None


def page_number(raw: str | None) -> int | None:
    """The ``?page=`` number (1 when absent); None when it is not a whole number ≥ 1."""
    if raw is None or raw == "":
        return 1
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
        return None
    return int(raw)


@dataclass(frozen=True)
class Paging:
    number: int
    count: int
    total: int
    size: int = PAGE_SIZE

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.count else None


def paging(number: int, total: int, size: int = PAGE_SIZE) -> Paging:
    """Page ``number`` of ``total`` rows (a number past the end shows the last page)."""
    count = max(1, -(-total // size))
    return Paging(number=min(number, count), count=count, total=total, size=size)
