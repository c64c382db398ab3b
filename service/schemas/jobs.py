"""A job: its request, its privacy plan, the quote of its cost and its public view."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)

from service.modelspec import LogisticSpec, ModelSpec
from service.params import Delta, Epsilon
from service.schemas.budgets import BudgetView
from service.schemas.common import ApiInput, Guarantee, Method, RequestMethod, TrainingMethod
from service.schemas.dpsgd import DpsgdMechanism, DpsgdOptions
from service.schemas.estimates import ResourceQuote
from service.schemas.evaluations import EvaluationMechanism, PlanEvaluation, TrainingEvaluation
from service.schemas.events import DpEventJson
from service.schemas.expm import ExpmLangevinMechanism, ExpmMcmcMechanism, ExpmOptions
from service.schemas.expm_nf import ExpmNfMechanism, ExpmNfOptions
from service.schemas.selection import SelectionMechanism
from service.schemas.stored import Flaggable, Typed, mechanism_union
from service.vocabulary import FailureCategory, JobStage, JobStatus


class JobRequest(ApiInput):
    """A training request. ε in nats; δ a probability (0 for pure mechanisms)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "dataset": "adult",
                    "method": "dpsgd",
                    "epsilon": 1.0,
                    "delta": 1e-6,
                    "model": {"kind": "logistic"},
                    "dpsgd": {"epochs": 3, "batch_size": 256},
                },
                {
                    "dataset": "adult",
                    "method": "expm_nf",
                    "epsilon": 0.5,
                    "delta": 0,
                    "expm_nf": {"flow": "planar", "layers": 4},
                },
            ]
        }
    )

    dataset: str = Field(min_length=1, max_length=64)
    model: ModelSpec = Field(default_factory=LogisticSpec)
    method: RequestMethod  # 'auto': the service chooses (service/methods/auto.py)
    epsilon: Epsilon = Field(
        description="Requested ε (nats) for one release; at least 1e-6, the ledger's unit.",
    )
    delta: Delta = Field(
        default=0.0, description="Requested δ for one release: 0 or in [1e-20, 1)."
    )
    samples: int = Field(
        default=1, ge=1, le=100, description="Released models; the plan is charged once per model."
    )
    dpsgd: DpsgdOptions | None = None
    expm_nf: ExpmNfOptions | None = None
    expm: ExpmOptions | None = None
    selection: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Set by POST /v1/selections only (method 'selection'): the resolved selection "
            "request, its kind and its per-candidate budget (service/selection/api_bodies.py)."
        ),
    )

    evaluation: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Set by POST /v1/evaluations only (method 'evaluation'): the evaluated job, "
            "metrics, noise and confidence (service/evaluations.py)."
        ),
    )
    evaluate: TrainingEvaluation | None = Field(
        default=None,
        # Left out when None: requests (and their digests) without it stay as before.
        exclude_if=lambda value: value is None,
        description=(
            "Train, then evaluate the released model (sample `sample`) on the dataset's "
            "private holdout, in one job: one plan whose cost composes both, one charge. "
            "The dataset must have a holdout. A training method (or 'auto') only."
        ),
    )

    @model_validator(mode="after")
    def _selection_iff_method(self) -> JobRequest:
        if (self.selection is None) != (self.method != "selection"):
            raise ValueError("the selection field goes with method 'selection' and only with it")
        if (self.evaluation is None) != (self.method != "evaluation"):
            raise ValueError("the evaluation field goes with method 'evaluation' and only with it")
        if self.evaluate is not None:
            if self.method in ("selection", "evaluation"):
                raise ValueError("evaluate goes with a training method (or 'auto') only")
            if self.evaluate.sample >= self.samples:
                raise ValueError(
                    f"evaluate.sample {self.evaluate.sample}: the job releases "
                    f"{self.samples} sample(s)"
                )
            if len(set(self.evaluate.metrics)) != len(self.evaluate.metrics):
                raise ValueError("evaluate.metrics: each metric may be named once")
        return self


