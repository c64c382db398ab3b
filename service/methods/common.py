"""What every method's plan builder shares: the planning error and the calibration of a
Gaussian history together with the integer-noise sampler's slack; and what every method's
resource estimate shares (issue 11, 23): its inputs, its answer and the sizes several
estimates count alike (float32 tensors, parameters with their gradients and Adam's
moments, GRU-D's activations)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.privacy.calibrate import Accountant, calibrate_noise_multiplier
from service.privacy.events import DpEvent, PmfSlackEvent
from service.schemas import JobRequest, PrivacyPlan

__all__ = [
    "FLOAT_BYTES",
    "WITH_GRAD_AND_ADAM",
    "MethodPlan",
    "PlanError",
    "PlanFacts",
    "ResourceEstimate",
    "ResourceFacts",
    "calibrate_with_slack",
    "grud_floats_per_pair_step",
    "no_estimate",
]


class PlanError(ValueError):
    """The request cannot be turned into a plan (a 4xx for the caller, nothing charged)."""


def calibrate_with_slack(
    request: JobRequest,
    *,
    sampling_rate: float,
    steps: int,
    slack: PmfSlackEvent,
    accountant: Accountant,
    what: str,
    delta: float | None = None,
) -> float:
    """σ of a (subsampled) Gaussian history that, with the integer-noise sampler's slack,
    stays within the request's (ε, δ) (or ``delta`` where given; raises :class:`PlanError`).

    RDP: the slack adds τ(2α−1)/(α−1) ≤ 12τ at every calibration order (α ≥ 1.1);
    PLD: pointwise e^{±τ} closeness turns (ε', δ') into (ε' + 2τ, δ'·e^{τ}).
    """
    try:
        return calibrate_noise_multiplier(
            sampling_rate=sampling_rate,
            steps=steps,
            epsilon=request.epsilon - 12.0 * slack.tau,
            delta=(request.delta if delta is None else delta) * math.exp(-slack.tau),
            accountant=accountant,
        )
    except ValueError as exc:
        raise PlanError(f"cannot calibrate {what} noise: {exc}") from exc


@dataclass(frozen=True)
class PlanFacts:
    """The public facts a plan builder may use: the dataset's public (DP noisy) row count,
    the encoded width its public schema implies (a time series: V, GRU-D's width), and its
    bound on ‖(x, 1)‖² (tabular only; None for other kinds)."""

    n_rows: int
    n_features: int
    norm_sq_bound: int | None = None
    max_rows: int | None = None
    """The schema's public cap on the dataset's rows (tabular ``max_rows``), or None."""


MethodPlan = tuple[DpEvent, dict[str, Any], str]
"""A method's plan for one release: its DP event, its mechanism parameters, its accountant."""


# Resource estimates (service/resources.py asks each method's through the METHODS table).
# Deliberately simple and on the high side: float32 tensors, parameters counted with their
# gradients and Adam's two moments, autograd activations counted three times.
FLOAT_BYTES = 4
WITH_GRAD_AND_ADAM = 4  # the value, its gradient, Adam's first and second moments


# GRU-D keeps its gates' activations for every (θ, row) pair and grid step: measured
# ≈ 1.4 KiB per pair and step at H = 16, V = 8 (4.37 MiB per θ for 64 rows × 48 steps,
# forward and backward, benchmarks/results/grud_memory.md), i.e. ≈ 360 floats; counted
# here as 3·(12·H + 10·V) floats (816 at H = 16, V = 8), on the high side.
def grud_floats_per_pair_step(*, hidden: int, n_vars: int) -> int:
    return 3 * (12 * hidden + 10 * n_vars)


@dataclass(frozen=True)
class ResourceFacts:
    """The public facts a resource estimate may use besides the plan: the model's width
    (V for GRU-D) and the time grid's T (time series only; None for other kinds)."""

    n_features: int
    series_steps: int | None = None


@dataclass(frozen=True)
class ResourceEstimate:
    """A plan's estimated worker time (s) and peak memory (bytes), each None where no
    estimate exists, with what the refusal suggests when one is over its limit."""

    seconds: float | None = None
    memory_bytes: int | None = None
    time_hint: str = "use fewer steps or samples"
    memory_hint: str = "use a smaller model or fewer samples per step"


def no_estimate(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    """The entry of a method with no estimate: the worker's hard limits are the backstop."""
    return ResourceEstimate()
