"""The release gate (issue 22, point 2): per dataset, training jobs only with a recent
passing audit of their configuration.

When the admin turns the gate on for a dataset (a maximum audit age in days), a training
job on it (quote and submission) is refused at planning, with a 422 that charges nothing,
unless an audit (service/audits.py) of the same configuration passed within that age:

* same configuration: the plan's method, the model family (``model.kind``) and its
  architecture (the model spec as a request states it: an MLP's hidden widths and
  activation, GRU-D's hidden size, a CNN's convolutions and norm; less ``classes`` and
  ``image``, which the service fills in from a dataset's schema, so they are the audited
  public dataset's on one side and the job's on the other: an audit of a width-8 MLP
  covers no width-256 MLP job), the data's classes and, on an image dataset, the images'
  shape (below), the DP-SGD engine and noise schedule, and the sampler
  (``mechanism.sampler``; DP-SGD has one, its Poisson sampler; ExpM is audited with the
  sampler its ``expm`` options name, Langevin by default; a job of ExpM's HMC sampler has
  no σ, so no audit covers it), with the job's noise multiplier σ at least the audited
  one (ExpM+NF, which has none: the job's ε at most the audited claim). Why σ ≥:
  a Gaussian step with noise σ' ≥ σ at the same clip norm is the step with noise σ
  followed by independent N(0, σ'² − σ²) noise, i.e. post-processing of it, so per step
  the job's mechanism is no less private than the one audited. The sampling rate and the
  number of steps may differ, so this is a statement about the code path at a noise
  level no lower than the audited one, not a transfer of the audit's figure to the job.
* same data shape: the same number of classes K on both sides (the audit's from its
  bundled dataset's public schema, the job's from its dataset's), and where the job's
  dataset or the audit's is an image dataset, both are, with the same height, width and
  channels. The model spec leaves both out (``image`` and ``classes`` are filled in from
  the schema), yet they make the network. Classes, on every kind of dataset: K = 2 is a
  sigmoid head scored by the logistic loss, K ≥ 3 a softmax head of K logits (another
  code path: a binary Adult logistic audit ran no multinomial step, nor a binary ICU
  GRU-D audit a K-class one), and K sets the head's parameter count; requiring equality
  is the narrow reading the gate can defend (an audit of the code path that ran), not a
  claim that K changes the privacy of a step. The bundled tabular datasets have K = 2
  (Adult), 3 (wine), 10 (digits-table, the digits as 64 columns) and 3 to 9 (its views
  digits-table-k3 … -k9, the rows of its first K digits: service/audits.py's
  DIGITS_TABLE_VIEWS), the bundled time series K = 2 (the ICU sample) and 3 (icu3, its
  stays with a 3-class outcome), so an audit opens the gate of a dataset of those K only:
  a tabular dataset of K ≥ 11, or a time series of K ≥ 4, has no audit that opens it (its
  jobs are refused while the gate is on).
  Images: a CNN's convolutions run over maps of the image's size, its head's fan-in is
  the last map's size, so the same ``conv`` layers on 28 × 28 or 3-channel images are
  another network (another parameter count, other per-row gradient sizes in the exact
  engine's fixed-point sums) than on the digits' 8 × 8; a logistic regression or MLP on
  the flattened pixels is held to the same rule on that kind (one rule per kind).
  The encoded width of a tabular or time-series dataset (its one-hot encoded columns,
  its variables) is not compared, though it sets the first layer's fan-in, hence the
  parameter count, as an image's size does. An audit runs only on a bundled public
  dataset (service/audits.py refuses registered ones: the audit's figure would be an
  uncharged statistic of their private rows), so a gate requiring the same width could
  be opened only for data of exactly a bundled set's width (Adult's 104 encoded columns,
  wine's 13, digits-table's 64, the ICU samples' 8 variables): for every other
  registered dataset it would refuse all jobs, whatever was audited. Not comparing it
  stays sound for what the gate claims: DP-SGD clips each row's whole gradient to norm C
  and adds N(0, σ²C²I), whose guarantee is a function of the sampling rate and σ alone,
  whatever the dimension (the sampled Gaussian mechanism's Rényi DP, Mironov, Talwar &
  Zhang 2019, arXiv:1908.10530: a row enters only through the L2 sensitivity C), and
  the width changes no step of the audited
  mechanism, only the length of the vectors it runs over, as the row count and sampling
  rate (which may differ, above) change only how often it runs. ExpM's row-norm bound B
  is computed from each side's schema by the same function, and its exact row sums
  group the one-hot blocks by the schema's block lengths (worker/mechanisms/langevin.py,
  ``_block_groups``: the same exact integers in any grouping). What the audit does not
  cover is a fault that shows only at the job's width (say an overflow of a wider sum);
  the card's reading already says a pass is not a proof.
* passed: the audit is done and its ε lower bound is at most the ε its configuration
  claimed. Passing is not a proof: the one-run audit can only ever show a violation (and
  never more than its ceiling); a pass means this test found none.
* within the age: the audit finished at most ``max_age_days`` days before the quote.
* one-run audits only: a LiRA audit (``attack: "lira"``) trains on a small public pool,
  so its plans' σ is not the σ of a job on the dataset's rows; it opens no gate.

The gate is read at planning (service/api/routes/jobs.py). Where it was on, admission
reads it again under the dataset's lock (one more statement), so a gate shortened or
turned off and on between the two refuses a job whose audit no longer passes. Where it
was off, admission does not read it (no cost on the common path; on PostgreSQL a
statement under the lock is a round trip, ~1 ms at load ~4, measured with Core): a job
planned before the gate was turned on is admitted as if it had come first (the window is
its planning time). The admitted job names its audit (table ``job_audits``), and
the worker's card names it (id, bound, ceiling, finished_at). Changing the gate takes the
dataset's lock and writes a zero-cost ``budget`` entry (action ``set_audit_gate``) to the
ledger, as budget changes do. Tables: migration 0011. Selections are refused while the
gate is on: a selection trains many configurations, which no single audit covers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Float,
    ForeignKey,
    String,
    Table,
    bindparam,
    insert,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from service.audits import Audit, public_schema
from service.datasets.images import ImageSchema
from service.datasets.kinds import DatasetSchema, parse_dataset_schema
from service.jobs import as_utc
from service.ledger.chain import _zero_cost_entry
from service.ledger.locks import lock_dataset
from service.ledger.tables import Base, Dataset, EntryKind, utcnow
from service.modelspec import MODEL_SPEC
from service.schemas import JobRequest, PrivacyPlan
from service.schemas.audits import READING
from service.schemas.expm import ExpmOptions

__all__ = [
    "MAX_GATE_DAYS",
    "SELECTIONS_GATED",
    "AuditGate",
    "GateCheck",
    "JobAudit",
    "audit_of_job",
    "check_gate",
    "gate_days",
    "recheck_under_lock",
    "record_job_audit",
    "set_audit_gate",
]

SELECTIONS_GATED = (
    "this dataset's release gate is on: selections are refused while it is, since a "
    "selection trains many configurations and no single audit covers them"
)
MAX_GATE_DAYS = 3650.0
"""The longest audit age a gate may state (ten years)."""


class AuditGate(Base):
    """A dataset's gate: on while a row exists, with the maximum audit age in days."""

    __tablename__ = "audit_gates"

    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), primary_key=True)
    max_age_days: Mapped[float] = mapped_column(Float)
    set_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobAudit(Base):
    """The audit that let a gated job through (at most one per job)."""

    __tablename__ = "job_audits"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    audit_id: Mapped[str] = mapped_column(String(36), ForeignKey("audits.id"))


