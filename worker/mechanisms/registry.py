"""The worker's mechanisms in one table: a plan's (method, sampler) names the function that
runs it (issue 23: the runner used to pick them in an ``if … elif`` chain). Adding a method
on the worker side is its own module plus one line here; the service side's plan names the
same key (``plan.method`` and, for ``expm``, ``plan.mechanism["sampler"]``).

Entries are resolved lazily (importlib), so a worker loads only the mechanism it runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from service.modelspec import CnnSpec, GrudSpec, LogisticSpec, MlpSpec, ModelSpec
from service.plans import PlanError
from service.schemas import PrivacyPlan
from worker.mechanisms.base import MechanismOutput, ProgressFn, TabularTrainingSet

__all__ = ["MECHANISMS", "Mechanism", "mechanism_key", "run_mechanism"]


@dataclass(frozen=True)
class Mechanism:
    """Where a mechanism lives. ``takes_plan``: the function takes the whole plan
    (``plan=``); otherwise the plan's mechanism parameters and sample count
    (``mechanism=``, ``samples=``)."""

    module: str
    function: str
    takes_plan: bool = False

    def resolve(self) -> Any:
        return getattr(importlib.import_module(self.module), self.function)


MECHANISMS: dict[tuple[str, str | None], Mechanism] = {
    ("dpsgd", None): Mechanism("worker.mechanisms.dpsgd", "run_dpsgd"),
    ("expm_nf", None): Mechanism("worker.mechanisms.expm_job", "run_expm_nf_plan", True),
    # Both Langevin charges (composition, hidden iterates) enter here: langevin_hidden.py
    # runs the plan's chain (langevin.py's for composition plans).
    ("expm", "langevin"): Mechanism("worker.mechanisms.langevin_hidden", "run_langevin_plan"),
    ("expm", "mcmc"): Mechanism("worker.mechanisms.mcmc", "run_expm_mcmc"),
}


def mechanism_key(plan: PrivacyPlan) -> tuple[str, str | None]:
    """The registry key of a plan: its method, and its sampler where the method has several
    (``expm``: langevin or mcmc)."""
    sampler = plan.mechanism.get("sampler") if plan.method == "expm" else None
    return plan.method, None if sampler is None else str(sampler)


def run_mechanism(
    *,
    plan: PrivacyPlan,
    spec: ModelSpec,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    """Run the plan's registered mechanism (a :class:`PlanError` for an unknown one)."""
    entry = MECHANISMS.get(mechanism_key(plan))
    if entry is None:
        raise PlanError(f"no mechanism for method {plan.method!r} ({mechanism_key(plan)})")
    run = entry.resolve()
    # The plan's model is the request's fitted to the dataset's public classes: a logistic
    # MLP or GRU-D model of a K-class target carries classes: K (service.plans.with_classes).
    classes = plan.model.get("classes")
    k_logits = (LogisticSpec, MlpSpec, GrudSpec)
    if classes is not None and isinstance(spec, k_logits) and spec.classes != classes:
        spec = spec.model_copy(update={"classes": int(classes)})
    if isinstance(spec, CnnSpec):  # and a CNN the dataset's image shape (service.plans)
        spec = CnnSpec.model_validate(plan.model)
    if entry.takes_plan:
        out = run(plan=plan, spec=spec, data=data, device=device, progress=progress)
    else:
        out = run(
            spec=spec,
            mechanism=plan.mechanism,
            samples=plan.samples,
            data=data,
            device=device,
            progress=progress,
        )
    assert isinstance(out, MechanismOutput)
    return out
