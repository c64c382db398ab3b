"""A dataset's ledger at registration: its budget and the charge of its noisy row count."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.ledger.chain import GENESIS, _zero_cost_entry, append_entry
from service.ledger.charges import _count_charge, _decimal_str
from service.ledger.errors import InvalidLedgerOperation
from service.ledger.filter_view import Filter
from service.ledger.locks import _apply
from service.ledger.tables import Dataset, EntryKind, LedgerEntry
from service.privacy.amounts import to_micro_down, to_micro_up
from service.privacy.orders import ORDERS, ORDERS_VERSION


def count_refusal(*, epsilon_total: float, delta_total: float, count_epsilon: float) -> str | None:
    """Would a fresh budget (ε_total, δ_total) admit the noisy count's charge? None if so.

    Registration asks this before it reads the CSV, so a budget too small for its own
    row count is refused with nothing read, released or written."""
    fresh = Filter(
        "dataset",
        to_micro_down(epsilon_total),
        _decimal_str(delta_total),
        0,
        tuple([0] * len(ORDERS)),
    )
    return fresh.refusal(_count_charge(count_epsilon))


def new_dataset(
    session: Session,
    *,
    name: str,
    public_schema: dict,
    noisy_n_rows: int,
    count_epsilon: float,
    epsilon_total: float,
    delta_total: float,
    allow_nominal: bool,
    holdout_rows: int | None = None,
) -> Dataset:
    """Create a dataset's budget and charge the DP noisy row count released with it.

    ``noisy_n_rows`` is the output of the count mechanism (worker/registration.py); it is
    the only row count anything outside the enclave ever sees, and what plans use. Its
    charge is the first entry after registration, so the dataset's filter includes it.
    ``holdout_rows`` (a public function of the noisy count, worker/registration.py): the
    evaluation holdout's size n_h; ``noisy_n_rows`` is then the training rows' n̂ − n_h.
    """
    if holdout_rows is not None and holdout_rows < 1:
        raise InvalidLedgerOperation(f"a holdout needs at least one row, got {holdout_rows}")
    refused = count_refusal(
        epsilon_total=epsilon_total, delta_total=delta_total, count_epsilon=count_epsilon
    )
    if refused:
        raise InvalidLedgerOperation(f"the noisy row count does not fit: {refused}")
    ds = Dataset(
        name=name,
        public_schema=public_schema,
        n_rows=noisy_n_rows,
        holdout_rows=holdout_rows,
        count_epsilon_micro=to_micro_up(count_epsilon),
        epsilon_total_micro=to_micro_down(epsilon_total),
        delta_total=_decimal_str(delta_total),
        allow_nominal=allow_nominal,
        orders_version=ORDERS_VERSION,
        spent_epsilon_micro=0,
        spent_rdp_micro=[0] * len(ORDERS),
        head_hash=GENESIS,
    )
    session.add(ds)
    session.flush()
    _zero_cost_entry(
        session,
        ds,
        kind=EntryKind.budget,
        event={
            "action": "register",
            "epsilon_total": epsilon_total,
            "delta_total": ds.delta_total,
            "n_rows": noisy_n_rows,
            "n_rows_is": "DP noisy count (two-sided geometric)",
            "count_epsilon": count_epsilon,
            **({} if holdout_rows is None else {"holdout_rows": holdout_rows}),
        },
        reason="dataset registered",
    )
    charge = _count_charge(count_epsilon)
    append_entry(
        session,
        ds,
        LedgerEntry(
            analyst_id=None,
            job_id=None,
            kind=EntryKind.charge,
            event=charge.event,
            epsilon_micro=charge.epsilon_micro,
            rdp_micro=charge.rdp_micro,
            delta=charge.delta,
            reason="DP noisy row count released at registration",
        ),
    )
    _apply(ds, None, charge)
    return ds
