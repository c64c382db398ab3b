"""The methods a job may name, in one table (issue 23): each method (and, for ``expm``, each
sampler) has its own module here with its options' defaults, its plan builder and its
resource estimate, and one entry below with its guarantee label. The worker's table is
worker/mechanisms/registry.py; a contract test checks both tables name the same keys.
Adding a method is its module here, its mechanism there, one line in each table and its name
in ``service.schemas.TRAINING_METHODS`` (with, where it has options, its options model and
the ``JobRequest`` field named after it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from service.methods.auto import choose_auto
from service.methods.common import (
    MethodPlan,
    PlanFacts,
    ResourceEstimate,
    ResourceFacts,
)
from service.methods.dpsgd import (
    dpsgd_guarantee,
    dpsgd_resources,
    dpsgd_work_twin,
    plan_dpsgd,
    resolve_dpsgd_request,
)
from service.methods.expm import (
    langevin_resources,
    mcmc_resources,
    plan_langevin,
    plan_mcmc,
    resolve_expm_request,
)
from service.methods.expm_nf import expm_nf_resources, plan_expm_nf, resolve_expm_nf_request
from service.schemas import Guarantee, JobRequest, PrivacyPlan
from service.schemas.common import AUTO_METHOD
from service.schemas.jobs import MethodChoice

__all__ = ["CHOOSERS", "METHODS", "MethodEntry", "choose_method", "method_key", "plan_key"]


def steps_times_samples(plan: PrivacyPlan) -> int:
    """The job's progress total when each released sample runs the plan's steps."""
    return int(plan.mechanism["steps"]) * plan.samples


@dataclass(frozen=True)
class MethodEntry:
    """A method's plan builder, the guarantee its releases carry (a function of the
    request: DP-SGD's depends on the model and engine), and the estimate of what its plan
    costs the worker (time and memory, from the plan and public facts; service/resources.py
    refuses at quote time what is over the worker's limits)."""

    plan: Callable[[JobRequest, PlanFacts], MethodPlan]
    guarantee: Callable[[JobRequest], Guarantee]
    resources: Callable[[PrivacyPlan, ResourceFacts], ResourceEstimate]
    progress_total: Callable[[PrivacyPlan], int] = steps_times_samples
    """T of the job's "step k of T" from its plan alone (data-independent): the steps its
    mechanism counts; by default each released sample's steps (``steps × samples``)."""
    work_twin: Callable[[JobRequest], JobRequest | None] = lambda _request: None
    """A request whose plan costs the worker what the request's does but is quick to plan
    (service/resources.py ``work_twin``), or None: planning is quick already."""
    resolve: Callable[[JobRequest, PlanFacts], JobRequest] = lambda request, _facts: request
    """The request with every default its plan fills in made explicit, which must plan
    identically (tests/unit/test_admitted_requests.py): stored at admission, it is what the
    worker re-plans, so a later change of a default rule does not fail a queued job. The
    default (the request as sent) suits a method whose plan fills no default."""


def _always(guarantee: Guarantee) -> Callable[[JobRequest], Guarantee]:
    return lambda _request: guarantee


METHODS: dict[tuple[str, str | None], MethodEntry] = {
    ("dpsgd", None): MethodEntry(
        plan_dpsgd,
        dpsgd_guarantee,
        dpsgd_resources,
        work_twin=dpsgd_work_twin,
        resolve=resolve_dpsgd_request,
    ),
    ("expm", "langevin"): MethodEntry(
        plan_langevin, _always("proven"), langevin_resources, resolve=resolve_expm_request
    ),
    ("expm", "mcmc"): MethodEntry(
        plan_mcmc, _always("asymptotic"), mcmc_resources, resolve=resolve_expm_request
    ),
    ("expm_nf", None): MethodEntry(
        # One flow is trained for all the samples: its steps are the job's.
        plan_expm_nf,
        _always("nominal"),
        expm_nf_resources,
        lambda plan: int(plan.mechanism["steps"]),
        resolve=resolve_expm_nf_request,
    ),
}


def method_key(request: JobRequest) -> tuple[str, str | None]:
    """A request's key in :data:`METHODS`: its method, and for ``expm`` its sampler
    (langevin unless the request names mcmc)."""
    if request.method == "expm":
        return (
            "expm",
            "mcmc" if request.expm is not None and request.expm.sampler == "mcmc" else "langevin",
        )
    return request.method, None


def plan_key(plan: PrivacyPlan) -> tuple[str, str | None]:
    """A plan's key in :data:`METHODS`: its method, and for ``expm`` the sampler its
    mechanism names (as worker/mechanisms/registry.py's ``mechanism_key``)."""
    sampler = plan.mechanism.get("sampler") if plan.method == "expm" else None
    return plan.method, None if sampler is None else str(sampler)


class MethodChooser(Protocol):
    """A rule choosing a request's method from public facts: the request with the chosen
    method, and the choice (a :class:`PlanError` where the request does not fit the rule)."""

    def __call__(
        self, request: JobRequest, facts: PlanFacts, *, n_classes: int
    ) -> tuple[JobRequest, MethodChoice]: ...


CHOOSERS: dict[str, MethodChooser] = {AUTO_METHOD: choose_auto}
"""The request methods that are not methods but a rule choosing one (``auto``,
service/methods/auto.py), by name."""


def choose_method(
    request: JobRequest, facts: PlanFacts, *, n_classes: int
) -> tuple[JobRequest, MethodChoice | None]:
    """``request`` with its method chosen where it names a rule of :data:`CHOOSERS`, and the
    choice (None: the request named its method and is returned as it is)."""
    chooser = CHOOSERS.get(request.method)
    return (request, None) if chooser is None else chooser(request, facts, n_classes=n_classes)
