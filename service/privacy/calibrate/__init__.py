"""Noise calibration for one DP-SGD job, and (ε, δ) of an event by RDP or PLD.

Inside one job every parameter (q, σ, steps) is fixed before the job runs, so
the job is a non-adaptive composition and any valid accountant may be used to
*calibrate* it, PLD included. What the ledger charges is always the event's RDP
curve (filters.py); a PLD-calibrated job therefore has the (ε, δ) of its PLD
accounting as its stated guarantee, while its ledger charge is its RDP curve
(RDP ε = 1.44 vs PLD ε = 1.00 at q = 256/30162, T = 354, σ = 0.9867; the
benchmark lists both for every cell). :class:`NoiseCalibration` carries the stated ε.

Accountants (every ε they return is an upper bound on the true ε):

* ``"rdp"`` — the RDP curve on :data:`~service.privacy.orders.CALIBRATION_ORDERS`
  converted with :func:`~service.privacy.rdp.epsilon_from_rdp` (Canonne, Kamath &
  Steinke 2020, Prop. 12). All integer orders are summed at once
  (:func:`~service.privacy.rdp.subsampled_gaussian_rdp_integer_orders`); fractional
  orders, whose series is the slow part, only downhill from the best integer order
  (:func:`~service.privacy.calibrate.rdp_epsilon.rdp_epsilon_of`). A subset of orders
  is always a valid bound; on every case checked it equals the full-grid minimum
  (within 6e-8 relative, never below).
* ``"pld"`` — a pessimistic privacy-loss distribution, connect-the-dots discretisation
  (Doroshenko et al. 2022, "Connect the Dots") composed by FFT (Koskela, Jälkö &
  Honkela 2020), implemented here for Poisson-subsampled Gaussian trees
  (:func:`~service.privacy.calibrate.fast_pld.fast_pld_epsilon`; vectorised, ~1 ms per
  ε instead of dp_accounting's 30–300 ms, whose cost is a Python loop over the grid in
  its PLD construction) and
  by dp_accounting (Meiser & Mohammadi 2018; Doroshenko et al. 2022) for trees with
  pure leaves. Where the fast PLD is unavailable it answers with RDP, also an upper
  bound ("fall back to RDP only where PLD fails").

The package, by concept (each module imports only those above it):

* :mod:`~service.privacy.calibrate.common` — accountant names, σ and PLD-grid limits,
  input checks, the PLD grid calibration uses;
* :mod:`~service.privacy.calibrate.pld_steps` — one step's pessimistic PLD on a grid;
* :mod:`~service.privacy.calibrate.fast_pld` — their composition by FFT, ε at δ;
* :mod:`~service.privacy.calibrate.rdp_epsilon` — ε at δ by RDP on CALIBRATION_ORDERS;
* :mod:`~service.privacy.calibrate.epsilon` — ε of an event by either accountant
  (dp_accounting for trees with pure leaves), and the information-only PLD ε;
* :mod:`~service.privacy.calibrate.search` — the σ search (guarded secant);
* :mod:`~service.privacy.calibrate.noise` — noise calibration of a DP-SGD job.
"""

from service.privacy.calibrate.common import (
    NOISE_MULTIPLIER_MAX,
    NOISE_MULTIPLIER_MIN,
    PLD_VALUE_DISCRETIZATION,
    PLD_VALUE_DISCRETIZATION_MAX,
    PLD_VALUE_DISCRETIZATION_MIN,
    Accountant,
    pld_value_discretization,
)
from service.privacy.calibrate.epsilon import PldUnavailable, epsilon_for, pld_epsilon
from service.privacy.calibrate.noise import (
    NoiseCalibration,
    calibrate,
    calibrate_noise_multiplier,
)

__all__ = [
    "NOISE_MULTIPLIER_MAX",
    "NOISE_MULTIPLIER_MIN",
    "PLD_VALUE_DISCRETIZATION",
    "PLD_VALUE_DISCRETIZATION_MAX",
    "PLD_VALUE_DISCRETIZATION_MIN",
    "Accountant",
    "NoiseCalibration",
    "PldUnavailable",
    "calibrate",
    "calibrate_noise_multiplier",
    "epsilon_for",
    "pld_epsilon",
    "pld_value_discretization",
]
