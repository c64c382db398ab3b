"""Plans of the ``architecture`` and ``hyperparameters`` selection kinds: one charge for
the whole workflow, a pure function of the request and public metadata.

Data use (both kinds). Each row goes to the validation part independently with the
public probability ``validation_fraction`` (a Bernoulli split drawn in the worker), the
rest to training. Every candidate is trained by DP-SGD on the training part (Poisson
sampling at q = batch / n̂_train, n̂_train = ⌊(1 − v)·n̂⌋ public) and scored by
:func:`worker.mechanisms.search.noisy_accuracy` on the validation part: correct count +
discrete Laplace(1/ε_fit), divided by the public n̂_val = max(1, ⌊v·n̂⌋). The count has
sensitivity 1 under add/remove-one, so each score is ε_fit-DP, charged as the noisy row
count is (:func:`service.privacy.sampling.count_event`: ε_fit plus the sampler's pmf
gap). We do not claim parallel composition over the two parts: each training and each
score is charged in full.

* ``architecture`` with ``runs`` (RS only): random stopping as for hyperparameters
  below, each run a uniformly drawn architecture.
* ``architecture`` with ``scoring = report_noisy_max`` (RS only): N trainings composed
  with one Report-Noisy-Max selection (ε_fit once); no score is released.
* ``architecture`` (RS, MGRS, PAAS): N = planned_trainings trainings and N scores,
  composed: N × (AnyOf(training events) + count_event(ε_fit)). The searches choose
  candidates adaptively from earlier noisy scores; composition of RDP holds under
  adaptive choice (Mironov 2017, Prop. 1) and AnyOf covers whichever training is
  picked (service/privacy/events.py).
* ``hyperparameters`` (Papernot & Steinke 2022): one run Q = draw settings uniformly
  from the declared grid, train, score; K ~ the declared runs distribution, drawn in the
  worker; the best run by noisy score is released. Charge: RandomStopping(Q) with
  Q's curve ≤ AnyOf(training events) + count_event(ε_fit) (service/privacy/tuning.py).

Every candidate's DP-SGD uses the σ calibrated for the *largest* model the request
allows (the integer-noise slack grows with the parameter count; a smaller model's slack
is smaller, so the charged event covers it), keyed by the privacy-relevant settings
(batch size, epochs, noise schedule).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field, model_validator

from service.datasets.tabular import TabularSchema, parse_schema
from service.methods.dpsgd import resolve_dpsgd_options
from service.modelspec import MlpSpec, ModelSpec
from service.params import BatchSize, ClipNorm, Epochs, InputModel, LearningRate, NoiseDecay
from service.plans import PlanError, build_plan
from service.privacy.events import (
    AnyOfEvent,
    ComposedEvent,
    DpEvent,
    RandomStoppingEvent,
    SelfComposedEvent,
    event_from_json,
)
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp
from service.privacy.sampling import count_event
from service.privacy.tuning import (
    MAX_RUNS_CAP,
    PoissonRuns,
    RunsDistribution,
    TruncatedNegativeBinomialRuns,
)
from service.schemas import DpsgdOptions, ExpmNfOptions, JobRequest
from service.selection.budget import SelectionBudget
from service.selection.features import (
    FeatureLayout,
    FeatureRequest,
    column_layout,
    feature_plan_parts,
    pafs_event,
)
from service.selection.search_space import (
    ArchitectureCandidate,
    ArchitectureSearch,
    ArchitectureSpace,
    planned_trainings,
)

__all__ = [
    "REQUEST_MODELS",
    "ArchitectureRequest",
    "HyperparameterCandidate",
    "HyperparameterRequest",
    "SelectionBudget",
    "SelectionKind",
    "SelectionPlan",
    "SelectionRequest",
    "architecture_key",
    "architecture_plan",
    "candidate_mechanism",
    "feature_plan",
    "hyperparameter_plan",
    "plan_selection",
    "plan_summary",
    "split_counts",
    "with_total_epsilon",
    "workflow_epsilon",
]


class _In(InputModel):
    pass


_MAX_RUNS = Field(
    default=None,
    ge=1,
    le=MAX_RUNS_CAP,
    description=(
        "Cap on the number of runs K: K is drawn from the law conditioned on K ≤ max_runs, "
        "so the work is bounded; charged by Papernot & Steinke's generic bound (Lemma 7), "
        "which costs more than the uncapped law's. Without it the quote estimates the work "
        "at K's 99.9% quantile."
    ),
)


class TnbRunsSpec(_In):
    kind: Literal["truncated_negative_binomial"] = "truncated_negative_binomial"
    eta: float = Field(default=1.0, gt=-1, le=100)
    gamma: float = Field(default=0.2, gt=0, lt=1)
    max_runs: int | None = _MAX_RUNS


class PoissonRunsSpec(_In):
    kind: Literal["poisson"] = "poisson"
    mu: float = Field(default=5.0, gt=0, le=1000, description="at least 1 without max_runs")
    max_runs: int | None = _MAX_RUNS

    @model_validator(mode="after")
    def _small_mu_needs_a_cap(self) -> PoissonRunsSpec:
        if self.mu < 1 and self.max_runs is None:
            raise ValueError("a Poisson law with mu < 1 needs max_runs (service/privacy/tuning.py)")
        return self


class ArchitectureRequest(_In):
    space: ArchitectureSpace = Field(default_factory=ArchitectureSpace)
    search: ArchitectureSearch = Field(default_factory=ArchitectureSearch)
    method: Literal["dpsgd", "expm_nf"] = Field(
        default="dpsgd",
        description=(
            "how each candidate is trained: DP-SGD (proven), or ExpM+NF (the exponential "
            "mechanism sampled through a normalizing flow: its ε is NOMINAL, so the whole "
            "workflow is labelled nominal and needs the dataset's nominal switch)"
        ),
    )
    training: DpsgdOptions = Field(default_factory=DpsgdOptions)
    expm_nf: ExpmNfOptions | None = Field(default=None, description="method expm_nf only")
    budget: SelectionBudget
    runs: TnbRunsSpec | PoissonRunsSpec | None = Field(
        default=None,
        discriminator="kind",
        description=(
            "rs only: a random number of candidates K from this law (Papernot & Steinke "
            "2022) instead of search.trainings; charged by their bound, not K times"
        ),
    )

    scoring: Literal["noisy_scores", "report_noisy_max"] = Field(
        default="noisy_scores",
        description=(
            "rs without runs only: report_noisy_max releases the winner and its weights but "
            "no score, and charges one ε_fit for all N scores instead of N"
        ),
    )

    @model_validator(mode="after")
    def _runs_only_for_rs(self) -> ArchitectureRequest:
        if self.method == "expm_nf" and (self.space.batch_sizes or self.space.learning_rates):
            raise ValueError("batch sizes and learning rates in the space are DP-SGD's")
        if self.method != "expm_nf" and self.expm_nf is not None:
            raise ValueError("expm_nf options apply to method expm_nf")
        if self.runs is not None and self.search.algorithm != "rs":
            raise ValueError("runs (random stopping) applies to random search (rs) only")
        if self.scoring == "report_noisy_max" and (
            self.search.algorithm != "rs" or self.runs is not None
        ):
            raise ValueError("report_noisy_max applies to random search (rs) without runs")
        return self


class HyperparameterRequest(_In):
    """A grid of DP-SGD settings; each run draws one setting uniformly (PS22 random search)."""

    model: ModelSpec = Field(default_factory=lambda: MlpSpec())
    learning_rates: list[LearningRate] = Field(default=[0.5, 1.0, 2.0], min_length=1, max_length=16)
    batch_sizes: list[BatchSize] = Field(default=[128], min_length=1, max_length=8)
    epochs: list[Epochs] = Field(default=[3], min_length=1, max_length=8)
    max_grad_norms: list[ClipNorm] = Field(default=[1.0], min_length=1, max_length=8)
    noise_decays: list[NoiseDecay | None] = Field(
        default=[None], min_length=1, max_length=4, description="None: constant σ"
    )
    runs: TnbRunsSpec | PoissonRunsSpec = Field(default_factory=TnbRunsSpec, discriminator="kind")
    budget: SelectionBudget


class HyperparameterCandidate(_In):
    learning_rate: float
    batch_size: int
    epochs: int
    max_grad_norm: float
    noise_decay: float | None


@dataclass(frozen=True)
class SelectionPlan:
    """The one charge of a selection job and the public values its worker needs."""

    event: DpEvent
    trainings: int | None  # None: random (hyperparameters), drawn by the worker
    n_train: int
    n_val: int
    # privacy key (batch, epochs, noise decay) → DP-SGD mechanism of the largest model
    mechanisms: dict[tuple[int, int, float | None], dict[str, Any]]
    runs: RunsDistribution | None = None
    features: FeatureLayout | None = None  # the ``features`` kind (service.selection.features)
    # ExpM+NF candidates (architecture kind): the charged (largest) candidate's mechanism;
    # every candidate runs the exponential mechanism at the same ε (its sensitivity does
    # not depend on the model), so the charge is the same for all. Nominal guarantee.
    expm_mechanism: dict[str, Any] | None = None
    # The DP-SGD trainings' guarantee (service.methods.dpsgd.dpsgd_guarantee): nominal for
    # GRU-D and the jl engine.
    training_guarantee: Literal["proven", "nominal"] = "proven"

    @property
    def guarantee(self) -> Literal["proven", "nominal"]:
        return "nominal" if self.expm_mechanism is not None else self.training_guarantee


def split_counts(n_public: int, validation_fraction: float) -> tuple[int, int]:
    """Public training and validation counts (the split itself is a per-row coin)."""
    n_val = max(1, int(validation_fraction * n_public))
    n_train = n_public - n_val
    if n_train < 1:
        raise PlanError("too few rows to split into training and validation parts")
    return n_train, n_val


def _training_events(
    *,
    dataset: str,
    model: ModelSpec,
    keys: set[tuple[int, int, float | None]],
    options: DpsgdOptions,
    budget: SelectionBudget,
    n_train: int,
    n_features: int,
    dataset_kind: str = "tabular",
) -> tuple[
    DpEvent, dict[tuple[int, int, float | None], dict[str, Any]], Literal["proven", "nominal"]
]:
    events: list[DpEvent] = []
    guarantee: Literal["proven", "nominal"] = "proven"
    mechanisms: dict[tuple[int, int, float | None], dict[str, Any]] = {}
    for batch, epochs, decay in sorted(keys, key=repr):
        opts = options.model_copy(
            update={
                "batch_size": batch,
                "epochs": epochs,
                "noise_schedule": "constant" if decay is None else "exponential",
                "noise_decay": decay,
            }
        )
        request = JobRequest(
            dataset=dataset,
            model=model,
            method="dpsgd",
            epsilon=budget.training_epsilon,
            delta=budget.training_delta,
            dpsgd=opts,
        )
        plan = build_plan(request, n_rows=n_train, n_features=n_features, dataset_kind=dataset_kind)
        events.append(event_from_json(plan.event))
        mechanisms[(batch, epochs, decay)] = dict(plan.mechanism)
        if plan.guarantee != "proven":
            guarantee = "nominal"
    one = events[0] if len(events) == 1 else AnyOfEvent(events=tuple(events))
    return one, mechanisms, guarantee


def expm_candidate_plan(
    request: ArchitectureRequest,
    *,
    dataset: str,
    model: ModelSpec,
    n_train: int,
    n_features: int,
    dataset_kind: str = "tabular",
) -> tuple[DpEvent, dict[str, Any]]:
    """One ExpM+NF candidate's event and mechanism (service.plans, method expm_nf) at the
    budget's training ε (pure: δ = 0). The API plans it for the largest model; the worker
    for each candidate's own model, with the same event."""
    job = JobRequest(
        dataset=dataset,
        model=model,
        method="expm_nf",
        epsilon=request.budget.training_epsilon,
        delta=0.0,
        expm_nf=request.expm_nf or ExpmNfOptions(),
    )
    plan = build_plan(job, n_rows=n_train, n_features=n_features, dataset_kind=dataset_kind)
    return event_from_json(plan.event), dict(plan.mechanism)