_GATES = cast(Table, AuditGate.__table__)
_GATE_DAYS = select(_GATES.c.max_age_days).where(_GATES.c.dataset_id == bindparam("dataset_id"))
"""Built once, Core: admission runs it on its connection (service/ledger/admission.py's
reasons for Core on the hot path apply)."""


@dataclass(frozen=True)
class GateCheck:
    """What planning found: the gate as read (None: off) and the audit that passes it."""

    max_age_days: float | None
    audit_id: str | None = None
    finished_at: datetime | None = None


def gate_days(db: Session | Connection, dataset_id: int) -> float | None:
    """The dataset's maximum audit age in days, or None (gate off). Core: admission calls
    it on its connection, under the dataset's lock."""
    value = db.execute(_GATE_DAYS, {"dataset_id": dataset_id}).scalar_one_or_none()
    return None if value is None else float(value)


def set_audit_gate(s: Session, *, dataset: Dataset, max_age_days: float | None) -> Dataset:
    """Turn the gate on (a maximum age in days, in (0, MAX_GATE_DAYS]) or off (None).
    Written to the ledger as budget changes are: a zero-cost ``budget`` entry in the
    dataset's hash chain, action ``set_audit_gate``."""
    if max_age_days is not None and not 0 < max_age_days <= MAX_GATE_DAYS:
        raise ValueError(f"max_age_days must be in (0, {MAX_GATE_DAYS:g}]")
    ds = lock_dataset(s, dataset.id)
    gate = s.get(AuditGate, ds.id)
    if max_age_days is None:
        if gate is not None:
            s.delete(gate)
    elif gate is None:
        s.add(AuditGate(dataset_id=ds.id, max_age_days=max_age_days, set_at=datetime.now(UTC)))
    else:
        gate.max_age_days = max_age_days
        gate.set_at = datetime.now(UTC)
    _zero_cost_entry(
        s,
        ds,
        kind=EntryKind.budget,
        event={"action": "set_audit_gate", "max_age_days": max_age_days},
        reason="audit gate "
        + ("off" if max_age_days is None else f"on: audits within {max_age_days:g} days")
        + ", set by the admin",
    )
    s.flush()
    return ds


