"""What every method's plan builder shares: the planning error and the calibration of a
Gaussian history together with the integer-noise sampler's slack."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.privacy.calibrate import Accountant, calibrate_noise_multiplier
from service.privacy.events import DpEvent, PmfSlackEvent
from service.schemas import JobRequest

__all__ = ["MethodPlan", "PlanError", "PlanFacts", "calibrate_with_slack"]


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


MethodPlan = tuple[DpEvent, dict[str, Any], str]
"""A method's plan for one release: its DP event, its mechanism parameters, its accountant."""
