"""Admission: check, then commit, against the dataset's and the analyst's privacy filters.

Every path that changes a running total (admit, refund, cap creation, budget change)
runs in ONE transaction that first locks the dataset row (PostgreSQL ``SELECT … FOR
UPDATE``; SQLite ``BEGIN IMMEDIATE``, see :mod:`service.db`) and then the analyst's cap
row. The evaluation itself (:func:`evaluate`) is a pure function of those rows and the
charge, shared by admission and by quotes, so a quote agrees exactly with what admission
would do on the same state.

Rules (see :mod:`service.privacy.filters` for the proofs):
- δ_total = 0: basic composition of pure mechanisms, Σε ≤ ε_total.
- δ_total > 0: a Rényi-DP filter over the public grid of orders, valid under fully
  adaptive choice of the next request.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal, cast

from sqlalchemy import (
    Connection,
    Select,
    Table,
    bindparam,
    event,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, object_session

from service.ledger.chain import GENESIS, append_entry, chained_row
from service.ledger.tables import (
    Analyst,
    AnalystCap,
    Dataset,
    EntryKind,
    Job,
    JobStatus,
    LedgerEntry,
)
from service.plans import progress_total
from service.privacy.amounts import curve_to_micro_up, from_micro, to_micro_down, to_micro_up
from service.privacy.events import event_from_json
from service.privacy.filters import (
    epsilon_spent,
    max_admissible_pure_epsilon,
    pure_admits,
    rdp_admits,
    rdp_budget_micro,
)
from service.privacy.orders import ORDERS, ORDERS_VERSION
from service.privacy.sampling import count_event
from service.schemas import MCMC_ONLY_FIELDS, BudgetView, Guarantee, JobRequest, PrivacyPlan


class LedgerError(Exception):
    """Base class: a refused ledger operation (a 4xx for the caller, nothing written)."""


class BudgetExceeded(LedgerError):
    def __init__(self, evaluation: Evaluation) -> None:
        super().__init__(evaluation.reason or "budget exceeded")
        self.evaluation = evaluation


class IdempotencyConflict(LedgerError):
    """The Idempotency-Key was used before with a different body."""


class InvalidLedgerOperation(LedgerError):
    pass


class NominalNotAllowed(LedgerError):
    """The dataset does not allow methods whose guarantee is not proven."""


# --------------------------------------------------------------------------- charges


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


# --------------------------------------------------------------------------- filters

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


# --------------------------------------------------------------------------- locking


def lock_dataset(session: Session, dataset_id: int) -> Dataset:
    return session.scalars(
        select(Dataset)
        .where(Dataset.id == dataset_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()


def lock_cap(session: Session, analyst_id: int, dataset_id: int) -> AnalystCap | None:
    return session.scalars(
        select(AnalystCap)
        .where(AnalystCap.analyst_id == analyst_id, AnalystCap.dataset_id == dataset_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()


def _apply(ds: Dataset, cap: AnalystCap | None, charge: Charge) -> None:
    ds.spent_epsilon_micro += charge.epsilon_micro
    ds.spent_rdp_micro = [a + b for a, b in zip(ds.spent_rdp_micro, charge.rdp_micro, strict=True)]
    if cap is not None:
        cap.spent_epsilon_micro += charge.epsilon_micro
        cap.spent_rdp_micro = [
            a + b for a, b in zip(cap.spent_rdp_micro, charge.rdp_micro, strict=True)
        ]


# --------------------------------------------------------------------------- operations


def _zero_cost_entry(
    session: Session,
    ds: Dataset,
    *,
    kind: EntryKind,
    event: dict,
    reason: str | None,
    analyst_id: int | None = None,
    job_id: str | None = None,
) -> LedgerEntry:
    """A chained entry that costs nothing: budget changes and releases."""
    return append_entry(
        session,
        ds,
        LedgerEntry(
            analyst_id=analyst_id,
            job_id=job_id,
            kind=kind,
            event=event,
            epsilon_micro=0,
            rdp_micro=None,
            delta="0",
            reason=reason,
        ),
    )


def _count_charge(epsilon: float) -> Charge:
    event = count_event(epsilon=epsilon)
    return Charge(
        epsilon_micro=to_micro_up(event.epsilon),
        rdp_micro=curve_to_micro_up(event.rdp(ORDERS)),
        delta="0",
        pure=True,
        event=event.to_json(),
    )


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
) -> Dataset:
    """Create a dataset's budget and charge the DP noisy row count released with it.

    ``noisy_n_rows`` is the output of the count mechanism (worker/registration.py); it is
    the only row count anything outside the enclave ever sees, and what plans use. Its
    charge is the first entry after registration, so the dataset's filter includes it.
    """
    refused = count_refusal(
        epsilon_total=epsilon_total, delta_total=delta_total, count_epsilon=count_epsilon
    )
    if refused:
        raise InvalidLedgerOperation(f"the noisy row count does not fit: {refused}")
    ds = Dataset(
        name=name,
        public_schema=public_schema,
        n_rows=noisy_n_rows,
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


# Request fields added after requests were first hashed, with their defaults: a field at its
# default is left out of the digest, so an Idempotency-Key retry of a request sent before the
# field existed still matches its first job.
_LATER_OPTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "dpsgd": {
        "noise_schedule": "constant",
        "noise_decay": None,
        "engine": "exact",
        "jl_projections": None,
    },
    "expm": dict.fromkeys(MCMC_ONLY_FIELDS),
    "expm_nf": {"domain_radius": None},
}
_LATER_TOP_LEVEL_FIELDS = ("expm",)  # options of methods added later, left out when None


def request_digest(request: JobRequest) -> str:
    data = request.model_dump(mode="json")
    for key in _LATER_TOP_LEVEL_FIELDS:
        if data.get(key) is None:
            data.pop(key, None)
    for options, later in _LATER_OPTION_DEFAULTS.items():
        if isinstance(data.get(options), dict):
            for key, default in later.items():
                if data[options].get(key, default) == default:
                    data[options].pop(key, None)
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def find_idempotent(
    session: Session, *, analyst_id: int, key: str, request_hash: str
) -> Job | None:
    job = session.scalars(
        select(Job).where(Job.analyst_id == analyst_id, Job.idempotency_key == key)
    ).one_or_none()
    if job is not None and job.request_hash != request_hash:
        raise IdempotencyConflict("this Idempotency-Key was already used with a different body")
    return job


def nominal_refusal(ds: Dataset, plan: PrivacyPlan) -> str | None:
    """The dataset's policy on guarantees that are not proven (nominal and asymptotic:
    neither covers the run that executes); shared by quotes and admission."""
    if plan.guarantee != "proven" and not ds.allow_nominal:
        return _nominal_reason(ds.name, plan)
    return None


def _nominal_reason(dataset_name: str, plan: PrivacyPlan) -> str:
    return (
        f"dataset {dataset_name!r} does not allow methods with a {plan.guarantee} guarantee "
        "(not proven; the admin decides this per dataset: allow_nominal)"
    )


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
) -> Admitted:
    """Charge the plan and create the queued job, in the caller's transaction.

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
        "status": JobStatus.queued,
        "progress_step": 0,
        "progress_total": progress_total(plan),
        "attempts": 0,
        "data_touched": False,
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


