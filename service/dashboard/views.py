"""How the dashboard shows figures: timestamps, guarantee labels and paging. Display only;
every figure comes from the ledger's query functions (signed ledger amounts from
:func:`service.admin.signed_delta`, as in the API and the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from service.ledger.tables import JobStatus
from service.schemas import JobPublic

PAGE_SIZE = 50
MAX_PAGE = 10**6


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
