"""Decaying noise schedule (service/privacy/schedules.py): accounting, calibration, tCDP."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from service.privacy import schedules
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


# ------------------------------------------------- the σ₀ search's answers (issue 26)


def _plain_walk(
    eps: Callable[[float], float], *, target: float, start: float, rel_tol: float, what: str
) -> tuple[float, int]:
    """The search as it was before issue 26's change: every point the walk asks at is
    evaluated. (σ₀, evaluations)."""
    calls: list[float] = []

    def sufficient(x: float) -> bool:
        calls.append(x)
        return eps(x) <= target

    hi, _ = schedules._bisection_walk(
        sufficient, target=target, start=start, rel_tol=rel_tol, what=what
    )
    return hi, len(calls)


def _searched(
    eps: Callable[[float], float], *, target: float, start: float, rel_tol: float, what: str
) -> tuple[float, dict[float, float]]:
    """The search as calibrate_sigma0 runs it, and every σ₀ it evaluated with its ε."""
    seen: dict[float, float] = {}

    def counted(x: float) -> float:
        assert x not in seen  # never evaluates a point twice
        seen[x] = eps(x)
        return seen[x]

    found = _SEARCH(counted, target=target, start=start, rel_tol=rel_tol, what=what)
    return found, seen


_SEARCH = schedules._smallest_sufficient_sigma0  # before any monkeypatch


_REAL_CASES = [
    # (q, decay, steps per epoch, epochs, ε, δ, accountant, slack τ)
    (Q, 0.8, SPE, 5, 1.3, 1e-5, "pld", None),  # tests/plan_cases "dpsgd pld exponential"
    (Q, 0.9, SPE, 2, 0.25, 1e-6, "rdp", None),
    (0.02, 0.5, 50, 3, 4.0, 1e-5, "pld", 0.01),
    (0.1, 0.95, 10, 20, 0.3, 1e-8, "rdp", 0.01),
    (0.004, 0.99, 400, 1, 0.05, 1e-5, "pld", None),
    (1.0, 0.9, 120, 2, 1.03, 1e-8, "rdp", None),
    (0.3, 0.05, 20, 12, 0.47, 1e-8, "pld", None),  # unreachable: σ₀ > NOISE_MULTIPLIER_MAX
    (1e-4, 1.0, 1, 1, 20.0, 1e-3, "pld", None),  # the floor NOISE_MULTIPLIER_MIN
]


@pytest.mark.parametrize("case", _REAL_CASES)
def test_sigma0_search_answers_as_the_plain_walk(
    case: tuple[float, float, int, int, float, float, str, float | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """calibrate_sigma0 on its real ε(σ₀) (both accountants, slack, the floor, an
    unreachable target): the same σ₀, bit for bit, or the same refusal, as the walk that
    evaluates every point it asks at, with fewer evaluations; the result and the walk's
    last insufficient point are evaluated on their sides of the target."""
    q, r, spe, epochs, eps, delta, accountant, tau = case
    runs: list[tuple[float | str, float | str, dict[float, float], int, float]] = []

    def both(
        f: Callable[[float], float], *, target: float, start: float, rel_tol: float, what: str
    ) -> float:
        kw = {"target": target, "start": start, "rel_tol": rel_tol, "what": what}
        seen: dict[float, float] = {}
        plain: float | str
        fast: float | str
        try:
            plain, n_plain = _plain_walk(f, **kw)  # type: ignore[arg-type]
        except ValueError as exc:
            plain, n_plain = str(exc), 0
        try:
            fast, seen = _searched(f, **kw)  # type: ignore[arg-type]
        except ValueError as exc:
            fast = str(exc)
        runs.append((plain, fast, seen, n_plain, target))
        if isinstance(fast, str):
            raise ValueError(fast)
        return fast

    monkeypatch.setattr(schedules, "_smallest_sufficient_sigma0", both)
    calibrate_sigma0.cache_clear()
    try:
        calibrate_sigma0(
            sampling_rate=q,
            decay=r,
            steps_per_epoch=spe,
            epochs=epochs,
            epsilon=eps,
            delta=delta,
            accountant=accountant,  # type: ignore[arg-type]
            slack=None if tau is None else PmfSlackEvent(tau=tau),
        )
    except ValueError:
        pass
    finally:
        calibrate_sigma0.cache_clear()
    [(plain, fast, seen, n_plain, target)] = runs
    assert repr(fast) == repr(plain)
    if isinstance(fast, float):
        assert seen[fast] <= target
        # fewer evaluations; as many where every point of the walk has ε = 0 (the floor)
        assert len(seen) < n_plain or (len(seen) == n_plain and fast == NOISE_MULTIPLIER_MIN)
        below = [x for x in seen if x < fast]
        if fast > NOISE_MULTIPLIER_MIN:  # the walk's last lo: the largest point below
            assert seen[max(below)] > target
            assert fast / max(below) <= 1.0 + 1e-3


def test_sigma0_search_answers_as_the_plain_walk_on_smooth_curves() -> None:
    """Many monotone ε(σ₀) = c·σ₀^−k·(1 + a·|log σ₀|)² with random starts: the same σ₀
    as the plain walk (or the same refusal), in about half its evaluations."""
    rng = np.random.default_rng(26)
    n_fast = n_plain = 0
    for _ in range(300):
        c = float(np.exp(rng.uniform(-3.0, 6.0)))
        k = float(rng.uniform(0.6, 3.5))
        a = float(rng.uniform(0.0, 0.05))
        target = float(np.exp(rng.uniform(-3.0, 3.0)))
        # as calibrate_sigma0's start (within ~40 % of the root), one case in 6 anywhere
        near = (c / target) ** (1.0 / k) * float(np.exp(rng.uniform(-0.4, 0.4)))
        start = near if rng.uniform() < 5 / 6 else float(np.exp(rng.uniform(-5.0, 9.5)))

        def eps(s: float, c: float = c, k: float = k, a: float = a) -> float:
            return c * s**-k * (1.0 + a * abs(math.log(s))) ** 2

        kw = {"target": target, "start": start, "rel_tol": 1e-3, "what": "test"}
        try:
            plain, count = _plain_walk(eps, **kw)  # type: ignore[arg-type]
        except ValueError as exc:
            with pytest.raises(ValueError, match="cannot reach"):
                _searched(eps, **kw)  # type: ignore[arg-type]
            assert "cannot reach" in str(exc)
            continue
        fast, seen = _searched(eps, **kw)  # type: ignore[arg-type]
        assert fast == plain
        n_fast += len(seen)
        n_plain += count
    assert n_fast < 0.7 * n_plain


def test_sigma0_search_is_safe_where_eps_is_not_monotone() -> None:
    """An ε(σ₀) with wiggles (not non-increasing, as a computed ε might not be at its last
    bits): the result is still evaluated at or below the target, and the walk's last
    insufficient point above it, within the tolerance."""
    rng = np.random.default_rng(7)
    for _ in range(100):
        target = float(np.exp(rng.uniform(-2.0, 2.0)))
        start = float(np.exp(rng.uniform(-1.0, 3.0)))
        amp = float(rng.uniform(1e-4, 3e-2))
        freq = float(rng.uniform(50.0, 5000.0))

        def eps(s: float, amp: float = amp, freq: float = freq) -> float:
            return 3.0 / s * (1.0 + amp * math.sin(freq * s))

        found, seen = _searched(eps, target=target, start=start, rel_tol=1e-3, what="test")
        assert seen[found] <= target
        lower = max(x for x in seen if x < found)
        assert seen[lower] > target
        assert found / lower <= 1.0 + 1e-3
