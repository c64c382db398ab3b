"""The fixed, public grids of Rényi orders.

``ORDERS`` is the grid Λ over which the ledger stores every charge and runs the
RDP privacy filter (see :mod:`service.privacy.filters`). It is part of the stored
data: a ledger row's RDP vector is only meaningful together with the grid it was
computed on, so the grid never changes in place. A new grid gets a new
``ORDERS_VERSION`` and a migration that recomputes stored curves.

Why these orders. With δ_total split over |Λ| orders, order α can absorb an RDP
charge of about ε_total − (log(|Λ|/δ_total) − log α)/(α − 1) (filters.py), so

* small orders (1.25 … 3) are what make large budgets usable: for
  δ_total = 1e-5 and |Λ| = 25 the order 1.25 is usable (B_α ≥ 0) once
  ε_total ≥ 56.5, the order 2 once ε_total ≥ 13.4, 2.5 once ε_total ≥ 8.7 and
  3 once ε_total ≥ 6.4;
* the middle (4 … 32) serves the usual 0.5 ≤ ε_total ≤ 10 DP-SGD range, with a
  spacing fine enough that the best order for a single job is never far away;
* large orders (64 … 256) serve small budgets (ε_total ≈ 0.05 … 0.5), where
  the optimal order grows like log(1/δ)/ε (order 256 is usable from
  ε_total ≥ 0.03).

Fractional orders are supported by the subsampled-Gaussian RDP of
:func:`service.privacy.rdp.subsampled_gaussian_rdp` (Mironov, Talwar & Zhang
2019, Sec. 3.3) and by the closed forms used for pure mechanisms.

Each extra order costs only log(|Λ|+1)/|Λ| in every B_α; 25 orders is a
compromise between grid spacing and that union-bound cost.
"""

from __future__ import annotations

from typing import Final

ORDERS: Final[tuple[float, ...]] = (
    1.25,
    1.5,
    1.75,
    2.0,
    2.25,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    6.0,
    7.0,
    8.0,
    10.0,
    12.0,
    14.0,
    16.0,
    20.0,
    24.0,
    32.0,
    48.0,
    64.0,
    128.0,
    256.0,
)
"""The ledger's grid Λ of Rényi orders (all > 1, strictly increasing)."""

ORDERS_VERSION: Final[int] = 1
"""Version of :data:`ORDERS`; bump (never edit ORDERS in place) to change the grid."""

CALIBRATION_ORDERS: Final[tuple[float, ...]] = (
    tuple(1.0 + x / 10.0 for x in range(1, 100))
    + tuple(float(a) for a in range(11, 64))
    + (80.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0, 1024.0)
)
"""A fine grid used only to compute a single job's (ε, δ) by RDP (calibration and
information). Never stored, so it may change freely; it mirrors dp_accounting's
``DEFAULT_RDP_ORDERS`` with a few extra large orders."""

LARGE_ORDERS: Final[tuple[float, ...]] = tuple(2.0 ** (11.0 + k / 16.0) for k in range(1, 209))
"""Orders above CALIBRATION_ORDERS' largest (1024), 16 per octave up to 2^24, used only to
convert a single job's curve to (ε, δ) when that curve is known in closed form at every
order (a Gaussian without subsampling, pure-DP leaves, the sampler's slack): see
:func:`service.privacy.calibrate.rdp_epsilon.rdp_epsilon_of`. The best order of a Gaussian
curve α/(2σ²) at δ is about 1 + σ·√(2·log(1/δ)): above 1024 once σ > 213 at δ = 1e-5, i.e.
at ε below about 0.01 (issue 24: ε = 1e-3 needs σ ≈ 5,000, best order ≈ 2.4e4). Spacing
2^(1/16): the convex ε(α) at the grid point nearest the optimum is within ~0.1 % of the
minimum. Never stored."""