DATASET_FILLED = frozenset({"classes", "image"})
"""Model spec fields the service fills in from a dataset's schema (service/modelspec.py):
not part of the architecture an audit and a job must share (module text)."""


def _architecture(model: dict[str, Any]) -> str | None:
    """The model's architecture as a canonical string (None: nothing beyond its kind, as
    logistic regression): the spec validated as a request's model is (so a stored audit's
    dict gains the defaults of fields it predates), dumped, less its kind and
    :data:`DATASET_FILLED`."""
    spec = MODEL_SPEC.validate_python(model).model_dump(mode="json")
    shape = {k: v for k, v in spec.items() if k != "kind" and k not in DATASET_FILLED}
    return json.dumps(shape, sort_keys=True, separators=(",", ":")) if shape else None


def _data(schema: DatasetSchema) -> str:
    """The dataset's shape as the gate compares it (module text), in words for its
    refusal: its classes K, and an image dataset's height, width and channels."""
    if isinstance(schema, ImageSchema):
        return (
            f"{schema.height}×{schema.width} with {schema.channels} channel(s), "
            f"{schema.n_classes} classes"
        )
    return f"{schema.n_classes} classes"


def _configuration(request: JobRequest, plan: PrivacyPlan, data: str) -> dict[str, Any]:
    """The keys an audit must share with the job (method, model family and architecture,
    the data's classes and image shape, engine, noise schedule, sampler)."""
    options = request.dpsgd
    return {
        "method": plan.method,
        "model": request.model.kind,
        "architecture": _architecture(request.model.model_dump(mode="json")),
        "data": data,
        "engine": options.engine if options is not None else "exact",
        "noise_schedule": options.noise_schedule if options is not None else "constant",
        "sampler": plan.mechanism.get("sampler"),
    }


def _audit_configuration(audit: Any) -> dict[str, Any]:
    request = audit.request
    options = request.get("dpsgd") or {}
    return {
        "method": request["method"],
        "model": request["model"]["kind"],
        "architecture": _architecture(request["model"]),
        "data": _data(public_schema(request["dataset"])),
        "engine": options.get("engine", "exact"),
        "noise_schedule": options.get("noise_schedule", "constant"),
        # The sampler the audit ran, named as a job's plan names it: ExpM's options' (its
        # default, Langevin, when the audit gave none); DP-SGD's Poisson sampler and
        # ExpM+NF's flow are not named in plans (None on both sides).
        "sampler": (
            (request.get("expm") or {}).get("sampler", _EXPM_DEFAULT_SAMPLER)
            if request["method"] == "expm"
            else None
        ),
    }


_EXPM_DEFAULT_SAMPLER = ExpmOptions.model_fields["sampler"].default


def _sigma(values: dict[str, Any] | None) -> float | None:
    value = (values or {}).get("noise_multiplier")
    return None if value is None else float(value)


def _covered(plan: PrivacyPlan, audit: Any) -> bool:
    """Whether the job runs the audited code path at a privacy level no weaker than the
    audit's: a noise multiplier at least the audited one where the mechanism has one
    (DP-SGD, ExpM's Langevin sampler; module docstring), else (ExpM+NF, whose flow has no
    σ) a claimed ε at most the audited claim: the same sampler aimed at a target of no
    lower temperature. Neither transfers the audit's figure to the job."""
    job_sigma = _sigma(plan.mechanism)
    if job_sigma is not None:
        audited = _sigma(audit.result) or _sigma(audit.planned)
        return audited is not None and job_sigma >= audited
    if plan.method == "expm_nf":
        return float(plan.epsilon) <= float(audit.request["epsilon"])
    return False


