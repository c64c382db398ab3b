"""Admin bodies and answers: analysts and their keys, budgets and caps, the nominal
policy, refunds, ledger entries and the ledger's verification."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.params import BudgetEpsilon, Delta
from service.schemas.common import ApiInput, ApiOutput
from service.schemas.ledger_events import LedgerEventDoc, ledger_event_type
from service.schemas.stored import Flaggable, Typed, one_of
from service.vocabulary import EntryKind, Role


class AnalystCreate(ApiInput):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"name": "alice", "role": "analyst", "expires_in_days": 90}]
        }
    )

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    role: Literal["analyst", "admin"] = "analyst"
    expires_in_days: float | None = Field(
        default=None, gt=0, le=3650, description="Optional lifetime of the key, in days."
    )


class KeyRotate(ApiInput):
    model_config = ConfigDict(json_schema_extra={"examples": [{"expires_in_days": 30}]})

    expires_in_days: float | None = Field(
        default=None,
        gt=0,
        le=3650,
        description=(
            "Lifetime of the new key, in days. Absent (or null): the new key keeps the "
            "current key's expiry (none if it had none); refused if that has passed."
        ),
    )
    no_expiry: bool = Field(
        default=False,
        description="The new key never expires (not with expires_in_days).",
    )

    @model_validator(mode="after")
    def _one_lifetime(self) -> KeyRotate:
        if self.no_expiry and self.expires_in_days is not None:
            raise ValueError("give expires_in_days or no_expiry, not both")
        return self


class AnalystCreated(BaseModel):
    id: int
    name: str
    role: Role
    api_key: str = Field(description="Shown once; only its hash is stored.")
    expires_at: datetime | None = None


class BudgetUpdate(ApiInput):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"epsilon_total": 10.0, "delta_total": 1e-5}]}
    )

    epsilon_total: BudgetEpsilon
    delta_total: Delta


class CapUpdate(ApiInput):
    model_config = ConfigDict(json_schema_extra={"examples": [{"epsilon": 2.0, "delta": 1e-6}]})

    epsilon: BudgetEpsilon
    delta: Delta


class NominalUpdate(ApiInput):
    """Allow methods whose guarantee is not proven: nominal and asymptotic ones."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"allow_nominal": True}]})

    allow_nominal: bool


class NominalPolicy(BaseModel):
    dataset: str
    allow_nominal: bool = Field(
        description="Whether methods whose ε is nominal (expm_nf) may run on the dataset."
    )


class AuditGateUpdate(ApiInput):
    """Turn a dataset's release gate on (the maximum age, in days, of a passing audit of a
    job's configuration) or off (null). service/audit_gate.py says what matches and passes."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"max_age_days": 30}]})

    max_age_days: float | None = Field(gt=0, le=3650, allow_inf_nan=False)


class AuditGatePolicy(BaseModel):
    dataset: str
    max_age_days: float | None = Field(
        description="Training jobs need an audit of their configuration that passed within "
        "this many days (null: the gate is off). Passing an audit is not a proof."
    )


class RefundRequest(ApiInput):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"reason": "the worker ran out of memory before reading"}]}
    )

    reason: str = Field(min_length=3, max_length=2000)
    override: bool = Field(
        default=False,
        description=(
            "Required to record a refund of a job that had already read private rows. Such a "
            "refund is information only: it is written to the ledger with the reason but "
            "returns no budget, because the job's output (even a failure) depended on the "
            "data. Jobs that never read a private row are refunded for real without it."
        ),
    )


class LedgerEntryPublic(ApiOutput, Flaggable):
    id: int
    dataset: str
    analyst_id: int | None
    job_id: str | None
    kind: EntryKind
    label: str = Field(
        default="",
        description=(
            "How the dashboard and the CLI name the entry: its kind, except 'refund "
            "(information only)' for an admin's override refund of a job that had read "
            "private rows (it returned no budget) and 'budget (nominal policy)' for a switch "
            "of the dataset's nominal policy."
        ),
    )
    event: (
        Annotated[
            dict[str, Any],
            Typed(LedgerEventDoc, pick=ledger_event_type),
            Field(json_schema_extra=one_of),
        ]
        | None
    ) = Field(
        description=(
            "What the entry records, as data (the stored JSON object, byte for byte), by "
            "its kind: a charge, the DP event charged (DpEventJson); a budget entry, the "
            "change (RegisterEventJson, SetBudgetEventJson, SetCapEventJson, "
            "SetNominalEventJson, by `action`); a refund, ReturnedRefundEventJson or "
            "InformationOnlyRefundEventJson; a release, ReleaseEventJson."
        )
    )
    epsilon: float
    delta: float = Field(
        description=(
            "δ of the entry, a number like ε (negative on a refund that returned budget, "
            "as ε). The ledger row keeps δ as the exact decimal string it hashes into the "
            "chain; that string is the shortest repr of the plan's float δ, so this float is "
            "the same value."
        )
    )
    reason: str | None
    created_at: str
    prev_hash: str
    hash: str


class ChainCheck(BaseModel):
    """One dataset's hash chain, walked from its first entry."""

    dataset: str
    entries: int
    ok: bool
    first_bad_entry_id: int | None = None
    problem: str | None = None


class TotalMismatch(BaseModel):
    """A running total (a cache) that differs from what its entries add up to."""

    where: str
    field: str
    stored: Any
    recomputed: Any


class LedgerVerification(BaseModel):
    ok: bool = Field(description="Every chain intact and every running total recomputed.")
    chains: list[ChainCheck]
    mismatches: list[TotalMismatch]
