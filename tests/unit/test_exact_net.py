"""Issue 25: DP-SGD's sum for logistic regression and MLPs from IEEE-754 arithmetic alone
(worker/mechanisms/exact_net.py). Each row's contribution must be the same bits whatever
else is in the batch and wherever the row sits, and adding one row must move the int64 sum
by at most 2^k, checked exactly in integers, for rows on a ReLU unit's boundary too."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import pytest
import torch

from service.modelspec import LogisticSpec, MlpSpec, parameter_count
from service.privacy.sampling import GRID_BITS
from worker.mechanisms import exact_net as en
from worker.mechanisms import fixed_point as fp
from worker.mechanisms import grad_engines as ge
from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.dpsgd import DpsgdParams, integer_sum_for
from worker.models import build_module
from worker.noise import secure_rng

SPECS = [
    LogisticSpec(),
    MlpSpec(hidden=[16, 8]),
    MlpSpec(hidden=[16, 8], activation="relu"),
]


def _model(spec: Any, d: int, *, seed: int, std: float = 1.0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    module = build_module(spec, d)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std, generator=gen)
    return module


def _data(n: int, d: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=gen), (torch.rand(n, generator=gen) > 0.5).float()


def _boundary_model(d: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """A ReLU MLP whose first hidden unit is w = (1, −1, 0, …), b = 0, and a row x* with
    x*_0 = x*_1: its pre-activation is exactly 0, the row sits on the unit's boundary."""
    module = _model(MlpSpec(hidden=[12, 6], activation="relu"), d, seed=7)
    first = module.net[0]
    with torch.no_grad():
        first.weight[0].zero_()
        first.weight[0, 0], first.weight[0, 1] = 1.0, -1.0
        first.bias[0] = 0.0
    x_star = torch.rand(1, d, generator=torch.Generator().manual_seed(8))
    x_star[0, 1] = x_star[0, 0]
    return module, x_star


def _clipper(module: torch.nn.Module, d: int, clip: float = 1.0) -> en.ExactNetClipper:
    p = sum(t.numel() for t in module.parameters())
    return en.ExactNetClipper(module, grid_bits=GRID_BITS, max_grad_norm=clip, parameters=p)


@pytest.mark.parametrize("spec", SPECS)
def test_each_rows_contribution_is_the_same_bits_in_any_batch_and_position(spec: Any) -> None:
    """Alone, in batches of 1 … 2,049 rows (every residue mod 4, 8 and 16 around the
    kernels' block sizes), reversed, and after appending one row: bitwise-identical."""
    d = 20
    module = _model(spec, d, seed=25, std=2.0)
    x, y = _data(2049, d, seed=26)
    assert_rows_batch_independent(_clipper(module, d, clip=0.5), x, y)


def assert_rows_batch_independent(
    clip: en.ExactNetClipper, x: torch.Tensor, y: torch.Tensor
) -> None:
    """Every row's contribution (V per layer) is the same bits alone (every 97th row), in
    the batches of the first n rows (n from 1 to all of x's, 2,049 for every size below),
    after one row is appended to them, and in the whole batch reversed."""
    rows = x.shape[0]
    picks = list(range(0, rows, 97))
    alone = [clip.contributions(x[i : i + 1], y[i : i + 1])[0] for i in picks]
    full, _ = clip.contributions(x, y)
    sizes = (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 1024, rows)
    for n in (n for n in sizes if n <= rows):
        part, _ = clip.contributions(x[:n], y[:n])
        for layer_full, layer_part in zip(full, part, strict=True):
            assert torch.equal(layer_full[:n], layer_part), n
        appended, _ = clip.contributions(torch.cat([x[:n], x[-1:]]), torch.cat([y[:n], y[-1:]]))
        for layer_full, layer_app in zip(full, appended, strict=True):
            assert torch.equal(layer_full[:n], layer_app[:n]), n
    flipped, _ = clip.contributions(x.flip(0), y.flip(0))
    for layer_full, layer_flip in zip(full, flipped, strict=True):
        assert torch.equal(layer_full, layer_flip.flip(0))
    for i, row in zip(picks, alone, strict=True):
        for layer_full, layer_row in zip(full, row, strict=True):
            assert torch.equal(layer_full[i], layer_row[0])


