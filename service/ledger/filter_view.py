"""The privacy filters as pure math over the stored running totals.

A :class:`Filter` is the state of one filter (a dataset's budget or an analyst's cap) as
read from its row; :func:`evaluate` decides a charge against both, a pure function of those
rows and the charge, shared by admission and by quotes, so a quote agrees exactly with what
admission would do on the same state.

Rules (see :mod:`service.privacy.filters` for the proofs):
- δ_total = 0: basic composition of pure mechanisms, Σε ≤ ε_total.
- δ_total > 0: a Rényi-DP filter over the public grid of orders, valid under fully
  adaptive choice of the next request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from functools import lru_cache
from typing import Literal

from service.ledger.charges import Charge
from service.ledger.tables import AnalystCap, Dataset
from service.privacy.amounts import from_micro
from service.privacy.filters import (
    epsilon_spent,
    max_admissible_pure_epsilon,
    pure_admits,
    rdp_admits,
    rdp_budget_micro,
)
from service.privacy.orders import ORDERS
from service.schemas import BudgetView, Guarantee

Scope = Literal["dataset", "analyst"]


@dataclass(frozen=True)
class Filter:
    """The state of one privacy filter: a dataset budget or an analyst's cap."""

    scope: Scope
    epsilon_total_micro: int
    delta_total: str
    spent_epsilon_micro: int
    spent_rdp_micro: tuple[int, ...]

    @property
    def rule(self) -> Literal["pure", "rdp"]:
        return "pure" if Decimal(self.delta_total) == 0 else "rdp"

    def budget_rdp_micro(self) -> list[int]:
        return list(_budget(self.epsilon_total_micro, self.delta_total))

    def refusal(self, charge: Charge) -> str | None:
        """None if this filter admits `charge`, else the reason in plain words."""
        who = (
            "the dataset's budget" if self.scope == "dataset" else "your budget cap on this dataset"
        )
        if self.rule == "pure":
            if not charge.pure:
                return (
                    f"{who} allows only pure ε-DP mechanisms (δ_total = 0); "
                    "this request needs δ > 0"
                )
            if not pure_admits(
                spent_micro=self.spent_epsilon_micro,
                charge_micro=charge.epsilon_micro,
                total_micro=self.epsilon_total_micro,
            ):
                return f"{who} is exceeded (basic composition Σε ≤ ε_total)"
            return None
        if not rdp_admits(
            spent_micro=self.spent_rdp_micro,
            charge_micro=charge.rdp_micro,
            budget_micro=self.budget_rdp_micro(),
        ):
            return f"{who} is exceeded (Rényi-DP filter: every order would be exhausted)"
        return None

    def after(self, charge: Charge) -> Filter:
        return replace(
            self,
            spent_epsilon_micro=self.spent_epsilon_micro + charge.epsilon_micro,
            spent_rdp_micro=tuple(
                a + b for a, b in zip(self.spent_rdp_micro, charge.rdp_micro, strict=True)
            ),
        )

    def remaining_epsilon(self) -> float:
        if self.rule == "pure":
            return from_micro(max(0, self.epsilon_total_micro - self.spent_epsilon_micro))
        return _remaining_rdp(self.spent_rdp_micro, tuple(self.budget_rdp_micro()))

    def epsilon_spent(self) -> float:
        """The valid ε spent (nats): Σε under the pure rule, else the smallest budget ε at
        δ_total whose RDP filter would have admitted the spending (filters.epsilon_spent)."""
        if self.rule == "pure":
            return from_micro(self.spent_epsilon_micro)
        return epsilon_spent(
            spent_micro=self.spent_rdp_micro, delta_total=float(Decimal(self.delta_total))
        )

    def view(self, *, guarantee: Guarantee | None = None) -> BudgetView:
        """The filter as the API shows it. ``guarantee`` is the dataset's label, which
        needs the jobs table (service.ledger.accounting.dataset_guarantee); callers that
        have not computed it leave it None."""
        return BudgetView(
            scope=self.scope,
            rule=self.rule,
            epsilon_total=from_micro(self.epsilon_total_micro),
            delta_total=float(Decimal(self.delta_total)),
            spent_epsilon_sum=from_micro(self.spent_epsilon_micro),
            epsilon_spent=self.epsilon_spent(),
            remaining_epsilon=self.remaining_epsilon(),
            guarantee=guarantee,
        )


@lru_cache(maxsize=256)
def _budget(epsilon_total_micro: int, delta_total: str) -> tuple[int, ...]:
    return tuple(
        rdp_budget_micro(
            epsilon_total=from_micro(epsilon_total_micro),
            delta_total=float(Decimal(delta_total)),
            orders=ORDERS,
        )
    )


@lru_cache(maxsize=4096)
def _remaining_rdp(spent: tuple[int, ...], budget: tuple[int, ...]) -> float:
    # A bisection over the filter (tens of curve evaluations): cached, because every
    # quote and dataset listing asks it again for the same ledger state.
    return max_admissible_pure_epsilon(spent_micro=list(spent), budget_micro=list(budget))


def dataset_filter(ds: Dataset) -> Filter:
    return Filter(
        "dataset",
        ds.epsilon_total_micro,
        ds.delta_total,
        ds.spent_epsilon_micro,
        tuple(ds.spent_rdp_micro),
    )


def cap_filter(cap: AnalystCap) -> Filter:
    return Filter(
        "analyst",
        cap.epsilon_cap_micro,
        cap.delta_cap,
        cap.spent_epsilon_micro,
        tuple(cap.spent_rdp_micro),
    )


@dataclass(frozen=True)
class Evaluation:
    admitted: bool
    reason: str | None
    dataset_before: Filter
    dataset_after: Filter | None
    analyst_before: Filter | None
    analyst_after: Filter | None


def evaluate(dataset: Filter, cap: Filter | None, charge: Charge) -> Evaluation:
    """Both filters must pass. Pure function: shared by quotes and admission."""
    reason = dataset.refusal(charge) or (cap.refusal(charge) if cap else None)
    admitted = reason is None
    return Evaluation(
        admitted=admitted,
        reason=reason,
        dataset_before=dataset,
        dataset_after=dataset.after(charge) if admitted else None,
        analyst_before=cap,
        analyst_after=cap.after(charge) if (admitted and cap) else None,
    )


def _holds(f: Filter) -> bool:
    """Would this filter, with its current spending, still be within its budget?"""
    if f.rule == "pure":
        return f.spent_epsilon_micro <= f.epsilon_total_micro
    budget = f.budget_rdp_micro()
    return any(s <= b for s, b in zip(f.spent_rdp_micro, budget, strict=True)) or not any(
        f.spent_rdp_micro
    )
