"""Job bookkeeping outside the enclave: enqueueing, the sweeper, public views.

Accepted work is never lost: a job is committed (and charged) before its message is
sent. If sending fails, or a worker dies mid-run (its heartbeat goes stale), the sweeper
sends the job again; the worker's claim step makes duplicate messages harmless.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, or_, select, update

from service.config import Settings
from service.db import transaction
from service.ledger.tables import Job, JobStatus
from service.queue import send_run_job
from service.schemas import JobPublic, PrivacyPlan

log = logging.getLogger("enclave.jobs")


def as_utc(ts: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes; everything we store is UTC.
    if ts is not None and ts.tzinfo is None:
        return ts.replace(tzinfo=UTC)
    return ts


def enqueue(engine: Engine, settings: Settings, job_id: str) -> bool:
    try:
        send_run_job(settings, job_id)
    except Exception:  # broker down: the job stays queued and the sweeper retries
        log.warning("could not enqueue job %s; the sweeper will retry", job_id, exc_info=True)
        return False
    with transaction(engine) as s:
        s.execute(update(Job).where(Job.id == job_id).values(enqueued_at=datetime.now(UTC)))
    return True


def jobs_to_resend(engine: Engine, settings: Settings, now: datetime | None = None) -> list[str]:
    now = now or datetime.now(UTC)
    stale = now - timedelta(seconds=settings.heartbeat_timeout_s)
    with transaction(engine) as s:
        rows = s.scalars(
            select(Job).where(
                or_(
                    Job.status == JobStatus.queued,
                    Job.status == JobStatus.running,
                )
            )
        ).all()
        out = []
        for job in rows:
            if job.status == JobStatus.queued:
                enq = as_utc(job.enqueued_at)
                # Never sent, or sent a while ago and still not picked up (lost message).
                if enq is None or enq < now - timedelta(seconds=settings.requeue_after_s):
                    out.append(job.id)
            else:
                beat = as_utc(job.heartbeat_at) or as_utc(job.started_at)
                enq = as_utc(job.enqueued_at)
                if (beat is None or beat < stale) and (enq is None or enq < stale):
                    out.append(job.id)
        return out


def sweep(engine: Engine, settings: Settings) -> int:
    """Re-send every job that is queued but unsent, or running with a stale heartbeat."""
    sent = 0
    for job_id in jobs_to_resend(engine, settings):
        sent += enqueue(engine, settings, job_id)
    return sent


def job_public(job: Job, dataset_name: str) -> JobPublic:
    plan = PrivacyPlan.model_validate(job.plan)
    return JobPublic(
        id=job.id,
        dataset=dataset_name,
        status=JobStatus(job.status),
        method=plan.method,
        progress_step=job.progress_step,
        progress_total=job.progress_total,
        guarantee=plan.guarantee,
        epsilon=plan.epsilon,
        delta=plan.delta,
        error=job.error,
        created_at=as_utc(job.created_at) or datetime.now(UTC),
        started_at=as_utc(job.started_at),
        finished_at=as_utc(job.finished_at),
        request=job.request,
        plan=plan,
        release_url=f"/v1/jobs/{job.id}/release" if job.status == JobStatus.released else None,
    )
