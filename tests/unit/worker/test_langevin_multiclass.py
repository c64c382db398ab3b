"""The proven ExpM sampler for K ≥ 3 classes (multinomial logistic regression, method
``expm``, sampler ``langevin``; issue 20): its plan and charge against closed forms, the
exact integer gradient sum against a Python-integer reference for K = 3, the residual bound
‖r_int‖² ≤ 2·2^(2a) (worker/mechanisms/langevin.py, "K classes") on extreme logits, the
run-time refusals, and the chain's target."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from service.methods.expm import LANGEVIN_MAX_NOISE_SCALE
from service.modelspec import LogisticSpec
from service.plans import build_plan
from service.privacy.orders import ORDERS
from service.privacy.sampling import noise_slack
from service.schemas import JobRequest
from worker.mechanisms.base import PlanMismatch, TabularTrainingSet
from worker.mechanisms.fixed_point import quantised_theta, theta_bits
from worker.mechanisms.langevin import (
    ExactRowSums,
    LangevinParams,
    gradient_sum,
    quantised_features,
    row_residuals,
    run_expm_langevin,
)

K = 3
KW = {"feature_bits": 16, "residual_bits": 16}


def _request(**kw: object) -> JobRequest:
    body = {"dataset": "d", "method": "expm", "epsilon": 1.0, "delta": 1e-5, **kw}
    return JobRequest.model_validate(body)


def _plan(
    request: JobRequest, *, n_rows: int = 1000, n_features: int = 6, bound: int = 7, k: int = K
):
    return build_plan(
        request, n_rows=n_rows, n_features=n_features, norm_sq_bound=bound, n_classes=k
    )


def _gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact δ(ε) of μ-GDP (Balle & Wang 2018; Dong, Roth & Su 2022, Cor. 2.13)."""
    return float(
        stats.norm.cdf(-epsilon / mu + mu / 2)
        - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
    )


def _theta(g: torch.Generator, d1: int, scale: float, b: int, m: int) -> torch.Tensor:
    raw = torch.randn(d1, K, generator=g, dtype=torch.float64) * scale
    return quantised_theta(raw, bits=b, limit_bits=m)


@pytest.mark.parametrize(("epsilon", "steps"), [(0.1, 50), (1.0, 300)])
def test_k_class_charge_is_the_full_batch_gaussian_composition(epsilon: float, steps: int) -> None:
    plan = _plan(_request(epsilon=epsilon, expm={"steps": steps}))
    m = plan.mechanism
    assert plan.model == {"kind": "logistic", "classes": K} and plan.guarantee == "proven"
    assert m["parameters"] == K * 7 and m["classes"] == K and m["residual_norm_sq_bound"] == 2
    sigma = m["noise_multiplier"]
    # RDP of T Gaussian mechanisms with noise multiplier σ: α·T/(2σ²) (Mironov 2017), plus
    # the integer sampler's slack for its K·(d + 1)·T draws.
    slack = noise_slack(draws=K * 7 * steps).rdp(ORDERS)
    for got, want, extra in zip(plan.rdp_curve, ORDERS, slack, strict=True):
        assert got == pytest.approx(want * steps / (2 * sigma**2) + extra, rel=1e-9)
    mu = math.sqrt(steps) / sigma
    assert _gaussian_delta(epsilon, mu) <= 1e-5
    assert _gaussian_delta(epsilon, mu / 0.99) > 1e-5 * 0.999
    # Noise σ·√(2B) on the gradient sum: k = 2n̂/(lr·σ²·2B).
    # (lr: the plan's resolved learning rate; its default is a rule of n̂, ε and B, 2938917)
    k = 2 * 1000 / (m["learning_rate"] * sigma**2 * 2 * 7)
    assert m["inverse_temperature"] == pytest.approx(k)
    # The worker's sensitivity is 2^(a+c)·√(2B), and its noise scale stays in range.
    params = LangevinParams.from_plan(m)
    a, c = m["residual_bits"], m["feature_bits"]
    assert params.sensitivity == 2.0 ** (a + c) * math.sqrt(14)
    assert sigma * params.sensitivity <= LANGEVIN_MAX_NOISE_SCALE
    assert params.inputs == 7 and params.classes == K


def test_binary_plans_carry_no_class_keys_and_keep_the_binary_sensitivity() -> None:
    binary = _plan(_request(expm={"steps": 20}), k=2)
    assert "classes" not in binary.mechanism and "residual_norm_sq_bound" not in binary.mechanism
    params = LangevinParams.from_plan(binary.mechanism)
    a, c = binary.mechanism["residual_bits"], binary.mechanism["feature_bits"]
    assert params.classes == 1 and params.sensitivity == 2.0 ** (a + c) * math.sqrt(7)
    # Same σ as the K-class plan for the same T: only the draws' slack differs.
    multi = _plan(_request(expm={"steps": 20}))
    assert multi.mechanism["noise_multiplier"] == pytest.approx(
        binary.mechanism["noise_multiplier"], rel=1e-3
    )


