"""Issue 20 for GRU-D: a head of K logits, softmax and cross-entropy in DP-SGD's exact engine
(worker/mechanisms/exact_grud.py, "K classes"; the softmax residuals are exact_net's
``softmax_residuals``, the K-class MLP's code). Each stay's gradient must be the same bits
alone and in any batch or position (issue 25's rule), a label outside [0, K) must make its
stay contribute nothing, the int64 sum must be the sum of the stays computed alone and move
by at most 2^k when one stay is added, and the fixed-point gradients must be autograd's
float64 cross-entropy gradients up to the grids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, vmap

from service.datasets.timeseries import deltas_from_masks, pack_grud_inputs
from service.modelspec import MAX_CLASSES, GrudSpec, parameter_count
from service.privacy.sampling import GRID_BITS
from worker.mechanisms import grad_engines as ge
from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.exact_grud import GrudExactClipper, grud_row_gradients
from worker.models import build_module
from worker.models.grud import Grud

T, V, H = 8, 3, 5
CLASSES = [3, 10]


def _stays(n: int, k: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random stays (40 % observed) with class indices 0 … K − 1 (float32, as encode_series)."""
    rng = np.random.default_rng(seed)
    masks = (rng.random((n, T, V)) < 0.4).astype(np.float32)
    values = rng.random((n, T, V)).astype(np.float32)
    x = torch.as_tensor(pack_grud_inputs(values, masks, deltas_from_masks(masks)))
    return x, torch.as_tensor(rng.integers(0, k, n).astype(np.float32))


def _awkward_labels(y: torch.Tensor, k: int) -> torch.Tensor:
    """Labels with a few that are not a class: NaN, ±inf, −1, K, 1.5, K − 0.5."""
    y = y.double().clone()
    odd = [float("nan"), float("inf"), -float("inf"), -1.0, float(k), 1.5, k - 0.5]
    for i, bad in enumerate(odd):
        y[7 * i + 3] = bad
    return y


def _model(k: int, seed: int, std: float = 0.5) -> Grud:
    gen = torch.Generator().manual_seed(seed)
    module = build_module(GrudSpec(hidden=H, classes=k), V, public_means=[0.3, 0.5, 0.7])
    assert isinstance(module, Grud)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std, generator=gen)
    return module


