"""Thin Celery tasks: ids in, everything else in :mod:`worker.runner`."""

from __future__ import annotations

from service.queue import RUN_AUDIT_TASK, RUN_JOB_TASK
from worker.audit_job import execute_audit
from worker.celery_app import app
from worker.runner import execute_job


@app.task(name=RUN_JOB_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_job(job_id: str) -> str:
    return execute_job(job_id).value


@app.task(name=RUN_AUDIT_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_audit(audit_id: str) -> str:
    """An admin's privacy audit (issue 22): worker/audit_job.py."""
    return execute_audit(audit_id).value