def test_a_plan_that_understates_the_residual_bound_is_refused() -> None:
    m = _plan(_request(expm={"steps": 5})).mechanism
    with pytest.raises(PlanMismatch, match="residual bound"):
        LangevinParams.from_plan({**m, "residual_norm_sq_bound": 1})
    with pytest.raises(PlanMismatch, match="classes"):
        LangevinParams.from_plan({**m, "classes": 2})
    with pytest.raises(PlanMismatch, match="residual bound"):
        LangevinParams.from_plan({**m, "classes": 1, "parameters": 7})  # the bound says K


def test_k_class_gradient_sum_equals_a_python_integer_reference() -> None:
    g = torch.Generator().manual_seed(31)
    n, d = 301, 4
    x = torch.rand(n, d, generator=g)
    y = torch.randint(K, (n,), generator=g).double()
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    x_int = quantised_features(x, feature_bits=16, norm_sq_bound=d + 1)
    xi = x_int.numpy().astype(np.int64).tolist()
    sensitivity_sq = 2 ** (2 * 32) * 2 * (d + 1)  # Δ² = 2^(2(a+c))·2B, an integer
    for scale in (0.3, 4.0, 300.0):
        theta = _theta(g, d + 1, scale, b, m)
        got = gradient_sum(x_int, y, theta, theta_bits=b, **KW)
        assert got.shape == (d + 1, K) and got.dtype == torch.int64
        r = row_residuals(x_int, y, theta, theta_bits=b, **KW)
        ti = theta.numpy().astype(np.int64).tolist()
        ri = r.numpy().astype(np.int64).tolist()
        for i in range(n):
            # Exact logits in rationals; the float softmax differs only below the grid.
            z = [Fraction(sum(xi[i][j] * ti[j][k] for j in range(d + 1)), 2 ** (16 + b))
                 for k in range(K)]  # fmt: skip
            top = max(z)
            e = [math.exp(float(v - top)) for v in z]
            p = [v / sum(e) for v in e]
            for k in range(K):
                want = (p[k] - (1.0 if k == int(y[i]) else 0.0)) * 2**16
                assert abs(ri[i][k] - want) <= 1.0 + 1e-6
                assert abs(ri[i][k]) <= abs(want) + 1e-6  # truncation toward zero
            # Row i's integer vector r ⊗ x within Δ, exactly in integers.
            norm_sq = sum(v * v for v in ri[i]) * sum(v * v for v in xi[i])
            assert norm_sq <= sensitivity_sq
        want_sum = [[sum(ri[i][k] * xi[i][j] for i in range(n)) for k in range(K)]
                    for j in range(d + 1)]  # fmt: skip
        assert got.tolist() == want_sum


def test_the_residual_bound_holds_on_extreme_logits_and_is_attained() -> None:
    """‖r_int‖² ≤ 2·2^(2a) (the docstring's proof, from correct rounding alone) on logits
    up to the grid's range, where p̃ is 0/1 or within an ulp of it and Σ p̃ need not be 1;
    the worst case p̃ = e_k, y ≠ k reaches the bound exactly."""
    g = torch.Generator().manual_seed(32)
    n, d = 4000, 5
    x_int = quantised_features(torch.rand(n, d, generator=g), feature_bits=16, norm_sq_bound=6)
    y = torch.randint(K, (n,), generator=g).double()
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    worst = 0
    for scale in (1e-3, 1.0, 30.0, 1e3, 1e6):
        theta = _theta(g, d + 1, scale, b, m)
        for bits in (1, 8, 16):
            r = row_residuals(x_int, y, theta, feature_bits=16, residual_bits=bits, theta_bits=b)
            norm_sq = (r * r).sum(dim=1)
            assert bool((norm_sq <= 2.0 ** (2 * bits + 1)).all())
            if bits == 16:
                worst = max(worst, int(norm_sq.max()))
    assert worst == 2 * 2**32


def test_a_k_class_rows_residuals_are_the_same_bits_in_any_batch() -> None:
    g = torch.Generator().manual_seed(33)
    d = 9
    x_int = quantised_features(torch.rand(1100, d, generator=g), feature_bits=16, norm_sq_bound=10)
    y = torch.randint(K, (1100,), generator=g).double()
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    for scale in (0.1, 5.0, 80.0):
        theta = _theta(g, d + 1, scale, b, m)
        kw = {"theta_bits": b, **KW}
        alone = torch.cat([row_residuals(x_int[i : i + 1], y[i : i + 1], theta, **kw)
                           for i in range(1100)])  # fmt: skip
        for n in (1, 2, 7, 64, 65, 257, 1024, 1100):
            assert torch.equal(row_residuals(x_int[:n], y[:n], theta, **kw), alone[:n]), n
        assert torch.equal(row_residuals(x_int.flip(0), y.flip(0), theta, **kw), alone.flip(0))