def _flat(module: Grud, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    g = grud_row_gradients(module, x, y)
    return torch.cat([b * 2.0**-bits for b, bits in zip(g.blocks, g.bits, strict=True)], 1)


def _clipper(module: Grud, k: int, clip: float = 1.0) -> GrudExactClipper:
    p = parameter_count(GrudSpec(hidden=H, classes=k), V)
    assert p == sum(t.numel() for t in module.parameters())
    return GrudExactClipper(module, grid_bits=GRID_BITS, max_grad_norm=clip, parameters=p)


@pytest.mark.parametrize("k", CLASSES)
def test_each_stays_gradient_is_the_same_bits_alone_and_in_any_batch(k: int) -> None:
    module = _model(k, seed=1)
    x, y = _stays(130, k, seed=2)
    y = _awkward_labels(y, k)
    full = grud_row_gradients(module, x, y)
    for n in (1, 2, 3, 17, 64, 65, 130):
        part = grud_row_gradients(module, x[:n], y[:n])
        assert torch.equal(full.valid[:n], part.valid)
        for a, b in zip(full.blocks, part.blocks, strict=True):
            assert torch.equal(a[:n], b), n
    flipped = grud_row_gradients(module, x.flip(0), y.flip(0))
    for a, b in zip(full.blocks, flipped.blocks, strict=True):
        assert torch.equal(a, b.flip(0))
    for i in (0, 3, 66, 129):  # every stay alone
        alone = grud_row_gradients(module, x[i : i + 1], y[i : i + 1])
        for a, b in zip(full.blocks, alone.blocks, strict=True):
            assert torch.equal(a[i : i + 1], b)


@pytest.mark.parametrize("k", CLASSES)
def test_a_label_outside_the_classes_contributes_nothing(k: int) -> None:
    module = _model(k, seed=3)
    x, y = _stays(60, k, seed=4)
    y = _awkward_labels(y, k)
    g = grud_row_gradients(module, x, y)
    bad = ~(torch.isfinite(y) & (y == torch.floor(y)) & (y >= 0) & (y < k))
    assert int(bad.sum()) == 7
    assert torch.equal(g.valid, ~bad)
    for block in g.blocks:
        assert bool((block[bad] == 0).all())
    clip = _clipper(module, k)
    assert torch.equal(clip(x, y), clip(x[~bad], y[~bad]))


@pytest.mark.parametrize("k", CLASSES)
def test_the_sum_is_the_stays_alone_and_one_stay_moves_it_by_at_most_2k(k: int) -> None:
    module = _model(k, seed=5, std=1.0)
    x, y = _stays(16, k, seed=6)
    for clip_norm in (1.0, 0.05):
        clip = _clipper(module, k, clip_norm)
        alone = sum(clip(x[i : i + 1], y[i : i + 1]) for i in range(12))
        assert torch.equal(clip(x[:12], y[:12]), alone)
        worst = 0
        base = clip(x[:12], y[:12])
        for star in range(12, 16):
            other = (y[star] + 1) % k  # any class: the bound is over every added stay
            added = clip(torch.cat([x[:12], x[star : star + 1]]), torch.cat([y[:12], other[None]]))
            worst = max(worst, int(((added - base) ** 2).sum()))
        assert worst <= 4**GRID_BITS
        if clip_norm == 0.05:
            assert worst > (0.9 * 2**GRID_BITS) ** 2  # clipped: the bound nearly met


@pytest.mark.parametrize("k", CLASSES)
def test_the_fixed_point_gradients_are_autograds_cross_entropy_up_to_the_grids(k: int) -> None:
    module = _model(k, seed=7)
    x, y = _stays(60, k, seed=8)
    got = _flat(module, x, y)
    reference = _model(k, seed=7).double()
    params = {name: t.detach() for name, t in reference.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        logits = functional_call(reference, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(logits, yi.unsqueeze(0))

    per_row = vmap(grad(loss), in_dims=(None, 0, 0))(params, x.double(), y.long())
    ref = torch.cat([per_row[name].reshape(60, -1) for name in params], dim=1)
    assert got.shape == ref.shape
    error = (got - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(error.median()) < 1e-3 and float(error.max()) < 1e-2


def test_ghost_refuses_grud() -> None:
    module = _model(3, seed=9)
    p = parameter_count(GrudSpec(hidden=H, classes=3), V)
    with pytest.raises(PlanMismatch, match="ghost needs"):
        ge.ghost_clipper(module, grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=p)
    assert isinstance(
        ge.exact_clipper(module, grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=p),
        GrudExactClipper,
    )


def test_a_head_of_the_most_classes_keeps_every_stay() -> None:
    """K up to MAX_CLASSES is admitted by the plan (GrudSpec.classes); the exactness check on
    dh = d·W_int must not drop stays for K > 2^11. With K = MAX_CLASSES every residual of a
    fresh model has |d_y| ≈ 2^20, so the old check K·max|d|·2^20 ≤ 2^51 failed every row
    (all contributions 0); the bound on every partial sum, Σ_k |d_k|·2^20 ≤ 2^51, holds."""
    k = MAX_CLASSES
    module = _model(k, seed=11)
    x, y = _stays(40, k, seed=12)
    y[:4] = torch.tensor([0.0, k - 1.0, 1.5, float(k)])  # the two ends and two non-classes
    full = grud_row_gradients(module, x, y)
    assert full.valid.tolist() == [True, True, False, False] + [True] * 36
    for i in (0, 1, 17, 39):  # each stay alone: the same bits
        alone = grud_row_gradients(module, x[i : i + 1], y[i : i + 1])
        for a, b in zip(full.blocks, alone.blocks, strict=True):
            assert torch.equal(a[i : i + 1], b)
    clip = _clipper(module, k)
    total = clip(x, y)
    assert torch.equal(total, sum(clip(x[i : i + 1], y[i : i + 1]) for i in range(40)))
    assert int((total != 0).sum()) > 0
