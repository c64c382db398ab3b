"""ExpM+NF's plan (method ``expm_nf``, nominal): the exponential mechanism's ε and the flow
sampler's sizes. The worker's side is worker/mechanisms/expm_nf.py."""

from __future__ import annotations

from typing import Any

from service.methods.common import MethodPlan, PlanError, PlanFacts
from service.privacy.events import DpEvent, ExponentialMechanismEvent
from service.schemas import ExpmNfOptions, JobRequest

# ExpM+NF's sampler defaults per model family: (steps, θ samples per step, rows per step).
# Tabular: tuned on Adult (benchmarks/expm_adult.py). GRU-D keeps T hidden states per
# (θ, row) pair (≈ 55 KiB at T = 48, H = 16, benchmarks/results/grud_memory.md): 32 × 64
# pairs a step, ≈ 0.35 s on one CPU thread for the bundled ICU sample (8 variables, 48 h);
# the whole default job at ε = 1 took 228 s on a shared 2-core machine (one run, holdout
# AUC 0.847, as DP-SGD's default job). Not tuned for utility.
EXPM_NF_DEFAULTS = {"tabular": (1500, 64, 1024), "grud": (300, 32, 64)}


def resolve_expm_nf_options(options: ExpmNfOptions, *, model_kind: str) -> ExpmNfOptions:
    """Fill the sampler sizes the request left out, by the model's family (public)."""
    steps, samples, batch = EXPM_NF_DEFAULTS["grud" if model_kind == "grud" else "tabular"]
    return options.model_copy(
        update={
            "steps": options.steps or steps,
            "n_samples_per_step": options.n_samples_per_step or samples,
            "batch_size": options.batch_size or batch,
        }
    )


def _expm_plan(request: JobRequest) -> tuple[DpEvent, dict[str, Any], str]:
    options = resolve_expm_nf_options(
        request.expm_nf or ExpmNfOptions(), model_kind=request.model.kind
    )
    if request.delta != 0:
        raise PlanError("expm_nf is a pure ε-DP mechanism: send delta = 0")
    # u = −Σ(ŷ−y)² − λ‖θ‖² with ŷ = sigmoid(·) ∈ [0,1], y ∈ [0,1]: adding or removing one
    # row changes u by a(θ) ∈ [0,1], always with the same sign (monotone), so a density
    # ∝ exp(ε·u/s), s = 1, is ε-DP and ε-bounded-range under add/remove (proof:
    # worker/mechanisms/expm_nf.py; McSherry & Talwar 2007). Not valid under replace-one.
    mechanism = {
        # The domain key is left out when unset, so that plans stay identical, key for
        # key, to those stored before domains existed (the worker compares).
        **options.model_dump(exclude={"domain_radius"} if options.domain_radius is None else None),
        "epsilon": request.epsilon,
        "sensitivity": 1.0,
        "calibration": "monotone",
    }
    return ExponentialMechanismEvent(epsilon=request.epsilon), mechanism, "pure-composition"


def plan_expm_nf(request: JobRequest, facts: PlanFacts) -> MethodPlan:
    """The registry's entry for ``expm_nf`` (nominal)."""
    return _expm_plan(request)
