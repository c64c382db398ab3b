"""ExactRowSums' one-hot storage (worker/mechanisms/langevin.py): the same exact integer
numerators, residuals and gradient sums as the dense products, bit for bit, on rows with
numeric columns, one-hot blocks (some rows with an all-zero block: a level outside the
declared ones), binary and K-class residuals, one part or several, blocks in one group or
in several (one wider than a group's table); a block that is not one-hot in the rows is
refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service.datasets.tabular import parse_schema
from tests.conftest import SMALL_SCHEMA
from worker.mechanisms.base import PlanMismatch
from worker.mechanisms.langevin import (
    _TABLE_CELLS,
    ExactRowSums,
    _block_groups,
    quantised_features,
)

BLOCKS = ((2, 3), (6, 4))  # columns: 2 numeric, a 3-level block, 1 numeric, a 4-level block
D = 10
# Three groups: 71·61 and 61·4101 joint states exceed a table, 71·4 does not; the 4,100-level
# block is wider than a table and forms a group alone.
WIDE_BLOCKS = ((6, 70), (76, 3), (79, 60), (139, 4100))
WIDE_D = 4240
FEATURE_BITS, RESIDUAL_BITS, THETA_BITS = 8, 16, 20


def _rows(
    n: int, seed: int, blocks: tuple[tuple[int, int], ...] = BLOCKS, d: int = D
) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = np.zeros((n, d), dtype=np.float32)
    x[:, [0, 1, 5]] = rng.random((n, 3))
    for start, length in blocks:
        level = rng.integers(0, length + 1, n)  # == length: no level (all zeros)
        hit = level < length
        x[np.nonzero(hit)[0], start + level[hit]] = 1.0
    return torch.from_numpy(x)


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("parts", [1, 3])
def test_one_hot_storage_gives_the_dense_products_bits(
    classes: int, parts: int, wide: bool
) -> None:
    n = 500
    blocks, d = (WIDE_BLOCKS, WIDE_D) if wide else (BLOCKS, D)
    x_int = quantised_features(_rows(n, 1, blocks, d), feature_bits=FEATURE_BITS, norm_sq_bound=d)
    rng = np.random.default_rng(2)
    y = torch.from_numpy(rng.integers(0, max(classes, 2), n).astype(np.float32))
    shape = (d + 1,) if classes == 1 else (d + 1, classes)
    theta = torch.from_numpy(np.round(rng.standard_normal(shape) * 2.0**THETA_BITS))
    kw = {
        "feature_bits": FEATURE_BITS,
        "residual_bits": RESIDUAL_BITS,
        "theta_bits": THETA_BITS,
        "parts": parts,
        "classes": classes,
    }
    dense = ExactRowSums(x_int, y, **kw)
    structured = ExactRowSums(x_int, y, one_hot=blocks, **kw)
    assert torch.equal(dense.residuals(theta), structured.residuals(theta))
    assert torch.equal(dense.gradient_sum(theta), structured.gradient_sum(theta))
    assert bool((dense.gradient_sum(theta) != 0).any())


@pytest.mark.parametrize("wide", [False, True])
def test_the_compiled_binary_step_is_the_numpy_steps_bits(wide: bool) -> None:
    """The binary one-hot step's compiled loops (_binary_part_sum) against the numpy path
    of the same storage (_numerators, _residuals, _backward), labels fractional as well as
    0/1, logits up to the σ̃ clamp and beyond; a NaN θ is left to the numpy path."""
    n = 700
    blocks, d = (WIDE_BLOCKS, WIDE_D) if wide else (BLOCKS, D)
    x_int = quantised_features(_rows(n, 4, blocks, d), feature_bits=FEATURE_BITS, norm_sq_bound=d)
    rng = np.random.default_rng(5)
    y = torch.from_numpy(np.where(rng.random(n) < 0.5, rng.random(n), rng.integers(0, 2, n)))
    kw = {"feature_bits": FEATURE_BITS, "residual_bits": RESIDUAL_BITS, "theta_bits": THETA_BITS}
    sums = ExactRowSums(x_int, y.float(), one_hot=blocks, parts=2, **kw)
    for spread in (2.0**THETA_BITS, 2.0 ** (THETA_BITS + 6)):
        theta = torch.from_numpy(np.round(rng.standard_normal(d + 1) * spread))
        for part in range(2):
            ys = sums._chunks[part][2]
            r_int = sums._residuals(sums._numerators(part, theta), ys, **kw)
            expected = sums._backward(part, r_int).round().to(torch.int64)
            got = sums._binary_part_sum(part, theta)
            assert got is not None and torch.equal(got, expected)
            assert bool((expected != 0).any())
    theta[3] = float("nan")
    assert sums._binary_part_sum(0, theta) is None


def test_blocks_are_grouped_by_their_public_lengths_within_a_table() -> None:
    assert _block_groups(BLOCKS) == ((0, 1),)
    assert _block_groups(WIDE_BLOCKS) == ((3,), (0, 1), (2,))
    # Adult's schema: 8 categorical columns in 3 groups of at most _TABLE_CELLS states.
    adult = ((1, 8), (9, 16), (26, 7), (33, 14), (47, 6), (53, 5), (58, 2), (63, 41))
    groups = _block_groups(adult)
    assert sorted(b for g in groups for b in g) == list(range(8))
    assert len(groups) == 3
    assert all(np.prod([adult[b][1] + 1 for b in g]) <= _TABLE_CELLS for g in groups)


def test_a_block_that_is_not_one_hot_is_refused() -> None:
    x = _rows(50, 3)
    x[7, 2:5] = torch.tensor([1.0, 1.0, 0.0])  # two levels at once
    x_int = quantised_features(x, feature_bits=FEATURE_BITS, norm_sq_bound=D + 1)
    y = torch.zeros(50)
    kw = {"feature_bits": FEATURE_BITS, "residual_bits": RESIDUAL_BITS, "theta_bits": THETA_BITS}
    with pytest.raises(PlanMismatch, match="one-hot"):
        ExactRowSums(x_int, y, one_hot=BLOCKS, **kw)
    x = _rows(50, 3)
    x[9, 6] = 0.5  # a fraction inside a block
    x_int = quantised_features(x, feature_bits=FEATURE_BITS, norm_sq_bound=D + 1)
    with pytest.raises(PlanMismatch, match="one-hot"):
        ExactRowSums(x_int, y, one_hot=BLOCKS, **kw)


def test_the_schema_states_its_one_hot_blocks() -> None:
    # SMALL_SCHEMA: a, b numeric, c categorical over 3 levels.
    assert parse_schema(SMALL_SCHEMA).one_hot_blocks == ((2, 3),)
