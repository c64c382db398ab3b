"""Admission: check, then commit, a job's charge against the dataset's and the analyst's
privacy filters, in the caller's transaction.

Admission locks the dataset row, then the analyst's cap row (the order every writer of a
running total follows, :mod:`service.ledger.locks`), and decides with
:func:`service.ledger.filter_view.evaluate`, the pure function that quotes use too. It is
the hot path, so its statements are SQLAlchemy Core.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Connection, Select, Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from service.ledger.chain import chained_row
from service.ledger.charges import charge_for
from service.ledger.errors import InvalidLedgerOperation, LedgerError, NominalNotAllowed
from service.ledger.filter_view import Evaluation, Filter, evaluate
from service.ledger.idempotency import find_idempotent, request_digest
from service.ledger.nominal import _nominal_reason
from service.ledger.tables import (
    AnalystCap,
    Dataset,
    EntryKind,
    Job,
    JobStage,
    JobStatus,
    LedgerEntry,
)
from service.plans import progress_total
from service.schemas import JobRequest, PrivacyPlan


class BudgetExceeded(LedgerError):
    def __init__(self, evaluation: Evaluation) -> None:
        super().__init__(evaluation.reason or "budget exceeded")
        self.evaluation = evaluation


@dataclass(frozen=True)
class Admitted:
    job: Job  # the new job's values (not attached to the session), or the replayed job
    dataset_name: str
    created: bool  # False when an Idempotency-Key replay returned the first job


# Admission's statements, built once (SQLAlchemy Core: admission is the hot path, and the
# ORM's unit of work cost several times the raw transaction; see
# benchmarks/results/ledger_admission.md). FOR UPDATE is left out on SQLite, whose
# transactions begin with BEGIN IMMEDIATE (service.db).
_DS = cast(Table, Dataset.__table__)
_CAP = cast(Table, AnalystCap.__table__)
_JOBS = cast(Table, Job.__table__)
_ENTRIES = cast(Table, LedgerEntry.__table__)
_LOCK_DATASET = (
    select(
        _DS.c.name,
        _DS.c.allow_nominal,
        _DS.c.epsilon_total_micro,
        _DS.c.delta_total,
        _DS.c.spent_epsilon_micro,
        _DS.c.spent_rdp_micro,
        _DS.c.head_hash,
    )
    .where(_DS.c.id == bindparam("dataset_id"))
    .with_for_update()
)
_LOCK_CAP = (
    select(
        _CAP.c.epsilon_cap_micro,
        _CAP.c.delta_cap,
        _CAP.c.spent_epsilon_micro,
        _CAP.c.spent_rdp_micro,
    )
    .where(
        _CAP.c.analyst_id == bindparam("analyst_id"),
        _CAP.c.dataset_id == bindparam("dataset_id"),
    )
    .with_for_update()
)
_INSERT_ENTRY = insert(_ENTRIES)
_INSERT_JOB = insert(_JOBS)
_UPDATE_DATASET = (
    update(_DS)
    .where(_DS.c.id == bindparam("d_id"))
    .values(
        spent_epsilon_micro=bindparam("d_spent_epsilon_micro"),
        spent_rdp_micro=bindparam("d_spent_rdp_micro", type_=_DS.c.spent_rdp_micro.type),
        head_hash=bindparam("d_head_hash"),
    )
)
_UPDATE_CAP = (
    update(_CAP)
    .where(
        _CAP.c.analyst_id == bindparam("c_analyst_id"),
        _CAP.c.dataset_id == bindparam("c_dataset_id"),
    )
    .values(
        spent_epsilon_micro=bindparam("c_spent_epsilon_micro"),
        spent_rdp_micro=bindparam("c_spent_rdp_micro", type_=_CAP.c.spent_rdp_micro.type),
    )
)
_ENTRY_COLUMNS = [c.name for c in _ENTRIES.c if c.name != "id"]
_JOB_COLUMNS = [c.name for c in _JOBS.c if c.name != "charge_entry_id"]


def _pg_write(*, with_cap: bool) -> Select[Any]:
    """PostgreSQL: the four writes of an admission in ONE statement (data-modifying CTEs:
    the entry, the job that names the entry's id, the dataset's and the cap's new totals),
    so the transaction makes as few round trips as a raw row-lock transaction plus the
    cap's lock. Returns the entry's id."""
    entry = (
        insert(_ENTRIES)
        .values({c: bindparam(f"e_{c}", type_=_ENTRIES.c[c].type) for c in _ENTRY_COLUMNS})
        .returning(_ENTRIES.c.id)
        .cte("entry")
    )
    job = insert(_JOBS).from_select(
        [*_JOB_COLUMNS, "charge_entry_id"],
        select(*(bindparam(f"j_{c}", type_=_JOBS.c[c].type) for c in _JOB_COLUMNS), entry.c.id),
    )
    ctes = [job.cte("job"), _UPDATE_DATASET.cte("totals")]
    if with_cap:
        ctes.append(_UPDATE_CAP.cte("cap_totals"))
    return select(entry.c.id).add_cte(*ctes)


_PG_WRITE = {False: _pg_write(with_cap=False), True: _pg_write(with_cap=True)}


def _write_admission(
    conn: Connection,
    *,
    entry: dict[str, Any],
    job: dict[str, Any],
    totals: dict[str, Any],
    cap_totals: dict[str, Any] | None,
) -> int:
    """Write an admitted charge: the chained entry, the job (its ``charge_entry_id`` set
    to the entry's id, which is returned) and the new running totals. The caller holds the
    dataset's (and cap's) lock. One statement on PostgreSQL; four elsewhere (SQLite has
    no data-modifying CTEs, and its BEGIN IMMEDIATE lock makes round trips cheap)."""
    if conn.dialect.name == "postgresql":
        params = {
            **{f"e_{k}": entry[k] for k in _ENTRY_COLUMNS},
            **{f"j_{k}": job.get(k) for k in _JOB_COLUMNS},
            **totals,
            **(cap_totals or {}),
        }
        return int(conn.execute(_PG_WRITE[cap_totals is not None], params).scalar_one())
    key = conn.execute(_INSERT_ENTRY, entry).inserted_primary_key
    assert key is not None
    entry_id = int(key[0])
    conn.execute(_INSERT_JOB, {**job, "charge_entry_id": entry_id})
    conn.execute(_UPDATE_DATASET, totals)
    if cap_totals is not None:
        conn.execute(_UPDATE_CAP, cap_totals)
    return entry_id


def _lock_rows(conn: Connection, *, dataset_id: int, analyst_id: int) -> tuple[Any, Any]:
    """Lock the dataset's row, then the analyst's cap row (None if there is none), in that
    order, and return their values.

    Two statements: reading the cap in the dataset's statement (a join) was tried and
    overspent under load, because on PostgreSQL a statement that waited for the dataset's
    lock sees the other joined rows as of its start (READ COMMITTED re-checks only the
    locked rows), i.e. a stale cap. The cap's statement takes its snapshot when it starts,
    after the dataset's lock is held. With psycopg both are sent in one pipeline (one
    round trip instead of two: PostgreSQL still runs them one after the other, in order),
    which shortens the time the dataset's lock is held by one round trip and, in a
    threaded API, by one wait for the interpreter lock.
    """
    params = {"dataset_id": dataset_id, "analyst_id": analyst_id}
    if conn.dialect.name != "postgresql" or conn.dialect.driver != "psycopg":
        ds = conn.execute(_LOCK_DATASET, params).one()
        return ds, conn.execute(_LOCK_CAP, params).one_or_none()
    from psycopg.rows import namedtuple_row

    raw = conn.connection.driver_connection
    assert raw is not None
    lock_ds, lock_cap = _pg_lock_sql(conn.dialect)
    with (
        raw.cursor(row_factory=namedtuple_row) as c_ds,
        raw.cursor(row_factory=namedtuple_row) as c_cap,
    ):
        with raw.pipeline():
            c_ds.execute(lock_ds, params)
            c_cap.execute(lock_cap, params)
        ds = c_ds.fetchone()
        cap = c_cap.fetchone()
    if ds is None:
        raise InvalidLedgerOperation(f"no dataset with id {dataset_id}")
    return ds, cap


@lru_cache(maxsize=4)
def _pg_lock_sql(dialect: Any) -> tuple[str, str]:
    """The two locking statements as the psycopg dialect compiles them (named params)."""
    return str(_LOCK_DATASET.compile(dialect=dialect)), str(_LOCK_CAP.compile(dialect=dialect))


def admit_job(
    db: Session | Connection,
    *,
    analyst_id: int,
    dataset_id: int,
    request: JobRequest,
    plan: PrivacyPlan,
    idempotency_key: str | None,
    resolved_request: JobRequest | None = None,
) -> Admitted:
    """Charge the plan and create the queued job, in the caller's transaction.

    ``resolved_request`` is ``request`` with the defaults its plan filled in written out
    (service.plans.resolve_defaults), stored for the worker's plan check; None, or equal to
    ``request``: nothing to resolve (stored NULL). The digest is of ``request`` as sent.

    Raises :class:`BudgetExceeded` (nothing written) when either filter refuses.

    Everything that does not depend on the running totals happens before the dataset's
    lock: the request digest, the charge (the plan's RDP curve in micro-units, from the
    plan computed before the transaction) and the job row's contents. Under the lock: the
    replay check, the nominal policy, the cap's lock, the exact filter decision on the
    locked totals, the chained ledger entry, the job and the new running totals.
    (Writing the job row before the lock was tried: its foreign key takes a KEY SHARE lock
    on the dataset row, and 64 such lockers beside the admission lock made PostgreSQL
    build multixacts and halved throughput.)

    The statements are Core: the same locks, rows and values as the ORM writers (refunds,
    budget changes use them), at a fraction of the cost. ``db`` is the caller's Session
    (ORM objects of the dataset or cap it loaded earlier are expired) or, cheaper still, a
    Core Connection in a transaction (the API's path: an ORM session's own begin/commit
    cost about 0.35 ms of a 1.8 ms admission, benchmarks/results/ledger_admission.md).
    """
    digest = request_digest(request)
    charge = charge_for(plan)
    job_row: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "analyst_id": analyst_id,
        "dataset_id": dataset_id,
        "idempotency_key": idempotency_key,
        "request_hash": digest,
        "request": request.model_dump(mode="json"),
        "plan": plan.model_dump(mode="json"),
        "resolved_request": None
        if resolved_request is None or resolved_request == request
        else resolved_request.model_dump(mode="json"),
        "status": JobStatus.queued,
        "progress_step": 0,
        "progress_total": progress_total(plan),
        "attempts": 0,
        "data_touched": False,
        "stage_reached": JobStage.queued,
        "data_read": False,
        "created_at": datetime.now(UTC),
    }
    conn = db.connection() if isinstance(db, Session) else db
    ds, cap = _lock_rows(conn, dataset_id=dataset_id, analyst_id=analyst_id)
    # Under the lock: a concurrent request with the same key has either committed (we
    # see it) or not started its charge yet (it will see ours and replay it).
    if idempotency_key is not None:
        if isinstance(db, Session):
            existing = find_idempotent(
                db, analyst_id=analyst_id, key=idempotency_key, request_hash=digest
            )
        else:
            with Session(bind=conn, expire_on_commit=False) as lookup:
                existing = find_idempotent(
                    lookup, analyst_id=analyst_id, key=idempotency_key, request_hash=digest
                )
        if existing is not None:
            return Admitted(existing, ds.name, created=False)
    if plan.guarantee != "proven" and not ds.allow_nominal:
        raise NominalNotAllowed(_nominal_reason(ds.name, plan))
    ds_filter = Filter(
        "dataset",
        ds.epsilon_total_micro,
        ds.delta_total,
        ds.spent_epsilon_micro,
        tuple(ds.spent_rdp_micro),
    )
    cap_view = (
        Filter(
            "analyst",
            cap.epsilon_cap_micro,
            cap.delta_cap,
            cap.spent_epsilon_micro,
            tuple(cap.spent_rdp_micro),
        )
        if cap is not None
        else None
    )
    ev = evaluate(ds_filter, cap_view, charge)
    if not ev.admitted:
        raise BudgetExceeded(ev)
    entry = chained_row(
        dataset_id=dataset_id,
        head_hash=ds.head_hash,
        analyst_id=analyst_id,
        job_id=job_row["id"],
        kind=EntryKind.charge,
        event=charge.event,
        epsilon_micro=charge.epsilon_micro,
        rdp_micro=charge.rdp_micro,
        delta=charge.delta,
        reason=None,
    )
    assert ev.dataset_after is not None
    job_row["charge_entry_id"] = _write_admission(
        conn,
        entry=entry,
        job=job_row,
        totals={
            "d_id": dataset_id,
            "d_spent_epsilon_micro": ev.dataset_after.spent_epsilon_micro,
            "d_spent_rdp_micro": list(ev.dataset_after.spent_rdp_micro),
            "d_head_hash": entry["hash"],
        },
        cap_totals=None
        if ev.analyst_after is None
        else {
            "c_analyst_id": analyst_id,
            "c_dataset_id": dataset_id,
            "c_spent_epsilon_micro": ev.analyst_after.spent_epsilon_micro,
            "c_spent_rdp_micro": list(ev.analyst_after.spent_rdp_micro),
        },
    )
    if isinstance(db, Session):
        db.expire_all()
    return Admitted(Job(**job_row), ds.name, created=True)