def architecture_plan(
    request: ArchitectureRequest,
    *,
    dataset: str,
    n_rows: int,
    n_features: int,
    dataset_kind: str = "tabular",
) -> SelectionPlan:
    n_train, n_val = split_counts(n_rows, request.budget.validation_fraction)
    expm_mechanism: dict[str, Any] | None = None
    mechanisms: dict[tuple[int, int, float | None], dict[str, Any]] = {}
    guarantee: Literal["proven", "nominal"] = "proven"
    if request.method == "expm_nf":
        train, expm_mechanism = expm_candidate_plan(
            request,
            dataset=dataset,
            model=request.space.largest(),
            n_train=n_train,
            n_features=n_features,
            dataset_kind=dataset_kind,
        )
    else:
        options = resolve_dpsgd_options(request.training, n_rows=n_train)
        assert options.batch_size is not None and options.epochs is not None
        batches = request.space.batch_sizes or [options.batch_size]
        keys = {(b, options.epochs, options.noise_decay) for b in batches}
        train, mechanisms, guarantee = _training_events(
            dataset=dataset,
            model=request.space.largest(),
            keys=keys,
            options=options,
            budget=request.budget,
            n_train=n_train,
            n_features=n_features,
            dataset_kind=dataset_kind,
        )
    per = ComposedEvent(events=(train, count_event(epsilon=request.budget.fitness_epsilon)))
    if request.runs is not None:
        runs = _runs(request.runs)
        return SelectionPlan(
            event=RandomStoppingEvent(event=per, runs=runs),
            trainings=None,
            n_train=n_train,
            n_val=n_val,
            mechanisms=mechanisms,
            training_guarantee=guarantee,
            runs=runs,
            expm_mechanism=expm_mechanism,
        )
    n = planned_trainings(request.search)
    event: DpEvent = per if n == 1 else SelfComposedEvent(event=per, count=n)
    if request.scoring == "report_noisy_max":
        # RS's N candidates are drawn without looking at the data, so their N validation
        # counts can be scored by Report Noisy Max: counts of one validation set move in
        # the same direction under add/remove-one, so argmax_i (c_i + Lap(1/ε)) is ε-DP
        # (Dwork & Roth 2014, Claim 3.9; with two-sided geometric noise the same proof
        # holds since P[Z ≥ k + 1] ≥ e^{−ε} P[Z ≥ k]). Composed after the N trainings.
        fit = count_event(epsilon=request.budget.fitness_epsilon)
        trainings = train if n == 1 else SelfComposedEvent(event=train, count=n)
        event = ComposedEvent(events=(trainings, fit))
    return SelectionPlan(
        event=event,
        trainings=n,
        n_train=n_train,
        n_val=n_val,
        mechanisms=mechanisms,
        training_guarantee=guarantee,
        expm_mechanism=expm_mechanism,
    )


