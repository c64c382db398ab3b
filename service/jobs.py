"""Job bookkeeping outside the enclave: enqueueing, the sweeper, public views.

Accepted work is never lost: a job is committed (and charged) before its message is
sent. If sending fails, or a worker dies mid-run (its heartbeat goes stale), or a
message is lost, the sweeper sends the job again; the worker's claim step makes duplicate
messages harmless. The sweeper does not send again a job whose message is still waiting in
the broker, and backs off where it cannot tell, so a backlog does not grow the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine, or_, select, update

from service.config import Settings
from service.db import transaction
from service.ledger.tables import Job, JobStatus
from service.plans import progress_total
from service.problems import ProblemError
from service.queue import Waiting, send_run_job, waiting_in_broker
from service.release_hold import public_progress
from service.schemas import AdminJob, JobPublic, PrivacyPlan
from service.schemas.stored import unreadable

log = logging.getLogger("enclave.jobs")


def as_utc(ts: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes; everything we store is UTC.
    if ts is not None and ts.tzinfo is None:
        return ts.replace(tzinfo=UTC)
    return ts


def enqueue(engine: Engine, settings: Settings, job_id: str, now: datetime | None = None) -> bool:
    try:
        send_run_job(settings, job_id)
    except Exception:  # broker down: the job stays queued and the sweeper retries
        log.warning("could not enqueue job %s; the sweeper will retry", job_id, exc_info=True)
        return False
    with transaction(engine) as s:
        s.execute(update(Job).where(Job.id == job_id).values(enqueued_at=now or datetime.now(UTC)))
    return True


def recovery_deadline_s(settings: Settings) -> float:
    """Worst case, from a worker's death to its running job being sent again: the last
    heartbeat is at most at the death; the job is stale `heartbeat_timeout_s` after it;
    the sweeper runs every `sweep_interval_s`, so the next sweep is at most that later.
    (An idle worker then takes the message and claims the stale job at once.)"""
    return settings.heartbeat_timeout_s + settings.sweep_interval_s


def backoff_s(settings: Settings, waited_s: float, base_s: float) -> float:
    """Wait before re-sending a job (when the broker cannot tell whether its message is
    still queued) that had been waiting `waited_s` when it was last sent: that same time
    again (so the sends' spacing doubles), at least `base_s`, at most
    `requeue_backoff_max_s`. A job that waits W seconds is thus sent about
    2 + log2(W / base_s) times until the cap, then once per cap."""
    return min(settings.requeue_backoff_max_s, max(base_s, waited_s))


# What the sweeper asks of the broker: which of these jobs have a message waiting
# (service/queue.py, Redis only); None where it cannot tell.
BrokerLook = Callable[[Collection[str]], Waiting | None]


def jobs_to_resend(
    engine: Engine,
    settings: Settings,
    now: datetime | None = None,
    broker: BrokerLook | None = None,
) -> list[str]:
    """Jobs to send again: queued and never sent; queued and sent `requeue_after_s` ago
    without being started; running with a heartbeat older than `heartbeat_timeout_s`.

    Of the last two, a job whose message is still waiting in the broker (``broker``'s
    answer) is not sent again: the message will reach a worker. One the broker has
    lost (a complete look did not find it) is sent again. Where the broker cannot tell,
    the re-sends back off (:func:`backoff_s`), so a long backlog is not sent again and
    again every sweep: this used to turn 880 queued jobs into 5,017 messages in 3.5 min.
    """
    now = now or datetime.now(UTC)
    stale = now - timedelta(seconds=settings.heartbeat_timeout_s)
    requeue = timedelta(seconds=settings.requeue_after_s)
    with transaction(engine) as s:
        rows = s.execute(
            select(
                Job.id,
                Job.status,
                Job.created_at,
                Job.enqueued_at,
                Job.heartbeat_at,
                Job.started_at,
            ).where(or_(Job.status == JobStatus.queued, Job.status == JobStatus.running))
        ).all()
    out: list[str] = []
    # Sent before and now overdue: (job id, last send, when it began to wait, base wait).
    overdue: list[tuple[str, datetime, datetime, float]] = []
    for job_id, status, created, enqueued, heartbeat, started in rows:
        enq = as_utc(enqueued)
        if status == JobStatus.queued:
            if enq is None:  # never sent (the broker was down at submission)
                out.append(job_id)
            elif enq < now - requeue:  # sent a while ago and not started: lost?
                since = as_utc(created) or enq
                overdue.append((job_id, enq, min(since, enq), settings.requeue_after_s))
        else:
            beat = as_utc(heartbeat) or as_utc(started)
            if beat is not None and beat >= stale:
                continue  # alive
            if enq is None or beat is None or enq < beat:
                # Its worker went quiet and nobody sent the job since: send it now.
                if enq is None or enq < stale:
                    out.append(job_id)
            elif enq < stale:  # sent after it went quiet and still not claimed
                overdue.append((job_id, enq, beat, settings.heartbeat_timeout_s))
    if not overdue:
        return out
    look = broker([job_id for job_id, *_ in overdue]) if broker is not None else None
    for job_id, enq, since, base_s in overdue:
        if look is not None and job_id in look.job_ids:
            continue  # its message is waiting in the broker: a worker will get it
        if look is not None and look.complete:
            out.append(job_id)  # the broker lost its message
        elif now - enq >= timedelta(
            seconds=backoff_s(settings, (enq - since).total_seconds(), base_s)
        ):
            out.append(job_id)
    return out


def sweep(
    engine: Engine,
    settings: Settings,
    now: datetime | None = None,
    broker: BrokerLook | None = None,
) -> int:
    """Send again the jobs :func:`jobs_to_resend` names; by default it looks in the
    broker's queue (Redis) for messages still waiting. ``now`` and ``broker`` are for tests
    (an injected clock and broker)."""
    if broker is None:
        broker = partial(waiting_in_broker, settings)
    sent = 0
    for job_id in jobs_to_resend(engine, settings, now, broker):
        sent += enqueue(engine, settings, job_id, now)
    return sent


class UnreadableRecord(ProblemError):
    """A stored record whose JSON fails its documented type (issue 26: tampering, or a
    newer writer's key this model lacks). Logged (a warning: which record, where and why,
    never the values) when raised; an analyst's single-item request gets it as a 409
    problem (not a 5xx: the service works, that record cannot be served), a listing
    leaves the row out (the analyst's) or shows it flagged (the admin's)."""

    def __init__(self, what: str, why: str) -> None:
        log.warning("stored %s fails its type: %s", what, why)
        super().__init__(
            409,
            "unreadable-record",
            f"the stored {what} does not match its documented type and cannot be served; "
            "the service's admin sees it flagged",
        )
        self.why = why


def job_public(job: Job, dataset_name: str, now: datetime | None = None) -> JobPublic:
    """The analyst's view. A job the worker held (``release_at`` set, the release hold of
    service/release_hold.py) shows a progress computed from elapsed wall time against its
    public hold, out of the plan's T, never the run's own step counter (which the admin's
    view keeps); its finished_at is the grid time the worker recorded.
    :class:`UnreadableRecord` where the stored plan or request fails its type."""
    try:
        return _job_public(job, dataset_name, now)
    except ValidationError as exc:
        # The plan's own errors, or the view's (whose locations start at its field).
        why = unreadable("plan" if exc.title == PrivacyPlan.__name__ else "", exc)
        raise UnreadableRecord(f"job {job.id}", why) from exc


def readable_jobs(rows: Iterable[tuple[Job, str]]) -> list[JobPublic]:
    """The analyst's views of ``rows`` (job, dataset name), leaving out (logged, by
    :class:`UnreadableRecord`) a job whose stored JSON fails its type: one such row does
    not fail the whole listing."""
    out: list[JobPublic] = []
    for job, name in rows:
        try:
            out.append(job_public(job, name))
        except UnreadableRecord:
            continue
    return out


def _job_public(job: Job, dataset_name: str, now: datetime | None) -> JobPublic:
    plan = PrivacyPlan.model_validate(job.plan)
    step, total = job.progress_step, job.progress_total
    if job.release_at is not None:
        total = progress_total(plan)
        step = public_progress(
            status=JobStatus(job.status).value,
            started=as_utc(job.started_at),
            release_at=as_utc(job.release_at),
            total=total,
            now=now or datetime.now(UTC),
        )
    return JobPublic(
        id=job.id,
        dataset=dataset_name,
        status=JobStatus(job.status),
        method=plan.method,
        progress_step=step,
        progress_total=total,
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
        release_at=as_utc(job.release_at),
    )


def admin_job(job: Job, dataset_name: str) -> AdminJob:
    """The admin's view of a job: the public view and what the worker recorded of the run
    (never shown to an analyst: it may depend on the private rows). A job whose stored
    JSON fails its type is shown flagged, its values as stored (:func:`flagged_admin_job`)."""
    try:
        public = job_public(job, dataset_name).model_dump()
    except UnreadableRecord as bad:
        return flagged_admin_job(job, dataset_name, bad.why)
    # The run's own step counter (the admin may see how far it got; analysts may not).
    public.update(progress_step=job.progress_step, progress_total=job.progress_total)
    return AdminJob(
        **public,
        stage_reached=job.stage_reached,
        data_read=job.data_read,
        failure_category=job.failure_category,
    )


def flagged_admin_job(job: Job, dataset_name: str, why: str) -> AdminJob:
    """The admin's row of a job whose stored plan or request fails its type: the stored
    JSON as it is (the evidence of tampering, or of a newer writer, is not rewritten), the
    fields read from the plan (method, guarantee, ε, δ) as the plan stores them (null
    where it has none of that JSON type), the run's own counters, and ``unreadable``
    saying what failed."""
    plan = job.plan if isinstance(job.plan, dict) else {}
    return AdminJob.flagged(
        why,
        {
            "id": job.id,
            "dataset": dataset_name,
            "status": JobStatus(job.status),
            "method": _stored(plan, "method", str),
            "progress_step": job.progress_step,
            "progress_total": job.progress_total,
            "guarantee": _stored(plan, "guarantee", str),
            "epsilon": _stored(plan, "epsilon", float),
            "delta": _stored(plan, "delta", float),
            "error": job.error,
            "created_at": as_utc(job.created_at),
            "started_at": as_utc(job.started_at),
            "finished_at": as_utc(job.finished_at),
            "request": job.request,
            "plan": job.plan,
            "release_url": (
                f"/v1/jobs/{job.id}/release" if job.status == JobStatus.released else None
            ),
            "release_at": as_utc(job.release_at),
            "stage_reached": job.stage_reached,
            "data_read": job.data_read,
            "failure_category": job.failure_category,
        },
    )


def _stored(plan: dict[str, Any], key: str, kind: type) -> Any:
    """``plan[key]`` where it is of JSON type ``kind`` (an integer counts as a float),
    else None."""
    value = plan.get(key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return value
    return value if isinstance(value, kind) else None
