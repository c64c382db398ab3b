"""Orders above 1024 for curves known in closed form at every order (issue 24: a proven
release at ε = 1e-3). The hidden-iterate Langevin chain is charged as one Gaussian without
subsampling; at ε ≤ 0.01 its best Rényi order lies above CALIBRATION_ORDERS' largest, so the
conversion also tries LARGE_ORDERS (service/privacy/calibrate/rdp_epsilon.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from service.privacy.calibrate.rdp_epsilon import rdp_epsilon_of
from service.privacy.events import ComposedEvent, PmfSlackEvent, PoissonSubsampledGaussianEvent
from service.privacy.orders import CALIBRATION_ORDERS, LARGE_ORDERS
from service.privacy.rdp import epsilon_from_rdp

DELTA = 1e-5


def _gaussian(sigma: float, tau: float = 0.0) -> ComposedEvent:
    g = PoissonSubsampledGaussianEvent(sampling_rate=1.0, noise_multiplier=sigma, steps=1)
    return ComposedEvent(events=(g, PmfSlackEvent(tau=tau)))


def _exact_gaussian_delta(epsilon: float, sigma: float) -> float:
    """δ(ε) of the Gaussian mechanism of sensitivity 1 and noise σ (Balle & Wang 2018,
    "Improving the Gaussian Mechanism for Differential Privacy", Thm. 8), by scipy's ndtr:
    Φ(1/(2σ) − εσ) − e^ε·Φ(−1/(2σ) − εσ)."""
    a, b = 0.5 / sigma, epsilon * sigma
    return float(special.ndtr(a - b) - math.exp(epsilon) * special.ndtr(-a - b))


@pytest.mark.parametrize("sigma", [600.0, 2083.78125, 9000.0])
def test_a_gaussians_epsilon_takes_the_best_order_of_both_grids(sigma: float) -> None:
    event = _gaussian(sigma, tau=2.1e-6)
    both = CALIBRATION_ORDERS + LARGE_ORDERS
    full = epsilon_from_rdp(rdp=event.rdp(both), orders=both, delta=DELTA)
    small = epsilon_from_rdp(
        rdp=event.rdp(CALIBRATION_ORDERS), orders=CALIBRATION_ORDERS, delta=DELTA
    )
    got = rdp_epsilon_of(event, DELTA)
    assert got == pytest.approx(full, rel=1e-12)
    assert got < small  # the best order is above 1024 at these σ
    # never below what the mechanism truly spends: the exact Gaussian profile at that ε
    assert _exact_gaussian_delta(got, sigma) <= DELTA


def test_epsilon_1e_3_is_reachable_and_not_loose() -> None:
    """σ found by bisection for ε = 1e-3: its ε is ≤ 1e-3, and the exact Gaussian needs at
    least 80 % of that σ (the RDP conversion is not far from the exact profile)."""
    lo, hi = 100.0, 1e5
    while hi / lo > 1.0 + 1e-6:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if rdp_epsilon_of(_gaussian(mid), DELTA) <= 1e-3 else (mid, hi)
    assert rdp_epsilon_of(_gaussian(hi), DELTA) <= 1e-3
    assert _exact_gaussian_delta(1e-3, hi) <= DELTA
    assert _exact_gaussian_delta(1e-3, 0.8 * hi) > DELTA


def test_subsampled_curves_keep_the_calibration_grid() -> None:
    """A subsampled Gaussian whose best order is 1024 has no closed form at larger orders:
    its ε is the calibration grid's, unchanged."""
    event = PoissonSubsampledGaussianEvent(sampling_rate=0.5, noise_multiplier=400.0, steps=1)
    curve = np.asarray(event.rdp(CALIBRATION_ORDERS))
    eps = curve + np.log1p(-1.0 / np.array(CALIBRATION_ORDERS))
    eps -= (math.log(DELTA) + np.log(CALIBRATION_ORDERS)) / (np.array(CALIBRATION_ORDERS) - 1)
    assert int(np.argmin(eps)) == len(CALIBRATION_ORDERS) - 1  # the case in question
    small = epsilon_from_rdp(rdp=curve, orders=CALIBRATION_ORDERS, delta=DELTA)
    assert rdp_epsilon_of(event, DELTA) == pytest.approx(small, rel=1e-9)
