"""Run-time guards: each mechanism checks, on the real run, the invariants its proof rests
on, and fails closed before anything is released (defence in depth, issue 19).

The API validates every privacy parameter once (:mod:`service.params`), and the worker
re-derives the plan from the stored request; these guards do not trust either. They are
the last line: a clip norm ≤ 0 (which turned clipping off when a tuning grid's bound was
missing), a non-finite step size or noise multiplier, a row whose contribution exceeds the
sensitivity the charge assumes, or a non-finite release each raise :class:`GuardFailed`.
The runner then marks the job failed with the generic analyst-facing message (a guard on
row contributions depends on the rows, so its outcome must not be told apart from other
failures outside the enclave) and logs the guard's reason for the admin in the enclave's
``worker.log``.

Every check here is exact comparison of IEEE-754 values the mechanism already computed;
none changes what a passing run computes (same releases bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

__all__ = [
    "GuardFailed",
    "finite_release",
    "nonnegative_finite",
    "positive_finite",
    "row_contributions_within",
]


class GuardFailed(RuntimeError):
    """A mechanism's proof precondition failed on the real run; nothing is released."""


def _is_finite_number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def positive_finite(mechanism: str, **values: float) -> None:
    """Each value is a finite number > 0 (clip norms, step sizes, noise multipliers,
    inverse temperatures, sampling rates, row counts)."""
    for name, value in values.items():
        if not (_is_finite_number(value) and value > 0):
            raise GuardFailed(f"{mechanism}: {name} must be finite and > 0, got {value!r}")


def nonnegative_finite(mechanism: str, **values: float) -> None:
    """Each value is a finite number ≥ 0 (regularisers, warm-up lengths)."""
    for name, value in values.items():
        if not (_is_finite_number(value) and value >= 0):
            raise GuardFailed(f"{mechanism}: {name} must be finite and ≥ 0, got {value!r}")


def row_contributions_within(
    mechanism: str, weights: torch.Tensor, norms: torch.Tensor, bound: float
) -> None:
    """DP-SGD's per-row invariant: every row's weight is finite and ≥ 0, and its
    contribution's norm w_i·‖g_i‖ is ≤ ``bound`` (c_row, integer units), where ‖g_i‖ is
    finite; a row whose norm is not finite must have weight 0 (it is zeroed). The engines'
    sensitivity proof (worker/mechanisms/grad_engines.py) needs exactly this."""
    if not (math.isfinite(bound) and bound > 0):
        raise GuardFailed(f"{mechanism}: the row bound must be finite and > 0, got {bound!r}")
    if weights.shape != norms.shape:
        raise GuardFailed(f"{mechanism}: {weights.shape[0]} weights for {norms.shape[0]} rows")
    if not bool((torch.isfinite(weights) & (weights >= 0)).all()):
        raise GuardFailed(f"{mechanism}: a row weight is negative or not finite")
    finite = torch.isfinite(norms)
    if bool((weights[~finite] != 0).any()):
        raise GuardFailed(f"{mechanism}: a row with a non-finite gradient has a weight")
    contribution = weights[finite] * norms[finite]
    if bool((contribution > bound).any()):
        worst = float(contribution.max())
        raise GuardFailed(
            f"{mechanism}: a row's contribution {worst:.6g} exceeds its bound {bound:.6g}"
        )


def finite_release(releases: Iterable[Mapping[str, torch.Tensor]]) -> None:
    """Every released tensor is finite (a release of NaN or ±inf weights is refused: it
    means a precondition of the run's proof or its arithmetic failed)."""
    for i, state in enumerate(releases):
        for name, tensor in state.items():
            if not bool(torch.isfinite(tensor).all()):
                raise GuardFailed(f"release {i}: {name} is not finite")
