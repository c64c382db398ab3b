"""The proven ExpM sampler (method ``expm``, sampler ``langevin``): its charge against closed
forms, the exact integer gradient sum and its sensitivity, and the chain's target."""

from __future__ import annotations

import hashlib
import json
import math
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from service.ledger.idempotency import request_digest
from service.methods.expm import langevin_grid_bits, row_norm_sq_bound
from service.plans import PlanError, build_plan
from service.privacy.orders import ORDERS
from service.privacy.sampling import noise_slack
from service.schemas import JobRequest
from worker.mechanisms.base import PlanMismatch, TabularTrainingSet
from worker.mechanisms.fixed_point import quantised_theta, sigmoid_basic, theta_bits
from worker.mechanisms.langevin import (
    ExactRowSums,
    LangevinParams,
    gradient_sum,
    quantised_features,
    row_residuals,
    run_expm_langevin,
)
from worker.noise import secure_rng


def _request(**kw: object) -> JobRequest:
    body = {"dataset": "d", "method": "expm", "epsilon": 1.0, "delta": 1e-5, **kw}
    return JobRequest.model_validate(body)


def _plan(request: JobRequest, *, n_rows: int = 1000, n_features: int = 6, bound: int = 7):
    return build_plan(request, n_rows=n_rows, n_features=n_features, norm_sq_bound=bound)


