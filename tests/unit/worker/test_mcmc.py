"""The asymptotic ExpM sampler (method ``expm``, sampler ``mcmc``): its Gaussian-DP charge
against the closed form, its draws against the exact density on a grid, and the
convergence diagnostics against chains whose answer is known."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import get_args

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from scipy import stats

from service.plans import PlanError, build_plan
from service.privacy.orders import ORDERS
from service.releases import STATEMENTS
from service.schemas import Guarantee, JobRequest, PrivacyPlan, weakest_guarantee
from worker.mechanisms.base import PlanMismatch, TabularTrainingSet
from worker.mechanisms.mcmc import (
    LogisticTarget,
    McmcParams,
    Metric,
    checked_rows,
    run_expm_mcmc,
    sample_hmc,
)
from worker.mechanisms.mcmc_diagnostics import (
    ess_bulk,
    rhat_and_ess_by_coordinate,
    split_rhat,
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Batched chains on a shared CPU: one thread is faster than an oversubscribed pool."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _request(**kw: object) -> JobRequest:
    expm = {"sampler": "mcmc", **kw.pop("expm", {})}  # type: ignore[dict-item]
    body = {"dataset": "d", "method": "expm", "epsilon": 1.0, "delta": 1e-5, "expm": expm, **kw}
    return JobRequest.model_validate(body)


def _plan(request: JobRequest, *, n_features: int = 6, bound: int = 7) -> PrivacyPlan:
    return build_plan(request, n_rows=1000, n_features=n_features, norm_sq_bound=bound)


def _gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact δ(ε) of μ-GDP (Balle & Wang 2018; Dong, Roth & Su 2022, Cor. 2.13)."""
    return float(
        stats.norm.cdf(-epsilon / mu + mu / 2)
        - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
    )


# ------------------------------------------------------------------------- the charge


@pytest.mark.parametrize(
    ("epsilon", "delta", "l2"), [(0.1, 1e-5, 30.0), (1.0, 1e-5, 30.0), (8.0, 1e-6, 2.0)]
)
def test_charge_is_the_gaussian_dp_closed_form(epsilon: float, delta: float, l2: float) -> None:
    plan = _plan(_request(epsilon=epsilon, delta=delta, expm={"l2": l2}))
    mu, k = plan.mechanism["gdp_mu"], plan.mechanism["inverse_temperature"]
    assert plan.guarantee == "asymptotic"
    # The ledger charges μ-GDP as the Gaussian mechanism: RDP α·μ²/2, exactly.
    assert plan.rdp_curve == pytest.approx([a * mu**2 / 2 for a in ORDERS], rel=1e-12)
    # Gopi, Lee & Liu 2022: μ = G·√(k/l2) with G = √B (B = 7 here).
    assert mu == pytest.approx(math.sqrt(7 * k / l2), rel=1e-12)
    # The request's (ε, δ) holds for μ by Dong–Roth–Su's exact conversion, and μ is tight:
    # 1% more breaks it.
    assert _gaussian_delta(epsilon, mu) <= delta
    assert _gaussian_delta(epsilon, 1.01 * mu) > delta


def test_samples_are_charged_once_each_and_need_their_own_chains() -> None:
    one = _plan(_request())
    three = _plan(_request(samples=3))
    assert three.rdp_curve == pytest.approx([3 * v for v in one.rdp_curve], rel=1e-12)
    with pytest.raises(PlanError, match="chains"):
        _plan(_request(samples=3, expm={"chains": 2}))


def test_plan_refusals_and_defaults() -> None:
    with pytest.raises(PlanError, match="logistic"):
        _plan(_request(model={"kind": "mlp"}))
    with pytest.raises(PlanError, match="delta > 0"):
        _plan(_request(delta=0))
    with pytest.raises(PlanError, match="l2 > 0"):
        _plan(_request(expm={"l2": 0}))
    with pytest.raises(ValidationError, match="'mcmc' sampler only"):
        JobRequest.model_validate(
            {"dataset": "d", "method": "expm", "epsilon": 1, "delta": 1e-5, "expm": {"chains": 4}}
        )
    m = _plan(_request()).mechanism
    assert (m["chains"], m["steps"], m["warmup"], m["l2"]) == (8, 500, 500, 30.0)
    assert "learning_rate" not in m  # a Langevin option, not this sampler's
    assert _plan(_request(expm={"steps": 40})).mechanism["warmup"] == 40


# ---------------------------------------------------------- draws against the density

_X = torch.tensor(
    [[0.0], [0.1], [0.2], [0.3], [0.4], [0.5], [0.6], [0.7], [0.8], [0.9], [1.0], [1.0]]
)
_Y = torch.tensor([0, 0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 0], dtype=torch.float64)


