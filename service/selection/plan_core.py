"""What every selection kind's plan shares: :class:`SelectionPlan` (the one charge and the
public values the worker needs), the public training/validation split counts, the
DP-SGD training events of the candidates (σ calibrated for the largest model, one per
privacy key) and one candidate's mechanism. The data use and the charges are described
in :mod:`service.selection.plans`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from service.modelspec import ModelSpec
from service.plans import PlanError, build_plan
from service.privacy.events import AnyOfEvent, DpEvent, event_from_json
from service.privacy.tuning import RunsDistribution
from service.schemas import DpsgdOptions, JobRequest
from service.selection.budget import SelectionBudget
from service.selection.features import FeatureLayout

__all__ = ["SelectionPlan", "candidate_mechanism", "split_counts", "training_events"]


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
    # The DP-SGD trainings' guarantee: nominal if any candidate's job plan is not proven
    # (service.methods.dpsgd.dpsgd_guarantee says which models and engines are).
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


def training_events(
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
        plan = build_plan(
            request,
            n_rows=n_train,
            n_features=n_features,
            dataset_kind=dataset_kind,
            # A model fitted to K ≥ 3 classes (selection.kinds.fit_to_classes); else binary.
            n_classes=getattr(model, "classes", None) or 2,
        )
        events.append(event_from_json(plan.event))
        mechanisms[(batch, epochs, decay)] = dict(plan.mechanism)
        if plan.guarantee != "proven":
            guarantee = "nominal"
    one = events[0] if len(events) == 1 else AnyOfEvent(events=tuple(events))
    return one, mechanisms, guarantee


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
