"""Issue 20: DP-SGD's sum for multinomial logistic regression from IEEE-754 arithmetic alone
(worker/mechanisms/exact_softmax.py). The int64 sum must equal a big-integer reference built
from each row computed on its own, every row's contribution must be within c_row exactly
(in Python integers), and adding one row must move the sum by at most 2^k; K = 3 and 10."""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import pytest
import torch

from service.modelspec import LogisticSpec, parameter_count
from service.privacy.sampling import GRID_BITS
from worker.mechanisms import exact_softmax as es
from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.exact_net import FEATURE_BITS, norm_sq_upper
from worker.mechanisms.grad_engines import exact_clipper
from worker.models import Softmax, build_module


def _model(d: int, k: int, *, seed: int, std: float = 1.0) -> Softmax:
    gen = torch.Generator().manual_seed(seed)
    module = build_module(LogisticSpec(classes=k), d)
    assert isinstance(module, Softmax)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std, generator=gen)
    return module


def _data(n: int, d: int, k: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64).float()
    y = torch.randint(0, k, (n,), generator=gen).float()
    return x, y


def _clipper(module: Softmax, d: int, *, clip: float) -> es.ExactSoftmaxClipper:
    p = parameter_count(LogisticSpec(classes=module.classes), d)
    return es.ExactSoftmaxClipper(module, grid_bits=GRID_BITS, max_grad_norm=clip, parameters=p)


def _row(clip: es.ExactSoftmaxClipper, x: torch.Tensor, y: torch.Tensor) -> tuple[list, list]:
    """One row on its own: (V as Python ints, Ã as Python ints)."""
    v, s = clip.contributions(x.unsqueeze(0), y.unsqueeze(0))
    return [int(t) for t in v[0].tolist()], [int(t) for t in s.inputs[0].tolist()]


