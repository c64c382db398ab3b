"""Decaying noise schedule (service/privacy/schedules.py): accounting, calibration, tCDP."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.privacy.calibrate import (
    NOISE_MULTIPLIER_MIN,
    epsilon_for,
    pld_value_discretization,
)
from service.privacy.events import (
    ComposedEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
    event_from_json,
    leaf_counts,
)
from service.privacy.orders import ORDERS
from service.privacy.rdp import subsampled_gaussian_rdp
from service.privacy.sampling import noise_slack
from service.privacy.schedules import (
    calibrate_sigma0,
    decaying_event,
    epoch_noise_multipliers,
    tcdp_estimate,
)

# Adult-like public sizes: n̂ = 30162, expected batch 256.
N_ROWS = 30162
Q = 256 / N_ROWS
SPE = math.ceil(N_ROWS / 256)  # 118 steps per epoch
DELTA = 1e-5


def test_epoch_noise_levels_follow_sigma_squared_times_r_to_the_epoch() -> None:
    sigmas = epoch_noise_multipliers(sigma0=3.0, decay=0.8, epochs=5)
    assert len(sigmas) == 5
    assert sigmas[0] == 3.0
    for e, s in enumerate(sigmas):
        assert s * s == pytest.approx(9.0 * 0.8**e, rel=1e-14)
    assert list(sigmas) == sorted(sigmas, reverse=True)  # noise decreases over training


def test_decaying_event_curve_is_the_stepwise_composition() -> None:
    """The charged curve equals Σ over all T steps of each step's own one-step curve,
    computed here independently, step by step (Mironov 2017, Prop. 1)."""
    spe, epochs, r, s0 = 7, 4, 0.6, 2.5
    event = decaying_event(sampling_rate=Q, sigma0=s0, decay=r, steps_per_epoch=spe, epochs=epochs)
    per_step_sigma = [s0 * math.sqrt(r) ** (t // spe) for t in range(spe * epochs)]
    step_curves = [
        subsampled_gaussian_rdp(sampling_rate=Q, noise_multiplier=s, orders=ORDERS)
        for s in per_step_sigma
    ]
    stepwise = np.array([math.fsum(c[i] for c in step_curves) for i in range(len(ORDERS))])
    curve = event.rdp(ORDERS)
    np.testing.assert_allclose(curve, stepwise, rtol=1e-13, atol=0)
    # E distinct noise levels, steps_per_epoch steps each; and the JSON round trip
    # (what the ledger stores) charges the same bits.
    assert sorted(leaf_counts(event).values()) == [spe] * epochs
    assert np.array_equal(event_from_json(event.to_json()).rdp(ORDERS), curve)
    # Not a constant schedule in disguise: it differs from T steps at σ₀ or at σ_last.
    for s in (s0, per_step_sigma[-1]):
        flat = PoissonSubsampledGaussianEvent(
            sampling_rate=Q, noise_multiplier=s, steps=spe * epochs
        ).rdp(ORDERS)
        assert not np.allclose(flat, curve, rtol=1e-3)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibration_meets_the_target_from_both_sides(accountant: str) -> None:
    epochs, r, target = 3, 0.7, 1.0
    slack = noise_slack(draws=15 * SPE * epochs)
    sigma0 = calibrate_sigma0(
        sampling_rate=Q,
        decay=r,
        steps_per_epoch=SPE,
        epochs=epochs,
        epsilon=target,
        delta=DELTA,
        accountant=accountant,  # type: ignore[arg-type]
        slack=slack,
    )
    vdi = pld_value_discretization(epsilon=target, steps=SPE * epochs)

    def eps(s0: float) -> float:
        history = decaying_event(
            sampling_rate=Q, sigma0=s0, decay=r, steps_per_epoch=SPE, epochs=epochs
        )
        return epsilon_for(
            event=ComposedEvent(events=(history, slack)),
            delta=DELTA,
            accountant=accountant,  # type: ignore[arg-type]
            value_discretization_interval=vdi,
        )

    assert sigma0 > NOISE_MULTIPLIER_MIN
    assert eps(sigma0) <= target
    assert eps(sigma0 * (1.0 - 1e-3)) > target


def test_decaying_needs_at_least_the_constant_noise_at_its_start() -> None:
    """Every σ_e ≤ σ₀, so the decaying run is less private than T steps at σ₀: by RDP,
    σ₀ must exceed the constant schedule's σ for the same (ε, δ)."""
    common = {"sampling_rate": Q, "steps_per_epoch": SPE, "epochs": 2, "epsilon": 2.0}
    const = calibrate_sigma0(decay=1.0, delta=DELTA, accountant="rdp", **common)  # type: ignore[arg-type]
    decayed = calibrate_sigma0(decay=0.5, delta=DELTA, accountant="rdp", **common)  # type: ignore[arg-type]
    assert decayed > const * 1.1


