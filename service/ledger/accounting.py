"""Information for the admin: what each composition rule says about a dataset's spending."""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ledger.admission import dataset_filter
from service.ledger.tables import Dataset, EntryKind, LedgerEntry
from service.privacy.amounts import from_micro
from service.privacy.calibrate import pld_epsilon
from service.privacy.events import DpEvent, event_from_json
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp


class AccountingSummary(BaseModel):
    dataset: str
    rule: str
    epsilon_total: float
    delta_total: float
    charges_in_force: int
    naive_epsilon_sum: float
    rdp_epsilon: float | None
    pld_epsilon: float | None
    remaining_epsilon: float
    note: str


def charged_events(session: Session, dataset: Dataset) -> list[DpEvent]:
    """The events of every charge that has not been refunded."""
    refunded = select(LedgerEntry.job_id).where(
        LedgerEntry.dataset_id == dataset.id, LedgerEntry.kind == EntryKind.refund
    )
    rows = session.scalars(
        select(LedgerEntry).where(
            LedgerEntry.dataset_id == dataset.id,
            LedgerEntry.kind == EntryKind.charge,
            LedgerEntry.job_id.not_in(refunded),
        )
    )
    return [event_from_json(e.event or {}) for e in rows]


def accounting_summary(session: Session, dataset: Dataset) -> AccountingSummary:
    f = dataset_filter(dataset)
    events = charged_events(session, dataset)
    delta = float(Decimal(dataset.delta_total))
    rdp_eps = pld_eps = None
    if delta > 0 and events:
        rdp_eps = epsilon_from_rdp(
            rdp=[from_micro(v) for v in dataset.spent_rdp_micro], orders=ORDERS, delta=delta
        )
        try:
            pld_eps = pld_epsilon(events=events, delta=delta)
        except ValueError:
            pld_eps = None
    return AccountingSummary(
        dataset=dataset.name,
        rule=f.rule,
        epsilon_total=from_micro(f.epsilon_total_micro),
        delta_total=delta,
        charges_in_force=len(events),
        naive_epsilon_sum=from_micro(dataset.spent_epsilon_micro),
        rdp_epsilon=rdp_eps,
        pld_epsilon=pld_eps,
        remaining_epsilon=f.remaining_epsilon(),
        note=(
            "Admission uses only the rule named in `rule`. `rdp_epsilon` is the ε implied by "
            "the RDP totals at δ_total (one fixed conversion, for comparison); `pld_epsilon` "
            "is PLD composition of the same events, tighter but not proven valid when "
            "analysts choose requests adaptively, so it is information only."
        ),
    )
