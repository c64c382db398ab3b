"""ε at δ of an event tree by RDP on
:data:`~service.privacy.orders.CALIBRATION_ORDERS` (and on
:data:`~service.privacy.orders.LARGE_ORDERS` where the best order is the grid's largest and
every curve is a closed form, as for the hidden-iterate Langevin chain), converted with
:func:`~service.privacy.rdp.epsilon_from_rdp` (Canonne, Kamath & Steinke 2020,
Prop. 12). All integer orders are summed at once
(:func:`~service.privacy.rdp.subsampled_gaussian_rdp_integer_orders`); fractional
orders, whose series is the slow part, only downhill from the best integer order
(:func:`rdp_epsilon_of`). A subset of orders is always a valid bound; on every case
checked it equals the full-grid minimum (within 6e-8 relative, never below).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Final

import numpy as np

from service.privacy.events import (
    DpEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
    leaf_counts,
)
from service.privacy.orders import CALIBRATION_ORDERS, LARGE_ORDERS
from service.privacy.rdp import (
    IntegerOrderTable,
    epsilon_from_rdp_on_checked_orders,
    integer_order_table,
    subsampled_gaussian_rdp,
    subsampled_gaussian_rdp_on_table,
    validate_orders,
)

__all__ = ["rdp_epsilon_of"]


_INTEGER_ORDERS: Final[tuple[int, ...]] = tuple(
    int(a) for a in CALIBRATION_ORDERS if float(a).is_integer()
)
_INTEGER_ORDERS_F: Final[tuple[float, ...]] = validate_orders(_INTEGER_ORDERS)
# built once, at import (the first quote does not build it)
_INTEGER_TABLE: Final[IntegerOrderTable] = integer_order_table(_INTEGER_ORDERS)
_FRACTIONAL_ORDERS: Final[tuple[float, ...]] = tuple(
    a for a in CALIBRATION_ORDERS if not float(a).is_integer()
)
_LARGE_ORDERS: Final[tuple[float, ...]] = validate_orders(LARGE_ORDERS)


def _closed_form_at_every_order(leaves: dict[DpEvent, int]) -> bool:
    """Whether every leaf's curve is a closed form valid and cheap at any order > 1: a
    Gaussian without subsampling (α/(2σ²), rdp.py), the pure-DP curves (randomized
    response, bounded range) and the sampler's slack τ(2α − 1)/(α − 1). A subsampled
    Gaussian's series at orders in the millions is neither."""
    return all(
        isinstance(leaf, PmfSlackEvent | PureDpEvent)
        or (isinstance(leaf, PoissonSubsampledGaussianEvent) and leaf.sampling_rate == 1.0)
        for leaf in leaves
    )


def _leaf_curves(
    leaves: dict[DpEvent, int], orders: Sequence[float], *, integer: bool
) -> np.ndarray:
    """Σ_leaves count × curve(leaf) on ``orders`` (each leaf's own upper bound; Mironov
    2017, Prop. 1), with the vectorised integer-order sum for DP-SGD leaves. ``leaves``:
    the event's :func:`~service.privacy.events.leaf_counts` (walked once per ε)."""
    total = np.zeros(len(orders))
    for leaf, count in leaves.items():
        if integer and isinstance(leaf, PoissonSubsampledGaussianEvent):
            # q and σ were checked by the event; the grid is this module's own
            curve = subsampled_gaussian_rdp_on_table(
                q=leaf.sampling_rate, sigma=leaf.noise_multiplier, table=_INTEGER_TABLE
            )
        elif isinstance(leaf, PoissonSubsampledGaussianEvent):
            curve = subsampled_gaussian_rdp(
                sampling_rate=leaf.sampling_rate,
                noise_multiplier=leaf.noise_multiplier,
                orders=orders,
            )
        else:
            curve = leaf.rdp(orders)
        total += count * curve
    return total


def _cks_epsilons(rdp: np.ndarray, orders: np.ndarray, delta: float) -> np.ndarray:
    """Per-order ε of the CKS conversion (see :func:`~service.privacy.rdp.epsilon_from_rdp`),
    only used to pick orders; the returned ε always comes from epsilon_from_rdp."""
    with np.errstate(invalid="ignore"):
        return rdp + np.log1p(-1.0 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1.0)


@lru_cache(maxsize=256)
def _cks_order_terms(alpha: float) -> tuple[float, float]:
    """log1p(−1/α) and log α as :func:`_cks_epsilons` computes them for the one-order array
    ``[α]`` (numpy's functions, on that array: the same floats)."""
    orders = np.array([alpha])
    return float(np.log1p(-1.0 / orders)[0]), float(np.log(orders)[0])


def _cks_epsilon(rdp: float, alpha: float, log_delta: float) -> float:
    """``float(_cks_epsilons(np.array([rdp]), np.array([alpha]), delta)[0])`` with
    ``log_delta = math.log(delta)``: the same IEEE operations in the same order on the same
    floats (a sum, a sum, a difference, a quotient, a difference), without the arrays."""
    log1p_inv, log_alpha = _cks_order_terms(alpha)
    return rdp + log1p_inv - (log_delta + log_alpha) / (alpha - 1.0)


