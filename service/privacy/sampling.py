"""Public constants of the worker's noise samplers, and what they cost in the accounting.

The worker (worker/noise.py) draws integer noise in floating point. Every pmf value it
realises is within a relative error ``PMF_RELATIVE_ERROR`` (η) of the exact law, inside
the sampler's support cap (derivation in worker/noise.py, whose tests check that its own
bound is at most this one). The accounting charges that gap explicitly as a
:class:`~service.privacy.events.PmfSlackEvent` instead of ignoring it.

Support cap: the samplers reject outputs beyond 40σ (Gaussian) or 801 scales (Laplace),
mass below e^{-800} each. Strictly, a capped law has an infinite Rényi divergence at the
edge, so every stated (ε, δ) holds with δ increased by at most
(number of draws)·(1 + e^ε)·e^{-800}, which is below 1e-300 for any job this product can
run (and far below the gap left by trusting the ChaCha20 stream itself). The ledger does
not charge it; the model card's statement is meant with it.

DP-SGD quantises each clipped per-example gradient onto the grid C·2^−GRID_BITS before the
exact integer sum and the integer noise (worker/mechanisms/dpsgd.py); the grid is public
and fixed, so it is part of the plan.
"""

from __future__ import annotations

import math
from typing import Final

from service.privacy.events import PmfSlackEvent, PureDpEvent

__all__ = [
    "GRID_BITS",
    "PMF_RELATIVE_ERROR",
    "count_event",
    "default_count_epsilon",
    "noise_slack",
]

PMF_RELATIVE_ERROR: Final[float] = 1e-12
"""η: bound on the relative error of every pmf value of the worker's integer samplers."""

GRID_BITS: Final[int] = 20
"""DP-SGD's fixed-point grid: one unit is C·2^−20 (C the clipping norm)."""


def noise_slack(*, draws: int) -> PmfSlackEvent:
    """The slack of ``draws`` independent noise coordinates, each within relative η of its
    exact pmf: the joint law is within e^{±τ}, τ = draws·(−log(1 − η)) (nats)."""
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 0:
        raise ValueError(f"draws must be a non-negative int, got {draws!r}")
    return PmfSlackEvent(tau=draws * -math.log1p(-PMF_RELATIVE_ERROR))


def count_event(*, epsilon: float) -> PureDpEvent:
    """The ledger event of a noisy row count: the two-sided geometric mechanism with scale
    1/ε is ε-DP for a count under add/remove-one (Ghosh, Roughgarden & Sundararajan 2009);
    the sampler's pmf gap adds 2τ to the privacy loss (a ratio of two values, each within
    e^{±τ}), so the event is PureDpEvent(ε + 2τ)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"the count's epsilon must be a positive finite number, got {epsilon!r}")
    return PureDpEvent(epsilon=epsilon + 2.0 * noise_slack(draws=1).tau)


def default_count_epsilon(epsilon_total: float) -> float:
    """What registration spends on the noisy row count unless the admin says otherwise:
    1% of ε_total, at most 0.1 nats (noise std √2/ε rows: 14 rows at ε = 0.1)."""
    return min(0.1, 0.01 * epsilon_total)
