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
# Laws capped at max_runs (K conditioned on K ≤ max_runs): PS22's generic Lemma 7 bound.
CAPPED: list[RunsDistribution] = [
    TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.1, max_runs=20),
    TruncatedNegativeBinomialRuns(eta=0.0, gamma=0.05, max_runs=5),
    TruncatedNegativeBinomialRuns(eta=-0.5, gamma=0.2, max_runs=3),
    TruncatedNegativeBinomialRuns(eta=2.0, gamma=0.3, max_runs=40),
    TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.5, max_runs=1),
    PoissonRuns(mu=3.0, max_runs=4),
    PoissonRuns(mu=10.0, max_runs=12),
    # μ < 1: K = 0 (⊥) is likely; the bound must count its mass on both sides
    PoissonRuns(mu=0.5, max_runs=1),
    PoissonRuns(mu=0.5, max_runs=3),
]


@pytest.mark.parametrize("dist", DISTS + CAPPED, ids=repr)
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


@pytest.mark.parametrize("dist", DISTS + CAPPED, ids=repr)
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


@pytest.mark.parametrize("dist", CAPPED, ids=repr)
def test_capped_bound_dominates_exact_best_of_k_on_random_score_laws(
    dist: RunsDistribution,
) -> None:
    # Q: a random pair of laws on 6 ordered scores (neighbouring datasets), the release the
    # best of K runs: P[best ≤ j] = f(F(j)) with f the capped law's pgf (a polynomial, so
    # this is exact). The bound is evaluated on Q's own exact RDP curve, at every order and
    # in both directions; a wrong reading of PS22's Lemma 7 would show up here.
    rng = np.random.default_rng(7)
    ks = np.arange(0 if isinstance(dist, PoissonRuns) else 1, (dist.max_runs or 0) + 1)
    pmf = np.exp(dist.log_pmf(ks.astype(np.float64)))

    def best_law(q: np.ndarray) -> np.ndarray:
        cdf = np.cumsum(q)
        f = np.array([float(np.sum(pmf * c**ks)) for c in cdf])  # f(F(j))
        p0 = float(pmf[0]) if ks[0] == 0 else 0.0  # K = 0: ⊥
        return np.concatenate(([p0], np.diff(np.concatenate(([p0], f)))))

    orders = tuple(o for o in ORDERS if o <= 64)
    for _ in range(25):
        spread = rng.uniform(0.2, 3.0)
        a = rng.dirichlet(np.ones(6))
        b = a * np.exp(rng.uniform(-spread, spread, 6))
        b /= b.sum()
        base = [max(_renyi(a, b, o), _renyi(b, a, o)) for o in orders]
        hat = [max(_renyi(a, b, o), _renyi(b, a, o)) for o in ORDERS]
        bound = random_stopping_rdp(
            dist=dist,
            base_rdp=base,
            orders=orders,
            hat_rdp=hat,
            hat_orders=ORDERS,
        )
        la, lb = best_law(a), best_law(b)
        keep = (la > 1e-300) & (lb > 1e-300)
        la, lb = la[keep], lb[keep]
        for n, lam in enumerate(orders):
            exact = max(_renyi(la, lb, lam), _renyi(lb, la, lam))
            assert exact <= bound[n] + 1e-9, (lam, exact, bound[n])


def test_capped_law_is_the_conditioned_law_and_never_pure() -> None:
    free = TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.25)
    capped = TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.25, max_runs=3)
    k = np.arange(1, 10, dtype=np.float64)
    mass = np.exp(free.log_pmf(k[:3])).sum()
    np.testing.assert_allclose(
        np.exp(capped.log_pmf(k)), np.where(k <= 3, np.exp(free.log_pmf(k)) / mass, 0.0)
    )
    assert capped.prob_one() == pytest.approx(0.25 / mass)
    assert runs_quantile(capped, 0.999999) == 3
    e = RandomStoppingEvent(event=PureDpEvent(epsilon=0.4), runs=capped)
    assert not e.is_pure and e.pure_epsilon() is None
    # the cap is part of the law's public description and survives a JSON round trip
    from service.privacy.tuning import runs_distribution_from_json

    assert runs_distribution_from_json(capped.to_json()) == capped
    assert "max_runs" not in free.to_json()  # uncapped plans keep their old JSON
    with pytest.raises(ValueError, match="max_runs"):
        TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.25, max_runs=0)


def test_capped_geometric_costs_at_most_theorem_two_at_lambda_hat_one() -> None:
    # ε' − ε for the capped geometric is log(E[K]/P[K = 1]) + log(E[K])/(λ − 1) ≤
    # 2·log(1/γ) + log(1/γ)/(λ − 1): the λ̂ = 1 value of Theorem 2 for the uncapped law.
    g = 0.1
    capped = TruncatedNegativeBinomialRuns(eta=1.0, gamma=g, max_runs=50)
    lams = np.asarray(ORDERS)
    extra = random_stopping_rdp(
        dist=capped,
        base_rdp=np.zeros(len(ORDERS)),
        orders=ORDERS,
        hat_rdp=np.zeros(len(ORDERS)),
        hat_orders=ORDERS,
    )
    assert np.all(extra <= (2 * math.log(1 / g) + math.log(1 / g) / (lams - 1)) * (1 + 1e-9))


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


def test_poisson_below_one_is_accepted_with_a_cap_only() -> None:
    from pydantic import ValidationError

    from service.selection.plans import PoissonRunsSpec

    with pytest.raises(ValidationError, match="needs max_runs"):
        PoissonRunsSpec(mu=0.5)
    assert PoissonRunsSpec(mu=0.5, max_runs=2).max_runs == 2
    capped = PoissonRuns(mu=0.5, max_runs=2)
    # P[K = 0 | K ≤ 2] = 1 / (1 + μ + μ²/2)
    assert capped.prob_zero() == pytest.approx(1 / (1 + 0.5 + 0.125))