def rdp_epsilon_of(event: DpEvent, delta: float) -> float:
    """ε (nats) at ``delta`` by RDP on CALIBRATION_ORDERS, searching the fractional orders
    only from the best integer order downhill.

    Any subset of orders gives a valid bound (each order's conversion is one); the
    subset is what makes it fast: the fractional-order series of rdp.py costs ~1 ms per
    order at small σ, and up to ~σ²·log(1/q) terms (≈ 1e4 at σ ≈ 45). All integer orders
    are evaluated (vectorised); then, on the grid's fractional orders within ±1 of the
    best integer order α*, we walk from α* towards whichever neighbour is lower, for as
    long as ε decreases (typically 2–6 orders instead of 99). If
    ε(α) is unimodal on the grid (it is in every case we checked, see the tests), this
    finds the full-grid minimum; otherwise the result can only be larger (still sound).

    Speed (issue 26): the walk's orders are computed a few at a time, ahead of it
    (:class:`_Ahead`: one batched series for the orders it is expected to visit, guessed
    from where the last walk from the same α* ended); only the orders the walk asks for
    enter the result, so it is the one the walk one order at a time gives.
    """
    ints = np.asarray(_INTEGER_ORDERS, dtype=np.float64)
    leaves = leaf_counts(event)
    rdp_int = _leaf_curves(leaves, _INTEGER_ORDERS, integer=True)
    eps_int = _cks_epsilons(rdp_int, ints, delta)
    # np.nanargmin is np.argmin after NaN → +inf (numpy's own definition); without a NaN
    # the same index, without its ~50 µs of overhead
    nan = bool(np.isnan(eps_int).any())
    best_i = int(np.nanargmin(eps_int) if nan else np.argmin(eps_int))
    best = float(ints[best_i])
    window = sorted({best, *(a for a in _FRACTIONAL_ORDERS if best - 1.0 < a < best + 1.0)})
    values: dict[float, tuple[float, float]] = {best: (float(rdp_int[best_i]), eps_int[best_i])}
    at = window.index(best)
    ahead = _Ahead(leaves, delta, window, at, _LAST_END.get(best))

    def value(a: float) -> float:
        if a not in values:
            values[a] = ahead.get(a)
        return values[a][1]

    for direction in (-1, 1):
        i = at
        ahead.direction = direction
        while 0 <= i + direction < len(window) and value(window[i + direction]) < value(window[i]):
            i += direction
        if i != at:
            break  # went downhill one way; for a unimodal ε the other way goes up
    _LAST_END[best] = i - at
    frac = sorted(a for a in values if a != best)
    orders = _INTEGER_ORDERS_F + tuple(frac)  # floats > 1 of CALIBRATION_ORDERS: valid
    rdp = np.concatenate((rdp_int, np.array([values[a][0] for a in frac])))
    eps = epsilon_from_rdp_on_checked_orders(rdp=rdp.tolist(), alphas=orders, delta=delta)
    if best_i == len(ints) - 1 and _closed_form_at_every_order(leaves):
        # The grid's largest order is the best: the minimum may lie above it (small ε).
        # Every order's conversion is a valid bound (Canonne, Kamath & Steinke 2020,
        # Prop. 12), so the smaller of the two minima is one; where the best order is
        # below 1024, or a leaf has no closed form, nothing changes.
        large = _leaf_curves(leaves, _LARGE_ORDERS, integer=False)
        eps = min(
            eps,
            epsilon_from_rdp_on_checked_orders(
                rdp=large.tolist(), alphas=_LARGE_ORDERS, delta=delta
            ),
        )
    return eps


_LAST_END: dict[float, int] = {}
"""Per best integer order α*, where the last walk from it ended (grid steps from α*): the
σ searches evaluate nearby σ one after another, whose walks end alike (a guess for the
orders computed ahead; speed only, whatever another thread writes here)."""


_AHEAD_MARGIN = 2
"""Orders computed past the walk's guessed end, and per later batch (speed only)."""


class _Ahead:
    """(RDP, ε) of the walk's fractional orders, computed in batches ahead of the walk of
    :func:`rdp_epsilon_of` (speed only: a batch of orders costs little more than one,
    rdp.py's ``_log_a_fracs``). Each value is the float a one-order evaluation gives:
    the batched series equals the one-order series order by order, and so do
    :func:`_leaf_curves` on a DP-SGD leaf and :func:`_cks_epsilon`. Events with other
    leaves are evaluated one order at a time, as before."""

    def __init__(
        self,
        leaves: dict[DpEvent, int],
        delta: float,
        window: list[float],
        at: int,
        last_end: int | None,
    ) -> None:
        self.leaves, self.delta, self.window, self.at = leaves, delta, window, at
        self.log_delta = math.log(delta)
        self.batched = all(isinstance(leaf, PoissonSubsampledGaussianEvent) for leaf in leaves)
        self.last_end = last_end
        self.direction = -1
        self.known: dict[float, tuple[float, float]] = {}

    def get(self, a: float) -> tuple[float, float]:
        if a not in self.known:
            self._compute(self._batch(a) if self.batched else [a])
        return self.known[a]

    def _batch(self, a: float) -> list[float]:
        """``a`` and the orders the walk is expected to ask next."""
        window, at = self.window, self.at
        p = window.index(a)
        if not self.known and p == at - 1:  # the walk's first order
            positions = [at - 1, at + 1]
            if self.last_end is None:
                positions += [at - 2, at + 2]
            else:  # to where the last walk from α* ended, and a little past it
                side = -1 if self.last_end < 0 else 1
                reach = abs(self.last_end) + _AHEAD_MARGIN
                positions += [at + side * s for s in range(2, reach + 1)]
        else:
            positions = [p + self.direction * s for s in range(_AHEAD_MARGIN + 1)]
        picked = [window[i] for i in positions if 0 <= i < len(window) and i != at]
        return [a, *(b for b in dict.fromkeys(picked) if b != a and b not in self.known)]

    def _compute(self, orders: list[float]) -> None:
        curve = _leaf_curves(self.leaves, tuple(orders), integer=False).tolist()
        for a, r in zip(orders, curve, strict=True):
            self.known[a] = (r, _cks_epsilon(r, a, self.log_delta))
