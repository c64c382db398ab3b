"""Row locks for the ledger's ORM writers, and applying a charge to the locked totals.

Every path that changes a running total (admit, refund, cap creation, budget change)
runs in ONE transaction that first locks the dataset row (PostgreSQL ``SELECT … FOR
UPDATE``; SQLite ``BEGIN IMMEDIATE``, see :mod:`service.db`) and then the analyst's cap
row. Admission takes the same locks with its own Core statements
(:mod:`service.ledger.admission`); the functions here are the ORM's.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ledger.charges import Charge
from service.ledger.tables import AnalystCap, Dataset, Job


def lock_dataset(session: Session, dataset_id: int) -> Dataset:
    return session.scalars(
        select(Dataset)
        .where(Dataset.id == dataset_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()


def lock_cap(session: Session, analyst_id: int, dataset_id: int) -> AnalystCap | None:
    return session.scalars(
        select(AnalystCap)
        .where(AnalystCap.analyst_id == analyst_id, AnalystCap.dataset_id == dataset_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()


def _apply(ds: Dataset, cap: AnalystCap | None, charge: Charge) -> None:
    ds.spent_epsilon_micro += charge.epsilon_micro
    ds.spent_rdp_micro = [a + b for a, b in zip(ds.spent_rdp_micro, charge.rdp_micro, strict=True)]
    if cap is not None:
        cap.spent_epsilon_micro += charge.epsilon_micro
        cap.spent_rdp_micro = [
            a + b for a, b in zip(cap.spent_rdp_micro, charge.rdp_micro, strict=True)
        ]


def lock_job(session: Session, job_id: str) -> Job | None:
    return session.scalars(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()