# The plan format's version: the value 1, validated as `Literal[1]`, documented as an
# integer in [1, 1]. Pydantic's own schema for `Literal[1]` is `{"const": 1}`, from which
# openapi-python-client 0.29.1 writes `if version != 1and ...` (a SyntaxWarning, a
# SyntaxError under `python -W error`); the bounds say the same and generate valid code.
PlanVersion = Annotated[Literal[1], WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 1})]

ExpmMechanism = Annotated[ExpmLangevinMechanism | ExpmMcmcMechanism, Field(discriminator="sampler")]
"""An ``expm`` plan's mechanism, by its sampler."""

PLAN_MECHANISMS: dict[str, TypeAdapter[Any]] = {
    "dpsgd": TypeAdapter(DpsgdMechanism),
    "expm": TypeAdapter(ExpmMechanism),
    "expm_nf": TypeAdapter(ExpmNfMechanism),
    "selection": TypeAdapter(SelectionMechanism),
    "evaluation": TypeAdapter(EvaluationMechanism),
}
"""The type of a plan's mechanism, by the plan's method (for ``expm``, then by the
mechanism's ``sampler``). A method without an entry (one added to the tables but not here;
tests/unit/test_typed_records.py refuses that for the registered ones) has an untyped
mechanism."""


def _plan_mechanism_type(value: Any, info: ValidationInfo) -> TypeAdapter[Any] | None:
    method = info.data.get("method")
    return PLAN_MECHANISMS.get(method) if isinstance(method, str) else None


_PLAN_MECHANISM_DOC, _PLAN_MECHANISM_EXTRA = mechanism_union(
    (
        DpsgdMechanism,
        ExpmLangevinMechanism,
        ExpmMcmcMechanism,
        ExpmNfMechanism,
        SelectionMechanism,
        EvaluationMechanism,
    ),
    typed=PLAN_MECHANISMS,
)
PlanMechanism = Annotated[
    dict[str, Any],
    Typed(_PLAN_MECHANISM_DOC, pick=_plan_mechanism_type),
    Field(
        description=(
            "Resolved mechanism parameters. Which member of the union: the plan's method "
            "(DpsgdMechanism, ExpmNfMechanism, SelectionMechanism, EvaluationMechanism), "
            "for expm then its sampler (ExpmLangevinMechanism, ExpmMcmcMechanism)."
        ),
        json_schema_extra=_PLAN_MECHANISM_EXTRA,
    ),
]
"""A plan's mechanism: the stored JSON object, checked against its method's model."""