def test_unreachable_decay_raises_instead_of_computing_vanishing_noise() -> None:
    with pytest.raises(ValueError, match="cannot reach"):
        calibrate_sigma0(
            sampling_rate=Q,
            decay=1e-6,
            steps_per_epoch=SPE,
            epochs=5,
            epsilon=1.0,
            delta=DELTA,
            accountant="pld",
        )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"decay": 0.0},
        {"decay": 1.5},
        {"decay": float("nan")},
        {"epochs": 0},
        {"steps_per_epoch": 0},
        {"epsilon": 0.0},
        {"delta": 0.0},
        {"accountant": "prv"},
        {"sampling_rate": 1.5},
        {"slack": 0.1},  # not a PmfSlackEvent
    ],
)
def test_invalid_calibration_inputs_raise(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {
        "sampling_rate": Q,
        "decay": 0.9,
        "steps_per_epoch": SPE,
        "epochs": 2,
        "epsilon": 1.0,
        "delta": DELTA,
        "accountant": "rdp",
        **kwargs,
    }
    with pytest.raises(ValueError):
        calibrate_sigma0(**args)  # type: ignore[arg-type]


def test_tcdp_closed_form_equals_the_stepwise_sum() -> None:
    """ρ = 13q² Σ_t 1/(2σ_t²) over every step (Bun et al. 2018), the geometric closed form
    against the explicit sum; ω from the least noisy step; ε by the tCDP conversion."""
    s0, r, epochs = 6.0, 0.85, 6
    est = tcdp_estimate(
        sampling_rate=Q, sigma0=s0, decay=r, steps_per_epoch=SPE, epochs=epochs, delta=DELTA
    )
    sigmas = [s0 * r ** (0.5 * (t // SPE)) for t in range(SPE * epochs)]
    rho = math.fsum(13.0 * Q * Q / (2.0 * s * s) for s in sigmas)
    omega = math.log(1.0 / Q) * min(sigmas) ** 2 / 2.0
    assert est.rho == pytest.approx(rho, rel=1e-12)
    assert est.omega == pytest.approx(omega, rel=1e-12)
    log_inv_d = math.log(1.0 / DELTA)
    assert log_inv_d <= (omega - 1.0) ** 2 * rho  # this example sits in the first branch
    assert est.epsilon == pytest.approx(rho + 2.0 * math.sqrt(rho * log_inv_d), rel=1e-12)
    assert est.conditions_hold  # ρ_t ≤ 0.1 ⇔ σ_t ≥ √5; the last σ here is ≈ 4.2
    # At R = 1 it is the constant schedule's 13q²T/(2σ²).
    flat = tcdp_estimate(
        sampling_rate=Q, sigma0=s0, decay=1.0, steps_per_epoch=SPE, epochs=epochs, delta=DELTA
    )
    assert flat.rho == pytest.approx(13.0 * Q * Q * SPE * epochs / (2.0 * s0 * s0), rel=1e-14)


def test_tcdp_estimate_flags_noise_levels_outside_its_theorem() -> None:
    est = tcdp_estimate(
        sampling_rate=Q, sigma0=1.2, decay=0.9, steps_per_epoch=SPE, epochs=3, delta=DELTA
    )
    assert not est.conditions_hold  # ρ_t = 1/(2σ²) > 0.1


def test_slack_is_part_of_the_calibrated_event() -> None:
    """A larger pointwise slack needs more noise (the slack is accounted, not ignored)."""
    common = {
        "sampling_rate": Q,
        "decay": 0.9,
        "steps_per_epoch": SPE,
        "epochs": 2,
        "epsilon": 1.0,
        "delta": DELTA,
        "accountant": "rdp",
    }
    none = calibrate_sigma0(**common)  # type: ignore[arg-type]
    big = calibrate_sigma0(slack=PmfSlackEvent(tau=0.02), **common)  # type: ignore[arg-type]
    assert big > none * 1.01
