"""Run one job inside the enclave: claim, check the plan, train, release (compare-and-set).

1. Claim (one transaction, job row locked): skip jobs that are finished or running with a
   fresh heartbeat; give up after `max_attempts`; otherwise take a new run token.
2. Recompute the plan from the stored request and public metadata; refuse a plan that
   cannot be reproduced (before any private row is read). The request re-planned is the
   one admitted, its defaults resolved at admission: a default rule changed by an upgrade
   while the job was queued does not fail it, and what the analyst sent must be kept.
3. Open the private rows, mark `data_touched` just before the first read (a failure
   before that, e.g. a missing data file, leaves the charge refundable), run the
   mechanism. A heartbeat thread reports data-independent progress (step k of T) and
   notices when another worker took over.
4. Hold the finished job until its public release time (service/release_hold.py, with
   ENCLAVE_RELEASE_HOLD on): a grid time fixed at the claim from the plan's public time
   estimate, never from the run; the heartbeat goes on, and this worker takes no other job
   meanwhile. A failure after the first row was read is held the same way.
5. Write the release files under the run token, then in one transaction release the job
   only if it is still ours and still running: a duplicate run is never released. The
   job's finished_at is the release time (its grid point under the hold).

What an analyst can see of a failure is a generic sentence; the detail goes to the
enclave's log only. The admin also sees what the runner records on the job row as it goes
(issue 26): the stage reached (JobStage), whether the rows were read (`data_read`, with
`data_touched`) and a failure category from the error's type (:func:`failure_category`).
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import Engine, update
from sqlalchemy.exc import DBAPIError, OperationalError

from service.audit_gate import audit_of_job
from service.config import Settings, get_settings
from service.db import engine_for, transaction
from service.evaluations import (
    evaluation_plan,
    plan_evaluation_job,
    trained_evaluation_plan,
    training_part,
    with_evaluation,
)
from service.jobs import as_utc
from service.ledger.locks import lock_job
from service.ledger.releases import record_release
from service.ledger.tables import Dataset, FailureCategory, Job, JobStage, JobStatus, Release
from service.modelspec import ModelSpec
from service.plans import (
    PlanError,
    check_resolved,
    progress_total,
    replan_admitted,
    resolve_defaults,
)
from service.privacy.amounts import from_micro
from service.release_hold import HoldPolicy, plan_hold_seconds, release_time
from service.releases import release_paths
from service.schemas import JobRequest, PrivacyPlan
from service.selection.api_bodies import ResolvedSelection, plan_selection_job
from worker.data import load_holdout, load_training_set
from worker.device import apply_threads, resolve_device
from worker.evaluation_job import (
    evaluated_model,
    release_json,
    released_module,
    run_evaluation,
)
from worker.mechanisms import registry
from worker.mechanisms.base import MechanismOutput, ProgressFn, TabularTrainingSet
from worker.mechanisms.guards import GuardFailed, finite_release
from worker.release import (
    RELEASE_SPACE_FAILURE,
    ReleaseSpaceError,
    check_release_space,
    model_card,
    release_size_bound,
    sha256_bytes,
    weights_bytes,
    write_release,
)

log = logging.getLogger("enclave.worker")

GENERIC_FAILURE = "the job failed inside the enclave; the admin can see the details"
PLAN_FAILURE = "the job's privacy plan could not be reproduced; it was not run"


class Outcome(enum.StrEnum):
    released = "released"
    skipped = "skipped"
    failed = "failed"
    superseded = "superseded"
    # An infrastructure error (the ledger database unreachable): the job is left running,
    # not failed, and the sweeper sends it again once its heartbeat is stale.
    deferred = "deferred"


def _transient(exc: BaseException) -> bool:
    """Errors of the infrastructure, not of the mechanism: they must not fail a job."""
    return isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)
    )


# Waits between tries of the release transaction (the training is done; ~2 min in all).
RELEASE_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)


class Superseded(Exception):
    """Another worker took this job over (our heartbeat went stale)."""


def failure_category(exc: BaseException, *, data_read: bool) -> FailureCategory:
    """The admin's category of a failure after the plan check, from the error's type and
    whether the rows were read: never from its message or any value it carries (those
    may depend on the rows). A failed plan check is plan_mismatch, whatever the error."""
    if isinstance(exc, GuardFailed):
        return FailureCategory.guard_failed
    if isinstance(exc, ReleaseSpaceError | MemoryError | torch.OutOfMemoryError):
        return FailureCategory.resource_limit
    if isinstance(exc, OSError) and not data_read:
        return FailureCategory.data_unavailable  # no such data file, no permission
    return FailureCategory.internal_error


def hold_policy(settings: Settings) -> HoldPolicy:
    return HoldPolicy(
        factor=settings.release_hold_factor,
        quantum_s=settings.release_hold_quantum_s,
        time_limit_s=settings.job_time_limit_s,
    )


def _claim(engine: Engine, settings: Settings, job_id: str) -> tuple[str, Job, Dataset] | None:
    """Take the job (see the module's step 1). With the release hold on, the claim also
    fixes the public release time ``release_at = started_at + D`` (D from the stored plan
    and the dataset's public schema only)."""
    now = datetime.now(UTC)
    with transaction(engine) as s:
        job = lock_job(s, job_id)
        if job is None or job.status in (JobStatus.released, JobStatus.failed, JobStatus.cancelled):
            return None
        if job.status == JobStatus.running:
            beat = as_utc(job.heartbeat_at) or as_utc(job.started_at)
            if beat is not None and beat > now - timedelta(seconds=settings.heartbeat_timeout_s):
                return None  # someone else is on it
        if job.attempts >= settings.max_attempts:
            job.status = JobStatus.failed
            job.error = GENERIC_FAILURE
            job.failure_category = FailureCategory.worker_lost
            job.finished_at = now
            log.error("job %s: giving up after %d attempts", job_id, job.attempts)
            return None
        token = str(uuid.uuid4())
        job.status = JobStatus.running
        job.attempts += 1
        job.run_token = token
        job.started_at = now
        job.heartbeat_at = now
        job.progress_step = 0
        ds = s.get_one(Dataset, job.dataset_id)
        job.release_at = None
        if settings.release_hold:
            hold_s = plan_hold_seconds(job.plan, ds.public_schema, hold_policy(settings))
            job.release_at = now + timedelta(seconds=hold_s)
        s.flush()  # before the expunge, which would drop the unflushed change
        s.expunge(job)
        s.expunge(ds)
        return token, job, ds


def _finish_failed(
    engine: Engine,
    job_id: str,
    token: str,
    message: str,
    category: FailureCategory,
    finished_at: datetime | None = None,
) -> None:
    with transaction(engine) as s:
        job = lock_job(s, job_id)
        if job is not None and job.run_token == token and job.status == JobStatus.running:
            job.status = JobStatus.failed
            job.error = message
            job.failure_category = category
            job.finished_at = finished_at or datetime.now(UTC)


def _reach(engine: Engine, job_id: str, token: str, stage: JobStage) -> None:
    """Record the stage this run reached (the admin's view); Superseded if the job is no
    longer this run's."""
    with transaction(engine) as s:
        res = s.execute(
            update(Job)
            .where(Job.id == job_id, Job.run_token == token, Job.status == JobStatus.running)
            .values(stage_reached=stage)
        )
        if res.rowcount == 0:  # type: ignore[attr-defined]
            raise Superseded(job_id)


def _mark_data_touched(engine: Engine, job_id: str, token: str) -> None:
    """Record, before the first private row is read, that this job reads private data
    (``data_touched``, which the refunds read, and ``data_read``, the admin's view of it:
    the same update, so they never disagree).

    From here on the job is a round of the ledger's filter (service/privacy/filters.py):
    its charge can no longer be refunded for real. Raises Superseded (and nothing is
    read) if the job is no longer this run's.
    """
    with transaction(engine) as s:
        res = s.execute(
            update(Job)
            .where(Job.id == job_id, Job.run_token == token, Job.status == JobStatus.running)
            .values(data_touched=True, data_read=True)
        )
        if res.rowcount == 0:  # type: ignore[attr-defined]
            raise Superseded(job_id)


def _keep_alive(engine: Engine, job_id: str, token: str) -> None:
    """The heartbeat of a held job (no progress: the run is over); Superseded if the job
    is no longer this run's."""
    with transaction(engine) as s:
        res = s.execute(
            update(Job)
            .where(Job.id == job_id, Job.run_token == token, Job.status == JobStatus.running)
            .values(heartbeat_at=datetime.now(UTC))
        )
        if res.rowcount == 0:  # type: ignore[attr-defined]
            raise Superseded(job_id)


def hold_release(
    engine: Engine, settings: Settings, job: Job, token: str, interval: float
) -> datetime | None:
    """Wait for the job's public release time (service/release_hold.py): the first grid
    point ``started_at + D·2^j`` not before now, D fixed at the claim (``release_at``).
    Returns that time, the job's finished_at, or None where nothing is held (the hold off:
    release now). Meanwhile the heartbeat goes on (a ledger outage is only logged: the
    release retries after), and the worker takes no other job. Superseded if the job stops
    being this run's. The run's exact duration goes to the enclave's log only."""
    started, release_at = as_utc(job.started_at), as_utc(job.release_at)
    if started is None or release_at is None:
        return None
    hold_s = (release_at - started).total_seconds()
    now = datetime.now(UTC)
    target = release_time(started, hold_s, hold_policy(settings).cap_s, now)
    log.info(
        "job %s: the run took %.3f s; held until its release time, %.0f s after its start",
        job.id,
        (now - started).total_seconds(),
        (target - started).total_seconds(),
    )
    while (left := (target - datetime.now(UTC)).total_seconds()) > 0:
        time.sleep(min(left, interval))
        try:
            _keep_alive(engine, job.id, token)
        except DBAPIError as exc:
            if not _transient(exc):
                raise
            log.warning("job %s: heartbeat while held failed (ledger unreachable)", job.id)
    return target


def _set_release_mtime(release_dir: Path, job_id: str, token: str, at: datetime) -> None:
    """Date the release files at the release time, not at the end of writing them: the
    weights are served with Last-Modified and an ETag from their mtime."""
    paths = release_paths(release_dir, job_id, token)
    for path in (paths.weights, paths.card):
        os.utime(path, (at.timestamp(), at.timestamp()))


class Heartbeat:
    """Writes progress and a heartbeat; flags when the job's run token is no longer ours."""

    def __init__(
        self, engine: Engine, job_id: str, token: str, interval: float, *, total: int
    ) -> None:
        self.engine, self.job_id, self.token, self.interval = engine, job_id, token, interval
        # T from the plan (set at admission) until the mechanism reports its own.
        self.step, self.total = 0, total
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def beat(self) -> None:
        with transaction(self.engine) as s:
            res = s.execute(
                update(Job)
                .where(
                    Job.id == self.job_id,
                    Job.run_token == self.token,
                    Job.status == JobStatus.running,
                )
                .values(
                    heartbeat_at=datetime.now(UTC),
                    progress_step=self.step,
                    progress_total=self.total,
                )
            )
            if res.rowcount == 0:  # type: ignore[attr-defined]
                self.lost.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception:
                log.warning("heartbeat failed for job %s", self.job_id, exc_info=True)

    def progress(self, step: int, total: int) -> None:
        """The mechanisms' progress callback: step k of T (data-independent)."""
        self.step, self.total = step, total
        if self.lost.is_set():
            raise Superseded(self.job_id)


def run_mechanism(
    *,
    plan: PrivacyPlan,
    spec: ModelSpec,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    """The plan's mechanism, from the registry (worker/mechanisms/registry.py)."""
    return registry.run_mechanism(plan=plan, spec=spec, data=data, device=device, progress=progress)


def _run_selection(
    selection: ResolvedSelection,
    *,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> tuple[MechanismOutput, dict[str, Any]]:
    """A selection job: the kind's workflow, its selected model's weights (none if the
    random number of runs was 0) and what the card states of the selection."""
    from worker.mechanisms.model_selection import released_summary, run_selection

    out = run_selection(
        selection.request, selection.plan, data=data, device=device, progress=progress
    )
    # The number of trainings stays in the enclave (K is secret under random stopping).
    log.info("selection: %d trainings", out.trainings)
    releases = [] if out.weights is None else [out.weights]
    return MechanismOutput(releases=releases), released_summary(out)


def _evaluated_model(
    engine: Engine, settings: Settings, request: JobRequest, ds: Dataset
) -> torch.nn.Module:
    """The release an evaluation scores (a public input, loaded before the holdout)."""
    from service.datasets.kinds import parse_dataset_schema

    spec = request.evaluation
    assert spec is not None
    return evaluated_model(
        engine,
        settings.resolved_release_dir,
        job_id=str(spec["job_id"]),
        dataset_id=ds.id,
        sample=int(spec["sample"]),
        n_features=parse_dataset_schema(ds.public_schema).n_features,
    )


def _run_evaluation(
    request: JobRequest, ds: Dataset, *, model: torch.nn.Module, holdout: TabularTrainingSet
) -> tuple[MechanismOutput, dict[str, Any]]:
    """An evaluation job (issue 21): the holdout scored by the evaluated model, the noisy
    metrics (worker/mechanisms/evaluation.py) as the card's ``evaluation``; no weights."""
    spec = request.evaluation
    assert spec is not None
    plan = evaluation_plan(request, holdout_rows=ds.holdout_rows, public_schema=ds.public_schema)
    released = run_evaluation(plan=plan, module=model, data=holdout)
    card = release_json(
        released, plan=plan, evaluated_job=str(spec["job_id"]), sample=int(spec["sample"])
    )
    return MechanismOutput(releases=[]), card


def _evaluate_trained(
    request: JobRequest,
    ds: Dataset,
    plan: PrivacyPlan,
    output: MechanismOutput,
    *,
    job_id: str,
    data_dir: Path,
    before_first_read: Callable[[], None],
) -> dict[str, Any]:
    """Train then evaluate: the model this job is about to release (sample
    ``evaluate.sample`` of exactly the weights file it writes) scored on the holdout and
    its statistics noised (worker/mechanisms/evaluation.py), as the card's ``evaluation``.
    The release's guards run first: a non-finite model is never scored."""
    from service.datasets.kinds import parse_dataset_schema

    spec = request.evaluate
    assert spec is not None
    finite_release(output.releases)
    module = released_module(
        weights_bytes(output.releases),
        samples=len(output.releases),
        sample=spec.sample,
        model=plan.model,
        n_features=parse_dataset_schema(ds.public_schema).n_features,
    )
    evaluation = trained_evaluation_plan(
        request, holdout_rows=ds.holdout_rows, public_schema=ds.public_schema
    )
    holdout = load_holdout(
        data_dir, ds.public_schema, torch.device("cpu"), before_first_read=before_first_read
    )
    released = run_evaluation(plan=evaluation, module=module, data=holdout)
    return release_json(released, plan=evaluation, evaluated_job=job_id, sample=spec.sample)


def _admitted_request(
    job_id: str, request: JobRequest, resolved: dict[str, Any] | None, ds: Dataset
) -> JobRequest:
    """What the plan check re-plans: the request with the defaults resolved at admission
    (``Job.resolved_request``), which must keep every value the analyst sent; the request as
    sent where none was stored. A default rule changed since admission (an upgrade) thus
    leaves the admitted plan reproducible; it is logged, and the admitted defaults run."""
    if resolved is None:
        return request
    admitted = JobRequest.model_validate(resolved)
    check_resolved(request, admitted)
    try:
        today = resolve_defaults(request, n_rows=ds.n_rows, public_schema=ds.public_schema)
    except PlanError:
        today = None  # today's rules refuse it (auto's, say): the admitted choice runs
    if today != admitted:
        log.info("job %s: runs the defaults resolved at admission (today's rules differ)", job_id)
    return admitted


def execute_job(job_id: str, settings: Settings | None = None) -> Outcome:
    settings = settings or get_settings()
    engine = engine_for(settings.resolved_database_url)
    claimed = _claim(engine, settings, job_id)
    if claimed is None:
        return Outcome.skipped
    token, job, ds = claimed
    try:
        request = JobRequest.model_validate(job.request)
        stored = PrivacyPlan.model_validate(job.plan)
        admitted = _admitted_request(job_id, request, job.resolved_request, ds)
        selection: ResolvedSelection | None = None
        trained_plan: PrivacyPlan | None = None  # a training's own plan (without evaluation)
        if request.method == "selection":
            selection, plan = plan_selection_job(
                admitted, n_rows=ds.n_rows, public_schema=ds.public_schema
            )
        elif request.method == "evaluation":
            plan = plan_evaluation_job(
                admitted, holdout_rows=ds.holdout_rows, public_schema=ds.public_schema
            )
        else:
            trained_plan = replan_admitted(
                training_part(admitted),
                sent=training_part(request),
                stored=stored,
                n_rows=ds.n_rows,
                public_schema=ds.public_schema,
            )
            # With `evaluate`: the training and the evaluation composed, as admitted.
            plan = with_evaluation(
                trained_plan, admitted, holdout_rows=ds.holdout_rows, public_schema=ds.public_schema
            )
        if plan != stored:
            raise PlanError("stored plan differs from the recomputed plan")
    except Exception:
        log.exception("job %s: plan check failed", job_id)
        _finish_failed(engine, job_id, token, PLAN_FAILURE, FailureCategory.plan_mismatch)
        return Outcome.failed
    # Before any private row is read: a release that cannot be written fails the job now,
    # untouched, so its charge is refunded (refunds.refund_unread_failure), not burned.
    try:
        bound = release_size_bound(plan, ds.public_schema)
        check_release_space(settings.resolved_release_dir, bound)
    except Exception as exc:
        log.exception("job %s: the release folder cannot take this release", job_id)
        category = failure_category(exc, data_read=False)
        _finish_failed(engine, job_id, token, RELEASE_SPACE_FAILURE, category)
        return Outcome.failed
    interval = max(0.2, min(5.0, settings.heartbeat_timeout_s / 4))
    read = False

    def before_first_read() -> None:
        nonlocal read
        _mark_data_touched(engine, job_id, token)
        read = True

    try:
        # The release gate's audit (service/audit_gate), fixed at admission: read now, while
        # nothing is trained, so that a ledger outage at release time meets only the
        # release's own retries (tests/e2e/test_faults.py), never a read that defers the job.
        with transaction(engine) as s:
            gate_audit = audit_of_job(s, job_id)
        _reach(engine, job_id, token, JobStage.planned)
        with Heartbeat(engine, job_id, token, interval, total=progress_total(plan)) as hb:
            apply_threads(settings.worker_threads)
            trains = trained_plan if trained_plan is not None else plan
            device = resolve_device(settings.device, method=trains.method, model=trains.model)
            selected: dict[str, Any] | None = None
            evaluated: dict[str, Any] | None = None
            if request.method == "evaluation":
                model = _evaluated_model(engine, settings, request, ds)
                holdout = load_holdout(
                    settings.resolved_data_dir,
                    ds.public_schema,
                    torch.device("cpu"),
                    before_first_read=before_first_read,
                )
                _reach(engine, job_id, token, JobStage.data_loaded)
                _reach(engine, job_id, token, JobStage.training)
                output, evaluated = _run_evaluation(request, ds, model=model, holdout=holdout)
                hb.progress(1, 1)
            else:
                data = load_training_set(
                    settings.resolved_data_dir,
                    ds.public_schema,
                    device,
                    before_first_read=before_first_read,
                )
                _reach(engine, job_id, token, JobStage.data_loaded)
                _reach(engine, job_id, token, JobStage.training)
                if selection is not None:
                    output, selected = _run_selection(
                        selection, data=data, device=device, progress=hb.progress
                    )
                else:
                    assert trained_plan is not None
                    output = run_mechanism(
                        plan=trained_plan,
                        spec=request.model,
                        data=data,
                        device=device,
                        progress=hb.progress,
                    )
                    if admitted.evaluate is not None:  # train then evaluate (one charge)
                        evaluated = _evaluate_trained(
                            admitted,
                            ds,
                            plan,
                            output,
                            job_id=job_id,
                            data_dir=settings.resolved_data_dir,
                            before_first_read=before_first_read,
                        )
            try:
                hb.beat()  # the last progress; the release below checks ownership anyway
            except DBAPIError as exc:
                if not _transient(exc):
                    raise
                log.warning("job %s: final heartbeat failed (ledger unreachable)", job_id)
        try:
            _reach(engine, job_id, token, JobStage.releasing)
        except DBAPIError as exc:
            # The stage is the admin's view only: a ledger outage here must not cost the
            # trained model, whose release below retries (the release records 'released').
            if not _transient(exc):
                raise
            log.warning("job %s: stage 'releasing' not recorded (ledger unreachable)", job_id)
        # Fail closed before anything is written (worker/mechanisms/guards.py).
        finite_release(output.releases)
        payload = weights_bytes(output.releases)
        digest = sha256_bytes(payload)
        card = model_card(
            job_id=job_id,
            run_token=token,
            plan=plan,
            public_schema=ds.public_schema,
            count_epsilon=(
                None if ds.count_epsilon_micro is None else from_micro(ds.count_epsilon_micro)
            ),
            weights_sha256=digest,
            samples=len(output.releases),
            selection=selected,
            evaluation=evaluated,
            audit=gate_audit,
        )
        if output.enclave_diagnostics:
            log.info("job %s enclave diagnostics: %s", job_id, output.enclave_diagnostics)
        finished_at = hold_release(engine, settings, job, token, interval)
        write_release(settings.resolved_release_dir, job_id, token, payload, card)
        if finished_at is not None:
            _set_release_mtime(settings.resolved_release_dir, job_id, token, finished_at)
    except Superseded:
        log.warning("job %s: superseded by another run; discarding this one", job_id)
        return Outcome.superseded
    except Exception as exc:
        if _transient(exc):
            log.warning("job %s: ledger unreachable; left for the sweeper to resend", job_id)
            return Outcome.deferred
        # The admin reads why in worker.log (a guard names the invariant that failed); the
        # analyst sees the generic message whatever failed (a guard may depend on rows).
        kind = "a privacy guard" if isinstance(exc, GuardFailed) else "an error"
        log.exception("job %s failed on %s", job_id, kind)
        category = failure_category(exc, data_read=read)
        # A failure after the first row was read may depend on the rows (a guard): it is
        # held to the release time like a release. One before it depends on public facts.
        try:
            failed_at = hold_release(engine, settings, job, token, interval) if read else None
        except Superseded:
            log.warning("job %s: superseded while its failure was held", job_id)
            return Outcome.superseded
        _finish_failed(engine, job_id, token, GENERIC_FAILURE, category, failed_at)
        return Outcome.failed
    return _release_with_retries(engine, job_id, token, digest, card, finished_at)


def _release_with_retries(
    engine: Engine,
    job_id: str,
    token: str,
    digest: str,
    card: dict[str, Any],
    finished_at: datetime | None = None,
) -> Outcome:
    """The release transaction, retried while the ledger is unreachable (the model is
    already written under the run token; releasing it is idempotent by compare-and-set).
    ``finished_at``: the release time under the hold (None: now)."""
    for delay in (*RELEASE_RETRY_DELAYS_S, None):
        try:
            return _release(engine, job_id, token, digest, card, finished_at)
        except DBAPIError as exc:
            if not _transient(exc):
                raise
            if delay is None:
                log.error("job %s: ledger unreachable at release; left for the sweeper", job_id)
                return Outcome.deferred
            log.warning("job %s: ledger unreachable at release; retrying in %gs", job_id, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def _release(
    engine: Engine,
    job_id: str,
    token: str,
    digest: str,
    card: dict[str, Any],
    finished_at: datetime | None = None,
) -> Outcome:
    with transaction(engine) as s:
        job = lock_job(s, job_id)
        if job is None or job.run_token != token or job.status != JobStatus.running:
            log.warning("job %s: not ours any more; this run is not released", job_id)
            return Outcome.superseded
        s.add(Release(job_id=job_id, weights_sha256=digest, card=card))
        record_release(s, job=job, weights_sha256=digest)
        job.status = JobStatus.released
        job.stage_reached = JobStage.released
        job.progress_step = job.progress_total = int(job.progress_total or job.progress_step)
        job.finished_at = finished_at or datetime.now(UTC)
    return Outcome.released