@pytest.mark.parametrize("engine", ["exact", "ghost"])
@pytest.mark.parametrize("clip", [1.0, 0.05])
def test_a_row_on_a_relu_boundary_moves_the_sum_by_at_most_2k(engine: str, clip: float) -> None:
    """The audit's construction (issue 25): the float engines moved S by 1.32–1.64·2^k
    when a row on a unit's boundary was added. Exactly in integers, every batch size
    tried, both engines the plan offers for MLPs, C ∈ {1, 0.05}."""
    d = 10
    module, x_star = _boundary_model(d)
    grids, _ = en.layer_grids(module)
    a0 = torch.trunc(x_star.double() * 2.0**en.FEATURE_BITS)
    numerator = a0 @ grids[0].weight.T + grids[0].bias * 2.0**en.FEATURE_BITS
    assert float(numerator[0, 0]) == 0.0  # x* sits exactly on the first unit's boundary
    p = parameter_count(MlpSpec(hidden=[12, 6], activation="relu"), d)
    params = DpsgdParams.from_plan(
        {
            "engine": engine,
            "grid_bits": GRID_BITS,
            "max_grad_norm": clip,
            "parameters": p,
            "learning_rate": 0.1,
            "noise_multiplier": 1.0,
            "sampling_rate": 0.5,
            "steps": 1,
            "steps_per_epoch": 1,
            "expected_batch_size": 10.0,
            "public_n_rows": 20,
            "epochs": 1,
            "batch_size": 10,
        }
    )
    summed = integer_sum_for(params, module=module, rng=secure_rng())
    x, y = _data(700, d, seed=9)
    x[::3, 1] = x[::3, 0]  # a third of D sits on the boundary too
    worst = 0
    for n in [*range(1, 34), 63, 64, 65, 127, 128, 129, 255, 256, 257, 699]:
        for y_star in (0.0, 1.0):
            a = summed(torch.cat([x[:n], x_star]), torch.cat([y[:n], torch.tensor([y_star])]))
            b = summed(x[:n], y[:n])
            worst = max(worst, int(((a - b) ** 2).sum()))
    assert worst <= 4**GRID_BITS
    if clip == 0.05:
        assert worst > (0.9 * 2**GRID_BITS) ** 2  # x* clipped to ≈ C: the bound nearly met


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("clip", [1.0, 0.05])
def test_adding_any_row_moves_the_sum_by_at_most_2k(spec: Any, clip: float) -> None:
    d = 30
    module = _model(spec, d, seed=26)
    x, y = _data(700, d, seed=27)
    summed = _clipper(module, d, clip=clip)
    worst = 0
    for n in [*range(1, 20), 127, 128, 255, 256, 511, 512, 699]:
        for x_star, y_star in (
            (x[n : n + 1], y[n : n + 1]),
            (1.0 - x[n : n + 1], 1 - y[n : n + 1]),
        ):
            a = summed(torch.cat([x[:n], x_star]), torch.cat([y[:n], y_star]))
            b = summed(x[:n], y[:n])
            worst = max(worst, int(((a - b) ** 2).sum()))
    assert worst <= 4**GRID_BITS


@pytest.mark.parametrize("spec", SPECS)
def test_the_sum_is_the_clipped_float_sum_up_to_the_grids(spec: Any) -> None:
    """What is computed is DP-SGD's clipped sum: within the grids' rounding of the float64
    per-example reference (3e-4 relative, plus the final rounding's √P)."""
    d = 7
    module = _model(spec, d, seed=3)
    x, y = _data(200, d, seed=4)
    p = sum(t.numel() for t in module.parameters())
    for clip in (1.0, 0.05):
        got = _clipper(module, d, clip=clip)(x, y)
        g = ge.per_example_grads(module, x, y)
        ref = (g * torch.clamp(clip / g.norm(dim=1, keepdim=True), max=1.0)).sum(0)
        ref = ref * 2.0**GRID_BITS / clip
        assert got.dtype == torch.int64
        assert float((got.double() - ref).norm()) <= 3e-4 * float(ref.norm()) + math.sqrt(p)