def _runs(spec: TnbRunsSpec | PoissonRunsSpec) -> RunsDistribution:
    if isinstance(spec, PoissonRunsSpec):
        return PoissonRuns(mu=spec.mu, max_runs=spec.max_runs)
    return TruncatedNegativeBinomialRuns(eta=spec.eta, gamma=spec.gamma, max_runs=spec.max_runs)


def hyperparameter_plan(
    request: HyperparameterRequest,
    *,
    dataset: str,
    n_rows: int,
    n_features: int,
    dataset_kind: str = "tabular",
) -> SelectionPlan:
    n_train, n_val = split_counts(n_rows, request.budget.validation_fraction)
    keys = {
        (b, e, d) for b in request.batch_sizes for e in request.epochs for d in request.noise_decays
    }
    train, mechanisms, guarantee = _training_events(
        dataset=dataset,
        model=request.model,
        keys=keys,
        options=DpsgdOptions(),
        budget=request.budget,
        n_train=n_train,
        n_features=n_features,
        dataset_kind=dataset_kind,
    )
    q = ComposedEvent(events=(train, count_event(epsilon=request.budget.fitness_epsilon)))
    runs = _runs(request.runs)
    return SelectionPlan(
        event=RandomStoppingEvent(event=q, runs=runs),
        trainings=None,
        n_train=n_train,
        n_val=n_val,
        mechanisms=mechanisms,
        training_guarantee=guarantee,
        runs=runs,
    )


