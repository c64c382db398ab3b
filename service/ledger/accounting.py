"""Information for the admin: what each composition rule says about a dataset's spending,
and the dataset's guarantee label. Plain query functions shared by the API and the dashboard.

Which figures are valid is argued in :mod:`service.privacy.filters`: admission uses only
the dataset's rule; ``epsilon_spent`` is the smallest budget whose filter would have
admitted everything charged so far (valid under adaptive choice in that sense); the PLD
figure composes the same events as if they had been fixed in advance and is information
only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.ledger.filter_view import dataset_filter
from service.ledger.spending import charges_in_force
from service.ledger.tables import Dataset, EntryKind, Job, LedgerEntry
from service.privacy.amounts import from_micro
from service.privacy.calibrate import PldUnavailable, pld_epsilon
from service.privacy.events import DpEvent, event_from_json
from service.schemas import GUARANTEE_ORDER, Guarantee, LedgerEntryPublic, weakest_guarantee
from service.schemas.stored import unreadable

log = logging.getLogger("enclave.ledger")


class AccountingSummary(BaseModel):
    """What each composition rule says about one dataset. ε in nats, δ a probability."""

    dataset: str
    rule: str = Field(description="The admission rule: 'pure' (Σε ≤ ε_total) or 'rdp'.")
    epsilon_total: float
    delta_total: float
    guarantee: Guarantee = Field(
        description=(
            "The weakest guarantee of the jobs that read the dataset's rows: 'nominal' once "
            "a nominal job (ExpM sampled through a normalizing flow) ran, else "
            "'asymptotic' once an asymptotic one (ExpM sampled by MCMC) ran: no proof then "
            "covers the dataset's releases as a whole; 'proven' otherwise."
        )
    )
    charges_in_force: int = Field(
        description=(
            "Charge entries the filter still holds: every charge except those of jobs "
            "refunded for real (jobs that never read a private row). Includes the noisy row "
            "count charged at registration and charges kept by information-only refunds."
        )
    )
    naive_epsilon_sum: float = Field(
        description="Σε of the charges in force: the rule for 'pure', information for 'rdp'."
    )
    epsilon_spent: float = Field(
        description=(
            "The smallest ε such that a budget (ε, δ_total) would have admitted every charge "
            "in force. 'rdp': min over the orders of the RDP → (ε, δ) conversion of the spent "
            "RDP at δ_total/|orders| (the union bound admission pays; the conversion at the "
            "full δ_total with the order picked afterwards is not justified under adaptive "
            "choice). 'pure': Σε. Valid under adaptive choice in the sense that a ledger "
            "given this budget from the start would have run the same jobs; the guarantee "
            "the ledger enforces stays (ε_total, δ_total)."
        )
    )
    pld_epsilon: float | None = Field(
        description=(
            "PLD composition of the same events at δ_total, as if they had been chosen in "
            "advance. INFORMATION ONLY: not proven valid when analysts choose requests "
            "adaptively, never used to admit, and it may be tighter or looser than "
            "epsilon_spent (pure and ExpM events enter as randomized response, without the "
            "bounded-range refinement of their RDP charge). Null (not available) for pure "
            "datasets, when nothing is charged, or when a charge in force has an event type "
            "with no PLD here (random stopping, any-of)."
        )
    )
    remaining_epsilon: float = Field(
        description=(
            "The largest ε of ONE further pure ε-DP request the filter would still admit "
            "('rdp': charged with the randomized-response RDP curve). Below ε_total even "
            "before any charge under 'rdp' (δ_total split over the orders, RDP → (ε, δ) "
            "conversion)."
        )
    )
    note: str


def charged_events(session: Session, dataset: Dataset) -> list[DpEvent]:
    """The events of every charge in force (see :func:`charges_in_force`).

    Information-only refunds (admin overrides of jobs that read private rows) do not remove
    their charge, and charges without a job (the registration's noisy row count) are kept:
    a ``job_id NOT IN (…)`` filter would drop them, as SQL's ``NULL NOT IN (…)`` is not
    true.
    """
    rows = session.scalars(charges_in_force(dataset.id).order_by(LedgerEntry.id))
    return [event_from_json(e.event or {}) for e in rows]


def dataset_guarantee(session: Session, dataset_id: int) -> Guarantee:
    """The weakest guarantee among the jobs that have read private rows of the dataset
    (``data_touched``): 'nominal' once a nominal job ran, else 'asymptotic' once an
    asymptotic one ran, else 'proven'. A release without a proof for its run leaves the
    dataset's transcript without one too, whatever ran since."""
    labels = session.scalars(
        select(Job.plan["guarantee"].as_string())
        .where(
            Job.dataset_id == dataset_id,
            Job.data_touched.is_(True),
            Job.plan["guarantee"].as_string().in_(("asymptotic", "nominal")),
        )
        .distinct()
    ).all()
    return weakest_guarantee(*(label for label in labels if label in GUARANTEE_ORDER))


def accounting_summary(
    session: Session, dataset: Dataset, *, compose_pld: bool = True
) -> AccountingSummary:
    """The dataset's figures. ``compose_pld=False`` leaves ``pld_epsilon`` out (None) and
    counts the charges in force without reading their events: composing every charge by
    PLD takes time proportional to the ledger, too slow for the dashboard's home page on
    a large ledger (issue 26); the dataset's own page and the API compose it."""
    guarantee = dataset_guarantee(session, dataset.id)
    view = dataset_filter(dataset).view(guarantee=guarantee)
    delta = float(Decimal(dataset.delta_total))
    pld_eps: float | None = None
    if not compose_pld:
        in_force = session.scalar(
            select(func.count()).select_from(charges_in_force(dataset.id).subquery())
        )
        events: list[DpEvent] = []
    else:
        events = charged_events(session, dataset)
        in_force = len(events)
    if delta > 0 and events:
        # Information only, never used to admit: an event type without a PLD (random
        # stopping, any-of) makes it "not available". Nothing else is caught: any other
        # error here is a bug and must show.
        try:
            pld_eps = pld_epsilon(events=events, delta=delta)
        except PldUnavailable:
            pld_eps = None
    return AccountingSummary(
        dataset=dataset.name,
        rule=view.rule,
        epsilon_total=view.epsilon_total,
        delta_total=delta,
        guarantee=guarantee,
        charges_in_force=in_force or 0,
        naive_epsilon_sum=view.spent_epsilon_sum,
        epsilon_spent=view.epsilon_spent,
        pld_epsilon=pld_eps,
        remaining_epsilon=view.remaining_epsilon,
        note=(
            "Admission uses only the rule named in `rule`. `epsilon_spent` is the smallest "
            "budget ε at δ_total whose filter would have admitted every charge in force "
            "(valid under adaptive choice in that sense). `pld_epsilon` composes the same "
            "events by PLD as if they had been fixed in advance: information only, not valid "
            "under adaptive choice, and it may be tighter or looser than `epsilon_spent`; null "
            "where a charge's event type has no PLD. "
            "`remaining_epsilon` is the largest ε of one further pure ε-DP request the filter "
            "would admit; under the RDP rule it is below ε_total even before any charge."
        ),
    )


def refund_is_information_only(event: dict[str, Any] | None) -> bool:
    """Whether a refund entry's event marks it information only: an admin's override for a
    job that had read private rows, which returns no budget (service/ledger/refunds.py)."""
    return bool((event or {}).get("information_only"))


def entry_label(kind: EntryKind, event: dict[str, Any] | None) -> str:
    """How every view names an entry: its kind, except an information-only refund (which
    returned nothing, unlike a refund) and a nominal-policy switch (a ``budget`` entry)."""
    if kind == EntryKind.refund and refund_is_information_only(event):
        return "refund (information only)"
    if kind == EntryKind.budget and (event or {}).get("action") == "set_nominal":
        return "budget (nominal policy)"
    return kind.value


def ledger_entry_public(entry: LedgerEntry, dataset_name: str) -> LedgerEntryPublic:
    """An entry as the admin's views show it. An entry whose stored event fails its type
    (tampering, or a newer writer) is shown flagged, its event as stored (the hash chain
    covers it: ``GET /v1/admin/ledger/verify`` tells which), and logged; one such entry
    does not fail a listing."""
    kind = EntryKind(entry.kind)
    values: dict[str, Any] = {
        "id": entry.id,
        "dataset": dataset_name,
        "analyst_id": entry.analyst_id,
        "job_id": entry.job_id,
        "kind": kind,
        "event": entry.event,
        "epsilon": from_micro(entry.epsilon_micro),
        "delta": float(entry.delta),
        "reason": entry.reason,
        "created_at": entry.created_at,
        "prev_hash": entry.prev_hash,
        "hash": entry.hash,
    }
    try:
        return LedgerEntryPublic(label=entry_label(kind, entry.event), **values)
    except (ValidationError, AttributeError) as exc:  # AttributeError: an event not an object
        why = (
            unreadable("event", exc) if isinstance(exc, ValidationError) else "event: not an object"
        )
        log.warning("stored ledger entry %s fails its type: %s", entry.id, why)
        return LedgerEntryPublic.flagged(why, {**values, "label": kind.value})


@dataclass(frozen=True)
class SpendingPoint:
    """The dataset's valid ε spent (nats, as ``epsilon_spent`` above) just after one ledger
    entry: a charge, a refund or a release (which costs nothing: it marks when a charged
    job's output left the enclave)."""

    entry_id: int
    at: datetime
    kind: EntryKind
    job_id: str | None
    epsilon_spent: float


def spending_over_time(session: Session, dataset: Dataset) -> list[SpendingPoint]:
    """The dataset's ε spent after each charge, refund and release, in ledger order.

    The running totals are re-added from the entries (as ``enclave ledger check`` does), so
    the last point equals the figure the filter holds now; each point is evaluated by the
    same rule as admission (:meth:`Filter.epsilon_spent`) against the current δ_total.
    """
    rows = session.scalars(
        select(LedgerEntry)
        .where(
            LedgerEntry.dataset_id == dataset.id,
            LedgerEntry.kind.in_([EntryKind.charge, EntryKind.refund, EntryKind.release]),
        )
        .order_by(LedgerEntry.id)
    )
    base = dataset_filter(dataset)
    eps, rdp = 0, [0] * len(dataset.spent_rdp_micro)
    points = []
    for e in rows:
        eps += e.epsilon_micro
        rdp = [a + b for a, b in zip(rdp, e.rdp_micro or [0] * len(rdp), strict=True)]
        running = replace(base, spent_epsilon_micro=eps, spent_rdp_micro=tuple(rdp))
        points.append(
            SpendingPoint(
                entry_id=e.id,
                at=datetime.fromisoformat(e.created_at),
                kind=EntryKind(e.kind),
                job_id=e.job_id,
                epsilon_spent=running.epsilon_spent(),
            )
        )
    return points