class MethodChoice(BaseModel):
    """Why a plan has its method when the request let the service choose (``auto``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requested: Literal["auto"] = Field(description="The request's method.")
    method: TrainingMethod = Field(description="The method chosen: the plan's.")
    reason: str = Field(description="The rule's reason, from public values only.")


class PrivacyPlan(BaseModel):
    """Every number that decides a job's privacy cost. A pure function of the request and
    public metadata (the registered row count), computed before any private row is read.

    The meaning of a version never changes; new fields are optional (see STYLE.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: PlanVersion = Field(default=1, description="The plan format's version.")
    method: Method
    dataset: str
    n_rows: int = Field(description="The dataset's public (DP noisy) row count the plan used.")
    model: Annotated[dict[str, Any], Typed(ModelSpec)] = Field(
        description="The target model (a default MLP activation, tanh, may be left out)."
    )
    epsilon: float = Field(description="ε of the whole job (all released models), nats.")
    delta: float = Field(description="δ of the whole job.")
    guarantee: Guarantee
    accountant: str
    samples: int
    event: Annotated[dict[str, Any], Typed(DpEventJson)] = Field(
        description="The DP event: the mechanism description as data."
    )
    rdp_orders: list[float]
    rdp_curve: list[float] = Field(description="RDP ε(α) of the job on the public grid of orders.")
    mechanism: PlanMechanism
    method_choice: MethodChoice | None = Field(
        default=None,
        # Left out when None: the plans of requests that name their method stay as before.
        exclude_if=lambda value: value is None,
        description="Set when the request's method was 'auto': what was chosen and why.",
    )
    evaluation: Annotated[dict[str, Any], Typed(PlanEvaluation)] | None = Field(
        default=None,
        # Left out when None: the plans of requests without `evaluate` stay as before.
        exclude_if=lambda value: value is None,
        description=(
            "Set when the request asked to evaluate the trained model (`evaluate`): the "
            "evaluation's own (ε, δ), the training's, the composition rule, and the "
            "evaluation's public plan (holdout size, classes, each metric's share, "
            "sensitivity and noise scale). The plan's (ε, δ), event and RDP curve are then "
            "the training's and the evaluation's composed: one charge."
        ),
    )


class QuoteResponse(BaseModel):
    admitted: bool
    reason: str | None = None
    plan: PrivacyPlan
    charged_epsilon: float | None = Field(
        default=None,
        description=(
            "What the ledger will charge, in ε terms: the plan's RDP curve (the charge the "
            "filters add up) converted to ε at the plan's δ on the ledger's grid of orders "
            "(Canonne, Kamath & Steinke conversion). It can exceed plan.epsilon, the stated "
            "guarantee, when the plan was calibrated with the tighter PLD accountant, which "
            "the ledger cannot use across adaptively chosen jobs. Null for pure plans "
            "(δ = 0), whose charge is plan.epsilon itself."
        ),
    )
    dataset_before: BudgetView
    dataset_after: BudgetView | None
    analyst_before: BudgetView | None
    analyst_after: BudgetView | None
    estimate: ResourceQuote | None = Field(
        default=None,
        description="The plan's expected worker time and memory (service/resources.py).",
    )


class JobPublic(BaseModel):
    id: str
    dataset: str
    status: JobStatus = Field(
        description=(
            "queued → running → released | failed; cancelled (by the analyst, while queued). "
            "A failed job keeps its charge unless the admin refunds it."
        )
    )
    method: Method
    progress_step: int
    progress_total: int
    guarantee: Guarantee
    epsilon: float
    delta: float
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None = Field(
        description=(
            "When the job was released, failed or cancelled. Under the release hold (the "
            "default), a run's public release time: release_at, or its next doubling from "
            "started_at if the run overshot; never the moment the run ended."
        )
    )
    request: dict[str, Any]
    plan: PrivacyPlan
    release_url: str | None = None
    release_at: datetime | None = Field(
        default=None,
        description=(
            "The public release time fixed when the worker started the job: started_at + D, "
            "D from the plan's time estimate only (service/release_hold.py). The job is "
            "released (or fails, if it read rows) then, or at started_at + 2D, 4D, … if its "
            "run overshoots; progress_step is the elapsed share of D meanwhile. Null: not "
            "started, or the release hold is off."
        ),
    )


class AdminJob(JobPublic, Flaggable):
    """A job as the admin sees it (GET /v1/admin/jobs, /v1/admin/jobs/{job_id}): the
    analyst's view and what the worker recorded of the run. Never in the analyst's view:
    how far a job got and why it failed may depend on the private rows (a guard can fail
    on them)."""

    stage_reached: JobStage | None = Field(
        description=(
            "The last stage the worker reached: queued → planned (the plan re-derived, no "
            "row read) → data_loaded → training → releasing → released. Null: not recorded "
            "(a job older than the record)."
        )
    )
    data_read: bool | None = Field(
        description=(
            "Whether the worker opened the private rows: a fact it records just before the "
            "first read, not derived from the rows. A failed job that read them keeps its "
            "charge (a refund is then information only). Null: not recorded."
        )
    )
    failure_category: FailureCategory | None = Field(
        description=(
            "Why a failed job failed, from the type of the error (never its message or a "
            "data value): plan_mismatch, resource_limit, data_unavailable, guard_failed, "
            "worker_lost or internal_error. Null unless failed (or not recorded)."
        )
    )
