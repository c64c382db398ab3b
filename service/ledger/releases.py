"""A release's ledger entry (zero cost: the job's charge was taken at admission)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.ledger.chain import _zero_cost_entry
from service.ledger.locks import lock_dataset
from service.ledger.tables import EntryKind, Job, LedgerEntry


def record_release(session: Session, *, job: Job, weights_sha256: str) -> LedgerEntry:
    """A release row in the ledger (zero cost: the charge was taken at admission)."""
    ds = lock_dataset(session, job.dataset_id)
    return _zero_cost_entry(
        session,
        ds,
        kind=EntryKind.release,
        event={"weights_sha256": weights_sha256},
        reason=None,
        analyst_id=job.analyst_id,
        job_id=job.id,
    )
