"""The ledger's vocabularies: roles, job statuses, job stages, failure categories and
ledger entry kinds. Shared by the ORM
tables (service/ledger/tables.py, which store them as strings) and the API's schemas
(service/schemas.py), which therefore need not import the ledger."""

from __future__ import annotations

import enum

__all__ = ["EntryKind", "FailureCategory", "JobStage", "JobStatus", "Role"]


class Role(enum.StrEnum):
    admin = "admin"
    analyst = "analyst"


class JobStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    released = "released"
    failed = "failed"
    cancelled = "cancelled"


class JobStage(enum.StrEnum):
    """The last stage of execute_job (worker/runner.py) a job reached, in order. Written by
    the worker as it goes; admin-only, since how far a job got may depend on its rows."""

    queued = "queued"  # admitted, not yet through the plan check
    planned = "planned"  # the plan re-derived and the release space checked; no row read
    data_loaded = "data_loaded"  # the private rows read and encoded
    training = "training"  # the mechanism running
    releasing = "releasing"  # the mechanism done: the release guards and files
    released = "released"  # the release transaction committed


class FailureCategory(enum.StrEnum):
    """Why a job failed, from the exception's type and the stage (never its message or any
    data value): worker/runner.py's failure_category. Admin-only: a guard can fail because
    of the rows."""

    plan_mismatch = "plan_mismatch"  # the plan could not be re-derived as stored
    resource_limit = "resource_limit"  # release space, memory (host or GPU)
    data_unavailable = "data_unavailable"  # the private file could not be opened
    guard_failed = "guard_failed"  # a privacy guard (worker/mechanisms/guards.py) refused
    worker_lost = "worker_lost"  # the runs kept dying: given up after max_attempts
    internal_error = "internal_error"  # anything else (the detail is in worker.log)


class EntryKind(enum.StrEnum):
    charge = "charge"
    refund = "refund"
    release = "release"
    budget = "budget"