def refund_job(session: Session, *, job: Job, reason: str, override: bool = False) -> LedgerEntry:
    """Append a refund of the job's charge. The caller holds the job row lock.

    Only a job that never read a private row is refunded for real (negative amounts that
    return its charge to both filters). That is sound because the filter's rounds are job
    *starts* (first reads of private rows), not admissions: the argument is in
    :mod:`service.privacy.filters`. A job that did read rows ran a mechanism whose output
    (even a failure) depends on the data; returning its charge could revive an exhausted
    Rényi order and void the guarantee. With ``override`` the admin may still record such
    a refund, but it is **information only**: a zero-cost entry that names the charge and
    the reason, and leaves the filter state (and so every later admission and the stated
    guarantee) untouched. Without ``override`` it is refused.
    """
    if job.data_touched and not override:
        raise InvalidLedgerOperation(
            "the job read private rows: its charge cannot be returned; with an explicit "
            "override the refund is recorded as information only and returns no budget"
        )
    ds = lock_dataset(session, job.dataset_id)
    already = session.scalar(
        select(func.count())
        .select_from(LedgerEntry)
        .where(LedgerEntry.job_id == job.id, LedgerEntry.kind == EntryKind.refund)
    )
    if already:
        raise InvalidLedgerOperation("this job was already refunded")
    charge_entry = session.get(LedgerEntry, job.charge_entry_id)
    if charge_entry is None or charge_entry.rdp_micro is None:
        raise InvalidLedgerOperation("the job has no charge to refund")
    if job.data_touched:
        return append_entry(
            session,
            ds,
            LedgerEntry(
                analyst_id=job.analyst_id,
                job_id=job.id,
                kind=EntryKind.refund,
                event={
                    "refund_of": charge_entry.id,
                    "data_touched": True,
                    "information_only": True,
                    "charge_kept_epsilon": from_micro(charge_entry.epsilon_micro),
                    "charge_kept_delta": charge_entry.delta,
                },
                epsilon_micro=0,
                rdp_micro=None,
                delta="0",
                reason=reason,
            ),
        )
    cap = lock_cap(session, job.analyst_id, ds.id)
    refund = Charge(
        epsilon_micro=charge_entry.epsilon_micro,
        rdp_micro=list(charge_entry.rdp_micro),
        delta=charge_entry.delta,
        pure=True,
        event=charge_entry.event or {},
    ).negated()
    entry = append_entry(
        session,
        ds,
        LedgerEntry(
            analyst_id=job.analyst_id,
            job_id=job.id,
            kind=EntryKind.refund,
            event={"refund_of": charge_entry.id, "data_touched": False},
            epsilon_micro=refund.epsilon_micro,
            rdp_micro=refund.rdp_micro,
            delta=charge_entry.delta,
            reason=reason,
        ),
    )
    _apply(ds, cap, refund)
    return entry


