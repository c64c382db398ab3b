"""RDP formulas: golden values, closed forms, independent cross-checks."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special

from service.privacy import rdp as rdp_module
from service.privacy.orders import CALIBRATION_ORDERS, ORDERS
from service.privacy.rdp import (
    bounded_range_rdp,
    epsilon_from_rdp,
    gaussian_rdp,
    randomized_response_rdp,
    subsampled_gaussian_rdp,
    subsampled_gaussian_rdp_integer_orders,
)

# Opacus 1.6.0 RDPAccountant.DEFAULT_ALPHAS
OPACUS_ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
INTEGER_ORDERS = [float(a) for a in range(2, 65)] + [128.0, 256.0]


def _dp_accounting_rdp(q: float, sigma: float, steps: int, orders: list[float]) -> np.ndarray:
    acc = dp_accounting.rdp.RdpAccountant(orders=orders)
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
        )
    )
    return acc.rdp


# ------------------------------------------------------------------ golden values


def test_golden_opacus_case_matches_dp_accounting_on_integer_orders() -> None:
    q, sigma, steps, delta = 0.04, 1.5, 2250, 1e-5
    ours = steps * subsampled_gaussian_rdp(
        sampling_rate=q, noise_multiplier=sigma, orders=INTEGER_ORDERS
    )
    ref = _dp_accounting_rdp(q, sigma, steps, INTEGER_ORDERS)
    np.testing.assert_allclose(ours, ref, rtol=1e-10)
    ours_eps = epsilon_from_rdp(rdp=ours, orders=INTEGER_ORDERS, delta=delta)
    ref_eps = rdp_privacy_accountant.compute_epsilon(INTEGER_ORDERS, ref, delta)[0]
    assert ours_eps == pytest.approx(ref_eps, rel=1e-10)


def test_golden_opacus_published_epsilon() -> None:
    # Opacus' accountants_test asserts ε = 7.32911117143 for σ = 1.5, q = 0.04,
    # 2250 steps, δ = 1e-5 on its default orders. Verified independently with
    # opacus.accountants.analysis.rdp (ε = 7.3291111714386545); dp_accounting
    # gives 7.32933 on the same orders because its fractional-order series sums
    # |C(α, i)| (looser); ours sums the signed series plus an error bound.
    ours = 2250 * subsampled_gaussian_rdp(
        sampling_rate=0.04, noise_multiplier=1.5, orders=OPACUS_ALPHAS
    )
    eps = epsilon_from_rdp(rdp=ours, orders=OPACUS_ALPHAS, delta=1e-5)
    assert eps == pytest.approx(7.32911117143, rel=1e-8)
    assert eps >= 7.32911117143 - 1e-9  # never below the exact value
    ref = _dp_accounting_rdp(0.04, 1.5, 2250, OPACUS_ALPHAS)
    assert np.all(ours <= ref * (1 + 1e-9))  # both upper bounds; ours is tighter


@pytest.mark.parametrize(
    ("q", "sigma"),
    [(0.04, 1.5), (256 / 30000, 1.0), (0.01, 0.5), (0.5, 0.7), (0.9, 2.0), (1e-4, 0.6), (0.2, 5.0)],
)
def test_integer_orders_match_dp_accounting(q: float, sigma: float) -> None:
    ours = subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=sigma, orders=INTEGER_ORDERS)
    ref = _dp_accounting_rdp(q, sigma, 1, INTEGER_ORDERS)
    np.testing.assert_allclose(ours, ref, rtol=1e-10)


def _rdp_by_quadrature(q: float, sigma: float, alpha: float, *, reverse: bool = False) -> float:
    """Independent check by direct numerical integration, in log space:
    D_α(μ ‖ μ0), or D_α(μ0 ‖ μ) if ``reverse``, with μ = (1−q)μ0 + qμ1."""

    def integrand(z: float) -> float:
        log_mu0 = -0.5 * (z / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))
        log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma**2))
        if reverse:  # ∫ μ (μ0/μ)^α = ∫ μ0 (μ/μ0)^(1−α)
            return math.exp(log_mu0 + (1 - alpha) * log_ratio)
        return math.exp(log_mu0 + alpha * log_ratio)

    lo, hi = -40 * sigma, alpha + 40 * sigma
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    points = sorted({0.0, 0.5, 1.0, alpha, min(max(z0, lo), hi)})
    val, _ = integrate.quad(integrand, lo, hi, points=points, limit=500, epsabs=0, epsrel=1e-13)
    return math.log(val) / (alpha - 1)


CALIBRATION_INTEGERS = [int(a) for a in CALIBRATION_ORDERS if float(a).is_integer()]


@pytest.mark.parametrize(
    ("q", "sigma"),
    [(0.04, 1.5), (256 / 30162, 0.5), (256 / 30162, 45.0), (0.5, 0.7), (1e-4, 0.6), (0.9, 2.0)],
)
def test_vectorised_integer_orders_are_the_same_sum_rounded_up(q: float, sigma: float) -> None:
    """The calibration's one-pass integer-order sum (rdp.py) against the per-order sum the
    ledger charges and against dp_accounting: equal up to its explicit rounding slack,
    and never below either (it is what calibration may rely on as an upper bound)."""
    fast = subsampled_gaussian_rdp_integer_orders(
        sampling_rate=q, noise_multiplier=sigma, orders=CALIBRATION_INTEGERS
    )
    orders = [float(a) for a in CALIBRATION_INTEGERS]
    per_order = subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=sigma, orders=orders)
    ref = _dp_accounting_rdp(q, sigma, 1, orders)
    assert np.all(fast >= per_order)
    assert np.all(fast >= ref * (1 - 1e-12))
    # the slack is absolute on log A_α: relative to D_α it is ≲ 1e-5 where D_α ≈ 1e-9
    np.testing.assert_allclose(fast, per_order, rtol=1e-5, atol=1e-15)
    big = per_order > 1e-3
    np.testing.assert_allclose(fast[big], per_order[big], rtol=1e-9)


def test_vectorised_integer_orders_validate_and_are_exact_without_subsampling() -> None:
    np.testing.assert_allclose(
        subsampled_gaussian_rdp_integer_orders(
            sampling_rate=1.0, noise_multiplier=0.8, orders=[2, 5, 64]
        ),
        np.array([2, 5, 64]) / (2 * 0.8**2),
        rtol=1e-15,
    )
    for bad in ([2.5], [1], [], [0]):
        with pytest.raises(ValueError):
            subsampled_gaussian_rdp_integer_orders(
                sampling_rate=0.1,
                noise_multiplier=1.0,
                orders=bad,  # type: ignore[arg-type]
            )


@pytest.mark.parametrize(
    ("q", "sigma", "alpha"),
    [
        (0.04, 1.5, 2.5),
        (0.04, 1.5, 10.5),
        (256 / 30000, 1.0, 1.25),
        (0.5, 0.7, 1.1),
        (0.2, 0.3, 1.25),
        (0.9, 2.0, 7.5),
        (0.3, 0.5, 3.5),
        (0.01, 4.0, 1.75),
    ],
)
def test_fractional_orders_match_quadrature(q: float, sigma: float, alpha: float) -> None:
    ours = subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=sigma, orders=[alpha])[0]
    ref = _rdp_by_quadrature(q, sigma, alpha)
    assert ours == pytest.approx(ref, rel=1e-6, abs=1e-12)
    assert ours >= ref * (1 - 1e-9)  # an upper bound, never below the true value
    # MTZ: the other direction is never worse, so A_α is the RDP
    assert _rdp_by_quadrature(q, sigma, alpha, reverse=True) <= ours


def test_fractional_orders_are_bracketed_by_neighbouring_integers() -> None:
    # D_α is non-decreasing in α (van Erven & Harremoës 2014).
    for q, sigma in [(0.04, 1.5), (0.01, 0.8), (0.3, 2.0)]:
        curve = subsampled_gaussian_rdp(
            sampling_rate=q, noise_multiplier=sigma, orders=CALIBRATION_ORDERS
        )
        assert np.all(np.diff(curve) >= -1e-12)


def _rdp_small_loss_by_quadrature(q: float, sigma: float, alpha: float) -> float:
    """D_α(μ ‖ μ0) when the likelihood ratio is within 1 ± x, x ≪ 1 (σ large): with
    x(z) = μ/μ0 − 1 = q(e^{(2z−1)/(2σ²)} − 1) and E_{μ0}[x] = 0,
    A_α − 1 = E_{μ0}[(1+x)^α − 1 − αx], a non-negative integrand without the
    cancellation that makes plain quadrature useless at RDP values ≈ 1e-11."""

    def integrand(u: float) -> float:  # z = σu, μ0 = N(0, σ²) becomes N(0, 1)
        x = q * math.expm1((2 * sigma * u - 1) / (2 * sigma * sigma))
        gauss = math.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)
        return gauss * (math.expm1(alpha * math.log1p(x)) - alpha * x)

    val, _ = integrate.quad(integrand, -40, 40, points=[0.0], limit=500, epsabs=0, epsrel=1e-12)
    return math.log1p(val) / (alpha - 1)


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 60.0), (0.001, 200.0), (1e-4, 1e4)])
def test_large_sigma_fallback_is_a_tight_upper_bound(q: float, sigma: float) -> None:
    # z0 = σ² log(1/q − 1) + ½ exceeds _MAX_FRAC_TERMS: fractional orders take the
    # log-convex interpolation between ⌊α⌋ and ⌈α⌉ (audit defect 10a: it used to return
    # log A_⌈α⌉ divided by α − 1 instead of ⌈α⌉ − 1, 4× too much at α = 1.25).
    assert sigma**2 * math.log(1 / q - 1) > rdp_module._MAX_FRAC_TERMS
    curve = subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=sigma, orders=ORDERS)
    assert np.all(np.isfinite(curve)) and np.all(curve > 0)
    # D_α is non-decreasing in α (up to the 2^-40 relative slack of the interpolation)
    assert np.all(np.diff(curve) >= -1e-9 * curve[1:])
    by_order = dict(zip(ORDERS, curve.tolist(), strict=True))
    for alpha, value in by_order.items():
        if alpha.is_integer():
            continue
        ceil = by_order[float(math.ceil(alpha))]
        # never looser than the monotonicity bound D_α ≤ D_⌈α⌉ (the old code gave
        # (⌈α⌉−1)/(α−1) times it)
        assert value <= ceil * (1 + 1e-9)
        if sigma <= 200:  # the quadrature reference resolves these values
            truth = _rdp_small_loss_by_quadrature(q, sigma, alpha)
            assert truth <= value
            assert value <= truth * (1 + 1 / (alpha - 1))  # the chord is no looser than this


def test_small_loss_quadrature_reference_is_exact_at_integer_orders() -> None:
    # A_2 = 1 + q²(e^{1/σ²} − 1) in closed form: validates the reference used above.
    for q, sigma in [(0.01, 60.0), (0.001, 200.0)]:
        exact = math.log1p(q * q * math.expm1(1 / sigma**2))
        assert _rdp_small_loss_by_quadrature(q, sigma, 2.0) == pytest.approx(exact, rel=1e-9)


# ------------------------------------------------------------------ closed forms


@pytest.mark.parametrize("sigma", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("steps", [1, 7, 1000])
def test_gaussian_without_subsampling_is_exact(sigma: float, steps: int) -> None:
    orders = np.asarray(ORDERS)
    ours = steps * subsampled_gaussian_rdp(sampling_rate=1.0, noise_multiplier=sigma, orders=ORDERS)
    np.testing.assert_allclose(ours, steps * orders / (2 * sigma**2), rtol=1e-15)
    np.testing.assert_allclose(
        gaussian_rdp(noise_multiplier=sigma, orders=ORDERS), ours / steps, rtol=1e-15
    )


def test_subsampling_never_hurts() -> None:
    for q in (0.001, 0.1, 0.6, 0.99):
        sub = subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=0.9, orders=ORDERS)
        assert np.all(sub <= gaussian_rdp(noise_multiplier=0.9, orders=ORDERS))


def test_randomized_response_limits() -> None:
    eps = 1.7
    big = randomized_response_rdp(epsilon=eps, orders=[1e6])[0]
    assert big == pytest.approx(eps, rel=1e-5)
    assert big <= eps
    for tiny in (1e-3, 1e-6, 1e-9):
        curve = randomized_response_rdp(epsilon=tiny, orders=ORDERS)
        np.testing.assert_allclose(curve, np.asarray(ORDERS) * tiny**2 / 2, rtol=1e-3 * 64)
        assert np.all(curve > 0)
    huge = randomized_response_rdp(epsilon=1e6, orders=ORDERS)
    assert np.all(np.isfinite(huge))
    np.testing.assert_allclose(huge, 1e6, rtol=1e-5)
    np.testing.assert_array_equal(randomized_response_rdp(epsilon=0.0, orders=ORDERS), 0.0)


@pytest.mark.parametrize("eps", [0.01, 0.5, 1.0, 3.0, 8.0])
def test_randomized_response_matches_dp_accounting(eps: float) -> None:
    # Binary RR in dp_accounting's parametrisation: with probability p output a uniform
    # bucket, so P = (1 − p/2, p/2) and e^ε = (1 − p/2)/(p/2).
    p = 2 / (1 + math.exp(eps))
    acc = dp_accounting.rdp.RdpAccountant(
        orders=list(ORDERS), neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    acc.compose(dp_accounting.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=2))
    ours = randomized_response_rdp(epsilon=eps, orders=ORDERS)
    np.testing.assert_allclose(ours, acc.rdp, rtol=1e-9, atol=1e-15)


def test_randomized_response_is_below_the_generic_bounds() -> None:
    for eps in (0.05, 0.7, 2.0, 20.0):
        rr = randomized_response_rdp(epsilon=eps, orders=ORDERS)
        assert np.all(rr <= eps)
        assert np.all(rr <= np.asarray(ORDERS) * eps**2 / 2 * (1 + 1e-12))


def _renyi(p: np.ndarray, q: np.ndarray, alpha: float) -> float:
    return float(special.logsumexp(alpha * np.log(p) + (1 - alpha) * np.log(q)) / (alpha - 1))


_dists = st.lists(st.floats(0.05, 1.0), min_size=2, max_size=6)


@settings(max_examples=100, deadline=None)
@given(a=_dists, b=_dists)
def test_rr_curve_dominates_every_pure_dp_pair(a: list[float], b: list[float]) -> None:
    """Numerical check of the KOV post-processing argument: any pair of distributions
    with |log P/Q| ≤ ε has D_α ≤ RR curve(ε)."""
    n = min(len(a), len(b))
    p = np.asarray(a[:n]) / sum(a[:n])
    q = np.asarray(b[:n]) / sum(b[:n])
    eps = float(np.max(np.abs(np.log(p / q))))
    rr = randomized_response_rdp(epsilon=eps, orders=ORDERS)
    for alpha, bound in zip(ORDERS, rr, strict=True):
        assert _renyi(p, q, alpha) <= bound + 1e-10


@settings(max_examples=100, deadline=None)
@given(a=_dists, b=_dists)
def test_bounded_range_bound_holds(a: list[float], b: list[float]) -> None:
    """Numerical check of the proof in bounded_range_rdp: loss range η ⇒ D_α ≤ αη²/8."""
    n = min(len(a), len(b))
    p = np.asarray(a[:n]) / sum(a[:n])
    q = np.asarray(b[:n]) / sum(b[:n])
    loss = np.log(p / q)
    eta = float(np.max(loss) - np.min(loss))
    br = bounded_range_rdp(epsilon=eta, orders=ORDERS)
    for alpha, bound in zip(ORDERS, br, strict=True):
        assert _renyi(p, q, alpha) <= bound + 1e-10
        assert _renyi(q, p, alpha) <= bound + 1e-10


# ------------------------------------------------------------------ conversion


@settings(max_examples=100, deadline=None)
@given(
    scale=st.floats(1e-3, 50.0),
    delta=st.sampled_from([1e-3, 1e-5, 1e-8]),
)
def test_epsilon_from_rdp_matches_dp_accounting(scale: float, delta: float) -> None:
    rdp = scale * np.asarray(ORDERS) ** 0.8
    ours = epsilon_from_rdp(rdp=rdp, orders=ORDERS, delta=delta)
    ref = rdp_privacy_accountant.compute_epsilon(list(ORDERS), rdp, delta)[0]
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-12)


def test_epsilon_from_rdp_edge_cases() -> None:
    assert epsilon_from_rdp(rdp=[0.0] * len(ORDERS), orders=ORDERS, delta=1e-5) == 0.0
    # tiny RDP: (0, δ)-DP through KL and Bretagnolle–Huber
    assert epsilon_from_rdp(rdp=[1e-12], orders=[2.0], delta=1e-5) == 0.0
    # formula value: ρ + log((α−1)/α) − (log δ + log α)/(α−1)
    expected = 1.0 + math.log(0.5) - (math.log(1e-5) + math.log(2.0))
    assert epsilon_from_rdp(rdp=[1.0], orders=[2.0], delta=1e-5) == pytest.approx(expected)
    assert epsilon_from_rdp(rdp=[math.inf] * 2, orders=[2.0, 3.0], delta=1e-5) == math.inf
    assert epsilon_from_rdp(rdp=[math.inf, 1.0], orders=[2.0, 3.0], delta=1e-5) < math.inf
    for bad_delta in (0.0, 1.0, -1e-5, 2.0):
        with pytest.raises(ValueError, match="delta"):
            epsilon_from_rdp(rdp=[1.0], orders=[2.0], delta=bad_delta)
    with pytest.raises(ValueError, match="entries"):
        epsilon_from_rdp(rdp=[1.0, 2.0], orders=[2.0], delta=1e-5)
    with pytest.raises(ValueError):
        epsilon_from_rdp(rdp=[math.nan], orders=[2.0], delta=1e-5)
    with pytest.raises(ValueError):
        epsilon_from_rdp(rdp=[-1.0], orders=[2.0], delta=1e-5)


@pytest.mark.parametrize("bad", [[1.0], [0.5], [math.inf], [math.nan], [], [True]])
def test_orders_are_validated(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        randomized_response_rdp(epsilon=1.0, orders=bad)
    with pytest.raises(ValueError):
        subsampled_gaussian_rdp(sampling_rate=0.1, noise_multiplier=1.0, orders=bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sampling_rate": 0.0, "noise_multiplier": 1.0},
        {"sampling_rate": 1.5, "noise_multiplier": 1.0},
        {"sampling_rate": math.nan, "noise_multiplier": 1.0},
        {"sampling_rate": 0.1, "noise_multiplier": 0.0},
        {"sampling_rate": 0.1, "noise_multiplier": -1.0},
        {"sampling_rate": 0.1, "noise_multiplier": math.inf},
    ],
)
def test_subsampled_gaussian_validates(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        subsampled_gaussian_rdp(orders=ORDERS, **kwargs)


def test_orders_grid_is_sane() -> None:
    assert all(a > 1 for a in ORDERS)
    assert list(ORDERS) == sorted(set(ORDERS))
    assert min(ORDERS) <= 1.5  # large budgets (ε_total ≈ 10 … 50) need small orders
    assert list(CALIBRATION_ORDERS) == sorted(set(CALIBRATION_ORDERS))