def _gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact δ(ε) of μ-GDP (Balle & Wang 2018; Dong, Roth & Su 2022, Cor. 2.13)."""
    return float(
        stats.norm.cdf(-epsilon / mu + mu / 2)
        - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
    )


@pytest.mark.parametrize(("epsilon", "steps"), [(0.1, 50), (1.0, 300), (10.0, 300)])
def test_charge_is_the_full_batch_gaussian_composition(epsilon: float, steps: int) -> None:
    plan = _plan(_request(epsilon=epsilon, expm={"steps": steps}))
    sigma = plan.mechanism["noise_multiplier"]
    slack = noise_slack(draws=7 * steps)
    # RDP of T Gaussian mechanisms with noise multiplier σ: α·T/(2σ²) (Mironov 2017), plus
    # the integer sampler's slack.
    expected = [a * steps / (2 * sigma**2) for a in ORDERS]
    slack_curve = slack.rdp(ORDERS)
    for got, want, extra in zip(plan.rdp_curve, expected, slack_curve, strict=True):
        assert got == pytest.approx(want + extra, rel=1e-9)
    # The stated (ε, δ) holds for the exact Gaussian composition, μ = √T/σ, and the
    # calibration is tight: 1% less noise breaks it.
    mu = math.sqrt(steps) / sigma
    assert _gaussian_delta(epsilon, mu) <= 1e-5
    assert _gaussian_delta(epsilon, mu / 0.99) > 1e-5 * 0.999
    assert plan.guarantee == "proven" and plan.epsilon == epsilon and plan.delta == 1e-5
    k = plan.mechanism["inverse_temperature"]
    assert k == pytest.approx(2 * 1000 / (plan.mechanism["learning_rate"] * sigma**2 * 7))


def test_samples_are_charged_once_each() -> None:
    one = _plan(_request(expm={"steps": 20}))
    three = _plan(_request(expm={"steps": 20}, samples=3))
    assert three.rdp_curve == pytest.approx([3 * v for v in one.rdp_curve], rel=1e-12)
    assert three.epsilon == 3 * one.epsilon


def test_plan_refusals() -> None:
    with pytest.raises(PlanError, match="logistic"):
        _plan(_request(model={"kind": "mlp"}))
    with pytest.raises(PlanError, match="delta > 0"):
        _plan(_request(delta=0))
    with pytest.raises(PlanError, match="tabular"):
        build_plan(_request(), n_rows=100, n_features=6)
    with pytest.raises(PlanError, match="too large"):
        langevin_grid_bits(noise_multiplier=2.0**39, norm_sq_bound=14)


def test_grid_keeps_the_noise_scale_in_the_samplers_range() -> None:
    for sigma in (0.5, 60.0, 5e3, 1e6):
        a, c = langevin_grid_bits(noise_multiplier=sigma, norm_sq_bound=14)
        assert a + c <= 32 and sigma * 2.0 ** (a + c) * math.sqrt(14) <= 2.0**40


def test_row_norm_bound_of_the_adult_schema() -> None:
    from pathlib import Path

    from service.datasets.kinds import load_schema_yaml

    root = Path(__file__).resolve().parents[3]
    schema = load_schema_yaml((root / "examples/adult/schema.yaml").read_text())
    assert row_norm_sq_bound(schema) == 14  # 6 numeric + 7 categorical + bias (issue 13: G = √14)


def _params(**kw: object) -> LangevinParams:
    base = {
        "steps": 5,
        "learning_rate": 1.0,
        "l2": 1.0,
        "public_n_rows": 50,
        "parameters": 4,
        "row_norm_sq_bound": 4,
        "residual_bits": 16,
        "feature_bits": 16,
        "noise_multiplier": 1.0,
        **kw,
    }
    return LangevinParams(**base)  # type: ignore[arg-type]


def test_gradient_sum_is_exact_and_each_row_within_the_sensitivity() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.rand(257, 3, generator=g)
    y = (torch.rand(257, generator=g) < 0.4).float()
    params = _params()
    b, m = theta_bits(feature_bits=16, parameters=4)
    theta = quantised_theta(torch.randn(4, generator=g, dtype=torch.float64), bits=b, limit_bits=m)
    x_int = quantised_features(x, feature_bits=16, norm_sq_bound=4)
    got = gradient_sum(x_int, y, theta, feature_bits=16, residual_bits=16, theta_bits=b)
    # Reference in Python integers and exact rationals, row by row.
    xi = x_int.numpy().astype(np.int64)
    ti = theta.numpy().astype(np.int64)
    z = [Fraction(int(sum(int(a) * int(t) for a, t in zip(row, ti, strict=True))), 2 ** (16 + b))
         for row in xi]  # fmt: skip
    r = row_residuals(x_int, y, theta, feature_bits=16, residual_bits=16, theta_bits=b)
    for i in range(len(xi)):
        s = 1 / (1 + math.exp(-float(z[i])))  # σ̃ is within 1e-13 of σ: only truncation differs
        assert abs(float(r[i]) - (s - float(y[i])) * 2**16) <= 1.0 + 1e-6
    ri = r.numpy().astype(np.int64)
    rows = [[int(ri[i]) * int(v) for v in xi[i]] for i in range(len(xi))]
    want = [sum(col) for col in zip(*rows, strict=True)]
    assert got.tolist() == want
    assert max(math.sqrt(sum(v * v for v in row)) for row in rows) <= params.sensitivity


def test_a_rows_residual_is_the_same_bits_in_any_batch_and_position() -> None:
    """Issue 25: float logits from a matrix product depend on the batch (BLAS kernels), and
    with a crafted θ adding one row moved another row's truncated residual by one unit.
    Now each row's residual is a function of the row and θ̃ alone, bit for bit: for batch
    sizes 1 … 2,049, every row's residual in the batch equals its residual alone."""
    g = torch.Generator().manual_seed(11)
    d = 13
    x = torch.rand(2049, d, generator=g)
    y = (torch.rand(2049, generator=g) < 0.5).float()
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    x_int = quantised_features(x, feature_bits=16, norm_sq_bound=d + 1)
    kw = {"feature_bits": 16, "residual_bits": 16, "theta_bits": b}
    thetas = [torch.randn(d + 1, generator=g, dtype=torch.float64) * s for s in (0.1, 3.0, 50.0)]
    # Crafted: θ puts row 0 on a truncation boundary of its residual (logit where σ·2^16 is
    # within float noise of an integer), the case that moved under the old float logits.
    crafted = torch.zeros(d + 1, dtype=torch.float64)
    crafted[-1] = math.log(0.5 + 1e-12 / 2**16)
    thetas.append(crafted)
    for raw in thetas:
        theta = quantised_theta(raw, bits=b, limit_bits=m)
        alone = torch.cat(
            [row_residuals(x_int[i : i + 1], y[i : i + 1], theta, **kw) for i in range(2049)]
        )
        for n in (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 1024, 2049):
            assert torch.equal(row_residuals(x_int[:n], y[:n], theta, **kw), alone[:n]), n
        # The row at every position of a reversed batch too.
        assert torch.equal(row_residuals(x_int.flip(0), y.flip(0), theta, **kw), alone.flip(0))