def candidate_mechanism(
    plan: SelectionPlan,
    *,
    key: tuple[int, int, float | None],
    parameters: int,
    learning_rate: float,
    max_grad_norm: float | None = None,
) -> dict[str, Any]:
    """The DP-SGD mechanism one candidate runs: the charged σ and schedule for its privacy
    key, its own parameter count (≤ the largest, whose slack was charged), learning rate
    and clip norm (neither changes the privacy cost: σ is relative to the clip norm)."""
    base = plan.mechanisms[key]
    if parameters > int(base["parameters"]):
        raise PlanError("candidate larger than the charged model")
    out = {**base, "parameters": parameters, "learning_rate": learning_rate}
    if max_grad_norm is not None:
        out["max_grad_norm"] = max_grad_norm
    return out


def architecture_key(
    plan: SelectionPlan, candidate: ArchitectureCandidate
) -> tuple[int, int, float | None]:
    """The privacy key of an architecture candidate (its batch size, or the request's)."""
    keys = sorted(plan.mechanisms, key=repr)
    if candidate.batch_size is None:
        return keys[0]
    for k in keys:
        if k[0] == candidate.batch_size:
            return k
    raise PlanError("candidate batch size not in the plan")


def feature_plan(
    request: FeatureRequest,
    *,
    dataset: str,
    schema: TabularSchema,
    n_rows: int,
    n_features: int,
) -> SelectionPlan:
    """The ``features`` kind: DP-CFS (one Gaussian charge on all histograms, no
    trainings, all rows) or PAFS (population × generations trainings and noisy scores,
    composed as for the architecture kind). See :mod:`service.selection.features`."""
    if schema.n_features != n_features:
        raise PlanError("the schema does not match the dataset's feature count")
    if request.method != "pafs":
        event, layout = feature_plan_parts(request, schema=schema)
        if request.final is None:
            return SelectionPlan(
                event=event, trainings=0, n_train=n_rows, n_val=0, mechanisms={}, features=layout
            )
        final = request.final
        opts = resolve_dpsgd_options(final.training, n_rows=n_rows)
        assert opts.batch_size is not None and opts.epochs is not None
        fkey = (opts.batch_size, opts.epochs, opts.noise_decay)
        train, mechanisms, guarantee = _training_events(
            dataset=dataset,
            model=final.model,  # on all features: the largest selection
            keys={fkey},
            options=opts,
            budget=SelectionBudget(training_epsilon=final.epsilon, training_delta=final.delta),
            n_train=n_rows,
            n_features=n_features,
        )
        return SelectionPlan(
            event=ComposedEvent(events=(event, train)),
            trainings=1,
            n_train=n_rows,
            n_val=0,
            mechanisms=mechanisms,
            training_guarantee=guarantee,
            features=replace(layout, training_key=fkey),
        )
    assert request.budget is not None
    columns = column_layout(schema, numeric_bins=request.numeric_bins)
    n_train, n_val = split_counts(n_rows, request.budget.validation_fraction)
    options = resolve_dpsgd_options(request.training, n_rows=n_train)
    assert options.batch_size is not None and options.epochs is not None
    key = (options.batch_size, options.epochs, options.noise_decay)
    train, mechanisms, guarantee = _training_events(
        dataset=dataset,
        model=request.model,  # on all features: the largest candidate
        keys={key},
        options=options,
        budget=request.budget,
        n_train=n_train,
        n_features=n_features,
    )
    n = request.ga.population * request.ga.generations
    layout = FeatureLayout(
        columns=columns,
        target_bins=2,
        histograms=0,
        cells=0,
        noise_multiplier=None,
        cell_scale=None,
        training_key=key,
    )
    return SelectionPlan(
        event=pafs_event(
            training=train, fitness_epsilon=request.budget.fitness_epsilon, trainings=n
        ),
        trainings=n,
        n_train=n_train,
        n_val=n_val,
        mechanisms=mechanisms,
        training_guarantee=guarantee,
        features=layout,
    )


