"""Request and response models of the HTTP API. ORM objects never cross the API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.modelspec import LogisticSpec, ModelSpec
from service.params import (
    BatchSize,
    BudgetEpsilon,
    ClipNorm,
    Delta,
    Epochs,
    Epsilon,
    InputModel,
    JlProjections,
    LearningRate,
    NoiseDecay,
)
from service.vocabulary import EntryKind, JobStatus, Role

TrainingMethod = Literal["dpsgd", "expm_nf", "expm"]
Method = Literal[TrainingMethod, "selection"]
"""``selection``: a selection job (POST /v1/selections), never submitted to POST /v1/jobs."""
Guarantee = Literal["proven", "asymptotic", "nominal"]
"""How far a release's (ε, δ) is proven, strongest first: **proven** (a proof covers the run
that executed, finite steps included), **asymptotic** (the sampler is exact only in the
limit of infinitely many steps; convergence diagnostics stay in the enclave), **nominal**
(no proof: ExpM sampled through a normalizing flow)."""
GUARANTEE_ORDER: tuple[Guarantee, ...] = ("proven", "asymptotic", "nominal")


def weakest_guarantee(*labels: Guarantee) -> Guarantee:
    """The weakest of the labels (a transcript is only as proven as its weakest release)."""
    return max(labels, key=GUARANTEE_ORDER.index, default="proven")


class _In(InputModel):
    """Inputs: unknown fields, NaN, infinities and booleans for numbers are errors."""


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class DpsgdOptions(_In):
    """DP-SGD (Abadi et al. 2016) with Poisson sampling, per-example clipping and Gaussian
    noise, run by the enclave's own sampler and integer-noise stage.

    With n̂ the dataset's public row count (a DP noisy count), each row is included in a
    step independently with probability q = batch_size/n̂ (batch_size is the *expected*
    batch), for T = epochs·⌈n̂/batch_size⌉ steps; the noise multiplier is calibrated so the
    whole run is (ε, δ)-DP under add/remove-one neighbours with the chosen accountant.
    Every batch size up to n̂ runs exactly as planned.

    Noise schedule. ``"constant"`` (default): one σ for all T steps. ``"exponential"``:
    decaying noise after Zhang, Ding, Wu, Wong, Nguyen & Pan 2021 (σ_t² = σ₀²·Rᵗ), with
    the time index t = the **epoch**: σ_e = σ₀·R^{e/2} for e = 0 … epochs − 1, constant
    within an epoch, R = ``noise_decay`` in (0, 1) (noise decreases over training). The
    plan calibrates σ₀ on the step-by-step composition of that history and charges its
    RDP curve; per epoch rather than per step because every distinct σ costs one curve in
    the accounting (see service/privacy/schedules.py for the measurements). A per-step
    decay r is R = r^{steps per epoch}.
    """

    epochs: Epochs | None = Field(
        default=None,
        description=(
            "Passes over the data. Default: from the public row count n̂, enough epochs for "
            "about 300 steps, at least 3 (service.methods.dpsgd.resolve_dpsgd_options)."
        ),
    )
    batch_size: BatchSize | None = Field(
        default=None,
        description="Expected batch size. Default: n̂/20 clamped to [16, 256].",
    )
    max_grad_norm: ClipNorm = 1.0
    learning_rate: LearningRate = 1.0
    accountant: Literal["rdp", "pld"] = "rdp"
    noise_schedule: Literal["constant", "exponential"] = Field(
        default="constant",
        description="constant σ, or σ_e² = σ₀²·R^e per epoch e (needs noise_decay).",
    )
    noise_decay: NoiseDecay | None = Field(
        default=None,
        description="R in (0, 1), per epoch: required iff noise_schedule is 'exponential'.",
    )

    engine: Literal["exact", "ghost", "jl"] = Field(
        default="exact",
        description=(
            "Per-example gradient engine (worker/mechanisms/grad_engines.py). 'exact': "
            "per-example gradients (Linear hooks or torch.func), any model. 'ghost': exact "
            "per-example norms without materialising per-example gradients (Li et al. 2021), "
            "same privacy cost as 'exact'; logistic and MLP only. 'jl': norms estimated from "
            "jl_projections random projections (Bu et al. 2021), each example also capped at "
            "κ·C with its exact norm; charged as sensitivity κ·C, i.e. κ times the noise of "
            "'exact' at the same (ε, δ) (service/privacy/jl.py); logistic and MLP only, "
            "constant noise only."
        ),
    )
    jl_projections: JlProjections | None = Field(
        default=None,
        description="r, the number of random projections of the 'jl' engine (required for it).",
    )

    @model_validator(mode="after")
    def _decay_iff_exponential(self) -> DpsgdOptions:
        if self.noise_schedule == "exponential" and self.noise_decay is None:
            raise ValueError("noise_schedule 'exponential' needs noise_decay R in (0, 1)")
        if self.noise_schedule == "constant" and self.noise_decay is not None:
            raise ValueError("noise_decay is only meaningful with noise_schedule 'exponential'")
        if (self.engine == "jl") != (self.jl_projections is not None):
            raise ValueError("jl_projections is required with engine 'jl' and only with it")
        return self


class ExpmNfOptions(_In):
    """The exponential mechanism sampled through a normalizing flow (nominal ε).

    These knobs shape only the sampler, not the mechanism's ε: the target density is
    exp(ε·u(θ)) with u = −Σ(ŷ − y)² − l2·‖θ‖² (sensitivity 1; the utility is monotone in
    the data set, so the McSherry–Talwar calibration without the factor 1/2 is ε-DP under
    add/remove-one). The parameters range over R^P, where l2 must be > 0 (without it the
    density does not normalise and the ε would describe no mechanism), or over a public box
    (−R, R)^P when ``domain_radius`` R is given: the mechanism is then ExpM restricted to
    the box, which normalises for any l2 ≥ 0, and the flow ends in a bijection onto it.
    """

    flow: Literal["planar", "sylvester"] = "planar"
    layers: int = Field(default=4, ge=1, le=64)
    # Left out: 1500, 64 and 1024 for tabular models, 300, 32 and 64 for GRU-D (whose
    # evaluation keeps T hidden states per (θ, row) pair), filled in by the plan.
    steps: int | None = Field(default=None, ge=1, le=100_000)
    n_samples_per_step: int | None = Field(default=None, ge=1, le=4096)
    batch_size: int | None = Field(default=None, ge=1, le=1_000_000)
    learning_rate: float = Field(default=0.02, gt=0, le=10)
    base_std: float = Field(default=1.0, gt=0, le=100)
    l2: float = Field(
        default=1.0,
        ge=0,
        le=1e6,
        description=(
            "Regulariser weight λ: > 0 on R^P (the target must normalise over unbounded θ); "
            "≥ 0 with a domain_radius."
        ),
    )
    domain_radius: float | None = Field(
        default=None,
        gt=0,
        le=1e4,
        description="R: restrict θ to the public box (−R, R)^P (default: all of R^P).",
    )

    @model_validator(mode="after")
    def _normalises(self) -> ExpmNfOptions:
        if self.l2 == 0 and self.domain_radius is None:
            raise ValueError(
                "l2 = 0 needs a domain_radius: over unbounded parameters the ExpM density "
                "does not normalise"
            )
        return self


class ExpmOptions(_In):
    """The regularised exponential mechanism for logistic regression.

    Target (Gopi, Lee & Liu 2022): π(θ) ∝ exp(−k·(Σᵢ ℓᵢ(θ) + l2·‖θ‖²/2)) with ℓᵢ the
    logistic loss of row i on the schema's encoding (features in [0, 1], one-hot levels),
    which is convex and Lipschitz, so π is strongly log-concave.

    Sampler ``"langevin"`` (**proven**): the unadjusted Langevin algorithm on π, started at
    θ = 0, for ``steps`` full-batch steps θ ← θ − (lr/n̂)·(Σᵢ∇ℓᵢ(θ) + N + l2·θ), N Gaussian.
    Each step is a Gaussian mechanism on the gradient sum (ℓ2 sensitivity bounded by the
    public schema), so the release (the last iterate) is (ε, δ)-DP by composition of the T
    steps that ran: the proof covers the finite run, not only its limit, and does not rely
    on the chain having mixed. The plan calibrates the noise multiplier σ for (ε, δ) and
    reports the inverse temperature k = 2n̂/(lr·σ²·B) of the target the chain approximates
    (B: the schema's bound on ‖x‖² with the bias).

    Sampler ``"mcmc"`` (**asymptotic**): Hamiltonian Monte Carlo with a Metropolis
    correction on π itself, ``chains`` chains in parallel for ``warmup`` + ``steps``
    iterations; the release is the final state of one chain per requested sample. π is
    μ-Gaussian-DP with μ = √(B·k/l2) (Gopi, Lee & Liu 2022), and the plan picks k for the
    request's (ε, δ); the chain's law tends to π as the steps grow, but no bound covers
    the finite run, hence the label. Its R̂, ESS and acceptance rate stay in the enclave.
    ``learning_rate`` is the Langevin sampler's only.
    """

    sampler: Literal["langevin", "mcmc"] = "langevin"
    steps: int | None = Field(
        default=None,
        ge=1,
        le=20_000,
        description=(
            "Langevin steps T, or MCMC iterations per chain after the warm-up. Default: "
            "langevin from the request's ε, 300 for ε ≥ 1, else 100; mcmc 500 "
            "(service.methods.expm.resolve_expm_options)."
        ),
    )
    learning_rate: float = Field(
        default=2.0,
        gt=0,
        le=100,
        description="Step on the mean gradient: θ moves by lr/n̂ times the noisy gradient sum.",
    )
    l2: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        description=(
            "Regulariser weight (μ): the target's log-density has −k·l2·‖θ‖²/2. Default: 1 "
            "for langevin, 30 for mcmc (must be > 0 there)."
        ),
    )
    chains: int | None = Field(
        default=None,
        ge=2,
        le=256,
        description="MCMC only: chains run in parallel (default 8); at least `samples`.",
    )
    warmup: int | None = Field(
        default=None,
        ge=0,
        le=20_000,
        description=(
            "MCMC only: warm-up iterations per chain, which adapt the step size and a "
            "diagonal metric and are discarded (default: as many as `steps`)."
        ),
    )
    leapfrog_steps: int | None = Field(
        default=None, ge=1, le=1024, description="MCMC only: leapfrog steps per iteration (16)."
    )
    step_size: float | None = Field(
        default=None,
        gt=0,
        le=10,
        description="MCMC only: the first leapfrog step size, adapted in the warm-up (0.05).",
    )

    @model_validator(mode="after")
    def _mcmc_fields_for_mcmc(self) -> ExpmOptions:
        if self.sampler != "mcmc":
            given = [n for n in MCMC_ONLY_FIELDS if getattr(self, n) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: options of the 'mcmc' sampler only")
        return self


MCMC_ONLY_FIELDS = ("chains", "warmup", "leapfrog_steps", "step_size")


class JobRequest(_In):
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
    method: Method
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

    @model_validator(mode="after")
    def _selection_iff_method(self) -> JobRequest:
        if (self.selection is None) != (self.method != "selection"):
            raise ValueError("the selection field goes with method 'selection' and only with it")
        return self


class PrivacyPlan(BaseModel):
    """Every number that decides a job's privacy cost. A pure function of the request and
    public metadata (the registered row count), computed before any private row is read.

    The meaning of a version never changes; new fields are optional (see STYLE.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    method: Method
    dataset: str
    n_rows: int = Field(description="The dataset's public (DP noisy) row count the plan used.")
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
    """One privacy filter (the dataset's, or the analyst's cap) as the caller may see it.

    ε in nats, δ a probability. The figures and why they differ from ε_total are argued
    in :mod:`service.privacy.filters` (module docstring: "spent", "remaining").
    """

    scope: Literal["dataset", "analyst"]
    rule: Literal["pure", "rdp"] = Field(
        description="pure: basic composition Σε ≤ ε_total. rdp: Rényi filter over a fixed grid."
    )
    epsilon_total: float = Field(description="The budget's ε (nats): the guarantee it enforces.")
    delta_total: float = Field(description="The budget's δ.")
    spent_epsilon_sum: float = Field(
        description=(
            "Naive sum of the ε of the charges in force. For rule 'pure' it is what admission "
            "compares with epsilon_total; for rule 'rdp' it is information only (usually far "
            "above what the Rényi filter counts)."
        )
    )
    epsilon_spent: float = Field(
        description=(
            "The smallest budget ε (at delta_total) whose filter would have admitted every "
            "charge in force: rule 'pure': Σε; rule 'rdp': min over the orders α of the RDP "
            "→ (ε, δ) conversion of the spent RDP at δ_total/|orders|, the split admission "
            "uses. Valid under adaptive choice in the sense that a ledger given this budget "
            "from the start would have run the same jobs; the guarantee stays epsilon_total."
        )
    )
    remaining_epsilon: float = Field(
        description=(
            "The largest ε of ONE further pure ε-DP request this filter would still admit "
            "(rule 'rdp': charged with the randomized-response RDP curve). Several smaller "
            "requests may add up to more. Under rule 'rdp' it is below epsilon_total even "
            "before any charge (about 0.032 below at δ_total = 1e-5: δ_total is split over "
            "the grid of orders, and the RDP → (ε, δ) conversion has its own cost)."
        )
    )
    guarantee: Guarantee | None = Field(
        default=None,
        description=(
            "Dataset scope: the weakest guarantee of the jobs that have read the dataset's "
            "rows. 'nominal' once a nominal job (ExpM sampled through a normalizing flow) "
            "ran, else 'asymptotic' once an asymptotic one (ExpM sampled by MCMC) ran: from "
            "then on no proof covers the dataset's releases as a whole, whatever the budget "
            "says; 'proven' otherwise. Null where not computed (analyst caps, quotes, budget "
            "updates)."
        ),
    )


class DatasetPublic(_Out):
    name: str
    n_rows: int = Field(
        description=(
            "The public row count: a DP noisy count released at registration (two-sided "
            "geometric noise with ε = count_epsilon, charged to the dataset's budget). Plans "
            "use only this value; the exact count is never published."
        )
    )
    count_epsilon: float | None = Field(
        default=None,
        description=(
            "ε (nats) spent on the noisy row count; null for a dataset registered before "
            "noisy counts, whose n_rows is exact and treated as public."
        ),
    )
    public_schema: dict[str, Any]
    allow_nominal: bool
    budget: BudgetView
    analyst_budget: BudgetView | None = None


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
    finished_at: datetime | None
    request: dict[str, Any]
    plan: PrivacyPlan
    release_url: str | None = None


class AnalystCreate(_In):
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


class KeyRotate(_In):
    model_config = ConfigDict(json_schema_extra={"examples": [{"expires_in_days": 30}]})

    expires_in_days: float | None = Field(
        default=None, gt=0, le=3650, description="Optional lifetime of the new key, in days."
    )


class AnalystCreated(BaseModel):
    id: int
    name: str
    role: Role
    api_key: str = Field(description="Shown once; only its hash is stored.")
    expires_at: datetime | None = None


class BudgetUpdate(_In):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"epsilon_total": 10.0, "delta_total": 1e-5}]}
    )

    epsilon_total: BudgetEpsilon
    delta_total: Delta


