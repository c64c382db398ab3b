"""Issue 25 for GRU-D: its per-example gradients by a hand-written forward and backward
through time in fixed-point arithmetic (worker/mechanisms/exact_grud.py): the same bits in
any batch, close to autograd's float64 gradients, and a sum that moves by at most 2^k,
checked exactly in integers, when one stay is added."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service.datasets.timeseries import deltas_from_masks, pack_grud_inputs
from service.privacy.sampling import GRID_BITS
from worker.mechanisms import grad_engines as ge
from worker.mechanisms.exact_grud import GrudExactClipper, grud_row_gradients
from worker.models.grud import Grud

T, V, H = 10, 4, 6


def _stays(n: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    masks = (rng.random((n, T, V)) < 0.4).astype(np.float32)
    values = rng.random((n, T, V)).astype(np.float32)
    x = torch.as_tensor(pack_grud_inputs(values, masks, deltas_from_masks(masks)))
    return x, torch.as_tensor((rng.random(n) < 0.5).astype(np.float32))


def _model(seed: int, std: float = 0.5) -> Grud:
    gen = torch.Generator().manual_seed(seed)
    module = Grud(V, H, public_means=torch.rand(V, generator=gen))
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std, generator=gen)
    return module


def _flat(module: Grud, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    g = grud_row_gradients(module, x, y)
    return torch.cat([b * 2.0**-bits for b, bits in zip(g.blocks, g.bits, strict=True)], 1)


def test_the_fixed_point_gradients_are_autograds_up_to_the_grids() -> None:
    module = _model(1)
    x, y = _stays(80, seed=2)
    got = _flat(module, x, y)
    ref = ge.per_example_grads(module, x, y)
    assert got.shape == ref.shape
    error = (got - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(error.median()) < 1e-3 and float(error.max()) < 1e-2


def test_each_stays_gradient_is_the_same_bits_in_any_batch_and_position() -> None:
    module = _model(3)
    x, y = _stays(300, seed=4)
    full = grud_row_gradients(module, x, y)
    for n in (1, 2, 3, 5, 8, 17, 64, 65, 257, 300):
        part = grud_row_gradients(module, x[:n], y[:n])
        for a, b in zip(full.blocks, part.blocks, strict=True):
            assert torch.equal(a[:n], b), n
    flipped = grud_row_gradients(module, x.flip(0), y.flip(0))
    for a, b in zip(full.blocks, flipped.blocks, strict=True):
        assert torch.equal(a, b.flip(0))


@pytest.mark.parametrize("clip", [1.0, 0.05])
def test_adding_one_stay_moves_the_sum_by_at_most_2k(clip: float) -> None:
    module = _model(5, std=1.0)
    x, y = _stays(260, seed=6)
    p = sum(t.numel() for t in module.parameters())
    summed = GrudExactClipper(module, grid_bits=GRID_BITS, max_grad_norm=clip, parameters=p)
    worst = 0
    for n in [*range(1, 12), 63, 64, 255, 256, 259]:
        for star in (slice(n, n + 1), slice(0, 1)):
            a = summed(torch.cat([x[:n], x[star]]), torch.cat([y[:n], 1 - y[star]]))
            b = summed(x[:n], y[:n])
            worst = max(worst, int(((a - b) ** 2).sum()))
    assert worst <= 4**GRID_BITS
    if clip == 0.05:
        assert worst > (0.9 * 2**GRID_BITS) ** 2  # the row is clipped: the bound nearly met


def test_a_stay_with_a_nan_contributes_nothing() -> None:
    module = _model(7)
    x, y = _stays(20, seed=8)
    p = sum(t.numel() for t in module.parameters())
    summed = GrudExactClipper(module, grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=p)
    bad = x.clone()
    bad[4, 0, 3, 1] = float("nan")
    keep = [i for i in range(20) if i != 4]
    assert torch.equal(summed(bad, y), summed(x[keep], y[keep]))


def test_the_exact_engine_runs_grud_through_the_fixed_point_path() -> None:
    module = _model(9)
    p = sum(t.numel() for t in module.parameters())
    clip = ge.exact_clipper(module, grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=p)
    assert isinstance(clip, GrudExactClipper)
