"""Re-account the ledger from its entries: the running totals are only a cache."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ledger.chain import ChainReport, verify_chain
from service.ledger.spending import cost_entries, spent_by, sum_entries
from service.ledger.tables import AnalystCap, Dataset, EntryKind
from service.privacy.amounts import curve_to_micro_up
from service.privacy.events import event_from_json
from service.privacy.orders import ORDERS


@dataclass(frozen=True)
class Mismatch:
    where: str
    field: str
    stored: object
    recomputed: object


def check_totals(session: Session) -> list[Mismatch]:
    """Recompute every running total from the entries, and every charge from its event."""
    out: list[Mismatch] = []
    for ds in session.scalars(select(Dataset).order_by(Dataset.id)):
        entries = cost_entries(session, dataset_id=ds.id)
        eps, rdp = sum_entries(entries)
        for e in entries:
            if e.kind == EntryKind.charge:
                # The event is the source of truth: re-derive the charge from it.
                try:
                    again = curve_to_micro_up(event_from_json(e.event or {}).rdp(ORDERS))
                except (KeyError, TypeError, ValueError) as exc:  # no event this code reads
                    out.append(Mismatch(f"entry {e.id}", "event", e.event, f"unreadable: {exc}"))
                    continue
                if again != e.rdp_micro:
                    out.append(Mismatch(f"entry {e.id}", "rdp_micro", e.rdp_micro, again))
        if eps != ds.spent_epsilon_micro:
            out.append(
                Mismatch(f"dataset {ds.name}", "spent_epsilon_micro", ds.spent_epsilon_micro, eps)
            )
        if rdp != list(ds.spent_rdp_micro):
            out.append(Mismatch(f"dataset {ds.name}", "spent_rdp_micro", ds.spent_rdp_micro, rdp))
    for cap in session.scalars(select(AnalystCap)):
        eps, rdp = spent_by(session, analyst_id=cap.analyst_id, dataset_id=cap.dataset_id)
        where = f"cap analyst={cap.analyst_id} dataset={cap.dataset_id}"
        if eps != cap.spent_epsilon_micro:
            out.append(Mismatch(where, "spent_epsilon_micro", cap.spent_epsilon_micro, eps))
        if rdp != list(cap.spent_rdp_micro):
            out.append(Mismatch(where, "spent_rdp_micro", cap.spent_rdp_micro, rdp))
    return out


def verify_all(session: Session) -> list[ChainReport]:
    return [
        verify_chain(session, ds) for ds in session.scalars(select(Dataset).order_by(Dataset.id))
    ]