def workflow_epsilon(plan: SelectionPlan, *, delta: float) -> float:
    """ε (nats) of the whole workflow at ``delta``, from the plan's RDP curve on the
    ledger's orders (Canonne, Kamath & Steinke 2020 conversion, as for every job)."""
    return epsilon_from_rdp(rdp=plan.event.rdp(ORDERS), orders=ORDERS, delta=delta)


def with_total_epsilon(
    request: SelectionRequest,
    *,
    epsilon: float,
    delta: float,
    dataset: str,
    n_rows: int,
    n_features: int,
    schema: TabularSchema | dict[str, Any] | None = None,
) -> SelectionRequest:
    """The request with the largest per-training ε (bisection in log ε, 40 steps) whose
    whole workflow is within (``epsilon``, ``delta``); the score's ε is kept as given.
    Any kind with per-candidate trainings (``schema``: as for :func:`plan_selection`).
    Raises PlanError if no calibratable per-training ε fits."""
    if request.budget is None:
        raise PlanError("this request has no per-training budget to calibrate")
    kind = next(k for k, model in REQUEST_MODELS.items() if isinstance(request, model))
    start = request.budget
    refusals: list[PlanError] = []

    def cost(t: float) -> float | None:
        """Whole-workflow ε with per-training ε = t; None if t cannot be calibrated."""
        budget = start.model_copy(update={"training_epsilon": t})
        candidate = request.model_copy(update={"budget": budget})
        try:
            plan = plan_selection(
                kind,  # type: ignore[arg-type]
                candidate,
                dataset=dataset,
                n_rows=n_rows,
                n_features=n_features,
                schema=schema,
            )
        except PlanError as exc:
            refusals.append(exc)
            return None
        return workflow_epsilon(plan, delta=delta)

    # Very small t cannot be calibrated (σ would exceed its cap): start at the smallest
    # calibratable t on a doubling grid up to the largest ε a training may ask for (100);
    # the cost grows with t from there.
    lo, low_cost = 1e-3, None
    while lo <= 100.0 and (low_cost := cost(lo)) is None:
        lo *= 2.0
    if low_cost is None:
        # Never plannable: say why (e.g. a model that does not fit the dataset).
        raise PlanError(f"no per-training ε can be planned: {refusals[-1]}")
    if low_cost > epsilon:
        raise PlanError(f"no per-training ε fits a whole-workflow ε of {epsilon:g}")
    hi = 100.0
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        c = cost(mid)
        lo, hi = (mid, hi) if c is not None and c <= epsilon else (lo, mid)
    return request.model_copy(update={"budget": start.model_copy(update={"training_epsilon": lo})})


