"""Target models: batched functional forms equal a per-sample loop, releases load into
build_module, and the utility's sensitivity is ≤ 1 for every model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from service.modelspec import GrudSpec, LogisticSpec, MlpSpec, ModelSpec
from worker.mechanisms.expm_nf import squared_error_utility
from worker.models import BatchedModel, Grud, LinearBatchedModel, build_batched, build_module
from worker.synthetic_icu import PUBLIC_SCHEMA, generate_icu

T_STEPS = 6
N_VARS = PUBLIC_SCHEMA.n_vars
MEANS = PUBLIC_SCHEMA.scaled_means


def _case(kind: str) -> tuple[ModelSpec, int]:
    if kind == "logistic":
        return LogisticSpec(), 5
    if kind == "mlp":
        return MlpSpec(hidden=[4, 3]), 5
    return GrudSpec(hidden=4), N_VARS


def _model(kind: str) -> BatchedModel:
    spec, d = _case(kind)
    return build_batched(spec, d, public_means=MEANS if kind == "grud" else None)


def _data(kind: str, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if kind == "grud":
        series = generate_icu(n, hours=T_STEPS, rng=np.random.default_rng(seed))
        return torch.tensor(series.packed()), torch.tensor(series.labels)
    _, d = _case(kind)
    x = torch.rand(n, d, generator=g)
    return x, (torch.rand(n, generator=g) < 0.4).float()


KINDS = ["logistic", "mlp", "grud"]


@pytest.mark.parametrize("kind", KINDS)
def test_batched_logits_equal_a_per_sample_loop(kind: str) -> None:
    model = _model(kind)
    x, y = _data(kind, 9, seed=0)
    theta = torch.randn(7, model.n_params, generator=torch.Generator().manual_seed(1))
    batched = model.logits(theta, x)
    assert batched.shape == (7, 9)
    torch.testing.assert_close(batched, model.logits_loop(theta, x), atol=1e-5, rtol=1e-5)
    # The loop goes through the module itself: load each θ and call forward.
    for t, row in zip(theta, batched, strict=True):
        module = build_module(_case(kind)[0], _case(kind)[1])
        module.load_state_dict(model.state_dict(t))
        torch.testing.assert_close(module(x), row, atol=1e-5, rtol=1e-5)
    u = squared_error_utility(model, theta, x, y, l2=0.3)
    loop = torch.stack(
        [
            -(torch.sigmoid(r) - y).square().sum() - 0.3 * t.square().sum()
            for t, r in zip(theta, model.logits_loop(theta, x), strict=True)
        ]
    )
    torch.testing.assert_close(u, loop, atol=1e-4, rtol=1e-5)


def test_logistic_uses_the_matmul_path() -> None:
    model = _model("logistic")
    assert isinstance(model, LinearBatchedModel)
    assert model.n_params == 6


@pytest.mark.parametrize("kind", KINDS)
def test_batched_gradients_equal_per_sample_gradients(kind: str) -> None:
    model = _model(kind)
    x, y = _data(kind, 5, seed=2)
    theta = torch.randn(3, model.n_params, generator=torch.Generator().manual_seed(3))
    theta.requires_grad_(True)
    squared_error_utility(model, theta, x, y, l2=0.1).sum().backward()
    assert theta.grad is not None
    for i in range(3):
        t = theta[i].detach().clone().requires_grad_(True)
        squared_error_utility(model, t.unsqueeze(0), x, y, l2=0.1).sum().backward()
        assert t.grad is not None
        torch.testing.assert_close(theta.grad[i], t.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_sensitivity_is_at_most_one_on_neighbouring_datasets(kind: str) -> None:
    model = _model(kind)
    for trial in range(5):
        x, y = _data(kind, 12, seed=10 + trial)
        other_x, _ = _data(kind, 1, seed=100 + trial)
        i = trial % 12
        x2, y2 = x.clone(), y.clone()
        x2[i], y2[i] = other_x[0], 1.0 - y[i]  # replace one row, label flipped: worst case
        g = torch.Generator().manual_seed(trial)
        # Large parameters saturate the sigmoid: the regime where a row counts most.
        theta = torch.randn(64, model.n_params, generator=g) * (1.0 + 10.0 * trial)
        diff = squared_error_utility(model, theta, x, y, l2=2.0) - squared_error_utility(
            model, theta, x2, y2, l2=2.0
        )
        assert float(diff.abs().max()) <= 1.0 + 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_adding_a_row_lowers_the_utility_by_at_most_one(kind: str) -> None:
    """The add/remove argument behind ExpM's monotone calibration exp(ε·u): for every θ,
    u(D) − u(D ∪ {x}) ∈ [0, 1] (one sign, range ≤ 1), for every model."""
    model = _model(kind)
    for trial in range(5):
        x, y = _data(kind, 13, seed=20 + trial)
        g = torch.Generator().manual_seed(trial)
        theta = torch.randn(64, model.n_params, generator=g) * (1.0 + 10.0 * trial)
        gap = squared_error_utility(model, theta, x[:12], y[:12], l2=2.0) - (
            squared_error_utility(model, theta, x, y, l2=2.0)
        )
        assert float(gap.min()) >= -1e-5 and float(gap.max()) <= 1.0 + 1e-5


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 20),
    d=st.integers(1, 6),
    scale=st.floats(0.0, 100.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_logistic_sensitivity_property(rows: int, d: int, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    model = build_batched(LogisticSpec(), d)
    x = torch.rand(rows, d, generator=g)
    y = (torch.rand(rows, generator=g) < 0.5).float()
    x2, y2 = x.clone(), y.clone()
    x2[0] = torch.rand(d, generator=g)
    y2[0] = torch.rand((), generator=g)  # any target in [0, 1]
    theta = torch.randn(16, d + 1, generator=g) * scale
    diff = squared_error_utility(model, theta, x, y, l2=1.0) - squared_error_utility(
        model, theta, x2, y2, l2=1.0
    )
    assert float(diff.abs().max()) <= 1.0 + 1e-5


def test_grud_accepts_flat_inputs_and_stores_the_public_means() -> None:
    module = build_module(GrudSpec(hidden=3), N_VARS, public_means=MEANS)
    x, _ = _data("grud", 4, seed=5)
    torch.testing.assert_close(module(x), module(x.reshape(4, -1)))
    assert "x_mean" in module.state_dict()
    torch.testing.assert_close(module.state_dict()["x_mean"], torch.tensor(MEANS))
    with pytest.raises(ValueError):
        module(torch.zeros(2, 3, T_STEPS, N_VARS + 1))


def test_grud_imputes_missing_values_from_the_last_observation_and_the_mean() -> None:
    module = build_module(GrudSpec(hidden=2), 1, public_means=[0.5])
    assert isinstance(module, Grud)
    values = torch.tensor([[[0.0], [0.9], [0.0], [0.2], [0.0]]])
    masks = torch.tensor([[[0.0], [1.0], [0.0], [1.0], [0.0]]])
    last = module.last_observed(values, masks)
    torch.testing.assert_close(last.flatten(), torch.tensor([0.5, 0.9, 0.9, 0.2, 0.2]))