def test_a_row_with_a_nan_feature_contributes_nothing_and_moves_no_other_row() -> None:
    """NaN: the row is invalid and contributes 0; ±inf is clamped into [0, 1] like any
    feature outside the schema's range."""
    d = 8
    module = _model(MlpSpec(hidden=[8]), d, seed=5)
    x, y = _data(50, d, seed=6)
    clip = _clipper(module, d)
    clean = clip(x, y)
    bad = x.clone()
    bad[10, 3] = float("nan")
    bad[20, 0] = float("inf")
    clamped = x.clone()
    clamped[20, 0] = 1.0
    keep = [i for i in range(50) if i != 10]
    assert torch.equal(clip(bad, y), clip(clamped[keep], y[keep]))
    assert not torch.equal(clean, clip(clamped[keep], y[keep]))


def test_a_relu_activation_beyond_its_range_makes_only_its_row_invalid() -> None:
    d = 4
    module = _model(MlpSpec(hidden=[3], activation="relu"), d, seed=1)
    with torch.no_grad():
        module.net[0].weight.fill_(200.0)  # a row of ones gives 800 > 2^8
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.001, 0.0, 0.0, 0.0]])
    s = en.row_signals(module, x, torch.tensor([1.0, 0.0]))
    assert s.valid.tolist() == [False, True]
    assert all(float(t[0].abs().sum()) == 0.0 for t in (*s.inputs, *s.grads))


def test_norm_sq_upper_bounds_the_exact_square_sum_and_is_tight() -> None:
    gen = torch.Generator().manual_seed(11)
    for scale in (1.0, 2.0**20, 2.0**40):
        v = torch.round(torch.randn(64, 300, generator=gen, dtype=torch.float64) * scale)
        exact = [sum(int(a) ** 2 for a in row.tolist()) for row in v]
        upper = en.norm_sq_upper(v)
        for e, u in zip(exact, upper.tolist(), strict=True):
            assert u >= e
            assert u <= e * (1 + 2.0**-17) + 300  # the coarse grid's ceil: 2^-20 relative
        if scale == 1.0:
            assert upper.tolist() == [float(e) for e in exact]  # small integers: exact
    with pytest.raises(PlanMismatch, match="range"):  # 4^s would leave int64: refused
        en.norm_sq_upper(torch.full((1, 3), 2.0**60, dtype=torch.float64))


def test_layer_grids_keep_every_product_sum_below_2_to_52() -> None:
    """The static bound behind exactness: (d_in + 1)·2^(c + r)·max|W_int| ≤ 2^52 forward,
    d_out·2^(g + r_g)·max|W_int| ≤ 2^52 backward, whatever the parameters' scale."""
    for std in (1e-6, 1.0, 1e3):
        module = _model(MlpSpec(hidden=[256, 64], activation="relu"), 100, seed=2, std=std)
        grids, _ = en.layer_grids(module)
        for index, grid in enumerate(grids):
            d_out, d_in = grid.weight.shape
            top = float(max(grid.weight.abs().max(), grid.bias.abs().max()))
            relu = 0 if index == 0 else en.RELU_RANGE_BITS
            assert (d_in + 1) * 2.0 ** (grid.in_bits + relu) * top <= 2.0**52
            if index > 0:
                g = en.GRAD_BITS + en.GRAD_RANGE_BITS
                assert d_out * 2.0**g * top <= 2.0**52
            assert top >= 2.0**15  # the grid uses its room: ≥ 15 bits below max|W|


@pytest.mark.parametrize("spec", SPECS)
def test_jl_estimates_are_the_same_bits_in_any_batch_and_match_the_float_estimator(
    spec: Any,
) -> None:
    """The jl engine's norm estimate M̂_i (Bu et al. 2021) from exact operations: a function
    of the row and the step's public directions alone, bit for bit, and close to the float64
    estimator it replaces."""
    d = 20
    module = _model(spec, d, seed=31)
    x, y = _data(700, d, seed=32)
    p = sum(t.numel() for t in module.parameters())
    directions = ge.gaussian_directions(secure_rng(), count=5, size=p)
    grids = en.layer_grids(module)
    full = en.jl_estimates(grids[0], en.row_signals(module, x, y, grids=grids), directions)
    for n in (1, 2, 3, 5, 17, 64, 255, 256, 257, 699):
        part = en.jl_estimates(
            grids[0], en.row_signals(module, x[:n], y[:n], grids=grids), directions
        )
        assert torch.equal(part, full[:n]), n
    reference = ge.jl_norm_estimates(module, x, y, directions)
    # The grids make a near-zero gradient exactly 0, and a ReLU unit whose rounded
    # pre-activation changes sign moves its row's gradient: a few rows by up to 2%.
    error = (full - reference).abs()
    assert bool((error <= 2e-2 * reference + 1e-4).all())
    assert float((error / reference.clamp(min=1e-3)).median()) < 1e-4


