"""The methods a job may name, in one table (issue 23): each method (and, for ``expm``, each
sampler) has its own module here with its options' defaults and its plan builder, and one
entry below with its guarantee label. The worker's table is worker/mechanisms/registry.py;
a contract test checks both tables name the same keys. Adding a method is its module
here, its mechanism there, and one line in each table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.methods.common import MethodPlan, PlanFacts
from service.methods.dpsgd import dpsgd_guarantee, plan_dpsgd
from service.methods.expm import plan_langevin, plan_mcmc
from service.methods.expm_nf import plan_expm_nf
from service.schemas import Guarantee, JobRequest

__all__ = ["METHODS", "MethodEntry", "method_key"]


@dataclass(frozen=True)
class MethodEntry:
    """A method's plan builder and the guarantee its releases carry (a function of the
    request: DP-SGD's depends on the model and engine)."""

    plan: Callable[[JobRequest, PlanFacts], MethodPlan]
    guarantee: Callable[[JobRequest], Guarantee]


def _always(guarantee: Guarantee) -> Callable[[JobRequest], Guarantee]:
    return lambda _request: guarantee


METHODS: dict[tuple[str, str | None], MethodEntry] = {
    ("dpsgd", None): MethodEntry(plan_dpsgd, dpsgd_guarantee),
    ("expm", "langevin"): MethodEntry(plan_langevin, _always("proven")),
    ("expm", "mcmc"): MethodEntry(plan_mcmc, _always("asymptotic")),
    ("expm_nf", None): MethodEntry(plan_expm_nf, _always("nominal")),
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
