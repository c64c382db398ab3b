"""ExpM+NF: diagnostics, a small-problem statistical test against the exact density, and
the run_expm_nf contract (loadable releases, data-independent progress, server RNG only)."""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
import torch

from service.modelspec import GrudSpec, LogisticSpec, MlpSpec, ModelSpec
from worker.flows import ElementwiseAffine, Flow, FlowConfig, grid_points, importance_diagnostics
from worker.flows.diagnostics import grid_comparison
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.expm_nf import (
    EXPM_NF_GUARANTEE,
    ExpmNfParams,
    ExpMTarget,
    exact_grid_comparison,
    make_sampler,
    run_expm_nf,
)
from worker.mechanisms.samplers import FlowSampler, FlowSamplerConfig, LogDensityTarget
from worker.models import build_batched, build_module
from worker.synthetic_icu import generate_icu

# ---------------------------------------------------------------- diagnostics


def _gaussian_flow(loc: list[float], scale: list[float]) -> Flow:
    affine = ElementwiseAffine(len(loc)).double()
    with torch.no_grad():
        affine.loc.copy_(torch.tensor(loc))
        affine.log_scale.copy_(torch.tensor(scale).log())
    return Flow(len(loc), [affine], base_std=1.0)


def _gaussian_log_density(mean: torch.Tensor, std: torch.Tensor, log_z: float):  # type: ignore[no-untyped-def]
    """Unnormalised N(mean, diag std²) with normaliser exp(log_z)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        log_n = -0.5 * (((x - mean) / std) ** 2).sum(-1) - torch.log(std).sum()
        return log_n - 0.5 * len(mean) * math.log(2 * math.pi) + log_z

    return f


def test_importance_diagnostics_are_exact_when_q_equals_p() -> None:
    flow = _gaussian_flow([1.0, -2.0], [0.5, 2.0])
    log_p = _gaussian_log_density(torch.tensor([1.0, -2.0]), torch.tensor([0.5, 2.0]), 3.7)
    draw = flow.rsample(500, generator=torch.Generator().manual_seed(0))
    d = importance_diagnostics(log_p(draw.x), draw.log_q)
    assert d.log_z == pytest.approx(3.7, abs=1e-9)
    assert d.ess == pytest.approx(500.0) and d.ess_fraction == pytest.approx(1.0)
    assert d.reverse_kl == pytest.approx(0.0, abs=1e-9)


def test_importance_diagnostics_estimate_kl_and_log_z_and_flag_a_narrow_q() -> None:
    # p = N(0.3, 1)·e^{-1.2}; KL(N(0, s²)‖N(0.3, 1)) = −log s + (s² + 0.09)/2 − 1/2.
    log_p = _gaussian_log_density(torch.tensor([0.3]), torch.tensor([1.0]), -1.2)
    wide = _gaussian_flow([0.0], [1.2])  # q wider than p: bounded weights, reliable IS
    draw = wide.rsample(200_000, generator=torch.Generator().manual_seed(1))
    d = importance_diagnostics(log_p(draw.x), draw.log_q)
    assert d.reverse_kl == pytest.approx(-math.log(1.2) + (1.44 + 0.09) / 2 - 0.5, abs=0.005)
    assert d.log_z == pytest.approx(-1.2, abs=0.01)
    assert d.ess_fraction > 0.85
    # A too-narrow q (the failure that inflates a flow's apparent utility) shows up as a
    # tiny ESS; its log Ẑ and KL are then underestimates and must not be trusted.
    narrow = _gaussian_flow([0.0], [0.2])
    draw = narrow.rsample(20_000, generator=torch.Generator().manual_seed(2))
    d = importance_diagnostics(log_p(draw.x), draw.log_q)
    assert d.ess_fraction < 0.02
    assert d.log_z < -1.2


def test_importance_diagnostics_report_nan_for_non_finite_weights() -> None:
    d = importance_diagnostics(torch.tensor([0.0, -math.inf]), torch.tensor([0.0, 0.0]))
    assert math.isnan(d.log_z) and math.isnan(d.ess)
    with pytest.raises(ValueError):
        importance_diagnostics(torch.zeros(3), torch.zeros(2))


def test_grid_comparison_zero_for_equal_densities_and_large_for_disjoint_ones() -> None:
    flow = _gaussian_flow([0.5], [0.7])
    same = grid_comparison(
        lambda x: flow.log_prob(x) + 5.0, flow.log_prob, [(-6.0, 6.0)], points_per_dim=2000
    )
    assert same.tv < 1e-6 and same.kl_pq < 1e-6 and same.q_mass == pytest.approx(1.0, abs=1e-6)
    far = _gaussian_flow([4.0], [0.3])
    apart = grid_comparison(far.log_prob, flow.log_prob, [(-6.0, 6.0)], points_per_dim=2000)
    assert apart.tv > 0.99 and apart.kl_pq > 10
    with pytest.raises(ValueError):
        grid_points([(0.0, 1.0)] * 4, 10)


# ------------------------------------------------------- statistical small problem


def _tiny_logistic_target(epsilon: float) -> ExpMTarget:
    """2 parameters (w, b) on 40 rows; the exact density is banana-shaped and correlated."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=g)
    y = (torch.rand(40, generator=g) < torch.sigmoid(6 * x[:, 0] - 3)).float()
    return ExpMTarget(model=build_batched(LogisticSpec(), 1), x=x, y=y, epsilon=epsilon, l2=0.05)


