"""Tamper evidence: every ledger entry carries the hash of the previous entry of its dataset.

The hash covers every field of the entry except its own id and hash, so rewriting an
amount, an event, a reason or the order of entries breaks the chain from that point on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ledger.tables import Dataset, EntryKind, LedgerEntry

GENESIS = "0" * 64


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


# The columns an entry's hash covers: every column except its own id and hash.
HASHED_FIELDS = (
    "dataset_id",
    "analyst_id",
    "job_id",
    "kind",
    "event",
    "epsilon_micro",
    "rdp_micro",
    "delta",
    "reason",
    "created_at",
    "prev_hash",
)


def fields_digest(fields: dict[str, Any]) -> str:
    """The hash of an entry given as its column values (``HASHED_FIELDS``)."""
    canonical = {k: fields[k] for k in HASHED_FIELDS}
    canonical["kind"] = EntryKind(canonical["kind"]).value
    return hashlib.sha256(_canonical(canonical)).hexdigest()


def entry_digest(entry: LedgerEntry) -> str:
    return fields_digest({k: getattr(entry, k) for k in HASHED_FIELDS})


def chained_row(*, dataset_id: int, head_hash: str, **fields: Any) -> dict[str, Any]:
    """The column values of a new entry linked after ``head_hash`` (the dataset's head,
    read under its row lock), hash included; for writers that insert rows directly
    (admission, :func:`service.ledger.admission.admit_job`). Its ``hash`` is the new head."""
    row = {
        **fields,
        "dataset_id": dataset_id,
        "created_at": datetime.now(UTC).isoformat(timespec="microseconds"),
        "prev_hash": head_hash,
    }
    row["hash"] = fields_digest(row)
    return row


def append_entry(session: Session, dataset: Dataset, entry: LedgerEntry) -> LedgerEntry:
    """Chain and add `entry`. The caller must hold the dataset row lock (admission does)."""
    entry.dataset_id = dataset.id
    entry.created_at = datetime.now(UTC).isoformat(timespec="microseconds")
    entry.prev_hash = dataset.head_hash
    entry.hash = entry_digest(entry)
    dataset.head_hash = entry.hash
    session.add(entry)
    session.flush()
    return entry


def _zero_cost_entry(
    session: Session,
    ds: Dataset,
    *,
    kind: EntryKind,
    event: dict,
    reason: str | None,
    analyst_id: int | None = None,
    job_id: str | None = None,
) -> LedgerEntry:
    """A chained entry that costs nothing: budget changes and releases."""
    return append_entry(
        session,
        ds,
        LedgerEntry(
            analyst_id=analyst_id,
            job_id=job_id,
            kind=kind,
            event=event,
            epsilon_micro=0,
            rdp_micro=None,
            delta="0",
            reason=reason,
        ),
    )


@dataclass(frozen=True)
class ChainReport:
    dataset: str
    entries: int
    ok: bool
    first_bad_entry_id: int | None = None
    problem: str | None = None


def verify_chain(session: Session, dataset: Dataset) -> ChainReport:
    """Walk the dataset's entries in id order and check every link and digest."""
    prev = GENESIS
    count = 0
    rows = session.scalars(
        select(LedgerEntry).where(LedgerEntry.dataset_id == dataset.id).order_by(LedgerEntry.id)
    )
    for entry in rows:
        count += 1
        if entry.prev_hash != prev:
            return ChainReport(dataset.name, count, False, entry.id, "broken link")
        if entry_digest(entry) != entry.hash:
            return ChainReport(dataset.name, count, False, entry.id, "digest mismatch")
        prev = entry.hash
    if prev != dataset.head_hash:
        return ChainReport(dataset.name, count, False, None, "head hash does not match last entry")
    return ChainReport(dataset.name, count, True)
