"""One contract suite for every flow layer and configuration (zuko's tests/test_flows.py
style): shapes, gradients, invertibility, log-det vs autograd, normalisation, constraints,
save/load."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import pytest
import torch
from torch import nn

from worker.flows import (
    BoxTanh,
    ElementwiseAffine,
    Flow,
    FlowConfig,
    HouseholderSylvester,
    Planar,
    Transform,
    build_flow,
    grid_points,
    solve_y_plus_a_tanh,
)

LayerFactory = Callable[[int, torch.Generator], Transform | Flow]

# Every transform and flow configuration goes through the same tests.
CASES: dict[str, LayerFactory] = {
    "planar": lambda d, g: Planar(d, init_scale=1.0, generator=g),
    "sylvester-1-reflection": lambda d, g: HouseholderSylvester(
        d, reflections=1, init_scale=0.5, generator=g
    ),
    "sylvester-full-q": lambda d, g: HouseholderSylvester(d, init_scale=0.5, generator=g),
    "affine": lambda d, g: ElementwiseAffine(d, init_scale=0.7),
    "flow-planar-affine": lambda d, g: build_flow(
        FlowConfig(kind="planar", layers=3, affine=True), d, generator=g
    ),
    "flow-sylvester-affine": lambda d, g: build_flow(
        FlowConfig(kind="sylvester", layers=2, affine=True, reflections=2), d, generator=g
    ),
    "flow-planar-no-affine": lambda d, g: build_flow(
        FlowConfig(kind="planar", layers=2, affine=False, base_std=0.5), d, generator=g
    ),
    "flow-planar-affine-box": lambda d, g: build_flow(
        FlowConfig(kind="planar", layers=2, affine=True, domain_radius=2.5), d, generator=g
    ),
}


def _make(name: str, dim: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    module = CASES[name](dim, torch.Generator().manual_seed(seed)).to(dtype)
    _randomise(module, seed, scale=0.5)
    return module


def _randomise(module: nn.Module, seed: int, *, scale: float) -> None:
    """Move every parameter away from its (near-identity) initialisation."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