def test_adding_one_row_changes_the_sum_by_exactly_that_rows_vector() -> None:
    """‖S(D + x*) − S(D)‖ = ‖r_int(x*)·x*_int‖ ≤ Δ exactly, for many D sizes and θ."""
    g = torch.Generator().manual_seed(12)
    d = 6
    params = _params(parameters=d + 1, row_norm_sq_bound=d + 1)
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    x_int = quantised_features(torch.rand(600, d, generator=g), feature_bits=16, norm_sq_bound=7)
    y = (torch.rand(600, generator=g) < 0.5).float()
    kw = {"feature_bits": 16, "residual_bits": 16, "theta_bits": b}
    for trial in range(40):
        theta = quantised_theta(
            torch.randn(d + 1, generator=g, dtype=torch.float64) * (trial + 1),
            bits=b,
            limit_bits=m,
        )
        n = int(torch.randint(1, 599, (1,), generator=g))
        base = gradient_sum(x_int[:n], y[:n], theta, **kw)
        plus = gradient_sum(x_int[: n + 1], y[: n + 1], theta, **kw)
        own = row_residuals(x_int[n : n + 1], y[n : n + 1], theta, **kw)
        diff = plus - base
        assert diff.tolist() == (own * x_int[n]).round().to(torch.int64).tolist()
        assert float(torch.linalg.vector_norm(diff.double())) <= params.sensitivity


@pytest.mark.parametrize("sparse", [True, False])
def test_prepared_storage_gives_the_same_bits_as_the_plain_products(sparse: bool) -> None:
    """Issue 25 (speed): a run prepares x_int once (CSR where sparse, else column-major);
    only the storage differs, so every row's residual (to the bit, sign of zero included)
    and the int64 sum equal the plain row-major products', on one-hot-like rows."""
    g = torch.Generator().manual_seed(21)
    n, d = 3000, 20
    x = torch.rand(n, d, generator=g) * (torch.rand(n, d, generator=g) < 0.15)
    x[:, :4] = (torch.rand(n, 4, generator=g) < 0.5).float()  # one-hot-like 0/1 columns
    x[:7] = 0.0  # rows holding only the bias: numerator ±0
    y = (torch.rand(n, generator=g) < 0.3).float()
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    kw = {"feature_bits": 16, "residual_bits": 16, "theta_bits": b}
    x_int = quantised_features(x, feature_bits=16, norm_sq_bound=d + 1)
    sums = ExactRowSums(x_int, y, sparse=sparse, **kw)
    assert sums.sparse is sparse
    for scale in (0.0, 1e-9, 0.5, 4.0, 300.0):
        raw = torch.randn(d + 1, generator=g, dtype=torch.float64) * scale
        raw[-1] = -1e-12  # θ̃'s bias rounds to −0.0
        theta = quantised_theta(raw, bits=b, limit_bits=m)
        want = row_residuals(x_int, y, theta, **kw)
        got = sums.residuals(theta)
        assert torch.equal(got.view(torch.int64), want.view(torch.int64)), scale
        assert torch.equal(sums.gradient_sum(theta), gradient_sum(x_int, y, theta, **kw))
        ri = want.numpy().astype(np.int64)
        exact = (ri[:, None] * x_int.numpy().astype(np.int64)).sum(axis=0)
        assert sums.gradient_sum(theta).tolist() == exact.tolist()


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_the_rows_split_into_parts_give_the_same_sums_on_a_pool_or_not(parts: int) -> None:
    """Issue 25 (speed): a run splits the rows into as many parts as the worker's threads
    and sums the parts on a thread pool; every part's sum is exact, so the int64 sum is the
    plain product's and the exact integer reference's, for any split, pool or none."""
    g = torch.Generator().manual_seed(23)
    n, d = 1001, 9
    x = torch.rand(n, d, generator=g) * (torch.rand(n, d, generator=g) < 0.3)
    y = (torch.rand(n, generator=g) < 0.4).float()
    b, m = theta_bits(feature_bits=16, parameters=d + 1)
    kw = {"feature_bits": 16, "residual_bits": 16, "theta_bits": b}
    x_int = quantised_features(x, feature_bits=16, norm_sq_bound=d + 1)
    sums = ExactRowSums(x_int, y, parts=parts, **kw)
    assert len(sums._chunks) == parts
    with ThreadPoolExecutor(max_workers=2) as pool:
        for scale in (0.0, 0.5, 20.0, 500.0):
            raw = torch.randn(d + 1, generator=g, dtype=torch.float64) * scale
            theta = quantised_theta(raw, bits=b, limit_bits=m)
            want = row_residuals(x_int, y, theta, **kw)
            assert torch.equal(sums.residuals(theta).view(torch.int64), want.view(torch.int64))
            # The CPU path's in-place numpy ufuncs are torch's operations, bit for bit.
            logits = (x_int @ theta) * 2.0 ** -(16 + b)
            by_torch = torch.trunc((sigmoid_basic(logits) - y.double()) * 2.0**16)
            assert torch.equal(want.view(torch.int64), by_torch.view(torch.int64))
            ri = want.numpy().astype(np.int64)
            exact = (ri[:, None] * x_int.numpy().astype(np.int64)).sum(axis=0).tolist()
            assert sums.gradient_sum(theta).tolist() == exact
            assert sums.gradient_sum(theta, pool=pool).tolist() == exact


