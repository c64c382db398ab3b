"""The JSON form of a ledger entry's ``event`` (``LedgerEntryPublic.event``), by the entry's
kind, as typed models.

What ``service/ledger/`` writes, and what older versions of it wrote (old rows must still
validate, so a key an older version wrote and the current one no longer writes is an
optional field here, noted as such):

* ``charge``: the charged plan's DP event (:data:`service.schemas.events.DpEventJson`);
  the registration's noisy row count is charged the same way (a ``pure_dp`` event).
* ``budget``: an admin's or the registration's change, discriminated on ``"action"``:
  ``register`` (service/ledger/datasets.py), ``set_budget``, ``set_cap`` and ``set_nominal``
  (service/ledger/budgets.py), ``set_audit_gate`` (service/audit_gate.py).
* ``refund`` (service/ledger/refunds.py): a refund that returned the charge, or an
  information-only refund of a job that had read private rows (it returned nothing).
* ``release`` (service/ledger/releases.py): the released weights' digest.

As for plans and cards (service/schemas/stored.py), these models check and document the
stored JSON; the value served is the stored object itself, byte for byte. Unknown keys are
refused, so a writer that adds a key must add it here (tests/integration/test_ledger_events.py
writes an entry of every kind with the real code and validates it).
Units: ε in nats; δ as the exact decimal string the hash chain holds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationInfo

from service.schemas.events import DpEventJson
from service.vocabulary import EntryKind

__all__ = [
    "LEDGER_EVENTS",
    "BudgetEventJson",
    "InformationOnlyRefundEventJson",
    "LedgerEventDoc",
    "RefundEventJson",
    "RegisterEventJson",
    "ReleaseEventJson",
    "ReturnedRefundEventJson",
    "SetBudgetEventJson",
    "SetCapEventJson",
    "SetNominalEventJson",
    "ledger_event_type",
]

DecimalDelta = Annotated[
    str,
    Field(
        pattern=r"^(0|[0-9]+(\.[0-9]+)?)$",
        description="δ as the exact decimal string of the ledger row (never exponent form).",
    ),
]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegisterEventJson(_Entry):
    """The dataset's registration: its budget and its released (noisy) row count."""

    action: Literal["register"]
    epsilon_total: float = Field(ge=0, description="The dataset's ε budget (nats).")
    delta_total: DecimalDelta
    n_rows: int = Field(
        ge=0,
        description=(
            "The row count the service plans with: a DP noisy count where ``n_rows_is`` "
            "says so (rows written before the noisy count existed hold the exact count)."
        ),
    )
    n_rows_is: str | None = Field(
        default=None, description="What n_rows is (absent on rows written before it existed)."
    )
    count_epsilon: float | None = Field(
        default=None, ge=0, description="ε of the noisy row count (nats), charged next."
    )
    holdout_rows: int | None = Field(
        default=None, ge=0, description="Rows reserved for private evaluation, where any."
    )


class SetBudgetEventJson(_Entry):
    """The admin set or raised the dataset's budget."""

    action: Literal["set_budget"]
    epsilon_total: float = Field(ge=0, description="The new ε budget (nats).")
    delta_total: DecimalDelta


class SetCapEventJson(_Entry):
    """The admin set an analyst's cap on the dataset (the entry's ``analyst_id``)."""

    action: Literal["set_cap"]
    epsilon: float = Field(ge=0, description="The new ε cap (nats).")
    delta: DecimalDelta


class SetNominalEventJson(_Entry):
    """The admin allowed or refused the methods whose guarantee is not proven."""

    action: Literal["set_nominal"]
    allow_nominal: bool


class SetAuditGateEventJson(_Entry):
    """The admin turned a dataset's release gate on (a maximum audit age) or off (null):
    service/audit_gate.py."""

    action: Literal["set_audit_gate"]
    max_age_days: float | None = Field(gt=0, description="Days; null: the gate is off.")


BudgetEventJson = Annotated[
    RegisterEventJson
    | SetBudgetEventJson
    | SetCapEventJson
    | SetNominalEventJson
    | SetAuditGateEventJson,
    Field(discriminator="action"),
]
"""A ``budget`` entry's event, discriminated on ``"action"``."""


class ReturnedRefundEventJson(_Entry):
    """A refund that returned the charge of entry ``refund_of`` (the entry's ε and δ are
    the charge's, negated)."""

    refund_of: int = Field(description="The id of the charge entry refunded.")
    data_touched: bool = Field(
        description=(
            "Whether the job had read private rows (always false in rows written now: "
            "such a job's charge is never returned)."
        )
    )
    outside_guarantee: bool | None = Field(
        default=None,
        description=(
            "Rows written by older versions only: a refund of a job that had read private "
            "rows, which voided the stated guarantee."
        ),
    )


class InformationOnlyRefundEventJson(_Entry):
    """An admin's override refund of a job that had read private rows: recorded with the
    reason, it returned nothing (the entry costs zero)."""

    refund_of: int = Field(description="The id of the charge entry kept.")
    data_touched: Literal[True]
    information_only: Literal[True]
    charge_kept_epsilon: float = Field(ge=0, description="ε of the charge kept (nats).")
    charge_kept_delta: DecimalDelta


RefundEventJson = ReturnedRefundEventJson | InformationOnlyRefundEventJson
"""A ``refund`` entry's event (the two exclude each other: ``information_only``)."""


class ReleaseEventJson(_Entry):
    """A release of the entry's job (zero cost: the charge was taken at admission)."""

    weights_sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the released weights file."
    )


LEDGER_EVENTS: dict[EntryKind, TypeAdapter[Any]] = {
    EntryKind.charge: TypeAdapter(DpEventJson),
    EntryKind.budget: TypeAdapter(BudgetEventJson),
    EntryKind.refund: TypeAdapter(RefundEventJson),
    EntryKind.release: TypeAdapter(ReleaseEventJson),
}
"""The type of a ledger entry's event, by the entry's kind."""

LedgerEventDoc: Any = DpEventJson | BudgetEventJson | RefundEventJson | ReleaseEventJson
"""Every event a ledger entry may hold, as documented (the entry's kind says which)."""


def ledger_event_type(value: Any, info: ValidationInfo) -> TypeAdapter[Any] | None:
    """The type an entry's event must satisfy, by the entry's ``kind`` (validated before
    it); None (any JSON object) where the kind did not validate."""
    kind = info.data.get("kind")
    return LEDGER_EVENTS.get(kind) if isinstance(kind, EntryKind) else None