def lock_job(session: Session, job_id: str) -> Job | None:
    return session.scalars(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()


def cancel_job(session: Session, *, job: Job) -> Job:
    """Cancel a queued job; it is refunded because no private row was read."""
    if job.status != JobStatus.queued or job.data_touched:
        raise InvalidLedgerOperation(
            f"only queued jobs can be cancelled (this one is {job.status})"
        )
    job.status = JobStatus.cancelled
    job.finished_at = datetime.now(UTC)
    refund_job(session, job=job, reason="cancelled by the analyst before any private row was read")
    return job


AUTOMATIC_REFUND_REASON = "automatic: the job failed before it read any private row"
_FAILED_JOBS = "enclave.jobs_marked_failed"  # Session.info key: jobs this transaction failed


def refund_unread_failure(session: Session, job: Job) -> LedgerEntry | None:
    """The automatic refund of a failed job that never read a private row (``data_touched``
    is set by the worker, in its own transaction, just before the first read).

    Such a job was never a round of the filter, so its charge goes back to both filters,
    as an admin refund would (:func:`refund_job`), with :data:`AUTOMATIC_REFUND_REASON`.
    Exactly once: :func:`refund_job` checks under the dataset lock that the job has no
    refund yet (an earlier automatic or admin one); then nothing is written. A job that
    read rows is never refunded here (only an admin's information-only override can
    record a refund for it).
    """
    if job.status != JobStatus.failed or job.data_touched or job.charge_entry_id is None:
        return None
    try:
        return refund_job(session, job=job, reason=AUTOMATIC_REFUND_REASON)
    except InvalidLedgerOperation:  # already refunded, or no charge to return
        return None


@event.listens_for(Job.status, "set")
def _note_failure(job: Job, value: object, oldvalue: object, _initiator: object) -> None:
    """Remember, on the session, a job set to ``failed`` (by the worker's failure paths in
    worker/runner.py, or any other ORM write); it is refunded when the transaction commits."""
    if value == JobStatus.failed and oldvalue != JobStatus.failed:
        session = object_session(job)
        if session is not None:
            session.info.setdefault(_FAILED_JOBS, []).append(job)


@event.listens_for(Session, "before_commit")
def _refund_unread_failures(session: Session) -> None:
    """Before the transaction that failed a job commits, refund it if it read no private
    row: in the same transaction as the failure, so the two are written together or not
    at all."""
    for job in session.info.pop(_FAILED_JOBS, []):
        refund_unread_failure(session, job)


@event.listens_for(Session, "after_rollback")
def _forget_failures(session: Session) -> None:
    session.info.pop(_FAILED_JOBS, None)


def record_release(session: Session, *, job: Job, weights_sha256: str) -> LedgerEntry:
    """A release row in the ledger (zero cost: the charge was taken at admission)."""
    ds = lock_dataset(session, job.dataset_id)
    return _zero_cost_entry(
        session,
        ds,
        kind=EntryKind.release,
        event={"weights_sha256": weights_sha256},
        reason=None,
        analyst_id=job.analyst_id,
        job_id=job.id,
    )


def cost_entries(
    session: Session, *, dataset_id: int, analyst_id: int | None = None
) -> list[LedgerEntry]:
    """The charge and refund entries of a dataset (and of one analyst, if given)."""
    stmt = select(LedgerEntry).where(
        LedgerEntry.dataset_id == dataset_id,
        LedgerEntry.kind.in_([EntryKind.charge, EntryKind.refund]),
    )
    if analyst_id is not None:
        stmt = stmt.where(LedgerEntry.analyst_id == analyst_id)
    return list(session.scalars(stmt.order_by(LedgerEntry.id)))


def sum_entries(entries: list[LedgerEntry]) -> tuple[int, list[int]]:
    """(Σ ε, Σ RDP curve) in micro-units: the running totals, recomputed."""
    eps = 0
    rdp = [0] * len(ORDERS)
    for e in entries:
        eps += e.epsilon_micro
        rdp = [a + b for a, b in zip(rdp, e.rdp_micro or [0] * len(ORDERS), strict=True)]
    return eps, rdp


def spent_by(session: Session, *, analyst_id: int, dataset_id: int) -> tuple[int, list[int]]:
    """Recompute an analyst's spending on a dataset from the entries."""
    return sum_entries(cost_entries(session, dataset_id=dataset_id, analyst_id=analyst_id))


def _holds(f: Filter) -> bool:
    """Would this filter, with its current spending, still be within its budget?"""
    if f.rule == "pure":
        return f.spent_epsilon_micro <= f.epsilon_total_micro
    budget = f.budget_rdp_micro()
    return any(s <= b for s, b in zip(f.spent_rdp_micro, budget, strict=True)) or not any(
        f.spent_rdp_micro
    )


def charges_in_force(dataset_id: int) -> Select[LedgerEntry]:
    """The dataset's charge entries whose amount the filter still holds: every charge
    except those of jobs refunded for real (a negative refund entry). Information-only
    refunds (zero amount) leave their charge in force; charges without a job (the noisy
    row count) are always in force."""
    really_refunded = select(LedgerEntry.job_id).where(
        LedgerEntry.dataset_id == dataset_id,
        LedgerEntry.kind == EntryKind.refund,
        LedgerEntry.epsilon_micro < 0,
        LedgerEntry.job_id.is_not(None),
    )
    return select(LedgerEntry).where(
        LedgerEntry.dataset_id == dataset_id,
        LedgerEntry.kind == EntryKind.charge,
        or_(LedgerEntry.job_id.is_(None), LedgerEntry.job_id.not_in(really_refunded)),
    )


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