def check_gate(
    s: Session, *, dataset_id: int, request: JobRequest, plan: PrivacyPlan
) -> tuple[GateCheck, str | None]:
    """The gate's decision on a planned training job: what it found and, when it refuses,
    why (the caller answers 422, nothing charged)."""
    days = gate_days(s, dataset_id)
    if days is None:
        return GateCheck(None), None
    dataset = s.get_one(Dataset, dataset_id)
    wanted = _configuration(request, plan, _data(parse_dataset_schema(dataset.public_schema)))
    job_sigma = _sigma(plan.mechanism)
    since = datetime.now(UTC) - timedelta(days=days)
    seen = {"matching": 0, "failed": 0, "expired": 0}
    done = s.scalars(select(Audit).where(Audit.status == "done").order_by(Audit.finished_at.desc()))
    for audit in done:
        if audit.request.get("attack", "one_run") != "one_run":
            continue  # a LiRA audit's plans are for its pool's size, not the dataset's
        if _audit_configuration(audit) != wanted:
            continue
        if not _covered(plan, audit):
            continue
        seen["matching"] += 1
        result = audit.result or {}
        if float(result["epsilon_lower_bound"]) > float(audit.request["epsilon"]):
            seen["failed"] += 1
            continue
        finished = as_utc(audit.finished_at)
        if finished is None or finished < since:
            seen["expired"] += 1
            continue
        return GateCheck(days, audit.id, finished), None
    return GateCheck(days), _reason(wanted, job_sigma, days, seen)


def _reason(wanted: dict[str, Any], sigma: float | None, days: float, seen: dict[str, int]) -> str:
    config = ", ".join(f"{k} {v}" for k, v in wanted.items() if v is not None)
    noise = "" if sigma is None else f" at a noise multiplier ≤ the job's {sigma:.4g}"
    found = (
        "no done audit matches it"
        if seen["matching"] == 0
        else f"{seen['matching']} matching audit(s): {seen['failed']} failed (lower bound "
        f"above the claimed ε), {seen['expired']} older than the gate allows"
    )
    return (
        f"this dataset's release gate requires an audit of this configuration ({config}"
        f"{noise}) that passed within {days:g} days; "
        f"{found}. The admin runs one with POST /v1/admin/audits"
    )


def recheck_under_lock(db: Session | Connection, dataset_id: int, seen: GateCheck) -> str | None:
    """In the admission transaction, after the dataset's lock is taken: the refusal when
    the gate changed since planning in a way the planned check does not satisfy (turned
    on, or its age shortened past the audit found). The API calls it where planning saw
    the gate on."""
    now_days = gate_days(db, dataset_id)
    if now_days is None:
        return None
    since = datetime.now(UTC) - timedelta(days=now_days)
    if seen.audit_id is not None and seen.finished_at is not None and seen.finished_at >= since:
        return None
    return (
        "this dataset's release gate changed while the job was planned; quote it again "
        f"(audits within {now_days:g} days are required)"
    )


def record_job_audit(db: Session | Connection, job_id: str, seen: GateCheck) -> None:
    """Name the audit that let the job through (nothing when the gate was off)."""
    if seen.audit_id is not None:
        db.execute(insert(JobAudit).values(job_id=job_id, audit_id=seen.audit_id))


def audit_of_job(s: Session, job_id: str) -> dict[str, Any] | None:
    """The card's ``audit``: the audit that let the job through (id, bound, ceiling,
    finished_at, what passing means), or None."""
    link = s.get(JobAudit, job_id)
    if link is None:
        return None
    audit = s.get_one(Audit, link.audit_id)
    result = audit.result or {}
    finished = as_utc(audit.finished_at)
    return {
        "id": audit.id,
        "epsilon_lower_bound": result.get("epsilon_lower_bound"),
        "ceiling": result.get("ceiling", audit.ceiling),
        "claimed_epsilon": audit.request["epsilon"],
        "noise_multiplier": _sigma(result) or _sigma(audit.planned),
        "finished_at": None if finished is None else finished.isoformat(),
        "reading": "The dataset's release gate admitted this job on this one-run audit of "
        "its configuration (its lower bound at most the claimed ε). Passing is not a "
        f"proof. {READING}",
    }
