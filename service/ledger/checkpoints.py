"""Incremental verification of the ledger from stored checkpoints (issue 26).

The full walk (:func:`service.ledger.audit.verify_all` and
:func:`service.ledger.audit.check_totals`: ``GET /v1/admin/ledger/verify``, ``enclave
ledger verify``/``check`` and the dashboard's "verify the whole chain" page) reads every
entry, so it takes time proportional to the ledger. The dashboard's home page instead
starts from each dataset's latest **checkpoint** (:class:`LedgerCheckpoint`: the last entry
verified, its hash, how many entries the dataset had up to it, and the running totals that
the verification recomputed up to it) and walks only the entries after it, checking for
them what the full walk checks. A checkpoint is written only after a verification of its
dataset that passed (chain and totals); never for one that failed.

What the incremental verification detects:

- any change to an entry after the checkpoint (a broken link or a digest mismatch), an
  entry after it removed or inserted (a broken link), and a head hash on the dataset row
  that does not match the last entry;
- a change to the checkpoint's own entry: its stored hash no longer the checkpoint's, or
  its fields no longer matching its stored hash; the entry gone or moved to another dataset;
- entries before the checkpoint removed or added (their number up to the checkpoint's
  entry is compared with the checkpoint's);
- running totals (the dataset's and its caps') that differ from the checkpoint's totals
  plus the entries after it, and a charge after the checkpoint whose RDP curve is not the
  one re-derived from its event.

What it cannot detect (only the full walk can): a change to an entry *before* the
checkpoint that leaves the number of entries alone: a rewritten amount, event, reason or
timestamp (its digest no longer matches its stored hash), or a rewritten hash (the next
entry's link breaks), as those entries are not read; nor a change to the stored
checkpoints themselves (whoever can write the database can write a checkpoint that
matches a tampered ledger). The checkpoints make the page fast; they are not a proof. Run
the full walk for an audit; it never reads or trusts a checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Engine,
    ForeignKey,
    Integer,
    String,
    Table,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Mapped, Session, mapped_column

from service.db import transaction
from service.ledger.audit import Mismatch
from service.ledger.chain import GENESIS, ChainReport, fields_digest
from service.ledger.charges import _event_charge
from service.ledger.tables import AnalystCap, Base, Dataset, EntryKind, LedgerEntry, utcnow
from service.privacy.orders import ORDERS


class LedgerCheckpoint(Base):
    """A point up to which a dataset's hash chain and running totals were verified
    (migration 0006). ``entry_id``/``entry_hash``: the last entry verified and its hash
    (the chain's head at that point); ``entries``: how many entries the dataset had up to
    and including it; the running totals recomputed from the charges and refunds up to it,
    the dataset's and per analyst (``analyst_totals``: ``{"<analyst id>": [ε, [RDP]]}``,
    micro-units). One row per (dataset, entry): two verifications racing to write the same
    checkpoint leave one row."""

    __tablename__ = "ledger_checkpoints"
    __table_args__ = (
        UniqueConstraint("dataset_id", "entry_id", name="uq_ledger_checkpoints_entry"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    entry_id: Mapped[int] = mapped_column(BigInteger)
    entry_hash: Mapped[str] = mapped_column(String(64))
    entries: Mapped[int] = mapped_column(BigInteger)
    spent_epsilon_micro: Mapped[int] = mapped_column(BigInteger)
    spent_rdp_micro: Mapped[list[int]]
    analyst_totals: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


_ENTRIES = cast(Table, LedgerEntry.__table__)
_CHECKPOINTS = cast(Table, LedgerCheckpoint.__table__)
_COST_KINDS = (EntryKind.charge, EntryKind.refund)


@dataclass(frozen=True)
class IncrementalReport:
    """One dataset's incremental verification. ``chain.entries``: the dataset's entries up
    to the head (or up to the first bad one); ``walked``: how many were read this time;
    ``checkpoint_entry_id``: the checkpoint it started from (None: from the first entry);
    ``saved_entry_id``: the checkpoint this verification wrote (None if none: it failed,
    or nothing was new)."""

    chain: ChainReport
    mismatches: list[Mismatch]
    walked: int
    checkpoint_entry_id: int | None
    checkpoint_at: datetime | None
    saved_entry_id: int | None = None

    @property
    def ok(self) -> bool:
        return self.chain.ok and not self.mismatches


@dataclass
class _Totals:
    epsilon: int = 0
    rdp: list[int] = field(default_factory=lambda: [0] * len(ORDERS))

    def add(self, epsilon: int, rdp: list[int] | None) -> None:
        self.epsilon += epsilon
        self.rdp = [a + b for a, b in zip(self.rdp, rdp or [0] * len(ORDERS), strict=True)]


def latest_checkpoint(session: Session, dataset_id: int) -> LedgerCheckpoint | None:
    return session.scalars(
        select(LedgerCheckpoint)
        .where(LedgerCheckpoint.dataset_id == dataset_id)
        .order_by(LedgerCheckpoint.entry_id.desc())
        .limit(1)
    ).first()


def _rederive(event: dict | None) -> list[int] | None:
    """The RDP curve (micro-units, rounded up) re-derived from a charge's event, as
    :func:`~service.ledger.audit.check_totals` does (cached by the event's JSON); None if
    the event cannot be read."""
    try:
        key = json.dumps(event or {}, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return list(_event_charge(key)[0])
    except (ValueError, TypeError, KeyError):
        return None


def verify_dataset(session: Session, ds: Dataset) -> tuple[IncrementalReport, dict | None]:
    """Verify ``ds`` from its latest checkpoint; returns the report and, if it passed and
    there were entries after the checkpoint, the values of the checkpoint to save (see
    :func:`save_checkpoint`). Reads only; the caller's transaction should be one snapshot."""
    cp = latest_checkpoint(session, ds.id)
    start_id, prev, count = 0, GENESIS, 0
    totals = _Totals()
    per: dict[int, _Totals] = {}
    cp_id = cp.entry_id if cp is not None else None
    cp_at = cp.created_at if cp is not None else None

    def failed(entry_id: int | None, problem: str, n: int) -> tuple[IncrementalReport, None]:
        report = ChainReport(ds.name, n, False, entry_id, problem)
        return IncrementalReport(report, [], n - (cp.entries if cp else 0), cp_id, cp_at), None

    if cp is not None:
        anchor = session.execute(select(_ENTRIES).where(_ENTRIES.c.id == cp.entry_id)).first()
        if anchor is None or anchor.dataset_id != ds.id:
            return failed(cp.entry_id, "checkpoint entry missing", cp.entries)
        if anchor.hash != cp.entry_hash:
            return failed(cp.entry_id, "checkpoint entry's hash changed", cp.entries)
        if fields_digest(dict(anchor._mapping)) != anchor.hash:
            return failed(cp.entry_id, "digest mismatch", cp.entries)
        before = session.scalar(
            select(func.count())
            .select_from(_ENTRIES)
            .where(_ENTRIES.c.dataset_id == ds.id, _ENTRIES.c.id <= cp.entry_id)
        )
        if before != cp.entries:
            return failed(None, "entries before the checkpoint added or removed", cp.entries)
        start_id, prev, count = cp.entry_id, cp.entry_hash, cp.entries
        totals = _Totals(cp.spent_epsilon_micro, list(cp.spent_rdp_micro))
        per = {int(a): _Totals(e, list(r)) for a, (e, r) in cp.analyst_totals.items()}
    mismatches: list[Mismatch] = []
    walked = 0
    last_id = start_id
    rows = session.execute(
        select(_ENTRIES)
        .where(_ENTRIES.c.dataset_id == ds.id, _ENTRIES.c.id > start_id)
        .order_by(_ENTRIES.c.id)
    )
    for row in rows:
        count += 1
        walked += 1
        if row.prev_hash != prev:
            return failed(row.id, "broken link", count)
        if fields_digest(dict(row._mapping)) != row.hash:
            return failed(row.id, "digest mismatch", count)
        prev, last_id = row.hash, row.id
        if row.kind in _COST_KINDS:
            totals.add(row.epsilon_micro, row.rdp_micro)
            if row.analyst_id is not None:
                per.setdefault(row.analyst_id, _Totals()).add(row.epsilon_micro, row.rdp_micro)
        if row.kind == EntryKind.charge:
            again = _rederive(row.event)
            if again != row.rdp_micro:
                mismatches.append(Mismatch(f"entry {row.id}", "rdp_micro", row.rdp_micro, again))
    if prev != ds.head_hash:
        return failed(None, "head hash does not match last entry", count)
    if totals.epsilon != ds.spent_epsilon_micro:
        mismatches.append(
            Mismatch(
                f"dataset {ds.name}", "spent_epsilon_micro", ds.spent_epsilon_micro, totals.epsilon
            )
        )
    if totals.rdp != list(ds.spent_rdp_micro):
        mismatches.append(
            Mismatch(f"dataset {ds.name}", "spent_rdp_micro", ds.spent_rdp_micro, totals.rdp)
        )
    for cap in session.scalars(select(AnalystCap).where(AnalystCap.dataset_id == ds.id)):
        mine = per.get(cap.analyst_id, _Totals())
        where = f"cap analyst={cap.analyst_id} dataset={cap.dataset_id}"
        if mine.epsilon != cap.spent_epsilon_micro:
            mismatches.append(
                Mismatch(where, "spent_epsilon_micro", cap.spent_epsilon_micro, mine.epsilon)
            )
        if mine.rdp != list(cap.spent_rdp_micro):
            mismatches.append(Mismatch(where, "spent_rdp_micro", cap.spent_rdp_micro, mine.rdp))
    report = IncrementalReport(ChainReport(ds.name, count, True), mismatches, walked, cp_id, cp_at)
    if mismatches or walked == 0:
        return report, None
    return report, {
        "dataset_id": ds.id,
        "entry_id": last_id,
        "entry_hash": prev,
        "entries": count,
        "spent_epsilon_micro": totals.epsilon,
        "spent_rdp_micro": totals.rdp,
        "analyst_totals": {str(a): [t.epsilon, t.rdp] for a, t in sorted(per.items())},
        "created_at": utcnow(),
    }


def save_checkpoint(session: Session, values: dict) -> bool:
    """Insert a checkpoint (values from a passed :func:`verify_dataset`); a checkpoint for
    the same (dataset, entry) already there, or being written by a concurrent transaction,
    wins and this insert is ignored (``ON CONFLICT DO NOTHING``). True if inserted."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        stmt: Any = pg_insert(_CHECKPOINTS).values(values).on_conflict_do_nothing()
    elif dialect == "sqlite":
        stmt = sqlite_insert(_CHECKPOINTS).values(values).on_conflict_do_nothing()
    else:  # pragma: no cover - the ledger runs on SQLite or PostgreSQL
        raise NotImplementedError(dialect)
    return session.execute(stmt.returning(_CHECKPOINTS.c.id)).first() is not None


@contextmanager
def _snapshot(engine: Engine) -> Iterator[Session]:
    """One consistent view of the ledger: PostgreSQL's REPEATABLE READ (so an admission
    committing mid-walk cannot make the entries and the head disagree); SQLite's
    transactions are already serialized (BEGIN IMMEDIATE, service.db)."""
    if engine.dialect.name != "postgresql":
        with transaction(engine) as s:
            yield s
        return
    with (
        engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn,
        Session(bind=conn, expire_on_commit=False) as s,
        s.begin(),
    ):
        yield s


def verify_incrementally(engine: Engine) -> list[IncrementalReport]:
    """Every dataset, verified from its latest checkpoint (see the module's docstring for
    what this can and cannot detect); a new checkpoint is saved, in its own transaction,
    for each dataset whose verification passed and had new entries."""
    reports: list[tuple[IncrementalReport, dict | None]] = []
    with _snapshot(engine) as s:
        for ds in s.scalars(select(Dataset).order_by(Dataset.id)):
            reports.append(verify_dataset(s, ds))
    to_save = [values for _, values in reports if values is not None]
    if to_save:
        with transaction(engine) as s:
            for values in to_save:
                save_checkpoint(s, values)
    return [
        replace(r, saved_entry_id=values["entry_id"]) if values is not None else r
        for r, values in reports
    ]