def _forward(module: nn.Module, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, log|det J|) for a transform or a flow (for a flow: minus the base term)."""
    if isinstance(module, Flow):
        sample = module.push(z)
        return sample.x, module.base_log_prob(z) - sample.log_q
    assert isinstance(module, Transform)
    return module(z)


def _inverse(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    assert isinstance(module, Transform | Flow)
    return module.inverse(x)


def _margin(module: nn.Module) -> torch.Tensor:
    assert isinstance(module, Transform | Flow)
    return module.invertibility_margin()


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_shapes_and_dtype(case: str) -> None:
    module = _make(case, 5)
    z = torch.randn(7, 5, dtype=torch.float64)
    x, ladj = _forward(module, z)
    assert x.shape == (7, 5) and ladj.shape == (7,)
    assert x.dtype == ladj.dtype == torch.float64
    assert torch.isfinite(x).all() and torch.isfinite(ladj).all()


def test_gradients_reach_every_parameter(case: str) -> None:
    module = _make(case, 4)
    z = torch.randn(16, 4, dtype=torch.float64)
    x, ladj = _forward(module, z)
    (x.square().sum() + ladj.sum()).backward()
    for name, p in module.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_numerical_inverse_recovers_z(case: str) -> None:
    module = _make(case, 6)
    z = torch.randn(32, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(6)) * 2.0
    x, _ = _forward(module, z)
    # A box's R·tanh saturates in float64 near its boundary (1 − tanh² < 1e-6 there leaves
    # too few bits to invert to 1e-8): points that close to the edge are left out.
    keep = torch.ones(32, dtype=torch.bool)
    for layer in module.modules():
        if isinstance(layer, BoxTanh):
            keep = (x.abs() < layer.radius * (1 - 1e-6)).all(dim=1)
    assert int(keep.sum()) >= 16
    torch.testing.assert_close(_inverse(module, x)[keep], z[keep], atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("dim", [1, 3, 5])
def test_log_det_matches_autograd_jacobian(case: str, dim: int) -> None:
    module = _make(case, dim, seed=dim)
    for z in torch.randn(4, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(dim)):

        def f(v: torch.Tensor, module: nn.Module = module) -> torch.Tensor:
            return _forward(module, v.unsqueeze(0))[0].squeeze(0)

        jac = torch.autograd.functional.jacobian(f, z)
        sign, logabsdet = torch.linalg.slogdet(jac)
        assert sign > 0  # orientation-preserving, never singular
        torch.testing.assert_close(_forward(module, z.unsqueeze(0))[1][0], logabsdet)


def test_density_integrates_to_one_in_2d(case: str) -> None:
    module = _make(case, 2, seed=3)
    flow = module if isinstance(module, Flow) else Flow(2, [cast(Transform, module)], base_std=1.0)
    flow = flow.to(torch.float64)
    # The base has std ≤ 1 and every layer moves points by a bounded amount or scales them
    # by < e^2, so ±14 holds all but a negligible part of the mass.
    points, volume = grid_points([(-14.0, 14.0), (-14.0, 14.0)], 280)
    with torch.no_grad():
        mass = float(flow.log_prob(points).exp().sum() * volume)
    assert mass == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("magnitude", [1.0, 30.0, 1e4])
def test_constraint_holds_for_adversarial_raw_parameters(case: str, magnitude: float) -> None:
    module = _make(case, 4, seed=int(magnitude))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * magnitude)
        # Planar's worst case: u anti-parallel to w, so the raw wᵀu is very negative.
        for layer in module.modules():
            if isinstance(layer, Planar):
                layer.u.copy_(-layer.w * magnitude)
    assert float(_margin(module).detach()) >= 0.0
    with torch.no_grad():
        _check_layer_constraints(module)
    z = torch.randn(64, 4, dtype=torch.float64, generator=g)
    _, ladj = _forward(module, z)
    assert not torch.isnan(ladj).any()


def _check_layer_constraints(module: nn.Module) -> None:
    for layer in module.modules():
        if isinstance(layer, Planar):
            # The dot product itself, up to rounding of a sum of large terms.
            w_u_hat = float((layer.w @ layer.u_hat()).detach())
            assert w_u_hat >= -1.0 - 1e-9 * (1.0 + float(layer.w.norm() * layer.u.norm()))
        if isinstance(layer, HouseholderSylvester):
            p, r2_diag = layer.diagonals()
            assert bool((p > -1.0).all()) and bool((r2_diag > 0).all())
            q = layer.q()
            torch.testing.assert_close(q @ q.T, torch.eye(4, dtype=q.dtype))


def test_save_load_round_trip(case: str) -> None:
    module = _make(case, 3, seed=11)
    fresh = _make(case, 3, seed=12)
    fresh.load_state_dict(module.state_dict())
    z = torch.randn(8, 3, dtype=torch.float64)
    for a, b in zip(_forward(module, z), _forward(fresh, z), strict=True):
        torch.testing.assert_close(a, b)


def test_bisection_solver_handles_the_constraint_boundary() -> None:
    a = torch.tensor([-1.0, -0.5, 0.0, 3.0, 100.0], dtype=torch.float64)
    y = torch.tensor([0.0, -2.0, 5.0, 0.3, -40.0], dtype=torch.float64)
    rhs = y + a * torch.tanh(y)
    torch.testing.assert_close(solve_y_plus_a_tanh(rhs, a), y, atol=1e-6, rtol=0)


def test_flow_samples_come_from_the_given_generator() -> None:
    flow = build_flow(FlowConfig(layers=2), 3, generator=torch.Generator().manual_seed(0))
    state = torch.get_rng_state()
    a = flow.rsample(5, generator=torch.Generator().manual_seed(42)).x
    b = flow.rsample(5, generator=torch.Generator().manual_seed(42)).x
    torch.testing.assert_close(a, b)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is never touched


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "realnvp"},
        {"layers": -1},
        {"base_std": 0.0},
        {"base_std": float("inf")},
        {"reflections": 0},
        {"affine_init_scale": -1.0},
    ],
)
def test_flow_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        FlowConfig(**bad)  # type: ignore[arg-type]


def test_box_log_det_is_stable_and_the_density_is_zero_outside() -> None:
    """The public domain's bijection (issue 13): log|det| equals autograd's even where
    1 − tanh² underflows, and the flow puts no mass outside the box."""
    box = BoxTanh(2, radius=3.0)
    for scale in (0.5, 5.0, 40.0):
        z = (torch.tensor([[1.0, -2.0]], dtype=torch.float64) * scale).requires_grad_(True)
        jac = torch.autograd.functional.jacobian(lambda t: box(t.unsqueeze(0))[0][0], z[0])
        expected = torch.log(torch.diagonal(jac)).sum() if scale < 10 else None
        got = box(z)[1][0]
        assert torch.isfinite(got)
        if expected is not None:
            torch.testing.assert_close(got, expected)
        else:  # log(3·sech²(z)) = log 3 + log 4 − 2|z| + O(e^{−2|z|})
            closed = sum(math.log(12.0) - 2.0 * abs(float(v)) for v in z.detach()[0])
            assert float(got.detach()) == pytest.approx(closed, abs=1e-9)
    flow = build_flow(FlowConfig(kind="planar", layers=2, domain_radius=3.0), 2).double()
    outside = torch.tensor([[3.5, 0.0], [0.0, -3.0], [1.0, 1.0]], dtype=torch.float64)
    with torch.no_grad():
        lp = flow.log_prob(outside)
        draws = flow.rsample(2000, generator=torch.Generator().manual_seed(0)).x
    assert lp[0] == -math.inf and lp[1] == -math.inf and torch.isfinite(lp[2])
    assert float(draws.abs().max()) < 3.0


def test_invertibility_margin_lives_on_the_flows_device() -> None:
    """A flow on a public domain holds BoxTanh, which has no parameters and states its
    margin on the CPU: the flow's margin is on its parameters' device (a CUDA job's
    ExpM+NF failed there, mixing devices: benchmarks/gpu_methods.py). The meta device
    stands in for CUDA on a machine without one."""
    flow = build_flow(FlowConfig(kind="planar", layers=2, domain_radius=3.0), 2)
    assert float(flow.invertibility_margin()) > 0
    assert flow.to("meta").invertibility_margin().device.type == "meta"
