"""DP-SGD runs exactly the planned mechanism, and depends only on the plan's public values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from service.methods.dpsgd import dpsgd_schedule
from service.modelspec import GrudSpec, LogisticSpec, MlpSpec, parameter_count
from service.plans import build_plan
from service.privacy.sampling import GRID_BITS
from service.schemas import DpsgdOptions, JobRequest
from worker.mechanisms import dpsgd
from worker.mechanisms import grad_engines as ge
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.dpsgd import PoissonSampler, run_dpsgd
from worker.mechanisms.grad_engines import clipped_integer_sum
from worker.models import build_module
from worker.noise import secure_rng

ADULT_PUBLIC_ROWS = 30162  # the bundled Adult training file's validated rows


def _mech(**kw: float) -> dict:
    base = dict(
        noise_multiplier=1.0,
        sampling_rate=0.1,
        steps=30,
        expected_batch_size=1.0,
        max_grad_norm=1.0,
        learning_rate=0.1,
        grid_bits=GRID_BITS,
        parameters=4,
        steps_per_epoch=10,
    )
    return {**base, **kw}


def _data(n: int = 10, d: int = 3) -> TabularTrainingSet:
    g = torch.Generator().manual_seed(0)
    return TabularTrainingSet(
        torch.rand(n, d, generator=g), (torch.rand(n, generator=g) > 0.5).float()
    )


def _run(mechanism: dict, data: TabularTrainingSet, progress=lambda k, t: None) -> dict:
    out = run_dpsgd(
        spec=LogisticSpec(),
        mechanism=mechanism,
        samples=1,
        data=data,
        device=torch.device("cpu"),
        progress=progress,
    )
    return out.releases[0]


def test_runs_every_planned_step_even_with_empty_poisson_batches() -> None:
    steps: list[tuple[int, int]] = []
    w = _run(_mech(), _data(), progress=lambda k, t: steps.append((k, t)))
    assert [k for k, _ in steps] == list(range(1, 31)) and {t for _, t in steps} == {30}
    assert set(w) == {"linear.weight", "linear.bias"}
    assert all(torch.isfinite(v).all() for v in w.values())


def test_noise_is_not_reproducible_by_anyone() -> None:
    """Two runs with identical inputs differ: the noise is drawn from fresh CSPRNG seeds."""
    a, b = (_run(_mech(noise_multiplier=5.0), _data()) for _ in range(2))
    assert not torch.equal(a["linear.weight"], b["linear.weight"])


@pytest.fixture
def zero_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start from θ = 0 so a single step's update can be read off the release."""

    def build(spec, n_features, **kw):  # type: ignore[no-untyped-def]
        module = build_module(spec, n_features, **kw)
        with torch.no_grad():
            for p in module.parameters():
                p.zero_()
        return module

    monkeypatch.setattr(dpsgd, "build_module", build)


def test_update_is_normalised_by_the_public_expected_batch_not_the_loaded_rows(
    monkeypatch: pytest.MonkeyPatch, zero_init: None
) -> None:
    """Audit defect 1. With the noise switched off (so the update is deterministic), q = 1,
    zero features, y = 1 and θ = 0, each row's bias gradient is σ(0) − 1 = −0.5, so one
    step moves the bias by lr·0.5·n_loaded/B̂ with B̂ the plan's expected batch size. The
    old code divided by q·n_loaded, giving lr·0.5 whatever n: the loaded row count set the
    scale of the released weights (and of their noise)."""
    monkeypatch.setattr(
        dpsgd, "rounded_gaussian", lambda rng, *, scale, size: np.zeros(size, np.int64)
    )
    for n in (99, 100):
        data = TabularTrainingSet(torch.zeros(n, 3), torch.ones(n))
        m = _mech(sampling_rate=1.0, steps=1, expected_batch_size=100.0, learning_rate=1.0)
        w = _run(m, data)
        assert float(w["linear.bias"][0]) == pytest.approx(0.5 * n / 100.0, abs=1e-6)


