"""What has been spent, recomputed from the ledger's entries (the running totals are a
cache of these sums), and which charges the filters still hold."""

from __future__ import annotations

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from service.ledger.tables import EntryKind, LedgerEntry
from service.privacy.orders import ORDERS


def cost_entries(
    session: Session, *, dataset_id: int, analyst_id: int | None = None
) -> list[LedgerEntry]:
    """The charge and refund entries of a dataset (and of one analyst, if given)."""
    stmt = select(LedgerEntry).where(
        LedgerEntry.dataset_id == dataset_id,
        LedgerEntry.kind.in_([EntryKind.charge, EntryKind.refund]),
    )
    if analyst_id is not None:
        stmt = stmt.where(LedgerEntry.analyst_id == analyst_id)
    return list(session.scalars(stmt.order_by(LedgerEntry.id)))


def sum_entries(entries: list[LedgerEntry]) -> tuple[int, list[int]]:
    """(Σ ε, Σ RDP curve) in micro-units: the running totals, recomputed."""
    eps = 0
    rdp = [0] * len(ORDERS)
    for e in entries:
        eps += e.epsilon_micro
        rdp = [a + b for a, b in zip(rdp, e.rdp_micro or [0] * len(ORDERS), strict=True)]
    return eps, rdp


def spent_by(session: Session, *, analyst_id: int, dataset_id: int) -> tuple[int, list[int]]:
    """Recompute an analyst's spending on a dataset from the entries."""
    return sum_entries(cost_entries(session, dataset_id=dataset_id, analyst_id=analyst_id))


def charges_in_force(dataset_id: int) -> Select[LedgerEntry]:
    """The dataset's charge entries whose amount the filter still holds: every charge
    except those of jobs refunded for real (a negative refund entry). Information-only
    refunds (zero amount) leave their charge in force; charges without a job (the noisy
    row count) are always in force."""
    really_refunded = select(LedgerEntry.job_id).where(
        LedgerEntry.dataset_id == dataset_id,
        LedgerEntry.kind == EntryKind.refund,
        LedgerEntry.epsilon_micro < 0,
        LedgerEntry.job_id.is_not(None),
    )
    return select(LedgerEntry).where(
        LedgerEntry.dataset_id == dataset_id,
        LedgerEntry.kind == EntryKind.charge,
        or_(LedgerEntry.job_id.is_(None), LedgerEntry.job_id.not_in(really_refunded)),
    )
