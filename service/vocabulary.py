"""The ledger's vocabularies: roles, job statuses and ledger entry kinds. Shared by the ORM
tables (service/ledger/tables.py, which store them as strings) and the API's schemas
(service/schemas.py), which therefore need not import the ledger."""

from __future__ import annotations

import enum

__all__ = ["EntryKind", "JobStatus", "Role"]


class Role(enum.StrEnum):
    admin = "admin"
    analyst = "analyst"


class JobStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    released = "released"
    failed = "failed"
    cancelled = "cancelled"


class EntryKind(enum.StrEnum):
    charge = "charge"
    refund = "refund"
    release = "release"
    budget = "budget"
