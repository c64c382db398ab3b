"""The ``architecture`` selection kind: its request and its plan (RS, MGRS, PAAS; RS with
random stopping or Report Noisy Max; DP-SGD or ExpM+NF candidates). The charges are
described in :mod:`service.selection.plans`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from service.datasets.images import ImageSchema
from service.datasets.timeseries import TimeSeriesSchema
from service.methods.dpsgd import resolve_dpsgd_options
from service.modelspec import ModelSpec, cnn_parameter_count
from service.params import InputModel
from service.plans import PlanError, build_plan
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    RandomStoppingEvent,
    SelfComposedEvent,
    event_from_json,
)
from service.privacy.sampling import count_event
from service.schemas import DpsgdOptions, ExpmNfOptions, JobRequest
from service.selection.budget import SelectionBudget
from service.selection.plan_core import SelectionPlan, split_counts, training_events
from service.selection.runs_spec import PoissonRunsSpec, TnbRunsSpec, runs_distribution
from service.selection.search_space import (
    ArchitectureCandidate,
    ArchitectureSearch,
    ArchitectureSpace,
    planned_trainings,
)

__all__ = [
    "ArchitectureRequest",
    "architecture_key",
    "architecture_plan",
    "expm_candidate_plan",
    "fit_space",
]


class _In(InputModel):
    pass


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


def fit_space(
    request: ArchitectureRequest, public_schema: Mapping[str, Any] | None
) -> ArchitectureRequest:
    """``request`` with its space fitted to the dataset (public schema): ``model`` left out
    becomes the kind's (``cnn`` on an image dataset, ``mlp`` otherwise); a CNN space gets
    the images' shape and, for K ≥ 3 classes, K (given ones must equal the dataset's), its
    activation ReLU, and every candidate's network must fit the images (checked on
    :meth:`~service.selection.search_space.ArchitectureSpace.cnn_extremes`: a candidate's
    geometry does not depend on its channels). A CNN space on another kind, or an MLP or
    GRU-D space on images, is a :class:`PlanError`. A GRU-D space on a time series whose
    outcome declares K ≥ 3 classes gets K (:func:`_grud_classes`). An MLP or binary GRU-D
    space is otherwise unchanged (its dump, hence its plan's digest, is what it was before
    CNN spaces)."""
    kind = str((public_schema or {}).get("kind", "tabular"))
    space = request.space
    model = space.model or ("cnn" if kind == "images" else "mlp")
    if model == "cnn" and kind != "images":
        raise PlanError(
            f"a CNN architecture space (space.model 'cnn') needs an image dataset; this "
            f"dataset is {kind}: search model 'mlp' on tabular data, 'grud' on time series"
        )
    if model != "cnn" and kind == "images":
        raise PlanError(
            f"architecture search on an image dataset searches CNNs (space.model 'cnn', "
            f"the default there), not space.model {model!r}"
        )
    if model == "grud" and kind == "timeseries":
        return request.model_copy(update={"space": _grud_classes(space, public_schema or {})})
    if model != "cnn":
        return request.model_copy(update={"space": space.model_copy(update={"model": model})})
    try:
        schema = ImageSchema.model_validate(dict(public_schema or {}))
        c, h, w = schema.shape
        image = {"channels": c, "height": h, "width": w}
        classes = schema.n_classes if schema.n_classes >= 3 else None
        given = space.image.model_dump() if space.image is not None else image
        if given != image:
            raise ValueError(f"space.image {given} differs from the dataset's {image}")
        if space.classes is not None and space.classes != classes:
            raise ValueError(
                f"space.classes {space.classes} differs from the dataset's {schema.n_classes}"
            )
        fitted = type(space).model_validate(
            {
                **space.model_dump(),
                "model": "cnn",
                "activations": ["relu"],
                "image": image,
                "classes": classes,
            }
        )
    except ValidationError as exc:
        raise PlanError(f"space: {exc.errors()[0]['msg']}") from None
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    for spec in fitted.cnn_extremes():
        try:
            cnn_parameter_count(spec)  # ValueError where a network does not fit the images
        except ValueError as exc:
            raise PlanError(
                f"a candidate of the CNN space does not fit the images: {exc}"
            ) from None
    return request.model_copy(update={"space": fitted})


def _grud_classes(space: ArchitectureSpace, public_schema: Mapping[str, Any]) -> ArchitectureSpace:
    """A GRU-D space fitted to the time series' outcome: ``classes`` K where the outcome
    declares K ≥ 3 classes (every candidate then ends in K logits, as a K-class GRU-D job's
    model, service.plans.with_classes), left out for a binary one (its dump, hence its
    plan's digest, as before). A ``classes`` given must equal the dataset's."""
    try:
        n_classes = TimeSeriesSchema.model_validate(dict(public_schema)).n_classes
    except ValidationError as exc:
        raise PlanError(
            f"the dataset's public schema is not valid: {exc.error_count()} error(s)"
        ) from None
    classes = n_classes if n_classes >= 3 else None
    if space.classes != classes and space.classes is not None:
        raise PlanError(f"space.classes {space.classes} differs from the dataset's {n_classes}")
    if classes is None:
        return space
    return type(space).model_validate({**space.model_dump(), "classes": classes})


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
        train, mechanisms, guarantee = training_events(
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
        runs = runs_distribution(request.runs)
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