def test_adding_one_row_changes_the_k_class_sum_by_exactly_that_rows_vector() -> None:
    g = torch.Generator().manual_seed(34)
    d = 6
    x_int = quantised_features(torch.rand(500, d, generator=g), feature_bits=16, norm_sq_bound=7)
    y = torch.randint(K, (500,), generator=g).double()
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    delta = 2.0**32 * math.sqrt(2 * (d + 1))
    kw = {"theta_bits": b, **KW}
    for trial in range(25):
        theta = _theta(g, d + 1, float(trial + 1), b, m)
        n = int(torch.randint(1, 499, (1,), generator=g))
        base = gradient_sum(x_int[:n], y[:n], theta, **kw)
        plus = gradient_sum(x_int[: n + 1], y[: n + 1], theta, **kw)
        own = row_residuals(x_int[n : n + 1], y[n : n + 1], theta, **kw)[0]
        diff = plus - base
        assert diff.tolist() == torch.outer(x_int[n], own).round().to(torch.int64).tolist()
        assert float(torch.linalg.vector_norm(diff.double())) <= delta


@pytest.mark.parametrize("sparse", [False, True])
def test_k_class_parts_and_storage_give_the_same_sums(sparse: bool) -> None:
    g = torch.Generator().manual_seed(35)
    d = 5
    x_int = quantised_features(torch.rand(900, d, generator=g), feature_bits=16, norm_sq_bound=6)
    y = torch.randint(K, (900,), generator=g).double()
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    theta = _theta(g, d + 1, 3.0, b, m)
    plain = gradient_sum(x_int, y, theta, theta_bits=b, **KW)
    with ThreadPoolExecutor(max_workers=3) as pool:
        for parts in (1, 3):
            sums = ExactRowSums(x_int, y, theta_bits=b, sparse=sparse, parts=parts, classes=K, **KW)
            assert torch.equal(sums.gradient_sum(theta, pool=pool), plain)
            assert torch.equal(
                sums.residuals(theta), row_residuals(x_int, y, theta, theta_bits=b, **KW)
            )


def _run(plan_mechanism: dict, data: TabularTrainingSet, spec: LogisticSpec | None = None):
    return run_expm_langevin(
        spec=spec or LogisticSpec(classes=K),
        mechanism=plan_mechanism,
        samples=1,
        data=data,
        device=torch.device("cpu"),
        progress=lambda step, total: None,
    )


def test_labels_outside_the_classes_and_a_wrong_model_are_refused() -> None:
    plan = _plan(_request(expm={"steps": 2}), n_rows=10, n_features=2, bound=3)
    for labels in ([0.0, 1.0, 3.0, 0.0], [0.0, 1.5, 2.0, 0.0], [0.0, -1.0, 2.0, 1.0]):
        data = TabularTrainingSet(x=torch.rand(4, 2), y=torch.tensor(labels))
        with pytest.raises(PlanMismatch, match="labels outside the declared classes"):
            _run(plan.mechanism, data)
    data = TabularTrainingSet(x=torch.rand(4, 2), y=torch.tensor([0.0, 1.0, 2.0, 0.0]))
    with pytest.raises(PlanMismatch, match="classes differ"):
        _run(plan.mechanism, data, LogisticSpec(classes=4))
    # A schema bound B = 2 that the rows x = (1, 1) exceed (‖(x, 1)‖² = 3).
    tight = _plan(_request(expm={"steps": 2}), n_rows=10, n_features=2, bound=2)
    with pytest.raises(PlanMismatch, match="norm bound"):
        _run(tight.mechanism, TabularTrainingSet(x=torch.ones(4, 2), y=data.y))


def test_k_class_chain_with_little_noise_reaches_the_regularised_optimum() -> None:
    """At ε = 50 the target is sharp and θ_T lands near argmin Σ CE + l2‖θ‖²/2 (the
    softmax's own minimiser, in its identifiable form: l2 > 0 makes it unique)."""
    g = torch.Generator().manual_seed(36)
    n, d = 3000, 3
    x = torch.rand(n, d, generator=g)
    w_true = torch.tensor([[3.0, -2.0, 0.0], [-1.0, 2.0, 1.0], [0.0, 0.0, -2.0]])
    y = torch.multinomial(torch.softmax(x @ w_true.T, dim=1), 1, generator=g)[:, 0].double()
    plan = _plan(
        _request(epsilon=50.0, expm={"steps": 500, "learning_rate": 2.0, "l2": 1.0}),
        n_rows=n,
        n_features=d,
        bound=d + 1,
    )
    release = _run(plan.mechanism, TabularTrainingSet(x=x, y=y)).releases[0]
    theta = torch.cat([release["linear.weight"], release["linear.bias"][:, None]], dim=1)
    xa = np.hstack([x.double().numpy(), np.ones((n, 1))])
    onehot = np.eye(K)[y.numpy().astype(int)]

    def objective(t: np.ndarray) -> float:
        z = xa @ t.reshape(K, d + 1).T
        top = z.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
        return float(np.sum(lse - (onehot * z).sum(axis=1)) + 0.5 * t @ t)

    best = optimize.minimize(objective, np.zeros(K * (d + 1)), method="BFGS").x
    got = theta.double().numpy().reshape(-1)
    error = np.linalg.norm(got - best) / np.linalg.norm(best)
    assert error < 0.1, error
