"""How the dashboard shows figures: timestamps, guarantee labels and paging. Display only;
every figure comes from the ledger's query functions (signed ledger amounts from
:func:`service.admin.signed_delta`, as in the API and the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import parse_qsl, urlencode, urlsplit

from service.ledger.tables import JobStatus
from service.methods.common import ResourceEstimate
from service.schemas import JobPublic

PAGE_SIZE = 50
MAX_PAGE = 10**6
DASHBOARD = "/dashboard"
MAX_BACK = 2000


def safe_back(raw: str | None, default: str) -> str:
    """The page a refused form's Back link returns to: the form's hidden ``back`` field (the
    path and query of the page the form was on) if it is a same-site relative path of the
    dashboard, else ``default``. Never an open redirect: no scheme, no host, no
    protocol-relative ``//`` or backslash, no control character, no dot segment; a path
    under /dashboard only."""
    if not raw or len(raw) > MAX_BACK or not raw.isprintable() or "\\" in raw:
        return default
    parts = urlsplit(raw)
    path = parts.path
    if parts.scheme or parts.netloc or parts.fragment or raw.startswith("//"):
        return default
    if not (path == DASHBOARD or path.startswith(DASHBOARD + "/")):
        return default
    if any(seg in (".", "..") for seg in path.split("/")) or "//" in path:
        return default
    return raw


def here(path: str, query: str) -> str:
    """A page's path and query for a form's ``back`` field, less the ``done`` notice."""
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "done"]
    return path + (f"?{urlencode(kept)}" if kept else "")


def timestamp(value: str | datetime | None) -> str:
    """UTC, to the second."""
    if value is None:
        return ""
    ts = datetime.fromisoformat(value) if isinstance(value, str) else value
    return ts.strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def estimate_text(estimate: ResourceEstimate) -> str:
    """A plan's quote-time estimate in a table cell: "~12 s, ~40 MiB" (each part only
    where the method has one)."""
    parts = []
    if estimate.seconds is not None:
        parts.append(f"~{estimate.seconds:.3g} s")
    if estimate.memory_bytes is not None:
        parts.append(f"~{estimate.memory_bytes / 2**20:.3g} MiB")
    return ", ".join(parts) or "no estimate"


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