@pytest.mark.parametrize("spec", SPECS)
def test_jl_sum_moves_by_at_most_kappa_2k_when_one_row_is_added(spec: Any) -> None:
    """Sensitivity κ·2^k for the jl engine (the hard cap at κ·C), exactly in integers, with
    the same directions on both sides (they are drawn before the batch is looked at)."""
    d = 12
    kappa = 3.2
    module = _model(spec, d, seed=33)
    x, y = _data(300, d, seed=34)
    p = sum(t.numel() for t in module.parameters())
    clip = en.ExactNetClipper(
        module, grid_bits=GRID_BITS, max_grad_norm=0.05, parameters=p, kappa=kappa
    )
    # r = 1: M̂ ≪ ‖g‖ for some rows (a fixed draw, so the test is deterministic)
    directions = ge.gaussian_directions(np.random.default_rng(35), count=1, size=p)
    worst = 0
    for n in [*range(1, 12), 64, 65, 255, 299]:
        for x_star, y_star in (
            (x[n : n + 1], y[n : n + 1]),
            (1.0 - x[n : n + 1], 1 - y[n : n + 1]),
        ):
            a = clip(torch.cat([x[:n], x_star]), torch.cat([y[:n], y_star]), directions)
            b = clip(x[:n], y[:n], directions)
            worst = max(worst, int(((a - b) ** 2).sum()))
    assert worst <= (kappa * 2**GRID_BITS) ** 2
    assert worst > (2**GRID_BITS) ** 2  # some row was kept above C by a small estimate


def test_the_width_cap_follows_the_engine() -> None:
    """Issue 25: the API's width cap is what the exact engine's grids hold (1024); a
    DP-SGD plan for an MLP of width 1024 builds and says proven, 1025 is refused."""
    from pydantic import ValidationError

    from service.plans import build_plan
    from service.schemas import JobRequest

    body = {"dataset": "x", "method": "dpsgd", "epsilon": 1, "delta": 1e-5}
    wide = JobRequest.model_validate({**body, "model": {"kind": "mlp", "hidden": [1024]}})
    assert build_plan(wide, n_rows=30_000, n_features=104).guarantee == "proven"
    with pytest.raises(ValidationError):
        JobRequest.model_validate({**body, "model": {"kind": "mlp", "hidden": [1025]}})
    module = _model(MlpSpec(hidden=[1024, 1024], activation="relu"), 104, seed=40)
    grids, _ = en.layer_grids(module)
    assert all(
        float(g.weight.abs().max()) >= 2.0**15 for g in grids
    )  # ≥ 15 bits of the parameters' range kept at width 1024


def _golden_digest() -> str:
    """sha256 over the int64 sums of the exact, ghost and jl engines for fixed models and
    batches: logistic regression and tanh/ReLU MLPs (widths 16, 64, 256 and 64-16), two
    parameter scales, C ∈ {1, 0.05}, batches of 1, 37 and 1,500 rows (two chunks)."""
    digest = hashlib.sha256()
    d = 24
    x, y = _data(1500, d, seed=50)
    x[::7, 2] = x[::7, 3]  # ties between features (and ReLU pre-activations near 0)
    specs = [
        LogisticSpec(),
        MlpSpec(hidden=[16]),
        MlpSpec(hidden=[64]),
        MlpSpec(hidden=[16], activation="relu"),
        MlpSpec(hidden=[64, 16], activation="relu"),
    ]
    for spec in specs:
        for std in (0.3, 3.0):
            module = _model(spec, d, seed=51, std=std)
            p = sum(t.numel() for t in module.parameters())
            for clip in (1.0, 0.05):
                for n in (1, 37, 1500):
                    exact = en.ExactNetClipper(
                        module, grid_bits=GRID_BITS, max_grad_norm=clip, parameters=p
                    )
                    digest.update(exact(x[:n], y[:n]).numpy().tobytes())
                    ghost = ge.ghost_integer_sum(
                        module, x[:n], y[:n], grid_bits=GRID_BITS, max_grad_norm=clip, parameters=p
                    )
                    digest.update(ghost.numpy().tobytes())
                    directions = ge.gaussian_directions(np.random.default_rng(52), count=3, size=p)
                    jl = en.ExactNetClipper(
                        module, grid_bits=GRID_BITS, max_grad_norm=clip, parameters=p, kappa=3.2
                    )
                    digest.update(jl(x[:n], y[:n], directions).numpy().tobytes())
    x, y = _data(300, 104, seed=53)
    for activation in ("tanh", "relu"):
        module = _model(MlpSpec(hidden=[256], activation=activation), 104, seed=54, std=0.2)
        p = sum(t.numel() for t in module.parameters())
        for grid_bits in (GRID_BITS, 12):
            exact = en.ExactNetClipper(module, grid_bits=grid_bits, max_grad_norm=0.1, parameters=p)
            digest.update(exact(x, y).numpy().tobytes())
    return digest.hexdigest()


