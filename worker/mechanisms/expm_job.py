"""ExpM+NF as a job: the plan's resolved parameters → :func:`run_expm_nf`.

The plan's ε was charged for the mechanism of :mod:`worker.mechanisms.expm_nf` (density
∝ exp(ε·u/s), add/remove neighbours, s = 1); a plan that states another sensitivity or
calibration is refused rather than run under a different mechanism.
"""

from __future__ import annotations

from typing import Any

import torch

from service.modelspec import GrudSpec, ModelSpec
from service.schemas import PrivacyPlan
from worker.mechanisms.base import MechanismOutput, ProgressFn, TabularTrainingSet
from worker.mechanisms.expm_nf import CALIBRATION, SENSITIVITY, ExpmNfParams, run_expm_nf
from worker.rng import secure_generator

# Enclave-only diagnostics of the trained flow evaluate the utility of this many draws on
# every row; for GRU-D (T hidden states per pair) the tabular default of 1024 would cost
# more than the training, so it gets fewer. They never reach the release.
GRUD_DIAGNOSTIC_SAMPLES = 16


def params_from_plan(
    plan: PrivacyPlan, *, grud_public_means: tuple[float, ...] | None = None
) -> ExpmNfParams:
    return params_from_mechanism(
        plan.mechanism, samples=plan.samples, grud_public_means=grud_public_means
    )


def params_from_mechanism(
    m: dict[str, Any], *, samples: int, grud_public_means: tuple[float, ...] | None = None
) -> ExpmNfParams:
    """The flow sampler's parameters from an ``expm_nf`` plan's mechanism (a job's, or an
    ExpM+NF candidate's in an architecture search)."""
    if float(m["sensitivity"]) != SENSITIVITY:
        raise ValueError("the plan's sensitivity is not the one this worker implements")
    if m.get("calibration") != CALIBRATION:
        raise ValueError("the plan's calibration is not the one this worker implements")
    return ExpmNfParams(
        epsilon=float(m["epsilon"]),
        samples=samples,
        flow=m["flow"],
        layers=int(m["layers"]),
        base_std=float(m["base_std"]),
        steps=int(m["steps"]),
        n_samples_per_step=int(m["n_samples_per_step"]),
        batch_size=int(m["batch_size"]),
        lr=float(m["learning_rate"]),
        l2=float(m["l2"]),
        domain_radius=None if m.get("domain_radius") is None else float(m["domain_radius"]),
        grud_public_means=grud_public_means,
        diagnostic_samples=(
            GRUD_DIAGNOSTIC_SAMPLES if grud_public_means else ExpmNfParams.diagnostic_samples
        ),
    )


def run_expm_nf_plan(
    *,
    plan: PrivacyPlan,
    spec: ModelSpec,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    return run_expm_nf(
        spec=spec,
        params=params_from_plan(
            plan, grud_public_means=data.public_means if isinstance(spec, GrudSpec) else None
        ),
        data=data,
        device=device,
        generator=secure_generator(device),
        progress=progress,
    )