def test_quantised_features_equal_the_integer_truncation() -> None:
    """The float32 → float64 grid (issue 25 speed) holds the integers trunc(x·2^c) that
    int64 truncation gives, +0.0 for a −0.0 input, the bias 2^c, any input float type."""
    g = torch.Generator().manual_seed(24)
    x = torch.rand(300, 5, generator=g)
    x[0, 0], x[1, :] = -0.0, 1.0
    want = torch.trunc(x.double() * 2.0**16).to(torch.int64)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        xs = x.to(dtype)
        got = quantised_features(xs, feature_bits=16, norm_sq_bound=6)
        ref = torch.trunc(xs.double() * 2.0**16).to(torch.int64)
        assert got.shape == (300, 6)
        assert torch.equal(got[:, :5].to(torch.int64), ref) and bool((got[:, 5] == 2.0**16).all())
        assert not bool(torch.signbit(got).any())  # no −0.0
    got = quantised_features(x, feature_bits=16, norm_sq_bound=6)
    assert torch.equal(got[:, :5], want.double())
    # A row exactly on the bound passes, one unit over it does not (exact comparison).
    on_bound = torch.ones(1, 3)
    assert quantised_features(on_bound, feature_bits=16, norm_sq_bound=4).shape == (1, 4)
    with pytest.raises(PlanMismatch, match="norm bound"):
        quantised_features(on_bound, feature_bits=16, norm_sq_bound=3)
    with pytest.raises(PlanMismatch, match="exact-sum"):
        quantised_features(x, feature_bits=17, norm_sq_bound=6)