def test_released_update_is_integer_noise_on_the_public_grid(zero_init: None) -> None:
    """Audit defect 6. From θ = 0 with no row sampled (q = 1e-12), one step's update is
    pure noise; with lr = C = B̂ = 1 it is N·2^−k for the integer noise vector N, exactly
    representable in float32 here. Float noise (torch.normal, the old code) is not on the
    grid almost surely."""
    m = _mech(
        noise_multiplier=0.01,
        sampling_rate=1e-12,
        steps=1,
        learning_rate=1.0,
        expected_batch_size=1.0,
        parameters=201,
    )
    w = _run(m, TabularTrainingSet(torch.zeros(10, 200), torch.ones(10)))
    flat = torch.cat([w["linear.weight"].flatten(), w["linear.bias"].flatten()]).double()
    units = flat * 2.0**GRID_BITS
    assert torch.equal(units, units.round())
    # and it is noise of the planned scale σ·2^k (a loose check on 201 draws)
    assert 0.5 < float(units.std()) / (0.01 * 2**GRID_BITS) < 1.5


def test_clipped_integer_sum_bounds_each_row() -> None:
    module = build_module(LogisticSpec(), 5)
    x = torch.rand(50, 5) * 1000.0  # huge gradients: all clipped
    y = torch.zeros(50)
    total = clipped_integer_sum(module, x, y, grid_bits=GRID_BITS, max_grad_norm=0.5, parameters=6)
    assert total.dtype == torch.int64
    assert float(total.double().norm()) <= 50 * 2**GRID_BITS
    for i in range(5):
        one = clipped_integer_sum(
            module, x[i : i + 1], y[i : i + 1], grid_bits=GRID_BITS, max_grad_norm=0.5, parameters=6
        )
        assert int((one * one).sum()) <= 4**GRID_BITS
        assert int((one * one).sum()) >= (2**GRID_BITS * 0.999) ** 2  # clipped to ≈ C
    empty = clipped_integer_sum(
        module, x[:0], y[:0], grid_bits=GRID_BITS, max_grad_norm=0.5, parameters=6
    )
    assert torch.equal(empty, torch.zeros(6, dtype=torch.int64))


def test_poisson_sampler_runs_exactly_q() -> None:
    for q in (1.0, 0.5, 1 / 3, 16 / ADULT_PUBLIC_ROWS, 1e-9, 5e-324):
        assert PoissonSampler(sampling_rate=q, rng=secure_rng()).rate == q
    s = PoissonSampler(sampling_rate=0.3, rng=secure_rng())
    n, draws = 1000, 200
    hits = sum(len(s.indices(n)) for _ in range(draws))
    # two-sided binomial test at 1e-7: a correct sampler fails this once in 10^7 runs
    assert stats.binomtest(hits, n * draws, 0.3).pvalue > 1e-7
    assert len(PoissonSampler(sampling_rate=1.0, rng=secure_rng()).indices(17)) == 17


class _ScriptedBits:
    """A bit generator whose raw 64-bit words carry a given byte stream, in order."""

    def __init__(self, stream: bytes) -> None:
        self.stream, self.at = stream, 0

    def random_raw(self, words: int) -> np.ndarray:
        chunk = self.stream[self.at : self.at + 8 * words].ljust(8 * words, b"\0")
        self.at += 8 * words
        return np.frombuffer(chunk, dtype=np.uint64).copy()


class _ScriptedRng:
    def __init__(self, stream: bytes) -> None:
        self.bit_generator = _ScriptedBits(stream)