GOLDEN = "8a9018327d96550bb88cc1c548bdd65ece77ef5c05f71caf0a65141f7a854bab"


def test_the_sums_are_the_golden_bits() -> None:
    """The engines' outputs, bit for bit, as recorded before the speed work of issue 25
    (commit bf711ea's code): a faster implementation must give the same int64 sums. The
    inputs come from torch's seeded generator (torch 2.13 CPU); the sums themselves are
    exact integer arithmetic and IEEE basic operations, so platform-independent."""
    assert _golden_digest() == GOLDEN


def _sigmoid_unblocked(z: np.ndarray) -> np.ndarray:
    """fixed_point's σ̃ as one pass per operation over the whole array (the pre-blocking
    code): the reference the blocked kernels must match bit for bit."""
    v = np.minimum(np.abs(z), 64.0) * (1.0 / 64.0)
    p = np.full_like(v, 1.0 / math.factorial(18))
    for j in range(17, -1, -1):
        p = p * -v + 1.0 / math.factorial(j)
    for _ in range(6):
        p = p * p
    e = np.maximum(p, 0.0)
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@pytest.mark.parametrize("shape", [(0,), (1,), (3, 5), (7, 16385), (40_000,)])
def test_blocked_sigmoid_and_tanh_are_the_unblocked_bits(shape: tuple[int, ...]) -> None:
    """The CPU kernels run block by block (fixed_point._BLOCK): same bits as one pass per
    operation, across block boundaries, for ±0, NaN, ±inf and beyond the clamp at 64."""
    rng = np.random.default_rng(60)
    z = rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0, 1e3], size=shape)
    z.reshape(-1)[: min(z.size, 6)] = [0.0, -0.0, np.nan, np.inf, -np.inf, 64.0][: z.size]
    got = fp.sigmoid_basic(torch.from_numpy(z)).numpy()
    assert np.array_equal(got.view(np.int64), _sigmoid_unblocked(z).view(np.int64))
    z_int = torch.from_numpy(np.round(z * 2.0**30))
    for scale in (-30, -40):
        s = _sigmoid_unblocked((2.0 * (z_int * 2.0**scale)).numpy())
        want = torch.round((2.0 * torch.from_numpy(s) - 1.0) * 2.0**16).numpy()
        tanh = fp.tanh_on_grid(z_int, scale_bits=scale, out_bits=16).numpy()
        assert np.array_equal(tanh.view(np.int64), want.view(np.int64))
        if z.ndim == 2:  # the hidden layer's input [A, 2^16] in one buffer
            wide = fp.tanh_on_grid(z_int, scale_bits=scale, out_bits=16, append=2.0**16)
            assert np.array_equal(wide[:, :-1].numpy().view(np.int64), want.view(np.int64))
            assert bool((wide[:, -1] == 2.0**16).all())


def test_pow2_tensor_is_the_exact_power_of_two() -> None:
    e = torch.arange(-62, 63)
    got = fp.pow2_tensor(e.reshape(5, 25)).reshape(-1).tolist()
    assert got == [math.ldexp(1.0, k) for k in range(-62, 63)]
    shifted = (torch.ones_like(e) << e.clamp(min=0)).double() / (
        torch.ones_like(e) << (-e).clamp(min=0)
    ).double()
    assert torch.equal(fp.pow2_tensor(e), shifted)  # the integer-shift construction


