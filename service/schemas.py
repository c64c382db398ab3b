"""Request and response models of the HTTP API. ORM objects never cross the API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.modelspec import LogisticSpec, ModelSpec

Method = Literal["dpsgd", "expm_nf"]
Guarantee = Literal["proven", "nominal"]


class _In(BaseModel):
    """Inputs: unknown fields, NaN and infinities are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class DpsgdOptions(_In):
    """DP-SGD (Abadi et al. 2016) with Poisson sampling, as implemented by Opacus.

    The sampling rate is 1/ceil(n/batch_size) and the number of steps
    epochs·ceil(n/batch_size), where n is the dataset's public row count; the noise
    multiplier is calibrated so the whole run is (ε, δ)-DP under the chosen accountant.
    """

    epochs: int = Field(default=3, ge=1, le=100)
    batch_size: int = Field(default=256, ge=1, le=1_000_000)
    max_grad_norm: float = Field(default=1.0, gt=0, le=1e3)
    learning_rate: float = Field(default=1.0, gt=0, le=1e3)
    accountant: Literal["rdp", "pld"] = "rdp"


class ExpmNfOptions(_In):
    """The exponential mechanism sampled through a normalizing flow (nominal ε).

    These knobs shape only the sampler, not the mechanism's ε: the target density is
    exp(ε·u(θ)/2) with u = −Σ(ŷ − y)² − l2·‖θ‖² (sensitivity 1).
    """

    flow: Literal["planar", "sylvester"] = "planar"
    layers: int = Field(default=4, ge=1, le=64)
    steps: int = Field(default=1500, ge=1, le=100_000)
    n_samples_per_step: int = Field(default=64, ge=1, le=4096)
    batch_size: int = Field(default=1024, ge=1, le=1_000_000)
    learning_rate: float = Field(default=0.02, gt=0, le=10)
    base_std: float = Field(default=1.0, gt=0, le=100)
    l2: float = Field(default=1.0, ge=0, le=1e6)


class JobRequest(_In):
    """A training request. ε in nats; δ a probability (0 for pure mechanisms)."""

    dataset: str = Field(min_length=1, max_length=64)
    model: ModelSpec = Field(default_factory=LogisticSpec)
    method: Method
    epsilon: float = Field(gt=0, le=100, description="Requested ε (nats) for one release.")
    delta: float = Field(default=0.0, ge=0, lt=1, description="Requested δ for one release.")
    samples: int = Field(
        default=1, ge=1, le=100, description="Released models; the plan is charged once per model."
    )
    dpsgd: DpsgdOptions | None = None
    expm_nf: ExpmNfOptions | None = None


class PrivacyPlan(BaseModel):
    """Every number that decides a job's privacy cost. A pure function of the request and
    public metadata (the registered row count), computed before any private row is read.

    The meaning of a version never changes; new fields are optional (see STYLE.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    method: Method
    dataset: str
    n_rows: int
    model: dict[str, Any]
    epsilon: float = Field(description="ε of the whole job (all released models), nats.")
    delta: float = Field(description="δ of the whole job.")
    guarantee: Guarantee
    accountant: str
    samples: int
    event: dict[str, Any] = Field(description="The DP event: the mechanism description as data.")
    rdp_orders: list[float]
    rdp_curve: list[float] = Field(description="RDP ε(α) of the job on the public grid of orders.")
    mechanism: dict[str, Any] = Field(description="Resolved mechanism parameters.")


class BudgetView(BaseModel):
    """One privacy filter (the dataset's, or the analyst's cap) as the caller may see it."""

    scope: Literal["dataset", "analyst"]
    rule: Literal["pure", "rdp"] = Field(
        description="pure: basic composition Σε ≤ ε_total. rdp: Rényi filter over a fixed grid."
    )
    epsilon_total: float
    delta_total: float
    spent_epsilon_sum: float = Field(description="Naive sum of charged ε (information).")
    remaining_epsilon: float = Field(
        description="Largest ε of a further pure ε-DP request that this filter would admit."
    )


class DatasetPublic(_Out):
    name: str
    n_rows: int
    public_schema: dict[str, Any]
    allow_nominal: bool
    budget: BudgetView
    analyst_budget: BudgetView | None = None


class QuoteResponse(BaseModel):
    admitted: bool
    reason: str | None = None
    plan: PrivacyPlan
    dataset_before: BudgetView
    dataset_after: BudgetView | None
    analyst_before: BudgetView | None
    analyst_after: BudgetView | None


class JobPublic(BaseModel):
    id: str
    dataset: str
    status: str
    method: Method
    progress_step: int
    progress_total: int
    guarantee: Guarantee
    epsilon: float
    delta: float
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    request: dict[str, Any]
    plan: PrivacyPlan
    release_url: str | None = None


class AnalystCreate(_In):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    role: Literal["analyst", "admin"] = "analyst"


class AnalystCreated(BaseModel):
    id: int
    name: str
    role: str
    api_key: str = Field(description="Shown once; only its hash is stored.")


class BudgetUpdate(_In):
    epsilon_total: float = Field(gt=0, le=1e4)
    delta_total: float = Field(ge=0, lt=1)


class CapUpdate(_In):
    epsilon: float = Field(gt=0, le=1e4)
    delta: float = Field(ge=0, lt=1)


class NominalUpdate(_In):
    allow_nominal: bool


class RefundRequest(_In):
    reason: str = Field(min_length=3, max_length=2000)
    override: bool = Field(
        default=False,
        description=(
            "Required to refund a job that had already read private rows. Such a refund is an "
            "explicit admin decision outside the ledger's DP guarantee, and is recorded so."
        ),
    )


class LedgerEntryPublic(_Out):
    id: int
    dataset: str
    analyst_id: int | None
    job_id: str | None
    kind: str
    event: dict[str, Any] | None
    epsilon: float
    delta: str
    reason: str | None
    created_at: str
    prev_hash: str
    hash: str