BOUNDS = [(-15.0, 15.0), (-15.0, 15.0)]


def _train(
    target: LogDensityTarget, flow: FlowConfig, steps: int
) -> tuple[FlowSampler, dict[str, float]]:
    sampler = FlowSampler(
        FlowSamplerConfig(
            flow=flow,
            steps=steps,
            n_samples_per_step=256,
            batch_size=64,
            lr=2e-2,
            diagnostic_samples=4000,
        )
    )
    result = sampler.sample(
        target, k=1, generator=torch.Generator().manual_seed(1), progress=lambda s, t: None
    )
    return sampler, result.diagnostics


def test_trained_flow_matches_the_exact_expm_density_on_a_grid() -> None:
    target = _tiny_logistic_target(epsilon=4.0)
    sampler, diag = _train(target, FlowConfig(kind="planar", layers=4, affine_init_scale=2.0), 600)
    assert sampler.flow is not None
    cmp = exact_grid_comparison(target, sampler.flow, BOUNDS, points_per_dim=200)
    assert cmp.q_mass == pytest.approx(1.0, abs=0.01)
    assert cmp.tv < 0.12  # observed ≈ 0.05
    assert cmp.kl_pq < 0.1
    assert diag["ess_fraction"] > 0.7
    # The IS estimate of log Z agrees with the grid's normaliser.
    points, volume = grid_points(BOUNDS, 200)
    grid_log_z = float(torch.logsumexp(target.log_density(points.float()).double(), 0)) + math.log(
        volume
    )
    assert diag["log_z"] == pytest.approx(grid_log_z, abs=0.1)

    # Negative control: a mean-field Gaussian (affine only) cannot fit this correlated
    # density, and the same comparison says so.
    gaussian, _ = _train(target, FlowConfig(layers=0, affine_init_scale=2.0), 300)
    assert gaussian.flow is not None
    assert exact_grid_comparison(target, gaussian.flow, BOUNDS, points_per_dim=200).tv > 0.3


# ------------------------------------------------------------- run_expm_nf contract


def _tabular(n: int, d: int) -> TabularTrainingSet:
    g = torch.Generator().manual_seed(3)
    x = torch.rand(n, d, generator=g)
    y = (x[:, 0] + 0.3 * torch.randn(n, generator=g) > 0.5).float()
    return TabularTrainingSet(x=x, y=y)


def _small(epsilon: float, **overrides: object) -> ExpmNfParams:
    """Params for a few-second run: 40 steps, tiny batches."""
    base: dict[str, object] = {
        "steps": 40,
        "n_samples_per_step": 16,
        "batch_size": 32,
        "diagnostic_samples": 64,
    }
    return ExpmNfParams(epsilon=epsilon, **{**base, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "flow"),
    [
        (LogisticSpec(), "planar"),
        (LogisticSpec(), "sylvester"),
        (MlpSpec(hidden=[3]), "planar"),
    ],
)
def test_run_expm_nf_releases_loadable_state_dicts(spec: ModelSpec, flow: str) -> None:
    data = _tabular(120, 4)
    params = _small(1.0, samples=3, flow=flow)
    calls: list[tuple[int, int]] = []
    rng_state = torch.get_rng_state()
    out = run_expm_nf(
        spec=spec,
        params=params,
        data=data,
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(11),
        progress=lambda s, t: calls.append((s, t)),
    )
    assert torch.equal(rng_state, torch.get_rng_state())  # only the server generator is used
    assert len(out.releases) == 3
    for state in out.releases:
        module = build_module(spec, 4)
        module.load_state_dict(state)
        assert module(data.x).shape == (120,)
    assert not torch.equal(
        out.releases[0]["net.0.weight" if isinstance(spec, MlpSpec) else "linear.weight"],
        out.releases[1]["net.0.weight" if isinstance(spec, MlpSpec) else "linear.weight"],
    )
    # Progress is step k of T, nothing else.
    assert calls[-1] == (40, 40) and [s for s, _ in calls] == sorted(s for s, _ in calls)
    for key in ("final_loss", "reverse_kl", "log_z", "ess", "ess_fraction"):
        assert math.isfinite(out.enclave_diagnostics[key]), key


