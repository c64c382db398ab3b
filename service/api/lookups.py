"""Lookups shared by routers: 404s as problems, ownership as one check."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.admin import NotFound, dataset_named
from service.api.deps import Caller
from service.api.errors import ProblemError
from service.ledger.tables import Dataset, Job, Role


def dataset_or_404(s: Session, name: str) -> Dataset:
    try:
        return dataset_named(s, name)
    except NotFound as exc:
        raise ProblemError(404, "not-found", str(exc)) from exc


def visible_job_or_404(s: Session, caller: Caller, job_id: str) -> Job:
    """The caller's own job (or any job for the admin); others' jobs do not exist (404)."""
    job = s.get(Job, job_id) if len(job_id) <= 36 else None
    if job is None or (caller.role != Role.admin and job.analyst_id != caller.id):
        raise ProblemError(404, "not-found", f"no job {job_id!r}")
    return job