@pytest.mark.parametrize("q", [556 / 2**16, 0.5 + 2**-16, 2**-16, 1 - 2**-16])
def test_poisson_coin_compares_every_two_byte_uniform_with_q_exactly(q: float) -> None:
    """All 2^16 values U of a 16-bit uniform, fed as the bytes the sampler reads (the high
    bytes of all rows, then a low byte for each row whose high byte tied with q's): a row
    is included iff U < q·2^16, so exactly q·2^16 rows of 2^16 are."""
    threshold = round(q * 2**16)
    sampler = PoissonSampler(sampling_rate=q, rng=secure_rng())
    values = np.arange(1 << 16)
    high, low = values >> 8, values & 0xFF
    tied = high == threshold >> 8
    stream = high.astype(np.uint8).tobytes()
    stream = stream.ljust(-(-len(stream) // 8) * 8, b"\0") + low[tied].astype(np.uint8).tobytes()
    sampler.rng = _ScriptedRng(stream)  # type: ignore[assignment]
    coins = sampler.coins(1 << 16)
    assert np.array_equal(coins, values < threshold)
    assert int(coins.sum()) == threshold


def test_poisson_blocks_follow_binomial_per_step_and_per_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Across blocks of many steps (forced small here, so steps straddle block ends): T
    steps, each batch's rows distinct, sorted and in range, batch sizes with the mean and
    variance of Binomial(n, q), and every row included in Binomial(T, q) of the steps."""
    monkeypatch.setattr(dpsgd, "_COIN_BLOCK", 7 * 300 + 5)
    n, q, steps = 300, 0.0371, 4000
    sampler = PoissonSampler(sampling_rate=q, rng=secure_rng())
    batches = []
    for block in sampler.blocks(n, steps):
        assert len(block.rows) == sum(block.sizes)
        batches += np.split(block.rows, np.cumsum(block.sizes)[:-1])
    assert len(batches) == steps
    assert all(np.all(np.diff(b) > 0) and (b.size == 0 or 0 <= b[0] <= b[-1] < n) for b in batches)
    sizes = np.array([b.size for b in batches], dtype=np.float64)
    mean, var = n * q, n * q * (1 - q)
    z_mean = (sizes.mean() - mean) / math.sqrt(var / steps)
    # the sample variance of T binomials: sd ≈ var·√(2/T) (binomial kurtosis is ≈ 3 here)
    z_var = (sizes.var(ddof=1) - var) / (var * math.sqrt(2 / steps))
    assert abs(z_mean) < 6 and abs(z_var) < 6, (z_mean, z_var)
    per_row = np.bincount(np.concatenate(batches), minlength=n)
    expected = steps * q
    chi2 = float(np.sum((per_row - expected) ** 2 / (expected * (1 - q))))
    assert stats.chi2.sf(chi2, n).item() > 1e-7 and stats.chi2.cdf(chi2, n).item() > 1e-7


def test_every_batch_size_up_to_2000_runs_as_planned_on_adult() -> None:
    """Audit defect 5 (Opacus ran int(1/q) batches per epoch, so 25 batch sizes up to 2000
    failed after touching data). Now the schedule is q = B/n̂, T = epochs·⌈n̂/B⌉ for every
    B, and the worker's sampler runs exactly that q for exactly the plan's T steps."""
    for batch in range(1, 2001):
        options = DpsgdOptions(batch_size=batch, epochs=3)
        sch = dpsgd_schedule(n_rows=ADULT_PUBLIC_ROWS, options=options)
        assert sch.sampling_rate == batch / ADULT_PUBLIC_ROWS
        assert sch.steps == 3 * math.ceil(ADULT_PUBLIC_ROWS / batch)
        rate = PoissonSampler(sampling_rate=sch.sampling_rate, rng=secure_rng()).rate
        assert rate == sch.sampling_rate


@pytest.mark.parametrize("batch", [16, 32])
def test_formerly_failing_batch_sizes_plan_and_run(batch: int) -> None:
    """Full path for two of the batch sizes the audit saw fail: plan, then run on data with
    the public row count, counting the steps the mechanism takes."""
    request = JobRequest(
        dataset="adult",
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        dpsgd=DpsgdOptions(batch_size=batch, epochs=1),
    )
    plan = build_plan(request, n_rows=ADULT_PUBLIC_ROWS, n_features=3)
    seen: list[int] = []
    _run(
        plan.mechanism,
        _data(n=ADULT_PUBLIC_ROWS),
        progress=lambda k, t: seen.append(k) if k == t else None,
    )
    assert seen == [plan.mechanism["steps"]] == [math.ceil(ADULT_PUBLIC_ROWS / batch)]


def test_parameter_count_matches_the_modules() -> None:
    specs = (LogisticSpec(), MlpSpec(hidden=[16]), MlpSpec(hidden=[8, 4, 2]))
    for spec in (*specs, GrudSpec(hidden=1), GrudSpec(hidden=16)):
        module = build_module(spec, 7)
        assert parameter_count(spec, 7) == sum(p.numel() for p in module.parameters())


def _grud_batch(n: int, *, steps: int = 5, n_vars: int = 3, seed: int = 0) -> torch.Tensor:
    """GRU-D inputs (n, 3, T, V) as the schema encodes them: values in [0, 1], masks,
    deltas in hours since the last observation."""
    from service.datasets.timeseries import deltas_from_masks, pack_grud_inputs

    rng = np.random.default_rng(seed)
    masks = (rng.random((n, steps, n_vars)) < 0.4).astype(np.float32)
    values = rng.random((n, steps, n_vars)).astype(np.float32)
    return torch.as_tensor(pack_grud_inputs(values, masks, deltas_from_masks(masks)))


def test_grud_per_example_grads_equal_a_per_row_reference() -> None:
    """torch.func's vmap over GRU-D (with its public-means buffer and decay parameters)
    gives each row's gradient, as one autograd backward per row does."""
    module = build_module(GrudSpec(hidden=4), 3, public_means=[0.2, 0.5, 0.9])
    assert ge.linear_layers(module) is None  # the torch.func path
    x, y = _grud_batch(6), torch.tensor([1.0, 0, 1, 0, 0, 1])
    fast = ge.per_example_grads(module, x, y)
    rows = []
    for i in range(6):
        module.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            module(x[i : i + 1]), y[i : i + 1], reduction="sum"
        )
        loss.backward()
        rows.append(torch.cat([p.grad.flatten() for p in module.parameters()]))  # type: ignore[union-attr]
    assert fast.shape == (6, parameter_count(GrudSpec(hidden=4), 3))
    torch.testing.assert_close(fast, torch.stack(rows).double(), atol=1e-6, rtol=1e-5)


def test_dpsgd_builds_grud_with_the_variables_width_and_the_public_means() -> None:
    """The model is built with V (x's last axis), not x's second axis (3 channels), and
    carries the schema's imputation means; the release is a GRU-D state dict."""
    means = (0.2, 0.5, 0.9)
    data = TabularTrainingSet(_grud_batch(20), (torch.rand(20) > 0.5).float(), public_means=means)
    spec = GrudSpec(hidden=2)
    mech = _mech(parameters=parameter_count(spec, 3), steps=3, expected_batch_size=4.0)
    out = run_dpsgd(
        spec=spec,
        mechanism=mech,
        samples=1,
        data=data,
        device=torch.device("cpu"),
        progress=lambda k, t: None,
    )
    release = out.releases[0]
    module = build_module(spec, 3)  # zero means until the release is loaded
    module.load_state_dict(release)  # strict: parameters and the means buffer
    assert release["gamma_x_weight"].shape == (3,)
    torch.testing.assert_close(module.x_mean, torch.tensor(means))


@pytest.mark.parametrize("spec", [LogisticSpec(), MlpSpec(hidden=[8]), MlpSpec(hidden=[6, 5, 4])])
def test_linear_engine_equals_torch_func_and_a_per_row_reference(spec: object) -> None:
    """The Linear fast path, and the engine each run uses (the closed form for logistic
    regression), give the same per-example gradients as torch.func's vmap and as one
    autograd backward per row (the microbatch reference), at random parameters."""
    module = build_module(spec, 7)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    x, y = torch.randn(9, 7), (torch.rand(9) > 0.5).float()
    layers = ge.linear_layers(module)
    assert layers is not None
    fast = ge._linear_per_example_grads(module, layers, x, y).double()
    engine = ge.gradient_engine(module)(x, y)
    assert engine.dtype == torch.float64
    torch.testing.assert_close(engine, fast, atol=1e-6, rtol=1e-5)
    ref_vmap = ge._vmap_per_example_grads(module, x, y).double()
    rows = []
    for i in range(9):
        module.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            module(x[i : i + 1]), y[i : i + 1], reduction="sum"
        )
        loss.backward()
        rows.append(torch.cat([p.grad.flatten() for p in module.parameters()]))  # type: ignore[union-attr]
    ref_rows = torch.stack(rows).double()
    torch.testing.assert_close(fast, ref_vmap, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast, ref_rows, atol=1e-6, rtol=1e-5)