def _reference(clip: es.ExactSoftmaxClipper, x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """round(Σ_i V_i ⊗ Ã_i·2^-18) in Python integers (round half up, as the engine), each
    row computed alone, flattened as parameters() (weights row-major, then biases)."""
    k = clip.classes
    d1 = x.shape[1] + 1
    total = [[0] * d1 for _ in range(k)]
    for i in range(x.shape[0]):
        v, a = _row(clip, x[i], y[i])
        for c in range(k):
            for j in range(d1):
                total[c][j] += v[c] * a[j]
    half, unit = 1 << (FEATURE_BITS - 1), 1 << FEATURE_BITS
    rounded = [[(t + half) // unit for t in row] for row in total]
    return [t for row in rounded for t in row[:-1]] + [row[-1] for row in rounded]


@pytest.mark.parametrize("k", [3, 10])
@pytest.mark.parametrize("clip", [1.0, 0.05])
def test_the_sum_equals_the_big_integer_reference_of_rows_computed_alone(
    k: int, clip: float
) -> None:
    d = 7
    module = _model(d, k, seed=k)
    x, y = _data(150, d, k, seed=k + 1)
    c = _clipper(module, d, clip=clip)
    assert c(x, y).tolist() == _reference(c, x, y)
    # the same rows in another order and another batch give the same row values
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(3))
    assert c(x[perm], y[perm]).tolist() == c(x, y).tolist()


@pytest.mark.parametrize("k", [3, 10])
def test_every_rows_contribution_is_within_c_row_exactly(k: int) -> None:
    d = 9
    module = _model(d, k, seed=20 + k, std=4.0)
    x, y = _data(200, d, k, seed=30 + k)
    c = _clipper(module, d, clip=0.01)  # clipping active on every row
    v, s = c.contributions(x, y)
    cap = Fraction(c.row_cap)
    for vi, ai in zip(v.tolist(), s.inputs.tolist(), strict=True):
        norm_sq = Fraction(sum(int(t) ** 2 for t in vi) * sum(int(t) ** 2 for t in ai))
        assert norm_sq / (1 << (2 * FEATURE_BITS)) <= cap * cap
    # the clip binds: the largest row is close to c_row, not far below it
    largest = max(
        math.sqrt(sum(t * t for t in vi) * sum(t * t for t in ai)) * 2.0**-FEATURE_BITS
        for vi, ai in zip(v.tolist(), s.inputs.tolist(), strict=True)
    )
    assert largest > 0.99 * c.row_cap


@pytest.mark.parametrize("k", [10, 100, 1000])
def test_the_integer_check_is_exact_and_never_fires_however_small_c(k: int) -> None:
    """Clipping keeps ‖V_i‖ < 2^20 (‖Ã_i‖ ≥ 2^18), so the bound U(V_i) is ‖V_i‖² exactly
    and the a-posteriori check (GuardFailed would end the job) never fires."""
    d = 3
    module = _model(d, k, seed=60 + k, std=6.0)
    x, y = _data(300, d, k, seed=70 + k)
    c = _clipper(module, d, clip=1e-4)
    v, s = c.contributions(x, y)  # raises GuardFailed if any row exceeded its bound
    assert float(v.abs().max()) < 2.0**20
    exact = [sum(int(t) ** 2 for t in vi) for vi in v.tolist()]
    assert norm_sq_upper(v).tolist() == [float(e) for e in exact]
    cap = Fraction(c.row_cap)
    for sq, ai in zip(exact, s.inputs.tolist(), strict=True):
        norm_sq = Fraction(sq * sum(int(t) ** 2 for t in ai))
        assert norm_sq / (1 << (2 * FEATURE_BITS)) <= cap * cap


@pytest.mark.parametrize("k", [3, 10])
def test_adding_any_row_moves_the_sum_by_at_most_2k(k: int) -> None:
    d = 6
    module = _model(d, k, seed=40 + k, std=3.0)
    x, y = _data(64, d, k, seed=50 + k)
    c = _clipper(module, d, clip=0.1)
    base = c(x[1:], y[1:]).tolist()
    for i in range(8):
        xs = torch.cat((x[1:], x[i : i + 1]))
        ys = torch.cat((y[1:], y[i : i + 1]))
        moved = sum((a - b) ** 2 for a, b in zip(c(xs, ys).tolist(), base, strict=True))
        assert moved <= (1 << GRID_BITS) ** 2  # exact, in integers


def test_the_softmax_is_torchs_and_the_sum_is_the_clipped_float_sum_up_to_the_grids() -> None:
    d, k = 5, 4
    module = _model(d, k, seed=7, std=0.5)
    x, y = _data(40, d, k, seed=8)
    w, b = module.linear.weight.detach().double(), module.linear.bias.detach().double()
    logits = x.double() @ w.T + b
    assert torch.allclose(es.softmax_basic(logits), torch.softmax(logits, dim=1), atol=1e-13)
    clip = 100.0  # above every row's norm (≤ √2·√6): the plain gradient sum, on its grid
    c = _clipper(module, d, clip=clip)
    got = c(x, y).double() * clip * 2.0**-GRID_BITS
    p = torch.softmax(logits, dim=1) - torch.nn.functional.one_hot(y.long(), k).double()
    xb = torch.cat((x.double(), torch.ones(40, 1, dtype=torch.float64)), dim=1)
    g = p.T @ xb  # (K, d + 1)
    want = torch.cat((g[:, :-1].reshape(-1), g[:, -1]))
    # per row: the noise grid C·2^-20 (V rounded), the residuals' 2^-20, the features' 2^-18
    unit = clip * 2.0**-GRID_BITS
    assert torch.allclose(got, want, rtol=0.0, atol=40 * (unit + 2.0**-16))
    assert not torch.allclose(got, torch.zeros_like(got), atol=1.0)


def test_an_invalid_row_contributes_nothing_and_moves_no_other_row() -> None:
    d, k = 4, 3
    module = _model(d, k, seed=9)
    x, y = _data(10, d, k, seed=10)
    c = _clipper(module, d, clip=1.0)
    clean = c(x, y).tolist()
    for bad_x, bad_y in [(float("nan"), 0.0), (0.5, 3.0), (0.5, -1.0), (0.5, 1.5)]:
        xs = torch.cat((x, torch.full((1, d), bad_x)))
        ys = torch.cat((y, torch.tensor([bad_y])))
        _, s = c.contributions(xs, ys)
        assert not bool(s.valid[-1]) and bool(s.valid[:-1].all())
        assert c(xs, ys).tolist() == clean


def test_the_dispatch_picks_the_softmax_engine_and_the_binary_path_is_unchanged() -> None:
    module = _model(3, 5, seed=1)
    p = parameter_count(LogisticSpec(classes=5), 3)
    assert p == 5 * 4
    assert isinstance(
        exact_clipper(module, grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=p),
        es.ExactSoftmaxClipper,
    )
    assert parameter_count(LogisticSpec(), 3) == 4
    with pytest.raises(PlanMismatch):
        es.ExactSoftmaxClipper(
            build_module(LogisticSpec(), 3), grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=4
        )


def _golden_digest() -> str:
    h = hashlib.sha256()
    for k, clip in ((3, 1.0), (10, 0.05)):
        d = 8
        module = _model(d, k, seed=100 + k, std=2.0)
        x, y = _data(700, d, k, seed=200 + k)
        h.update(_clipper(module, d, clip=clip)(x, y).numpy().tobytes())
    return h.hexdigest()


GOLDEN = "7411eb56f23f1f6fe7600bc2d03451e7aaf0d4845ffb2265ea8319cd68090681"


def test_the_sums_are_the_golden_bits() -> None:
    """The engine's int64 sums, bit for bit, as first committed (issue 20): a faster
    implementation (of this module or of fixed_point's exp_neg_basic) must give the same
    sums. Inputs from torch's seeded generator (torch 2.13 CPU); the sums are exact integer
    arithmetic and IEEE basic operations, so platform-independent."""
    assert _golden_digest() == GOLDEN
