"""Papernot–Steinke private selection: closed forms, an exact best-of-K computation the
bound must dominate, and the comparison with plain composition."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from service.privacy.events import (
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
    RandomStoppingEvent,
    SelfComposedEvent,
)
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp, gaussian_rdp, randomized_response_rdp
from service.privacy.tuning import (
    PoissonRuns,
    RunsDistribution,
    TruncatedNegativeBinomialRuns,
    delta_from_rdp,
    random_stopping_rdp,
    runs_quantile,
)

DISTS: list[RunsDistribution] = [
    TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.1),
    TruncatedNegativeBinomialRuns(eta=0.0, gamma=0.05),
    TruncatedNegativeBinomialRuns(eta=-0.5, gamma=0.2),
    TruncatedNegativeBinomialRuns(eta=2.0, gamma=0.3),
    PoissonRuns(mu=3.0),
    PoissonRuns(mu=1.0),
]


@pytest.mark.parametrize("dist", DISTS, ids=repr)
def test_pmf_sums_to_one_and_mean_is_expected_runs(dist: RunsDistribution) -> None:
    k = np.arange(0 if isinstance(dist, PoissonRuns) else 1, 200_000, dtype=np.float64)
    p = np.exp(dist.log_pmf(k))
    assert p.sum() == pytest.approx(1.0, abs=1e-6)
    assert (k * p).sum() == pytest.approx(dist.expected_runs(), rel=1e-4)


def test_geometric_is_eta_one() -> None:
    d = TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.25)
    k = np.arange(1, 30, dtype=np.float64)
    np.testing.assert_allclose(np.exp(d.log_pmf(k)), 0.25 * 0.75 ** (k - 1), rtol=1e-12)
    assert d.expected_runs() == pytest.approx(4.0)
    assert runs_quantile(d, 0.5) == 3  # P[K ≤ 2] = 0.4375, P[K ≤ 3] = 0.578


def test_tnb_closed_form_for_the_gaussian_mechanism() -> None:
    # Q = Gaussian, ε(λ) = λ/(2σ²): Theorem 2 with λ̂ minimised over {1} ∪ ORDERS.
    sigma, eta, gamma = 2.0, 1.0, 0.1
    d = TruncatedNegativeBinomialRuns(eta=eta, gamma=gamma)
    curve = gaussian_rdp(noise_multiplier=sigma, orders=ORDERS)
    got = random_stopping_rdp(
        dist=d, base_rdp=curve, orders=ORDERS, hat_rdp=curve, hat_orders=ORDERS
    )
    hats = [1.0, *ORDERS]
    extra = min(
        (1 + eta) * (1 - 1 / h) * h / (2 * sigma**2) + (1 + eta) * math.log(1 / gamma) / h
        for h in hats
    )
    want = [lam / (2 * sigma**2) + extra + math.log(1 / gamma) / (lam - 1) for lam in ORDERS]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert np.all(got >= want)  # rounded up, never down


def test_poisson_closed_form_for_a_pure_run() -> None:
    # ε₀-DP run with ε₀ ≤ log(λ/(λ−1)) has δ̂ = 0: ε' = ε(λ) + log μ /(λ−1).
    eps0, mu = 0.01, 6.0
    e = RandomStoppingEvent(event=PureDpEvent(epsilon=eps0), runs=PoissonRuns(mu=mu))
    rr = randomized_response_rdp(epsilon=eps0, orders=ORDERS)
    got = e.rdp(ORDERS)
    for n, lam in enumerate(ORDERS):
        if eps0 <= math.log(lam / (lam - 1)):
            assert got[n] == pytest.approx(rr[n] + math.log(mu) / (lam - 1), rel=1e-10)


def test_delta_from_rdp_inverts_epsilon_from_rdp() -> None:
    curve = SelfComposedEvent(
        event=PoissonSubsampledGaussianEvent(sampling_rate=0.02, noise_multiplier=1.0, steps=1),
        count=300,
    ).rdp(ORDERS)
    eps = epsilon_from_rdp(rdp=curve, orders=ORDERS, delta=1e-5)
    assert delta_from_rdp(rdp=curve, orders=ORDERS, epsilon=eps) == pytest.approx(1e-5, rel=1e-6)


# ------------------------------------------------------- exact best-of-K on a toy Q


def _pgf(dist: RunsDistribution, x: float) -> float:
    """E[x^K] by summing the pmf (tails negligible for these parameters)."""
    k = np.arange(0 if isinstance(dist, PoissonRuns) else 1, 100_000, dtype=np.float64)
    return float(np.sum(np.exp(dist.log_pmf(k) + k * math.log(x))))


def _renyi(p: np.ndarray, q: np.ndarray, lam: float) -> float:
    return float(special.logsumexp(lam * np.log(p) + (1 - lam) * np.log(q)) / (lam - 1))


@pytest.mark.parametrize("dist", DISTS, ids=repr)
@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0])
def test_bound_dominates_the_exact_rdp_of_best_of_k(dist: RunsDistribution, eps: float) -> None:
    # Q = binary randomized response, score = the output bit; best-of-K releases 1 iff some
    # run said 1 (⊥ if K = 0). Its RDP curve is exactly the RR curve, so the exact
    # divergence of A must be below the bound at every order, in both directions.
    p1 = math.exp(eps) / (1 + math.exp(eps))
    e = RandomStoppingEvent(event=PureDpEvent(epsilon=eps), runs=dist)
    bound = e.rdp(ORDERS)
    p0 = math.exp(-dist.mu) if isinstance(dist, PoissonRuns) else 0.0

    def law(p: float) -> np.ndarray:
        none_one = _pgf(dist, 1 - p)  # P[no run said 1] = E[(1−p)^K]
        return np.array([p0, none_one - p0, 1 - none_one])

    a, b = law(p1), law(1 - p1)
    keep = (a > 0) & (b > 0)
    a, b = a[keep], b[keep]
    for n, lam in enumerate(ORDERS):
        exact = max(_renyi(a, b, lam), _renyi(b, a, lam))
        assert exact <= bound[n] + 1e-9, (lam, exact, bound[n])
    if e.is_pure:
        pure = e.pure_epsilon()
        assert pure is not None
        assert float(np.max(np.abs(np.log(a / b)))) <= pure + 1e-12


def test_pure_epsilon_is_liu_talwar_three_epsilon_for_geometric() -> None:
    e = RandomStoppingEvent(
        event=PureDpEvent(epsilon=0.4), runs=TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.1)
    )
    assert e.pure_epsilon() == pytest.approx(1.2)
    assert np.all(e.rdp(ORDERS) <= randomized_response_rdp(epsilon=1.2, orders=ORDERS) + 1e-15)
    assert (
        RandomStoppingEvent(event=PureDpEvent(epsilon=0.4), runs=PoissonRuns(mu=3)).is_pure is False
    )


# -------------------------------------------------------- against plain composition

SGM = PoissonSubsampledGaussianEvent(sampling_rate=0.01, noise_multiplier=1.1, steps=500)


@pytest.mark.parametrize("dist", DISTS[:4], ids=repr)
def test_bound_is_at_least_one_run(dist: RunsDistribution) -> None:
    # E[K] ≥ 1 for K ≥ 1, so every added term is ≥ 0.
    e = RandomStoppingEvent(event=SGM, runs=dist)
    assert np.all(e.rdp(ORDERS) >= SGM.rdp(ORDERS))


@pytest.mark.parametrize(
    "dist", [TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.1), PoissonRuns(mu=10.0)], ids=repr
)
def test_bound_beats_composing_the_expected_number_of_runs(dist: RunsDistribution) -> None:
    # With E[K] = 10 DP-SGD runs the PS bound costs less (in (ε, δ)) than composing 10 runs,
    # and more than one run; PS22 Fig. 1 shows the same picture.
    delta = 1e-5
    one = epsilon_from_rdp(rdp=SGM.rdp(ORDERS), orders=ORDERS, delta=delta)
    tuned = epsilon_from_rdp(
        rdp=RandomStoppingEvent(event=SGM, runs=dist).rdp(ORDERS), orders=ORDERS, delta=delta
    )
    composed = epsilon_from_rdp(
        rdp=SelfComposedEvent(event=SGM, count=round(dist.expected_runs())).rdp(ORDERS),
        orders=ORDERS,
        delta=delta,
    )
    assert one < tuned < composed


def test_poisson_below_one_is_refused() -> None:
    # The bound with log μ < 0 undercuts the exact RDP of best-of-K (found by the test
    # above at μ = 0.5), so such a distribution is not accepted.
    with pytest.raises(ValueError, match="mu must be >= 1"):
        PoissonRuns(mu=0.5)