def _clipper(parameters: int) -> ge.IntegerClipper:
    module = build_module(LogisticSpec(), 3)
    return ge.IntegerClipper(module, grid_bits=GRID_BITS, max_grad_norm=0.7, parameters=parameters)


@pytest.mark.parametrize("parameters", [40, 9000])
def test_integer_sum_equals_an_exact_rational_reference_within_the_proofs_bound(
    parameters: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each row is weighted by min(2^k/C, c/‖g_i‖) (c = c_row·(1 − 2^-20)), and the engine's
    int64 sum is within ½ + γ_G·Σ|z_i| per coordinate of the exact rational sum of the
    weighted rows (Python Fractions: no rounding at all), rounded once; chunked or not."""
    from fractions import Fraction

    clip = _clipper(parameters)
    g = torch.randn(37, parameters, dtype=torch.float64) * torch.logspace(-3, 2, 37).unsqueeze(1)
    g[5] = 0.0
    w = clip.weights(g)
    assert float(w[5]) == clip._units  # a zero gradient: unclipped, contributes 0
    contrib = w.unsqueeze(1) * g
    assert float(contrib.norm(dim=1).max()) <= ge.row_cap(
        parameters=parameters, sensitivity=2.0**GRID_BITS
    )
    clip.grads = lambda x, y: g[x.flatten().long()]  # rows of g by index
    idx = torch.arange(37.0).unsqueeze(1)
    got = clip(idx, torch.zeros(37))
    wl, gl = w.tolist(), g.tolist()
    exact = [
        sum(Fraction(wl[i]) * Fraction(gl[i][j]) for i in range(37)) for j in range(parameters)
    ]
    gamma = 2 * (ge.REDUCE_CHUNK + 10) * 2.0**-53
    mass = contrib.abs().sum(dim=0).tolist()
    for j in range(parameters):
        assert abs(Fraction(int(got[j])) - exact[j]) <= Fraction(1, 2) + Fraction(gamma * mass[j])
    monkeypatch.setattr(ge, "REDUCE_CHUNK", 5)  # chunks of 5 rows, slices of 2: same bound
    clip._slice = 2
    chunked = clip(idx, torch.zeros(37))
    assert float((chunked - got).abs().max()) <= 1


def test_non_finite_gradients_weigh_nothing() -> None:
    """A NaN or ±inf entry (or a norm that overflows) gives the row weight 0: it adds
    nothing, and the other rows' sum is unchanged, so the bound holds whatever it held."""
    for parameters in (40, 9000):
        clip = _clipper(parameters)
        g = torch.ones(4, parameters, dtype=torch.float64)
        g[1, 3] = math.nan
        g[2, 0] = math.inf
        g[3] = 1e300  # finite entries, the norm overflows
        clip.grads = lambda x, y, g=g: g[x.flatten().long()]
        both = clip(torch.arange(4.0).unsqueeze(1), torch.zeros(4))
        alone = clip(torch.zeros(1, 1), torch.zeros(1))
        assert torch.equal(both, alone)


def test_noise_stream_has_the_rounded_gaussian_law() -> None:
    """Per-step noise vectors taken from the stream (blocks of steps, then one row each)
    follow the rounded Gaussian pmf Φ((k+½)/s) − Φ((k−½)/s): chi-square on 60 000 draws."""
    scale = 2.5
    stream = dpsgd.NoiseStream(rng=secure_rng(), size=20, steps=3000)
    draws = torch.cat([stream.draw(scale=scale, same_scale_ahead=3000 - i) for i in range(3000)])
    cells = np.arange(-7, 8)
    counts = np.array([int((draws == c).sum()) for c in cells])
    counts = np.append(counts, draws.numel() - counts.sum())  # |k| ≥ 8
    probs = stats.norm.cdf((cells + 0.5) / scale) - stats.norm.cdf((cells - 0.5) / scale)
    probs = np.append(probs, 1 - probs.sum())
    chi2 = float(np.sum((counts - draws.numel() * probs) ** 2 / (draws.numel() * probs)))
    assert stats.chi2.sf(chi2, len(cells)).item() > 1e-7


def test_noise_stream_draws_fresh_integer_noise_per_step_and_rescales() -> None:
    stream = dpsgd.NoiseStream(rng=secure_rng(), size=3, steps=204)
    a = [stream.draw(scale=1000.0, same_scale_ahead=4 - i) for i in range(4)]
    assert all(v.dtype == torch.int64 and v.shape == (3,) for v in a)
    assert len({tuple(v.tolist()) for v in a}) == 4  # distinct draws (equal ones: prob < 1e-9)
    big = torch.stack([stream.draw(scale=1e6, same_scale_ahead=200 - i) for i in range(200)])
    assert 0.8e6 < float(big.double().std()) < 1.2e6  # the new scale took effect at once


def test_decaying_schedule_uses_each_epochs_sigma() -> None:
    p = dpsgd.DpsgdParams.from_plan(
        {**_mech(steps=6), "steps_per_epoch": 2, "noise_multipliers": [3.0, 2.0, 1.0]}
    )
    assert [p.sigma_at(k) for k in range(1, 7)] == [3.0, 3.0, 2.0, 2.0, 1.0, 1.0]
    assert [p.steps_with_same_sigma(k) for k in range(1, 7)] == [2, 1, 2, 1, 2, 1]
    flat = dpsgd.DpsgdParams.from_plan({**_mech(steps=6), "steps_per_epoch": 2})
    assert {flat.sigma_at(k) for k in range(1, 7)} == {1.0}
