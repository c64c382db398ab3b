"""Lookups shared by routers: 404s as problems, ownership as one check."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.deps import Caller
from service.api.errors import ProblemError
from service.ledger.tables import Analyst, Dataset, Job, Role


def dataset_or_404(s: Session, name: str) -> Dataset:
    ds = s.scalars(select(Dataset).where(Dataset.name == name)).one_or_none()
    if ds is None:
        raise ProblemError(404, "not-found", f"no dataset named {name!r}")
    return ds


def analyst_or_404(s: Session, name: str) -> Analyst:
    a = s.scalars(select(Analyst).where(Analyst.name == name)).one_or_none()
    if a is None:
        raise ProblemError(404, "not-found", f"no analyst named {name!r}")
    return a


def visible_job_or_404(s: Session, caller: Caller, job_id: str) -> Job:
    """The caller's own job (or any job for the admin); others' jobs do not exist (404)."""
    job = s.get(Job, job_id) if len(job_id) <= 36 else None
    if job is None or (caller.role != Role.admin and job.analyst_id != caller.id):
        raise ProblemError(404, "not-found", f"no job {job_id!r}")
    return job