def test_a_release_is_the_same_at_one_and_two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's thread count changes how the rows are split and where the parts run,
    never a bit of the release (the same ChaCha20 key for both runs)."""
    from randomgen import ChaCha

    import worker.mechanisms.langevin as langevin

    plan = _plan(_request(expm={"steps": 25}), n_rows=700, n_features=4, bound=5)
    g = torch.Generator().manual_seed(25)
    data = TabularTrainingSet(x=torch.rand(700, 4, generator=g), y=torch.ones(700))
    data.y[::3] = 0.0
    monkeypatch.setattr(
        langevin, "secure_rng", lambda: np.random.Generator(ChaCha(key=99, rounds=20))
    )
    before = torch.get_num_threads()
    releases = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out = run_expm_langevin(
                spec=_request().model,
                mechanism=plan.mechanism,
                samples=1,
                data=data,
                device=torch.device("cpu"),
                progress=lambda s, t: None,
            )
            assert torch.get_num_threads() == threads  # the sampler gives the setting back
            releases.append(out.releases[0])
    finally:
        torch.set_num_threads(before)
    for other in releases[1:]:
        for key, value in releases[0].items():
            assert torch.equal(value.view(torch.int32), other[key].view(torch.int32))


def test_rows_beyond_the_schema_bound_are_refused() -> None:
    with pytest.raises(PlanMismatch, match="norm bound"):
        quantised_features(torch.ones(2, 4), feature_bits=16, norm_sq_bound=4)
    with pytest.raises(PlanMismatch, match=r"\[0, 1\]"):
        quantised_features(torch.full((2, 3), 1.5), feature_bits=16, norm_sq_bound=4)
    with pytest.raises(PlanMismatch, match=r"\[0, 1\]"):
        quantised_features(torch.full((2, 3), float("nan")), feature_bits=16, norm_sq_bound=4)
    plan = _plan(_request(expm={"steps": 2}), n_rows=10, n_features=2, bound=3)
    with pytest.raises(PlanMismatch, match="labels"):
        run_expm_langevin(
            spec=_request().model,
            mechanism=plan.mechanism,
            samples=1,
            data=TabularTrainingSet(x=torch.rand(4, 2), y=torch.tensor([0.0, 1.0, 2.0, 0.0])),
            device=torch.device("cpu"),
            progress=lambda step, total: None,
        )


def test_the_plan_and_the_worker_agree_on_the_mechanism_keys() -> None:
    plan = _plan(_request(expm={"steps": 7}))
    params = LangevinParams.from_plan(plan.mechanism)
    assert params.steps == 7 and params.parameters == 7 and params.row_norm_sq_bound == 7
    with pytest.raises(PlanMismatch, match="sampler"):
        LangevinParams.from_plan({**plan.mechanism, "sampler": "mala"})


def test_chain_with_little_noise_reaches_the_regularised_optimum() -> None:
    """At ε = 50 the target is sharp (k ≫ 1) and θ_T lands near argmin Σℓ + l2‖θ‖²/2."""
    g = torch.Generator().manual_seed(11)
    n, d = 4000, 3
    x = torch.rand(n, d, generator=g)
    w_true = torch.tensor([3.0, -2.0, 1.0])
    y = (torch.rand(n, generator=g) < torch.sigmoid(x @ w_true - 0.5)).float()
    plan = build_plan(
        _request(epsilon=50.0, expm={"steps": 500, "learning_rate": 2.0, "l2": 1.0}),
        n_rows=n,
        n_features=d,
        norm_sq_bound=d + 1,
    )
    assert plan.mechanism["inverse_temperature"] > 50
    out = run_expm_langevin(
        spec=_request().model,
        mechanism=plan.mechanism,
        samples=1,
        data=TabularTrainingSet(x=x, y=y),
        device=torch.device("cpu"),
        progress=lambda step, total: None,
    )
    theta = torch.cat([out.releases[0]["linear.weight"][0], out.releases[0]["linear.bias"]])
    xa = np.hstack([x.double().numpy(), np.ones((n, 1))])
    yn = y.double().numpy()

    def objective(t: np.ndarray) -> float:
        z = xa @ t
        return float(np.sum(np.logaddexp(0, z) - yn * z) + 0.5 * t @ t)

    best = optimize.minimize(objective, np.zeros(d + 1), method="BFGS").x
    # Measured ≈ 0.008 of ‖θ*‖ over four runs.
    assert np.linalg.norm(theta.double().numpy() - best) < 0.05 * np.linalg.norm(best)


def test_noise_stream_draws_are_fresh_per_run() -> None:
    """Two runs on the same data never release the same model (server-side randomness)."""
    plan = _plan(_request(expm={"steps": 3}), n_rows=10, n_features=2, bound=3)
    data = TabularTrainingSet(x=torch.rand(10, 2), y=torch.ones(10))
    kw = {"spec": _request().model, "mechanism": plan.mechanism, "samples": 1, "data": data}
    a = run_expm_langevin(**kw, device=torch.device("cpu"), progress=lambda s, t: None)  # type: ignore[arg-type]
    b = run_expm_langevin(**kw, device=torch.device("cpu"), progress=lambda s, t: None)  # type: ignore[arg-type]
    assert not torch.equal(a.releases[0]["linear.weight"], b.releases[0]["linear.weight"])
    assert secure_rng() is not secure_rng()


def test_request_digest_of_requests_without_expm_is_unchanged() -> None:
    """Idempotency digests stored before the method existed still match."""
    request = JobRequest.model_validate(
        {"dataset": "d", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-5}
    )
    data = request.model_dump(mode="json")
    data.pop("expm")
    data["dpsgd"] = None
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert request_digest(request) == hashlib.sha256(body.encode()).hexdigest()


def test_default_steps_follow_the_requested_epsilon() -> None:
    # Issue 21's rule: reach lr·T = n̂·ε/(10·√B) = 37.8 at ε = 1 (n̂ = 1000, B = 7), 3.78 at
    # ε = 0.1 (T at least 10, lr smaller); named steps win.
    assert _plan(_request(epsilon=1.0)).mechanism["steps"] == 38
    assert _plan(_request(epsilon=0.1)).mechanism["steps"] == 10
    assert _plan(_request(epsilon=0.1, expm={"steps": 7})).mechanism["steps"] == 7