class CapUpdate(_In):
    model_config = ConfigDict(json_schema_extra={"examples": [{"epsilon": 2.0, "delta": 1e-6}]})

    epsilon: BudgetEpsilon
    delta: Delta


class NominalUpdate(_In):
    """Allow methods whose guarantee is not proven: nominal and asymptotic ones."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"allow_nominal": True}]})

    allow_nominal: bool


class NominalPolicy(BaseModel):
    dataset: str
    allow_nominal: bool = Field(
        description="Whether methods whose ε is nominal (expm_nf) may run on the dataset."
    )


class RefundRequest(_In):
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


class LedgerEntryPublic(_Out):
    id: int
    dataset: str
    analyst_id: int | None
    job_id: str | None
    kind: EntryKind
    event: dict[str, Any] | None
    epsilon: float
    delta: str
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


class CardPreprocessing(BaseModel):
    model_config = ConfigDict(extra="allow")

    description: str
    feature_names: list[str] = Field(description="Model input columns, in order.")
    public_schema: dict[str, Any]


class CardPrivacy(BaseModel):
    model_config = ConfigDict(extra="allow")

    epsilon: float = Field(description="ε of the whole job (all released models), nats.")
    delta: float
    units: str
    accountant: str
    guarantee: Guarantee = Field(
        description="proven (DP-SGD) or nominal (ExpM sampled through a normalizing flow)."
    )
    statement: str = Field(description="What the guarantee covers, in words.")
    neighbouring_relation: str | None = None
    public_values: dict[str, str] | None = Field(
        default=None, description="What the mechanism may depend on besides the private rows."
    )
    event: dict[str, Any] = Field(description="The DP event charged, as data.")


class ModelCard(BaseModel):
    """The model card of a release: the model, its preprocessing, the mechanism and the
    privacy guarantee (proven or nominal). Fields may be added in later card versions."""

    model_config = ConfigDict(extra="allow")

    card_version: int
    job_id: str
    run_token: str
    model: dict[str, Any]
    samples: int
    weights_layout: str
    output: str
    preprocessing: CardPreprocessing
    mechanism: dict[str, Any]
    privacy: CardPrivacy
    weights_sha256: str = Field(description="SHA-256 (hex) of the weights file.")


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description="Where: body, query, path or header, then keys.")
    msg: str
    type: str | None = None


class RemainingBudgets(BaseModel):
    dataset: BudgetView
    analyst: BudgetView | None = None


class Problem(BaseModel):
    """RFC 9457 problem details, sent as `application/problem+json` with every error.

    `type` is a stable URI reference, `/problems/{slug}` relative to the service
    (`GET /problems/{slug}` describes it); new types may be added. `errors` comes with
    validation errors, `remaining` with budget-exceeded.
    """

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": "/problems/not-found",
                    "title": "Not found",
                    "status": 404,
                    "detail": "no job 'abc'",
                    "instance": "/v1/jobs/abc",
                }
            ]
        },
    )

    type: str = Field(
        description="URI reference of the problem type, e.g. /problems/validation-error.",
        json_schema_extra={"format": "uri-reference"},
    )
    title: str
    status: int = Field(ge=400, le=599)
    detail: str | None = None
    instance: str | None = Field(default=None, description="The request path.")
    errors: list[ValidationIssue] | None = None
    remaining: RemainingBudgets | None = None


class ProblemTypeInfo(BaseModel):
    type: str
    status: int
    title: str
    description: str


class Health(BaseModel):
    status: Literal["ok", "ready"]
