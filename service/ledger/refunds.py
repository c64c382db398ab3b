"""Refunds of a job's charge: by the admin, on cancel, and automatically for a job that
failed before it read a private row.

The automatic refund is triggered by SQLAlchemy event listeners, registered when this
module is imported; :mod:`service.ledger` imports it, so they are in place wherever the
ledger's tables are.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, object_session

from service.ledger.chain import append_entry
from service.ledger.charges import Charge
from service.ledger.errors import InvalidLedgerOperation
from service.ledger.locks import _apply, lock_cap, lock_dataset
from service.ledger.tables import EntryKind, Job, JobStatus, LedgerEntry
from service.privacy.amounts import from_micro


def refund_job(session: Session, *, job: Job, reason: str, override: bool = False) -> LedgerEntry:
    """Append a refund of the job's charge. The caller holds the job row lock.

    Only a job that never read a private row is refunded for real (negative amounts that
    return its charge to both filters). That is sound because the filter's rounds are job
    *starts* (first reads of private rows), not admissions: the argument is in
    :mod:`service.privacy.filters`. A job that did read rows ran a mechanism whose output
    (even a failure) depends on the data; returning its charge could revive an exhausted
    Rényi order and void the guarantee. With ``override`` the admin may still record such
    a refund, but it is **information only**: a zero-cost entry that names the charge and
    the reason, and leaves the filter state (and so every later admission and the stated
    guarantee) untouched. Without ``override`` it is refused.
    """
    if job.data_touched and not override:
        raise InvalidLedgerOperation(
            "the job read private rows: its charge cannot be returned; with an explicit "
            "override the refund is recorded as information only and returns no budget"
        )
    ds = lock_dataset(session, job.dataset_id)
    already = session.scalar(
        select(func.count())
        .select_from(LedgerEntry)
        .where(LedgerEntry.job_id == job.id, LedgerEntry.kind == EntryKind.refund)
    )
    if already:
        raise InvalidLedgerOperation("this job was already refunded")
    charge_entry = session.get(LedgerEntry, job.charge_entry_id)
    if charge_entry is None or charge_entry.rdp_micro is None:
        raise InvalidLedgerOperation("the job has no charge to refund")
    if job.data_touched:
        return append_entry(
            session,
            ds,
            LedgerEntry(
                analyst_id=job.analyst_id,
                job_id=job.id,
                kind=EntryKind.refund,
                event={
                    "refund_of": charge_entry.id,
                    "data_touched": True,
                    "information_only": True,
                    "charge_kept_epsilon": from_micro(charge_entry.epsilon_micro),
                    "charge_kept_delta": charge_entry.delta,
                },
                epsilon_micro=0,
                rdp_micro=None,
                delta="0",
                reason=reason,
            ),
        )
    cap = lock_cap(session, job.analyst_id, ds.id)
    refund = Charge(
        epsilon_micro=charge_entry.epsilon_micro,
        rdp_micro=list(charge_entry.rdp_micro),
        delta=charge_entry.delta,
        pure=True,
        event=charge_entry.event or {},
    ).negated()
    entry = append_entry(
        session,
        ds,
        LedgerEntry(
            analyst_id=job.analyst_id,
            job_id=job.id,
            kind=EntryKind.refund,
            event={"refund_of": charge_entry.id, "data_touched": False},
            epsilon_micro=refund.epsilon_micro,
            rdp_micro=refund.rdp_micro,
            delta=charge_entry.delta,
            reason=reason,
        ),
    )
    _apply(ds, cap, refund)
    return entry


def cancel_job(session: Session, *, job: Job) -> Job:
    """Cancel a queued job; it is refunded because no private row was read."""
    if job.status != JobStatus.queued or job.data_touched:
        raise InvalidLedgerOperation(
            f"only queued jobs can be cancelled (this one is {job.status})"
        )
    job.status = JobStatus.cancelled
    job.finished_at = datetime.now(UTC)
    refund_job(session, job=job, reason="cancelled by the analyst before any private row was read")
    return job


AUTOMATIC_REFUND_REASON = "automatic: the job failed before it read any private row"
_FAILED_JOBS = "enclave.jobs_marked_failed"  # Session.info key: jobs this transaction failed


def refund_unread_failure(session: Session, job: Job) -> LedgerEntry | None:
    """The automatic refund of a failed job that never read a private row (``data_touched``
    is set by the worker, in its own transaction, just before the first read).

    Such a job was never a round of the filter, so its charge goes back to both filters,
    as an admin refund would (:func:`refund_job`), with :data:`AUTOMATIC_REFUND_REASON`.
    Exactly once: :func:`refund_job` checks under the dataset lock that the job has no
    refund yet (an earlier automatic or admin one); then nothing is written. A job that
    read rows is never refunded here (only an admin's information-only override can
    record a refund for it).
    """
    if job.status != JobStatus.failed or job.data_touched or job.charge_entry_id is None:
        return None
    try:
        return refund_job(session, job=job, reason=AUTOMATIC_REFUND_REASON)
    except InvalidLedgerOperation:  # already refunded, or no charge to return
        return None


@event.listens_for(Job.status, "set")
def _note_failure(job: Job, value: object, oldvalue: object, _initiator: object) -> None:
    """Remember, on the session, a job set to ``failed`` (by the worker's failure paths in
    worker/runner.py, or any other ORM write); it is refunded when the transaction commits."""
    if value == JobStatus.failed and oldvalue != JobStatus.failed:
        session = object_session(job)
        if session is not None:
            session.info.setdefault(_FAILED_JOBS, []).append(job)


@event.listens_for(Session, "before_commit")
def _refund_unread_failures(session: Session) -> None:
    """Before the transaction that failed a job commits, refund it if it read no private
    row: in the same transaction as the failure, so the two are written together or not
    at all."""
    for job in session.info.pop(_FAILED_JOBS, []):
        refund_unread_failure(session, job)


@event.listens_for(Session, "after_rollback")
def _forget_failures(session: Session) -> None:
    session.info.pop(_FAILED_JOBS, None)