# ------------------------------------------------------------------ kind adapter

SelectionKind = Literal["architecture", "hyperparameters", "features"]
SelectionRequest = ArchitectureRequest | HyperparameterRequest | FeatureRequest
REQUEST_MODELS: dict[
    str, type[ArchitectureRequest] | type[HyperparameterRequest] | type[FeatureRequest]
] = {
    "architecture": ArchitectureRequest,
    "hyperparameters": HyperparameterRequest,
    "features": FeatureRequest,
}


def plan_selection(
    kind: SelectionKind,
    request: SelectionRequest,
    *,
    dataset: str,
    n_rows: int,
    n_features: int,
    schema: TabularSchema | dict[str, Any] | None = None,
) -> SelectionPlan:
    """The one plan of a selection job of ``kind`` (raises :class:`PlanError`).
    ``schema`` (the dataset's public schema) is needed by the ``features`` kind only."""
    dataset_kind = (
        str(schema.get("kind", "tabular")) if isinstance(schema, dict) else "tabular"
    )  # the model must fit the dataset's kind (GRU-D on time series): build_plan checks
    if kind == "architecture" and isinstance(request, ArchitectureRequest):
        return architecture_plan(
            request,
            dataset=dataset,
            n_rows=n_rows,
            n_features=n_features,
            dataset_kind=dataset_kind,
        )
    if kind == "hyperparameters" and isinstance(request, HyperparameterRequest):
        return hyperparameter_plan(
            request,
            dataset=dataset,
            n_rows=n_rows,
            n_features=n_features,
            dataset_kind=dataset_kind,
        )
    if kind == "features" and isinstance(request, FeatureRequest):
        if isinstance(schema, dict):
            if schema.get("kind", "tabular") != "tabular":
                raise PlanError("feature selection needs a tabular dataset")
            schema = parse_schema(schema)
        if not isinstance(schema, TabularSchema):
            raise PlanError("feature selection needs the dataset's tabular schema")
        return feature_plan(
            request, dataset=dataset, schema=schema, n_rows=n_rows, n_features=n_features
        )
    raise PlanError(f"request does not match selection kind {kind!r}")


def plan_summary(plan: SelectionPlan, *, delta: float) -> dict[str, Any]:
    """What a quote, the ledger and the model card state about the whole workflow: the
    event (what is charged), its RDP curve on the ledger's orders, (ε, δ) at ``delta``,
    and the public schedule (trainings, or the law of K: never K itself)."""
    curve = plan.event.rdp(ORDERS)
    extra: dict[str, Any] = {}
    if plan.features is not None and plan.features.noise_multiplier is not None:
        extra = {  # DP-CFS: the public noise of the histograms (no trainings)
            "histograms": plan.features.histograms,
            "noise_multiplier": plan.features.noise_multiplier,
            "cell_noise_std": plan.features.cell_scale,
        }
    return {
        **extra,
        "event": plan.event.to_json(),
        "rdp_orders": list(ORDERS),
        "rdp_curve": [float(v) for v in curve],
        "epsilon": epsilon_from_rdp(rdp=curve, orders=ORDERS, delta=delta),
        "delta": delta,
        "guarantee": plan.guarantee,
        "accountant": "rdp",
        "trainings": plan.trainings,
        "runs": None if plan.runs is None else plan.runs.to_json(),
        "n_train_public": plan.n_train,
        "n_val_public": plan.n_val,
    }