def _awkward_rows(n: int, d: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features beyond [0, 1], ±0, ±inf and NaN; labels 0/1 with a few NaN, ±inf and
    non-binary values: every branch of the row validity and the column norms."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen) * 2.0 - 0.5
    y = (torch.rand(n, generator=gen) > 0.5).float()
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.0])
    picks = torch.randint(0, n * d, (max(1, n * d // 50),), generator=gen)
    x.view(-1)[picks] = specials[torch.arange(picks.numel()) % specials.numel()]
    odd = torch.tensor([float("nan"), 0.3, -2.0, 7.0, float("inf"), -float("inf")])
    rows = torch.randint(0, n, (max(1, n // 40),), generator=gen)
    y[rows] = odd[torch.arange(rows.numel()) % odd.numel()]
    return x, y


def _nonzero_fast_sums(exact: en.ExactNetClipper, x: torch.Tensor, y: torch.Tensor) -> int:
    """The clipper's fast path (``exact(x, y)``) against its general path on batches of
    0, 1, 37, 1025 and 2100 rows: the same int64 sums; how many are not all zero."""
    nonzero = 0
    for n in (0, 1, 37, 1025, 2100):
        fast = exact(x[:n], y[:n])
        general = exact._general_sum(x[:n], y[:n], None)
        assert fast.dtype == torch.int64
        assert torch.equal(fast, general), n
        nonzero += int(fast.abs().sum() > 0)
    return nonzero


@pytest.mark.parametrize("d", [1, 24, 104])
def test_logistic_fast_path_is_the_general_paths_bits(d: int) -> None:
    """ExactNetClipper's numpy path for logistic regression (_logistic_sum) against the
    general path through row_signals and contributions (_general_sum): the same int64 sums
    for zero, small, large and float64 parameters, C ∈ {1, 0.05}, grids 2^20 and 2^12,
    empty batches and batches of 1 to 3 chunks, on awkward rows; the same refusals."""
    x, y = _awkward_rows(2100, d, seed=70 + d)
    # float64 features just below a point of the grid 2^-18, which float32 would round onto
    # it (the path computes in the features' own type)
    x64 = (torch.floor(x.double() * 2.0**18) + (1.0 - 2.0**-12)) * 2.0**-18
    checked = 0
    for std in (0.0, 0.3, 30.0):
        for dtype in (torch.float32, torch.float64):
            module = _model(LogisticSpec(), d, seed=71, std=std).to(dtype)
            for clip, grid_bits in ((1.0, GRID_BITS), (0.05, GRID_BITS), (1.0, 12)):
                exact = en.ExactNetClipper(
                    module, grid_bits=grid_bits, max_grad_norm=clip, parameters=d + 1
                )
                assert exact._logistic
                checked += _nonzero_fast_sums(exact, x if dtype == torch.float32 else x64, y)
    assert checked > 30  # the sums are not all zero
    module = _model(LogisticSpec(), d, seed=72)
    exact = en.ExactNetClipper(module, grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=d + 1)
    huge = torch.zeros(3)
    huge[1] = 1e12  # |b| ≈ 2^60: beyond the column norm's exact range
    for call in (exact, lambda a, b: exact._general_sum(a, b, None)):
        with pytest.raises(PlanMismatch, match="exact engine's range"):
            call(x[:3], huge)
    with torch.no_grad():
        module.linear.weight[0, 0] = float("nan")
    for call in (exact, lambda a, b: exact._general_sum(a, b, None)):
        with pytest.raises(PlanMismatch, match="not finite"):
            call(x[:0], y[:0])


def mlp_fast_sums(spec: MlpSpec, x: torch.Tensor, y: torch.Tensor, *, seed: int) -> int:
    """:func:`_nonzero_fast_sums` of an MLP of ``spec`` (parameters of std 0.3 and 4,
    float32 and float64, C ∈ {1, 0.05}, grids 2^20 and 2^12) on x, on float64 features
    just inside the grid 2^-18, and on a one-hot-like copy of x: how many sums are not all
    zero."""
    d = x.shape[1]
    x64 = (torch.floor(x.double() * 2.0**18) + (1.0 - 2.0**-12)) * 2.0**-18
    sparse = x.clone()  # one-hot-like: columns 0 (or −0, or < 0) on every row, one NaN
    sparse[:, 1::3] = 0.0
    sparse[::2, 2::3] = -0.0
    sparse[1::2, 2::3] = -3.0
    sparse[5, 2 % max(d, 1)] = float("nan")
    p = parameter_count(spec, d)
    checked = 0
    for std in (0.3, 4.0):
        for dtype in (torch.float32, torch.float64):
            module = _model(spec, d, seed=seed, std=std).to(dtype)
            for clip, grid_bits in ((1.0, GRID_BITS), (0.05, GRID_BITS), (1.0, 12)):
                exact = en.ExactNetClipper(
                    module, grid_bits=grid_bits, max_grad_norm=clip, parameters=p
                )
                assert exact._mlp
                checked += _nonzero_fast_sums(exact, x if dtype == torch.float32 else x64, y)
                if std == 0.3 and dtype == torch.float32:  # columns left out of the products
                    checked += _nonzero_fast_sums(exact, sparse, y)
    return checked


@pytest.mark.parametrize(
    ("hidden", "activation", "d"),
    [
        ([16], "tanh", 24),
        ([300], "tanh", 104),
        ([64, 16], "tanh", 24),
        ([16], "relu", 24),
        ([64, 16], "relu", 24),
        ([1], "tanh", 1),
    ],
)
def test_mlp_fast_path_is_the_general_paths_bits(
    hidden: list[int], activation: str, d: int
) -> None:
    """ExactNetClipper's numpy path for MLPs (_mlp_sum, blocked by rows) against the general
    path through row_signals and contributions (_general_sum): the same int64 sums for
    small, large and float64 parameters, C ∈ {1, 0.05}, grids 2^20 and 2^12, empty
    batches and batches of 1 to 3 chunks (and of several row blocks), on awkward rows; the
    same refusals."""
    x, y = _awkward_rows(2100, d, seed=80 + d)
    spec = MlpSpec(hidden=hidden, activation=activation)
    p = parameter_count(spec, d)
    checked = mlp_fast_sums(spec, x, y, seed=81)
    assert checked > 20  # the sums are not all zero (deep ReLU at std 4: every row invalid)
    module = _model(spec, d, seed=82)
    with torch.no_grad():  # a zero output layer keeps the hidden gradients valid (0)
        module.net[-1].weight.zero_()
    exact = en.ExactNetClipper(module, grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=p)
    huge = torch.zeros(3)
    huge[1] = 1e12  # |b| ≈ 2^60: beyond the output column norm's exact range
    for call in (exact, lambda a, b: exact._general_sum(a, b, None)):
        with pytest.raises(PlanMismatch, match="exact engine's range"):
            call(torch.rand(3, d), huge)
    with torch.no_grad():
        next(module.parameters()).view(-1)[0] = float("nan")
    for call in (exact, lambda a, b: exact._general_sum(a, b, None)):
        with pytest.raises(PlanMismatch, match="not finite"):
            call(x[:0], y[:0])


@pytest.mark.parametrize("scale_bits", [-92, -40, -20, 0, 5, 1000])
@pytest.mark.parametrize("out_bits", [0, 16, 60])
def test_tanh_grid_block_is_the_reference_sequence(scale_bits: int, out_bits: int) -> None:
    """fixed_point.tanh_grid_block's shorter route (fewer passes: its docstring) against
    tanh_on_grid's original sequence of operations, one numpy pass each (× 2^s, × 2, σ̃ of
    the unblocked reference, × 2, − 1, × 2^o, round): the same bits, NaN's sign included,
    for integers up to 2^53, ±0, NaN, ±inf, and scales where z·2^s overflows."""
    rng = np.random.default_rng(61)
    z = np.round(rng.standard_normal(5000) * np.exp2(rng.integers(0, 53, size=5000)))
    z[:8] = [0.0, -0.0, np.nan, np.inf, -np.inf, 2.0**53, -(2.0**53), 1.0]
    if scale_bits < 0:  # integers either side of where |2z·2^s| reaches 64 (the clamp)
        edge = 2.0 ** (5 - scale_bits)
        z[8:14] = [edge - 1, edge, edge + 1, -edge + 1, -edge, -edge - 1]
    with np.errstate(all="ignore"):
        s = _sigmoid_unblocked(2.0 * (z * 2.0**scale_bits))
        want = np.rint((2.0 * s - 1.0) * 2.0**out_bits)
        got = np.empty_like(z)
        fp.tanh_grid_block(z, scale_bits=scale_bits, out_bits=out_bits, out=got)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("columns", [1, 3, 4, 33, 1024])
def test_mlp_row_kernels_are_the_numpy_sequences(columns: int) -> None:
    """fixed_point._tanh_backward_kernel and _scale_rows_kernel (issue 25: one compiled loop
    each in exact_net's MLP path) against the numpy passes they replaced, bit for bit: T
    (outer product and given product), V, the row maxima of |·| with np.maximum.reduce's NaN
    rule, and the row sums of squares where they are exact integer sums (np.vecdot's);
    rows with NaN, ±inf, ±0 and values where H² or T overflow included."""
    rng = np.random.default_rng(90 + columns)
    rows = 9
    h = np.round(rng.uniform(-(2.0**16), 2.0**16, (rows, columns)))
    upper = np.round(rng.standard_normal(rows) * 2.0**20)
    weight = np.round(rng.standard_normal(columns) * 2.0**30)
    given = np.round(rng.standard_normal((rows, columns)) * 2.0**40)
    h[1, 0], upper[2], h[3, -1], weight[0] = np.nan, np.inf, 1e200, -0.0
    h[4] = -0.0
    upper[5] = 0.0
    given[6, 0] = -np.inf
    given[7, -1] = np.nan
    full, scale = fp.pow2(32), fp.pow2(-68)

    def numpy_back(t: np.ndarray) -> np.ndarray:
        factor = np.multiply(h, h)
        np.subtract(full, factor, out=factor)
        t = t * factor
        t *= scale
        return np.rint(t, out=t)

    def same(a: np.ndarray, b: np.ndarray) -> bool:
        return a.tobytes() == b.tobytes()

    with np.errstate(all="ignore"):
        for outer, start in ((True, upper[:, None] * weight[None, :]), (False, given)):
            expected = numpy_back(start)
            t = np.empty_like(h) if outer else given.copy()
            top, t_sq, h_sq = np.empty(rows), np.empty(rows), np.empty(rows)
            fp._tanh_backward_kernel(
                t,
                upper if outer else np.empty(0),
                weight if outer else np.empty(0),
                outer,
                h,
                full,
                scale,
                top,
                t_sq,
                h_sq,
            )
            assert same(t, expected)
            reference_top = np.maximum.reduce(np.abs(expected), axis=1)
            assert np.array_equal(top, reference_top, equal_nan=True)
            assert same(np.isnan(top), np.isnan(reference_top))
            finite = reference_top < 2.0 ** en._half_bits(columns)  # exact sums (NaN: False)
            assert same(t_sq[finite], np.vecdot(expected, expected)[finite])
            exact_h = np.all(np.isfinite(h) & (np.abs(h) <= 2.0**16), axis=1)
            assert same(h_sq[exact_h], np.vecdot(h, h)[exact_h])
            assert finite.sum() >= 2 and exact_h.sum() >= 5  # the comparisons saw rows

        g = np.round(rng.standard_normal((rows, columns)) * 2.0**25)
        g[0, 0], g[1, -1], g[2] = np.nan, -np.inf, -0.0
        w = rng.uniform(0.0, 1.0, rows)
        w[3], w[4] = 0.0, np.nan
        expected = np.multiply(g, w[:, None])
        expected *= fp.pow2(-20)
        np.rint(expected, out=expected)
        out, top, sq = np.empty_like(g), np.empty(rows), np.empty(rows)
        fp._scale_rows_kernel(g, w, fp.pow2(-20), out, top, sq)
        reference_top = np.maximum.reduce(np.abs(expected), axis=1)
        assert same(out, expected)
        assert np.array_equal(top, reference_top, equal_nan=True)
        finite = reference_top < 2.0 ** en._half_bits(columns)  # exact sums (NaN: False)
        assert same(sq[finite], np.vecdot(expected, expected)[finite])
        assert finite.sum() >= 5
        assert same(np.isnan(sq), np.isnan(reference_top))  # NaN rows: NaN sums
