"""Issue 20, K-class MLPs in DP-SGD's exact and ghost engines (worker/mechanisms/exact_net.py,
"K classes"): a head of K logits, softmax by fixed_point.softmax_basic and the residuals
round((p̃ − e_y)·2^20) on the grid. Each row's contribution must be the same bits in any
batch (issue 25's rule), within c_row exactly, the int64 sum the exact sum of the rows
computed alone, the numpy fast path the general path's bits, and the sum DP-SGD's clipped
cross-entropy gradient sum up to the grids. The helpers are test_exact_net's."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
import torch
from torch.func import functional_call, grad, vmap

from service.modelspec import MlpSpec, parameter_count
from service.privacy.sampling import GRID_BITS
from tests.unit.test_exact_net import (
    _awkward_rows,
    _clipper,
    _model,
    assert_rows_batch_independent,
    mlp_fast_sums,
)
from worker.mechanisms import exact_net as en
from worker.mechanisms import grad_engines as ge
from worker.mechanisms.base import PlanMismatch
from worker.noise import secure_rng

SPECS = [
    MlpSpec(hidden=[16, 8], classes=3),
    MlpSpec(hidden=[16, 8], activation="relu", classes=3),
    MlpSpec(hidden=[12], classes=10),
]
IDS = ["tanh-3", "relu-3", "tanh-10"]


def _classes(n: int, d: int, k: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features in [0, 1] and class indices 0 … K − 1 (int64, as the tabular loader's)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=gen), torch.randint(0, k, (n,), generator=gen)


def _awkward_classes(n: int, d: int, k: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """test_exact_net's awkward features (beyond [0, 1], ±0, ±inf, NaN) with class labels
    (float64), a few of them not a class: NaN, ±inf, −1, K, 1.5, K − 0.5 (and −0, a class)."""
    x, _ = _awkward_rows(n, d, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    y = torch.randint(0, k, (n,), generator=gen).double()
    odd = torch.tensor([float("nan"), float("inf"), -float("inf"), -1.0, k, 1.5, k - 0.5, -0.0])
    rows = torch.randint(0, n, (max(1, n // 30),), generator=gen)
    y[rows] = odd[torch.arange(rows.numel()) % odd.numel()].double()
    return x, y


def _exact_reference(clip: en.ExactNetClipper, x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """round(Σ_i V_l,i ⊗ [A_l, 2^c_l]_i·2^-c_l) per layer in int64 (round half up, as the
    engine), every row computed alone, flattened as parameters() (each layer's weights
    row-major, then its biases): what the sum must be if each row's contribution is a
    function of that row alone and the sum is exact."""
    totals: list[torch.Tensor] = []
    for i in range(x.shape[0]):
        v, s = clip.contributions(x[i : i + 1], y[i : i + 1])
        for layer, (vl, al) in enumerate(zip(v, s.inputs, strict=True)):
            outer = vl.to(torch.int64).T @ al.to(torch.int64)  # integer products, exact
            if layer == len(totals):
                totals.append(outer)
            else:
                totals[layer] += outer
    flat: list[int] = []
    for total, c in zip(totals, s.in_bits, strict=True):
        rounded = torch.div(total + (1 << (c - 1)), 1 << c, rounding_mode="floor")
        flat += rounded[:, :-1].reshape(-1).tolist() + rounded[:, -1].tolist()
    return flat


def _row_norm_sq(v: tuple[torch.Tensor, ...], s: en.RowSignals, row: int) -> Fraction:
    """‖z_i‖² = Σ_l ‖V_l,i‖²·‖[A_l, 2^c_l]_i‖²·2^-2c_l, exactly, in rationals."""
    total = Fraction(0)
    for vl, al, c in zip(v, s.inputs, s.in_bits, strict=True):
        v2 = sum(int(t) ** 2 for t in vl[row].tolist())
        a2 = sum(int(t) ** 2 for t in al[row].tolist())
        total += Fraction(v2 * a2, 1 << (2 * c))
    return total


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_each_rows_contribution_is_the_same_bits_in_any_batch_and_position(spec: Any) -> None:
    d = 20
    module = _model(spec, d, seed=25, std=2.0)
    x, y = _classes(2049, d, spec.classes, seed=26)
    assert_rows_batch_independent(_clipper(module, d, clip=0.5), x, y)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("clip", [1.0, 0.05])
def test_the_sum_is_the_exact_sum_of_rows_computed_alone(spec: Any, clip: float) -> None:
    """On awkward rows, in one batch (the numpy path, and the general torch path), in
    another order, and in int64 from each row computed alone: the same integers."""
    d = 9
    module = _model(spec, d, seed=31, std=1.5)
    x, y = _awkward_classes(150, d, spec.classes, seed=32)
    exact = _clipper(module, d, clip=clip)
    assert exact._mlp  # K logits take the numpy fast path
    reference = _exact_reference(exact, x, y)
    assert exact(x, y).tolist() == reference
    assert exact._general_sum(x, y, None).tolist() == reference
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(3))
    assert exact(x[perm], y[perm]).tolist() == reference
    assert any(reference)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_every_rows_contribution_is_within_c_row_exactly_on_awkward_rows(spec: Any) -> None:
    d = 9
    module = _model(spec, d, seed=40, std=4.0)
    x, y = _awkward_classes(300, d, spec.classes, seed=41)
    exact = _clipper(module, d, clip=0.01)  # clipping active on every valid row
    v, s = exact.contributions(x, y)  # GuardFailed if the integer check fired
    cap = Fraction(exact.row_cap)
    norms = [_row_norm_sq(v, s, i) for i in range(x.shape[0])]
    assert all(n <= cap * cap for n in norms)
    assert all(n == 0 for n, ok in zip(norms, s.valid.tolist(), strict=True) if not ok)
    assert not bool(s.valid.all())  # the awkward rows include invalid ones
    assert math.sqrt(max(norms)) > 0.99 * exact.row_cap  # the clip binds: near c_row


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_adding_any_row_moves_the_sum_by_at_most_2k(spec: Any) -> None:
    d = 12
    module = _model(spec, d, seed=50)
    x, y = _awkward_classes(400, d, spec.classes, seed=51)
    worst = 0
    for clip in (1.0, 0.05):
        summed = _clipper(module, d, clip=clip)
        for n in [*range(1, 12), 127, 128, 255, 256, 398]:
            b = summed(x[:n], y[:n])
            for x_star, y_star in ((x[n : n + 1], y[n : n + 1]), (1.0 - x[n : n + 1], y[:1])):
                a = summed(torch.cat([x[:n], x_star]), torch.cat([y[:n], y_star]))
                worst = max(worst, int(((a - b) ** 2).sum()))
    assert 0 < worst <= 4**GRID_BITS


@pytest.mark.parametrize(
    ("hidden", "activation", "classes"),
    [([16], "tanh", 3), ([64, 16], "relu", 5), ([300], "tanh", 4), ([1], "tanh", 3)],
)
def test_mlp_fast_path_is_the_general_paths_bits(
    hidden: list[int], activation: str, classes: int
) -> None:
    """test_exact_net's comparison of _mlp_sum with _general_sum (mlp_fast_sums), for K
    logits: batches of 0 to 2,100 rows (several chunks and row blocks), awkward features
    and labels."""
    d = 24
    spec = MlpSpec(hidden=hidden, activation=activation, classes=classes)  # type: ignore[arg-type]
    x, y = _awkward_classes(2100, d, classes, seed=60 + classes)
    assert mlp_fast_sums(spec, x, y, seed=61) > 20


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_the_sum_is_the_clipped_cross_entropy_sum_up_to_the_grids(spec: Any) -> None:
    """What is computed is DP-SGD's clipped sum of per-example cross-entropy gradients
    (float64, torch.func): within the grids' rounding (3e-4 relative, plus the final
    rounding's √P), clipped (C = 0.05) and not (C = 100)."""
    d = 7
    module = _model(spec, d, seed=3)
    x, y = _classes(200, d, spec.classes, seed=4)
    reference = module.double()
    params = {k: t.detach() for k, t in reference.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        logits = functional_call(reference, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(logits, yi.unsqueeze(0))

    per_row = vmap(grad(loss), in_dims=(None, 0, 0))(params, x.double(), y)
    g = torch.cat([per_row[k].reshape(200, -1) for k in params], dim=1)
    module = module.float()
    p = parameter_count(spec, d)
    for clip in (100.0, 0.05):
        got = _clipper(module, d, clip=clip)(x, y)
        ref = (g * torch.clamp(clip / g.norm(dim=1, keepdim=True), max=1.0)).sum(0)
        ref = ref * 2.0**GRID_BITS / clip
        assert float((got.double() - ref).norm()) <= 3e-4 * float(ref.norm()) + math.sqrt(p)
        assert float(ref.norm()) > 10 * math.sqrt(p)


def test_a_row_with_a_label_outside_the_classes_contributes_nothing() -> None:
    d, spec = 6, SPECS[0]
    module = _model(spec, d, seed=9)
    x, y = _classes(20, d, 3, seed=10)
    exact = _clipper(module, d)
    clean = exact(x, y).tolist()
    for bad in (3.0, -1.0, 1.5, float("nan"), float("inf")):
        xs = torch.cat((x, x[:1]))
        ys = torch.cat((y.double(), torch.tensor([bad], dtype=torch.float64)))
        _, s = exact.contributions(xs, ys)
        assert not bool(s.valid[-1]) and bool(s.valid[:-1].all())
        assert exact(xs, ys).tolist() == clean


def test_ghost_is_the_exact_sum_and_jl_refuses_k_classes() -> None:
    d, spec = 5, SPECS[1]
    module = _model(spec, d, seed=11)
    x, y = _classes(300, d, 3, seed=12)
    p = parameter_count(spec, d)
    kwargs: dict[str, Any] = {"grid_bits": GRID_BITS, "max_grad_norm": 0.5, "parameters": p}
    exact = ge.exact_clipper(module, **kwargs)
    assert isinstance(exact, en.ExactNetClipper)
    assert torch.equal(ge.ghost_clipper(module, **kwargs)(x, y), exact(x, y))
    with pytest.raises(PlanMismatch, match="binary target only"):
        ge.jl_integer_sum(module, x, y, projections=4, kappa=2.0, rng=secure_rng(), **kwargs)
