"""Selection jobs (POST /v1/selections) as jobs: the API body, its resolution into a stored
job request, and the job's privacy plan.

A selection is a :class:`~service.ledger.tables.Job` with method ``selection``: the same
table, admission, queue, sweeper, progress, cancel and release as a training job. The
body names the *whole workflow's* (ε, δ); the service resolves it, before any charge, into
the kind's request of :mod:`service.selection.plans` with a per-candidate budget: the
caller's ``training_epsilon`` if given, otherwise the largest one whose workflow fits ε
(:func:`service.selection.plans.with_total_epsilon`). The resolved request is what the job
stores (``JobRequest.selection``), so the worker re-derives exactly the charged plan
without repeating the calibration.

The plan's event (the kind's one composed or random-stopping event) is admitted as one
charge; its stated ε is that event's RDP curve converted at δ on the ledger's orders, the
same conversion the ledger's filter uses, so what is stated is what is charged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, RootModel, ValidationError, model_validator

from service.datasets.kinds import DEFAULT_KIND
from service.methods.dpsgd import resolve_dpsgd_options
from service.modelspec import CnnSpec, GrudSpec, LogisticSpec, MlpSpec, ModelSpec
from service.params import (
    BatchSize,
    ClipNorm,
    Epochs,
    Epsilon,
    InputModel,
    LearningRate,
    NoiseDecay,
    PositiveDelta,
    Probability,
)
from service.plans import PlanError, data_kind
from service.schemas import DpsgdOptions, ExpmNfOptions, JobRequest, PrivacyPlan
from service.selection.architecture import fit_space
from service.selection.features import (
    MAX_FEATURE_COLUMNS,
    FeatureGa,
    FeatureRequest,
    FinalTraining,
)
from service.selection.plans import (
    REQUEST_MODELS,
    ArchitectureRequest,
    HyperparameterRequest,
    PoissonRunsSpec,
    SelectionBudget,
    SelectionKind,
    SelectionPlan,
    TnbRunsSpec,
    fit_to_dataset,
    plan_selection,
    plan_summary,
    split_counts,
    with_total_epsilon,
)
from service.selection.search_space import ArchitectureSearch, ArchitectureSpace

__all__ = [
    "ArchitectureSelection",
    "FeatureSelection",
    "HyperparameterSelection",
    "ResolvedSelection",
    "SelectionRequest",
    "job_request",
    "n_features_of",
    "plan_selection_job",
    "privacy_plan",
    "resolve_training_defaults",
    "resolved_selection",
]


MAX_PRIVACY_SETTINGS = 8
"""Most distinct DP-SGD privacy settings (batch size × epochs × noise decay) one selection
may declare: each is calibrated separately, at every step of the per-training ε's
bisection (about 0.03 s each, times some 50 steps), before the request is answered."""


def _check_settings(count: int) -> None:
    if count > MAX_PRIVACY_SETTINGS:
        raise ValueError(
            f"{count} distinct DP-SGD privacy settings (batch size × epochs × noise decay); "
            f"at most {MAX_PRIVACY_SETTINGS} per selection"
        )


class _Body(InputModel):
    dataset: str = Field(min_length=1, max_length=64)
    epsilon: Epsilon = Field(description="ε (nats) of the whole workflow, at most.")
    delta: PositiveDelta = Field(
        description="δ of the whole workflow (the trainings are DP-SGD: > 0)."
    )
    training_epsilon: Epsilon | None = Field(
        default=None,
        description=(
            "ε of each DP-SGD training. Default: the largest whose whole workflow fits "
            "epsilon. Given: the workflow's ε must still fit epsilon."
        ),
    )
    fitness_epsilon: Epsilon = Field(default=0.1, description="ε of each noisy validation score.")
    validation_fraction: Probability = Field(
        default=0.2, description="Public probability that a row is for validation."
    )


class ArchitectureSelection(_Body):
    """Architecture search (RS, MGRS, PAAS; RS with random stopping when ``runs`` is set)."""

    kind: Literal["architecture"]
    space: ArchitectureSpace = Field(default_factory=ArchitectureSpace)
    search: ArchitectureSearch = Field(default_factory=ArchitectureSearch)
    method: Literal["dpsgd", "expm_nf"] = Field(
        default="dpsgd",
        description="dpsgd (proven) or expm_nf (NOMINAL ε: needs the nominal switch)",
    )
    training: DpsgdOptions = Field(default_factory=DpsgdOptions)
    expm_nf: ExpmNfOptions | None = Field(default=None, description="method expm_nf only")
    runs: TnbRunsSpec | PoissonRunsSpec | None = Field(
        default=None,
        discriminator="kind",
        description="rs only: a random number of candidates (Papernot & Steinke 2022)",
    )
    scoring: Literal["noisy_scores", "report_noisy_max"] = Field(
        default="noisy_scores",
        description="rs without runs: report_noisy_max charges one score ε for all N, "
        "releases no score",
    )

    @model_validator(mode="after")
    def _few_settings(self) -> ArchitectureSelection:
        _check_settings(len(set(self.space.batch_sizes)))
        return self


class HyperparameterSelection(_Body):
    """Hyperparameter tuning by Papernot & Steinke (2022) random stopping over a grid."""

    kind: Literal["hyperparameters"]
    model: ModelSpec = Field(default_factory=lambda: MlpSpec())
    learning_rates: list[LearningRate] = Field(default=[0.5, 1.0, 2.0], min_length=1, max_length=16)
    batch_sizes: list[BatchSize] = Field(default=[128], min_length=1, max_length=8)
    epochs: list[Epochs] = Field(default=[3], min_length=1, max_length=8)
    max_grad_norms: list[ClipNorm] = Field(default=[1.0], min_length=1, max_length=8)
    noise_decays: list[NoiseDecay | None] = Field(default=[None], min_length=1, max_length=4)
    runs: TnbRunsSpec | PoissonRunsSpec = Field(default_factory=TnbRunsSpec, discriminator="kind")

    @model_validator(mode="after")
    def _few_settings(self) -> HyperparameterSelection:
        _check_settings(
            len(set(self.batch_sizes)) * len(set(self.epochs)) * len(set(self.noise_decays))
        )
        return self


class FeatureSelection(_Body):
    """Feature selection: DP-CFS (``cfs_greedy``, ``cfs_ga``: noisy histograms, one charge
    of the whole (ε, δ), the search is post-processing) or PAFS (``pafs``: a genetic search
    whose fitness is a DP-SGD model's noisy validation accuracy)."""

    kind: Literal["features"]
    method: Literal["cfs_greedy", "cfs_ga", "pafs"] = "cfs_greedy"
    numeric_bins: int = Field(default=8, ge=2, le=32)
    max_selected: int | None = Field(default=None, ge=1, le=MAX_FEATURE_COLUMNS)
    ga: FeatureGa = Field(default_factory=FeatureGa)
    model: MlpSpec = Field(default_factory=lambda: MlpSpec(hidden=[16]), description="pafs")
    training: DpsgdOptions = Field(default_factory=DpsgdOptions, description="pafs")
    final: FinalTraining | None = Field(
        default=None,
        description=(
            "cfs_*: also a DP-SGD model on the selected columns, at its own (ε, δ); the "
            "histograms get the rest of epsilon (epsilon − final.epsilon)"
        ),
    )


# One branch per kind: a new kind (``features``) is one more member here and in
# service.selection.plans.REQUEST_MODELS.
class SelectionRequest(
    RootModel[
        Annotated[
            ArchitectureSelection | HyperparameterSelection | FeatureSelection,
            Field(discriminator="kind"),
        ]
    ]
):
    """The body of POST /v1/selections and its quote, discriminated on ``kind``. ε in
    nats and δ a probability, both for the whole workflow."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "dataset": "adult",
                    "kind": "architecture",
                    "epsilon": 2.0,
                    "delta": 1e-6,
                    "space": {"depths": [1, 2], "widths": [8, 32]},
                    "search": {"algorithm": "rs", "trainings": 4},
                    "training": {"epochs": 2, "batch_size": 256},
                },
                {
                    "dataset": "adult",
                    "kind": "hyperparameters",
                    "epsilon": 2.0,
                    "delta": 1e-6,
                    "learning_rates": [0.5, 1.0, 2.0],
                    "epochs": [2],
                    "batch_sizes": [256],
                    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.2},
                },
                {
                    "dataset": "adult",
                    "kind": "features",
                    "epsilon": 1.0,
                    "delta": 1e-6,
                    "method": "cfs_greedy",
                    "max_selected": 5,
                },
            ]
        }
    )


_BODY_FIELDS = set(_Body.model_fields) | {"kind"}


def _messages(exc: ValidationError) -> str:
    return "; ".join(str(e["msg"]) for e in exc.errors())


Body = ArchitectureSelection | HyperparameterSelection | FeatureSelection
KindRequest = ArchitectureRequest | HyperparameterRequest | FeatureRequest


@dataclass(frozen=True)
class ResolvedSelection:
    """A selection job's kind, its kind request (budget resolved) and its plan."""

    kind: SelectionKind
    request: KindRequest
    plan: SelectionPlan


def _kind_request(body: Body, training_epsilon: float) -> KindRequest:
    fields = body.model_dump(exclude=_BODY_FIELDS)
    if isinstance(body, FeatureSelection) and body.method != "pafs":
        # DP-CFS: one Gaussian charge of the whole (ε, δ); no trainings, no scores.
        if body.training_epsilon is not None:
            raise PlanError(f"training_epsilon applies to pafs, not {body.method}")
        statistics = body.epsilon - (0.0 if body.final is None else body.final.epsilon)
        if statistics <= 0:
            raise PlanError("final.epsilon leaves nothing of epsilon for the histograms")
        fields |= {"epsilon": statistics, "delta": body.delta}
    else:
        fields["budget"] = SelectionBudget(
            training_epsilon=training_epsilon,
            training_delta=body.delta,
            fitness_epsilon=body.fitness_epsilon,
            validation_fraction=body.validation_fraction,
        )
    try:
        return REQUEST_MODELS[body.kind].model_validate(fields)
    except ValidationError as exc:
        raise PlanError(_messages(exc)) from exc


def job_request(body: Body, *, n_rows: int, public_schema: dict[str, Any]) -> JobRequest:
    """The job request stored for ``body``: its per-candidate budget resolved (calibrated
    from the workflow's ε unless given). Raises :class:`PlanError` (→ 422)."""
    request = _kind_request(body, body.training_epsilon or body.epsilon)
    if isinstance(request, ArchitectureRequest):
        # Stored fitted: the space's model (CNNs on images), a CNN's image shape and classes.
        request = fit_space(request, public_schema)
    if isinstance(request, HyperparameterRequest) and isinstance(request.model, CnnSpec | GrudSpec):
        # A tuned CNN is stored fitted too (image shape, classes), and a tuned GRU-D (its
        # classes: K logits on a K-class outcome; a binary one is unchanged): the job's
        # model, its plan's and its estimate's. Other models are stored as sent (digests
        # unchanged).
        request = fit_to_dataset(body.kind, request, public_schema)
    if body.training_epsilon is None and request.budget is not None:
        request = with_total_epsilon(
            request,
            epsilon=body.epsilon,
            delta=body.delta,
            dataset=body.dataset,
            n_rows=n_rows,
            n_features=n_features_of(public_schema),
            schema=public_schema,
        )
    model: ModelSpec
    if isinstance(request, ArchitectureRequest):
        model = request.space.largest()
    elif isinstance(request, FeatureRequest) and request.method != "pafs":
        # DP-CFS trains nothing unless a final model is asked for
        model = LogisticSpec() if request.final is None else request.final.model
    else:
        model = request.model
    return JobRequest(
        dataset=body.dataset,
        method="selection",
        model=model,
        epsilon=body.epsilon,
        delta=body.delta,
        selection={"kind": body.kind, "request": request.model_dump(mode="json")},
    )


def resolve_training_defaults(request: JobRequest, *, n_rows: int) -> JobRequest:
    """``request`` (a stored selection job's) with the DP-SGD defaults its plan fills in
    written out: the batch size and epochs :func:`service.methods.dpsgd.resolve_dpsgd_options`
    gives an architecture search's or PAFS's trainings (on the public training split) or a
    DP-CFS final model (on every row), as their plans compute them. It plans identically;
    admission stores it as the job's admitted request (``Job.resolved_request``), so a
    default rule changed between admission and run leaves the plan reproducible (the
    training jobs' counterpart is :func:`service.plans.resolve_defaults`)."""
    if request.selection is None or request.selection.get("kind") not in REQUEST_MODELS:
        return request
    kind_request = REQUEST_MODELS[request.selection["kind"]].model_validate(
        request.selection.get("request")
    )
    resolved: ArchitectureRequest | HyperparameterRequest | FeatureRequest = kind_request
    searched = isinstance(kind_request, ArchitectureRequest) and kind_request.method == "dpsgd"
    pafs = isinstance(kind_request, FeatureRequest) and kind_request.budget is not None
    if (searched or pafs) and isinstance(kind_request, ArchitectureRequest | FeatureRequest):
        assert kind_request.budget is not None
        n_train, _ = split_counts(n_rows, kind_request.budget.validation_fraction)
        training = resolve_dpsgd_options(kind_request.training, n_rows=n_train)
        resolved = kind_request.model_copy(update={"training": training})
    elif isinstance(kind_request, FeatureRequest) and kind_request.final is not None:
        final = kind_request.final
        training = resolve_dpsgd_options(final.training, n_rows=n_rows)
        resolved = kind_request.model_copy(
            update={"final": final.model_copy(update={"training": training})}
        )
    if resolved is kind_request:
        return request
    selection = {**request.selection, "request": resolved.model_dump(mode="json")}
    return request.model_copy(update={"selection": selection})


def resolved_selection(
    request: JobRequest, *, n_rows: int, public_schema: dict[str, Any]
) -> ResolvedSelection:
    """The kind request and plan of a stored selection job (API and worker alike)."""
    if request.method != "selection" or request.selection is None:
        raise PlanError("not a selection job")
    kind = request.selection.get("kind")
    if kind not in REQUEST_MODELS:
        raise PlanError(f"unknown selection kind {kind!r}")
    try:
        kind_request = REQUEST_MODELS[kind].model_validate(request.selection.get("request"))
    except ValidationError as exc:
        raise PlanError(_messages(exc)) from exc
    # The candidates' space or model fitted to the dataset, as the worker trains them.
    kind_request = fit_to_dataset(kind, kind_request, public_schema)
    plan = plan_selection(
        kind,
        kind_request,
        dataset=request.dataset,
        n_rows=n_rows,
        n_features=n_features_of(public_schema),
        schema=public_schema,
    )
    return ResolvedSelection(kind=kind, request=kind_request, plan=plan)


def privacy_plan(request: JobRequest, resolved: ResolvedSelection, *, n_rows: int) -> PrivacyPlan:
    """The job's plan: one event for the whole workflow, its stated (ε, δ) (the charged
    curve converted at δ; refused if above the request's ε), and the public schedule."""
    summary = plan_summary(resolved.plan, delta=request.delta)
    if summary["epsilon"] > request.epsilon * (1 + 1e-9):
        raise PlanError(
            f"this workflow costs ε = {summary['epsilon']:.4g} at δ = {request.delta:g}, more "
            f"than the {request.epsilon:g} requested: lower training_epsilon, fitness_epsilon "
            "or the number of trainings"
        )
    budget = resolved.request.budget
    stages: dict[str, Any]
    if isinstance(resolved.request, FeatureRequest) and budget is None:
        # DP-CFS: the noisy histograms, and the final model's training if asked for
        final = resolved.request.final
        stages = {
            "statistics": {
                "epsilon": resolved.request.epsilon,
                "delta": request.delta,
                "mechanism": "Gaussian noise on the histograms",
                **{
                    k: summary[k]
                    for k in ("histograms", "noise_multiplier", "cell_noise_std")
                    if k in summary
                },
            }
        }
        if final is not None:
            stages["final"] = {"epsilon": final.epsilon, "delta": final.delta, "mechanism": "dpsgd"}
    else:
        assert budget is not None
        expm = resolved.plan.expm_mechanism is not None
        stages = {
            "training": {
                "epsilon": budget.training_epsilon,
                "delta": 0.0 if expm else budget.training_delta,
                "mechanism": "expm_nf" if expm else "dpsgd",
            },
            "fitness": {
                "epsilon": budget.fitness_epsilon,
                "delta": 0.0,
                "mechanism": "noisy count",
            },
        }
    mechanism: dict[str, Any] = {
        "kind": resolved.kind,
        "trainings": resolved.plan.trainings,
        "runs": summary["runs"],
        "n_train_public": resolved.plan.n_train,
        "n_val_public": resolved.plan.n_val,
        "validation_fraction": None if budget is None else budget.validation_fraction,
        "stages": stages,
        "candidates": [
            {"batch_size": b, "epochs": e, "noise_decay": d, **m}
            for (b, e, d), m in sorted(resolved.plan.mechanisms.items(), key=repr)
        ],
    }
    if resolved.plan.expm_mechanism is not None:
        mechanism["expm_nf"] = resolved.plan.expm_mechanism
    space = getattr(resolved.request, "space", None)
    if isinstance(space, ArchitectureSpace) and space.model == "cnn":
        # The time and memory estimates' models (service/resources.py): each candidate's
        # cost is at most one of theirs (ArchitectureSpace.cnn_extremes).
        mechanism["cost_models"] = [m.model_dump() for m in space.cnn_extremes()]
    return PrivacyPlan(
        method="selection",
        dataset=request.dataset,
        n_rows=n_rows,
        model=request.model.model_dump(),
        epsilon=float(summary["epsilon"]),
        delta=request.delta,
        guarantee=resolved.plan.guarantee,
        accountant="rdp",
        samples=1,
        event=summary["event"],
        rdp_orders=summary["rdp_orders"],
        rdp_curve=summary["rdp_curve"],
        mechanism=mechanism,
    )


def n_features_of(public_schema: dict[str, Any]) -> int:
    """The width candidates are built with: a tabular dataset's encoded width, or a time
    series' number of variables V (GRU-D candidates; the features kind refuses those):
    the schema's ``n_features`` as its kind's DATA_KINDS entry parses it."""
    entry = data_kind(str(public_schema.get("kind", DEFAULT_KIND)))
    return entry.parse(public_schema).n_features


def plan_selection_job(
    request: JobRequest, *, n_rows: int, public_schema: dict[str, Any]
) -> tuple[ResolvedSelection, PrivacyPlan]:
    """The stored selection job's kind request, selection plan and privacy plan (the API
    before admission, the worker before it reads data; the worker refuses a mismatch)."""
    resolved = resolved_selection(request, n_rows=n_rows, public_schema=public_schema)
    return resolved, privacy_plan(request, resolved, n_rows=n_rows)