def test_run_expm_nf_is_reproducible_from_the_generator_seed() -> None:
    data = _tabular(60, 3)
    params = _small(0.5)

    def once(seed: int) -> torch.Tensor:
        out = run_expm_nf(
            spec=LogisticSpec(),
            params=params,
            data=data,
            device=torch.device("cpu"),
            generator=torch.Generator().manual_seed(seed),
            progress=lambda s, t: None,
        )
        return out.releases[0]["linear.weight"]

    torch.testing.assert_close(once(5), once(5))
    assert not torch.equal(once(5), once(6))


def test_run_expm_nf_trains_grud_on_synthetic_icu_series() -> None:
    series = generate_icu(40, hours=8, rng=np.random.default_rng(0))
    data = TabularTrainingSet(
        x=torch.tensor(series.packed()).reshape(40, -1), y=torch.tensor(series.labels)
    )
    params = ExpmNfParams(
        epsilon=1.0,
        samples=2,
        grud_public_means=series.schema.scaled_means,
        steps=5,
        n_samples_per_step=4,
        batch_size=16,
        diagnostic_samples=8,
    )
    out = run_expm_nf(
        spec=GrudSpec(hidden=3),
        params=params,
        data=data,
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(2),
        progress=lambda s, t: None,
    )
    module = build_module(GrudSpec(hidden=3), series.schema.n_vars)
    module.load_state_dict(out.releases[1])
    torch.testing.assert_close(
        module.state_dict()["x_mean"], torch.tensor(series.schema.scaled_means)
    )
    assert module(data.x).shape == (40,)
    with pytest.raises(ValueError):
        run_expm_nf(
            spec=GrudSpec(hidden=3),
            params=ExpmNfParams(epsilon=1.0),
            data=data,
            device=torch.device("cpu"),
            generator=torch.Generator(),
            progress=lambda s, t: None,
        )


def test_targets_outside_unit_interval_are_refused() -> None:
    data = TabularTrainingSet(x=torch.rand(5, 2), y=torch.tensor([0.0, 1.0, 2.0, 0.0, 1.0]))
    with pytest.raises(ValueError):
        run_expm_nf(
            spec=LogisticSpec(),
            params=_small(1.0),
            data=data,
            device=torch.device("cpu"),
            generator=torch.Generator(),
            progress=lambda s, t: None,
        )


@pytest.mark.parametrize(
    "bad",
    [
        {"epsilon": 0.0},
        {"epsilon": float("nan")},
        {"epsilon": 1.0, "samples": 0},
        {"epsilon": 1.0, "l2": -1.0},
        {"epsilon": 1.0, "steps": 0},
        {"epsilon": 1.0, "flow": "realnvp"},
        {"epsilon": 1.0, "base_std": -1.0},
    ],
)
def test_params_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ExpmNfParams(**bad)  # type: ignore[arg-type]


def test_params_are_frozen_and_the_flow_sampler_is_nominal() -> None:
    params = ExpmNfParams(epsilon=1.0)
    with pytest.raises(FrozenInstanceError):
        params.epsilon = 2.0  # type: ignore[misc]
    sampler = make_sampler(params)
    assert sampler.guarantee == EXPM_NF_GUARANTEE == "nominal"
    # Data-independent initial scale: the regulariser-only density's std sqrt(1/(ελ)).
    assert params.flow_config().affine_init_scale == pytest.approx(1.0)
    wide = ExpmNfParams(epsilon=1e-4, l2=1.0)
    assert wide.flow_config().affine_init_scale == pytest.approx(100.0)


@pytest.mark.parametrize("spec", [LogisticSpec(), MlpSpec(hidden=[3])])
def test_full_data_utility_is_the_same_in_any_block_size(spec: ModelSpec) -> None:
    data = _tabular(50, 4)
    model = build_batched(spec, 4)
    theta = torch.randn(9, model.n_params, generator=torch.Generator().manual_seed(4))
    whole = ExpMTarget(model=model, x=data.x, y=data.y, epsilon=1.0, l2=0.5, max_pairs=10**6)
    blocks = ExpMTarget(model=model, x=data.x, y=data.y, epsilon=1.0, l2=0.5, max_pairs=7)
    torch.testing.assert_close(whole.log_density(theta), blocks.log_density(theta))