def _target(k: float, l2: float) -> LogisticTarget:
    return LogisticTarget(
        rows=checked_rows(_X, norm_sq_bound=2), y=_Y, inverse_temperature=k, l2=l2
    )


def _final_states(target: LogisticTarget, *, seed: int) -> np.ndarray:
    params = McmcParams(
        chains=3000,
        steps=25,
        warmup=25,
        leapfrog_steps=8,
        step_size=0.3,
        l2=target.l2,
        inverse_temperature=target.inverse_temperature,
        parameters=2,
        row_norm_sq_bound=2,
    )
    # A seeded generator, injected here only: jobs get worker.rng.secure_generator.
    generator = torch.Generator().manual_seed(seed)
    run = sample_hmc(target, params=params, generator=generator, progress=lambda s, t: None)
    return run.final.numpy()


def _chi2_pvalues(draws: np.ndarray, target: LogisticTarget) -> list[float]:
    """Binned χ² of the draws against the exact normalised density on a fine grid: ten
    equal-probability bins of w, of b and of log π(θ) (the last tests the joint shape)."""
    axis = np.linspace(-12.0, 12.0, 961)
    w, b = np.meshgrid(axis, axis, indexing="ij")
    grid = torch.tensor(np.stack([w.ravel(), b.ravel()], 1))
    log_p = target.log_density_and_grad(grid)[0].numpy()
    mass = np.exp(log_p - log_p.max())
    mass /= mass.sum()
    draw_lp = target.log_density_and_grad(torch.tensor(draws))[0].numpy()
    pvalues = []
    for grid_values, draw_values in (
        (w.ravel(), draws[:, 0]),
        (b.ravel(), draws[:, 1]),
        (log_p, draw_lp),
    ):
        order = np.argsort(grid_values)
        cdf = np.cumsum(mass[order])
        edges = grid_values[order][np.searchsorted(cdf, np.arange(1, 10) / 10)]
        probs = np.bincount(np.searchsorted(edges, grid_values, side="right"), mass, 10)
        counts = np.bincount(np.searchsorted(edges, draw_values, side="right"), minlength=10)
        expected = probs * len(draw_values)
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        pvalues.append(float(stats.chi2.sf(chi2, df=9)))
    return pvalues


def test_draws_match_the_exact_density_on_a_grid() -> None:
    """3,000 chains' final states on a 2-parameter problem (one feature and the bias):
    each χ² p-value above 0.001 (tolerance; the seed is fixed, so the test is
    deterministic). The same check rejects the chains of a target 30% too hot, so it has
    the power to see a sampler that misses the density."""
    target = _target(0.7, 0.5)
    assert min(_chi2_pvalues(_final_states(target, seed=5), target)) > 1e-3
    wrong = _final_states(_target(0.7 * 0.7, 0.5), seed=5)
    assert min(_chi2_pvalues(wrong, target)) < 1e-6


# --------------------------------------------------------------------- diagnostics


def test_rhat_and_ess_on_known_chains() -> None:
    rng = np.random.default_rng(0)
    iid = rng.normal(size=(4, 1000))
    assert split_rhat(iid) == pytest.approx(1.0, abs=0.01)
    assert ess_bulk(iid) == pytest.approx(4000, rel=0.1)
    # Chains stuck at different means: R̂ ≫ 1 and hardly any effective draws.
    stuck = iid + 2.0 * np.arange(4)[:, None]
    assert split_rhat(stuck) > 1.5 and ess_bulk(stuck) < 50
    # AR(1) with φ = 0.9: ESS = N·(1 − φ)/(1 + φ) (its integrated autocorrelation time).
    phi, n = 0.9, 4000
    ar = np.zeros((4, n))
    noise = rng.normal(size=(4, n))
    for t in range(1, n):
        ar[:, t] = phi * ar[:, t - 1] + noise[:, t]
    assert split_rhat(ar) < 1.02
    assert ess_bulk(ar) == pytest.approx(4 * n * (1 - phi) / (1 + phi), rel=0.2)
    # A chain drifting within itself: split-R̂ sees it though all chains agree.
    drift = rng.normal(size=(4, 1000)) + np.linspace(0, 4, 1000)
    assert split_rhat(drift) > 1.2


