"""The ``hyperparameters`` selection kind (Papernot & Steinke 2022 random search over a
grid of DP-SGD settings): its request, a run's drawn settings, its model fitted to the
dataset (:func:`fit_model`: a CNN on an image dataset) and its plan. The charge is
described in :mod:`service.selection.plans`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from service.modelspec import CnnSpec, MlpSpec, ModelSpec
from service.params import BatchSize, ClipNorm, Epochs, InputModel, LearningRate, NoiseDecay
from service.plans import PlanError, with_image_shape
from service.privacy.events import ComposedEvent, RandomStoppingEvent
from service.privacy.sampling import count_event
from service.schemas import DpsgdOptions, JobRequest
from service.selection.budget import SelectionBudget
from service.selection.plan_core import SelectionPlan, split_counts, training_events
from service.selection.runs_spec import PoissonRunsSpec, TnbRunsSpec, runs_distribution

__all__ = ["HyperparameterCandidate", "HyperparameterRequest", "fit_model", "hyperparameter_plan"]


class _In(InputModel):
    pass


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


def fit_model(
    request: HyperparameterRequest, public_schema: Mapping[str, Any] | None
) -> HyperparameterRequest:
    """``request`` with a CNN model given the image dataset's public shape (C, H, W), as a
    DP-SGD job's is (:func:`service.plans.with_image_shape`: a shape the request states must
    equal the dataset's, and the network must fit the images); the classes are fitted after
    this (:func:`service.selection.kinds.fit_to_classes`). A CNN on any other kind of
    dataset is a :class:`PlanError`. Any other model is returned unchanged (its dump, hence
    its plan's digest, is what it was before CNN tuning)."""
    if not isinstance(request.model, CnnSpec):
        return request
    kind = str((public_schema or {}).get("kind", "tabular"))
    if public_schema is None or kind != "images":
        raise PlanError(
            f"hyperparameter tuning of model 'cnn' needs an image dataset; this dataset is "
            f"{kind}: tune model 'logistic' or 'mlp' on tabular data, 'grud' on time series"
        )
    probe = JobRequest(dataset="-", method="dpsgd", epsilon=1.0, model=request.model)
    fitted = with_image_shape(probe, dict(public_schema)).model
    return request.model_copy(update={"model": fitted})


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
    train, mechanisms, guarantee = training_events(
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
    runs = runs_distribution(request.runs)
    return SelectionPlan(
        event=RandomStoppingEvent(event=q, runs=runs),
        trainings=None,
        n_train=n_train,
        n_val=n_val,
        mechanisms=mechanisms,
        training_guarantee=guarantee,
        runs=runs,
    )
