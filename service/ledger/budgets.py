"""The admin's budget changes: a dataset's budget and an analyst's cap on a dataset.

Lowering either below what has already been spent is refused.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy.orm import Session

from service.ledger.chain import _zero_cost_entry
from service.ledger.charges import _decimal_str
from service.ledger.errors import InvalidLedgerOperation
from service.ledger.filter_view import _holds, cap_filter, dataset_filter
from service.ledger.locks import lock_cap, lock_dataset
from service.ledger.spending import charges_in_force, spent_by
from service.ledger.tables import Analyst, AnalystCap, Dataset, EntryKind, LedgerEntry
from service.privacy.amounts import to_micro_down
from service.privacy.events import event_from_json


def _has_nonpure_charges(session: Session, *, dataset_id: int, analyst_id: int | None) -> bool:
    stmt = charges_in_force(dataset_id)
    if analyst_id is not None:
        stmt = stmt.where(LedgerEntry.analyst_id == analyst_id)
    return any(not event_from_json(e.event or {}).is_pure for e in session.scalars(stmt))


def set_dataset_budget(
    session: Session, *, dataset: Dataset, epsilon_total: float, delta_total: float
) -> Dataset:
    """Set or raise a dataset budget; lowering it below what is spent is refused."""
    ds = lock_dataset(session, dataset.id)
    new = replace(
        dataset_filter(ds),
        epsilon_total_micro=to_micro_down(epsilon_total),
        delta_total=_decimal_str(delta_total),
    )
    if not _holds(new) or (
        new.rule == "pure" and _has_nonpure_charges(session, dataset_id=ds.id, analyst_id=None)
    ):
        raise InvalidLedgerOperation("the new budget is below what has already been spent")
    ds.epsilon_total_micro = new.epsilon_total_micro
    ds.delta_total = new.delta_total
    _zero_cost_entry(
        session,
        ds,
        kind=EntryKind.budget,
        event={
            "action": "set_budget",
            "epsilon_total": epsilon_total,
            "delta_total": new.delta_total,
        },
        reason="budget set by the admin",
    )
    return ds


def set_nominal_policy(session: Session, *, dataset: Dataset, allow_nominal: bool) -> Dataset:
    """Allow or refuse, on a dataset, the methods whose guarantee is not proven (nominal and
    asymptotic ones). Written to the ledger as budget and cap changes are: a zero-cost
    ``budget`` entry in the dataset's hash chain, action ``set_nominal``."""
    ds = lock_dataset(session, dataset.id)
    ds.allow_nominal = allow_nominal
    _zero_cost_entry(
        session,
        ds,
        kind=EntryKind.budget,
        event={"action": "set_nominal", "allow_nominal": allow_nominal},
        reason=f"nominal methods {'allowed' if allow_nominal else 'refused'} by the admin",
    )
    return ds


def set_analyst_cap(
    session: Session, *, analyst: Analyst, dataset: Dataset, epsilon: float, delta: float
) -> AnalystCap:
    """Create or change an analyst's cap on a dataset; below what they spent is refused.

    A new cap starts from the analyst's spending so far, recomputed from the entries.
    """
    ds = lock_dataset(session, dataset.id)
    cap = lock_cap(session, analyst.id, ds.id)
    if cap is None:
        eps, rdp = spent_by(session, analyst_id=analyst.id, dataset_id=ds.id)
        cap = AnalystCap(
            analyst_id=analyst.id,
            dataset_id=ds.id,
            epsilon_cap_micro=0,
            delta_cap="0",
            spent_epsilon_micro=eps,
            spent_rdp_micro=rdp,
        )
        session.add(cap)
    new = replace(
        cap_filter(cap), epsilon_total_micro=to_micro_down(epsilon), delta_total=_decimal_str(delta)
    )
    if not _holds(new) or (
        new.rule == "pure"
        and _has_nonpure_charges(session, dataset_id=ds.id, analyst_id=analyst.id)
    ):
        raise InvalidLedgerOperation("the new cap is below what this analyst has already spent")
    cap.epsilon_cap_micro = new.epsilon_total_micro
    cap.delta_cap = new.delta_total
    _zero_cost_entry(
        session,
        ds,
        kind=EntryKind.budget,
        event={"action": "set_cap", "epsilon": epsilon, "delta": new.delta_total},
        reason="analyst cap set by the admin",
        analyst_id=analyst.id,
    )
    session.flush()
    return cap
