"""Charges: what a plan (or the noisy row count) costs, in the ledger's exact units.

A charge is recomputed from the plan's event, never taken from the plan's own curve, and
rounds up (micro-units); the event's curve is cached by its canonical JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import lru_cache

from service.ledger.errors import InvalidLedgerOperation
from service.privacy.amounts import curve_to_micro_up, to_micro_up
from service.privacy.events import event_from_json
from service.privacy.orders import ORDERS
from service.privacy.sampling import count_event
from service.schemas import PrivacyPlan


@dataclass(frozen=True)
class Charge:
    """What a plan costs, in the ledger's exact units (charges round up)."""

    epsilon_micro: int
    rdp_micro: list[int]
    delta: str
    pure: bool
    event: dict

    def negated(self) -> Charge:
        return replace(
            self, epsilon_micro=-self.epsilon_micro, rdp_micro=[-v for v in self.rdp_micro]
        )


def charge_for(plan: PrivacyPlan) -> Charge:
    """The plan's charge: its RDP curve recomputed from its event (never taken from the
    plan's own ``rdp_curve``), in micro-units rounded up."""
    if list(plan.rdp_orders) != list(ORDERS):
        raise InvalidLedgerOperation("the plan was made for another grid of Rényi orders")
    key = json.dumps(plan.event, sort_keys=True, separators=(",", ":"), allow_nan=False)
    rdp_micro, pure = _event_charge(key)
    return Charge(
        epsilon_micro=to_micro_up(plan.epsilon),
        rdp_micro=list(rdp_micro),
        delta=_decimal_str(plan.delta),
        pure=pure,
        event=plan.event,
    )


@lru_cache(maxsize=1024)
def _event_charge(event_json: str) -> tuple[tuple[int, ...], bool]:
    """An event's curve in micro-units and its purity: a pure function of the event's
    canonical JSON, cached because every quote and admission of the same plan shape asks
    for it (0.4 ms of a 2 ms admission, benchmarks/results/ledger_admission.md)."""
    event = event_from_json(json.loads(event_json))
    return tuple(curve_to_micro_up(event.rdp(ORDERS))), event.is_pure


def _decimal_str(x: float) -> str:
    return format(Decimal(repr(float(x))), "f") if x else "0"


def _count_charge(epsilon: float) -> Charge:
    event = count_event(epsilon=epsilon)
    return Charge(
        epsilon_micro=to_micro_up(event.epsilon),
        rdp_micro=curve_to_micro_up(event.rdp(ORDERS)),
        delta="0",
        pure=True,
        event=event.to_json(),
    )