def test_diagnostics_of_every_coordinate_at_once_equal_the_one_scalar_functions() -> None:
    """rhat_and_ess_by_coordinate gives, bit for bit, split_rhat and ess_bulk of each
    coordinate alone (no coordinate's ranks or scores depend on another's): odd and even
    draw counts, ties (rounded draws, a constant coordinate), stuck chains; and refuses
    what the one-scalar functions refuse."""
    rng = np.random.default_rng(3)
    cases = [
        rng.normal(size=(2, 40, 7)),
        np.round(rng.normal(size=(4, 33, 5)), 1),  # ties across chains and halves
        rng.normal(size=(3, 9, 4)) + np.arange(3)[:, None, None],
        np.concatenate([rng.normal(size=(2, 12, 2)), np.ones((2, 12, 1))], axis=2),
    ]
    for draws in cases:
        rhats, esses = rhat_and_ess_by_coordinate(draws)
        for j in range(draws.shape[2]):
            one = np.ascontiguousarray(draws[:, :, j])
            assert np.array_equal(
                [rhats[j], esses[j]], [split_rhat(one), ess_bulk(one)], equal_nan=True
            ), (draws.shape, j)
    with pytest.raises(ValueError):
        rhat_and_ess_by_coordinate(rng.normal(size=(2, 3, 4)))
    with pytest.raises(ValueError):
        rhat_and_ess_by_coordinate(rng.normal(size=(2, 30)))


# ---------------------------------------------------------------------- the job


def test_job_releases_final_states_and_keeps_diagnostics_in_the_enclave() -> None:
    plan = _plan(
        _request(epsilon=2.0, samples=2, expm={"chains": 4, "steps": 30, "warmup": 30}),
        n_features=2,
        bound=3,
    )
    g = torch.Generator().manual_seed(0)
    data = TabularTrainingSet(
        x=torch.rand(50, 2, generator=g), y=(torch.rand(50, generator=g) < 0.5).float()
    )
    seen: list[tuple[int, int]] = []
    out = run_expm_mcmc(
        spec=_request().model,
        mechanism=plan.mechanism,
        samples=2,
        data=data,
        device=torch.device("cpu"),
        progress=lambda s, t: seen.append((s, t)),
    )
    assert len(out.releases) == 2
    assert out.releases[0]["linear.weight"].shape == (1, 2)
    assert not torch.equal(out.releases[0]["linear.weight"], out.releases[1]["linear.weight"])
    assert seen[-1] == (60, 60) and len(seen) == 60  # data-independent progress
    diag = out.enclave_diagnostics
    for key in ("rhat_max", "ess_bulk_min", "acceptance_rate", "rhat_log_density"):
        assert math.isfinite(diag[key]), key
    assert 0.0 < diag["acceptance_rate"] <= 1.0


def test_rows_beyond_what_the_plan_charged_are_refused() -> None:
    with pytest.raises(PlanMismatch, match="norm bound"):
        checked_rows(torch.ones(2, 3), norm_sq_bound=3)
    with pytest.raises(PlanMismatch, match=r"\[0, 1\]"):
        checked_rows(torch.full((2, 2), -0.5), norm_sq_bound=3)
    assert checked_rows(torch.ones(2, 2), norm_sq_bound=3).shape == (2, 3)
    plan = _plan(_request(expm={"chains": 2, "steps": 2, "warmup": 0}), n_features=2, bound=3)
    with pytest.raises(PlanMismatch, match="sampler"):
        McmcParams.from_plan({**plan.mechanism, "sampler": "langevin"})


def test_the_weakest_guarantee_wins() -> None:
    assert weakest_guarantee() == "proven"
    assert weakest_guarantee("proven", "asymptotic") == "asymptotic"
    assert weakest_guarantee("asymptotic", "nominal", "proven") == "nominal"
    assert set(STATEMENTS) == set(get_args(Guarantee))


def test_metric_is_the_inverse_hessian_and_its_momentum_has_the_hessians_covariance() -> None:
    """For a Gaussian-like target the metric Σ = H⁻¹ whitens it: p ~ N(0, H), and the
    Hessian is the closed form k·(Σᵢ σ'(zᵢ)·xᵢxᵢᵀ + μ·I), checked against autograd."""
    g = torch.Generator().manual_seed(2)
    target = _target(0.7, 0.5)
    theta = torch.randn(4, 2, generator=g, dtype=torch.float64)
    hessians = [
        torch.autograd.functional.hessian(
            lambda t: -target.log_density_and_grad(t.reshape(1, 2))[0].sum(), theta[c]
        )
        for c in range(4)
    ]
    precision = target.mean_hessian(theta)
    assert torch.allclose(precision, torch.stack(hessians).mean(0), rtol=1e-10)
    metric = Metric.from_precision(precision)
    assert torch.allclose(metric.scale @ precision, torch.eye(2, dtype=torch.float64))
    p = metric.momentum(torch.Size((100_000, 2)), g)
    assert torch.allclose(torch.cov(p.T), precision, rtol=0.03, atol=0.01)
    assert torch.allclose(metric.kinetic(p), 0.5 * ((p @ metric.scale) * p).sum(1))
