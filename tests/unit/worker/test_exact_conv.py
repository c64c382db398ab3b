"""Issue 20 (point 3) with issue 25's proof standard: DP-SGD's clipped sum for CNNs from
IEEE-754 arithmetic alone (worker/mechanisms/exact_conv.py). A row's clipped contribution
must be bitwise the same whatever else is in the batch and wherever the row sits (several
batch sizes and positions, a row on a ReLU boundary included); adding one row must move
the int64 sum by exactly that row's contribution, of norm ≤ 2^k checked in Python
integers; the grid network's per-row gradients must agree with torch autograd on the
float network."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest
import torch

from service.modelspec import MODEL_SPEC, CnnSpec, fitted_cnn, parameter_count
from service.privacy.sampling import GRID_BITS
from worker.mechanisms.exact_conv import ExactConvClipper, row_gradients
from worker.mechanisms.grad_engines import exact_clipper
from worker.mechanisms.guards import GuardFailed
from worker.models import Cnn, build_module

LAYERS: dict[str, list[dict[str, Any]]] = {
    # padding, pooling of an odd map (a row and a column dropped), a stride-2 convolution
    "pooled": [
        {"channels": 3, "kernel": 3, "padding": 1, "pool": "avg2"},
        {"channels": 4, "kernel": 3, "stride": 2, "padding": 1},
    ],
    "one layer": [{"channels": 5, "kernel": 2}],
}


def _spec(
    layers: list[dict[str, Any]], *, classes: int | None, shape: tuple[int, int, int]
) -> CnnSpec:
    body: dict[str, Any] = {"kind": "cnn", "conv": layers}
    if classes is not None:
        body["classes"] = classes
    spec = MODEL_SPEC.validate_python(body)
    assert isinstance(spec, CnnSpec)
    return fitted_cnn(spec, shape)


def _model(spec: CnnSpec, *, seed: int, scale: float = 1.0) -> Cnn:
    torch.manual_seed(seed)
    module = build_module(spec, 0)
    assert isinstance(module, Cnn)
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(scale)
    return module


def _data(n: int, d: int, classes: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen).float()
    return x, y


def _clipper(module: Cnn, spec: CnnSpec, *, clip: float = 1.0) -> ExactConvClipper:
    d = module.shape[0] * module.shape[1] * module.shape[2]
    p = parameter_count(spec, d)
    return ExactConvClipper(module, grid_bits=GRID_BITS, max_grad_norm=clip, parameters=p)


def _autograd(module: Cnn, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-row gradients of the float64 network by torch autograd, one row at a time."""
    net = module.double()
    out = []
    for i in range(x.shape[0]):
        net.zero_grad()
        logits = net(x[i : i + 1].double())
        if module.classes is None:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, y[i : i + 1].double(), reduction="sum"
            )
        else:
            loss = torch.nn.functional.cross_entropy(logits, y[i : i + 1].long(), reduction="sum")
        loss.backward()
        out.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))  # type: ignore[union-attr]
    net.float()
    return torch.stack(out)


@pytest.mark.parametrize("classes", [None, 4])
@pytest.mark.parametrize("layers", list(LAYERS))
def test_row_gradients_agree_with_autograd(layers: str, classes: int | None) -> None:
    spec = _spec(LAYERS[layers], classes=classes, shape=(2, 7, 7))
    module = _model(spec, seed=1)
    x, y = _data(6, 2 * 49, classes or 2, seed=2)
    ours = row_gradients(module, x, y)
    reference = _autograd(module, x, y)
    assert ours.shape == reference.shape == (6, parameter_count(spec, 98))
    error = (ours - reference).norm(dim=1) / reference.norm(dim=1)
    # the grids: parameters at ≥ 2^-15 of their layer's largest, activations at 2^-16
    assert float(error.max()) < 1e-3, error
    assert float(error.max()) > 0.0  # a fixed-point computation, not autograd's own numbers


def _boundary_model(spec: CnnSpec) -> Cnn:
    """A model whose first channel's bias is 0, so a blank image sits exactly on the ReLU
    boundary of every unit of that channel (Z = 0), the audit's construction (issue 25)."""
    module = _model(spec, seed=3)
    with torch.no_grad():
        module.convs[0].bias[0] = 0.0
    return module


@pytest.mark.parametrize("classes", [None, 10])
def test_a_rows_contribution_is_bitwise_the_same_in_any_batch(classes: int | None) -> None:
    spec = _spec(LAYERS["pooled"], classes=classes, shape=(1, 8, 8))
    module = _boundary_model(spec)
    clip = _clipper(module, spec)
    k = classes or 2
    probes_x = torch.cat((torch.zeros(1, 64), _data(1, 64, k, seed=4)[0]))
    probes_y = torch.tensor([1.0, float(k - 1)])
    alone = [clip.contributions(probes_x[i : i + 1], probes_y[i : i + 1]) for i in range(2)]
    assert any(bool((z != 0).any()) for z in alone)
    for n in (1, 2, 3, 5, 31, 64, 129, 300):
        x, y = _data(n, 64, k, seed=n)
        for position in sorted({0, n // 2, n}):
            for i in range(2):
                xb = torch.cat((x[:position], probes_x[i : i + 1], x[position:]))
                yb = torch.cat((y[:position], probes_y[i : i + 1], y[position:]))
                z = clip.contributions(xb, yb)
                assert torch.equal(z[position], alone[i][0]), (n, position, i)


@pytest.mark.parametrize("clip_norm", [1.0, 0.05])
@pytest.mark.parametrize("classes", [None, 10])
def test_adding_one_row_moves_the_sum_by_its_contribution_at_most_two_to_the_k(
    classes: int | None, clip_norm: float
) -> None:
    spec = _spec(LAYERS["pooled"], classes=classes, shape=(1, 8, 8))
    module = _boundary_model(spec)
    clip = _clipper(module, spec, clip=clip_norm)
    k = classes or 2
    x, y = _data(200, 64, k, seed=7)
    base = clip(x, y)
    assert base.dtype == torch.int64
    probes = [(torch.zeros(64), 1.0), (torch.ones(64), 0.0), (x[3] * 0.5, float(k - 1))]
    for xs, ys in probes:
        for position in (0, 77, 200):
            xb = torch.cat((x[:position], xs.unsqueeze(0), x[position:]))
            yb = torch.cat((y[:position], torch.tensor([ys]), y[position:]))
            moved = [int(v) for v in (clip(xb, yb) - base).tolist()]
            alone = clip.contributions(xs.unsqueeze(0), torch.tensor([ys]))[0]
            assert moved == [int(v) for v in alone.tolist()]
            assert sum(v * v for v in moved) <= 4**GRID_BITS  # ‖S(D + x) − S(D)‖ ≤ 2^k exactly


def test_the_sum_does_not_depend_on_the_chunking_and_is_the_exact_engines() -> None:
    spec = _spec(LAYERS["pooled"], classes=10, shape=(1, 8, 8))
    module = _model(spec, seed=5)
    clip = _clipper(module, spec)
    x, y = _data(150, 64, 10, seed=6)
    whole = clip(x, y)
    clip._chunk = 7
    assert torch.equal(clip(x, y), whole)
    engine = exact_clipper(
        module, grid_bits=GRID_BITS, max_grad_norm=1.0, parameters=clip.parameters
    )
    assert isinstance(engine, ExactConvClipper)
    assert torch.equal(engine(x, y), whole)
    # rows are clipped: the sum of 150 rows is at most 150 · 2^k in norm
    assert float(whole.double().norm()) <= 150 * 2.0**GRID_BITS


def test_invalid_rows_contribute_nothing() -> None:
    spec = _spec(LAYERS["one layer"], classes=None, shape=(1, 6, 6))
    module = _model(spec, seed=8)
    clip = _clipper(module, spec)
    x, y = _data(4, 36, 2, seed=9)
    x[0, 5] = float("nan")
    y[1] = 2.0  # not a binary label
    y[2] = 0.5
    z = clip.contributions(x, y)
    assert not bool(z[:3].any()) and bool(z[3].any())
    # activations beyond 2^8 (huge weights) make the row invalid, not a wrong bound
    big = _model(spec, seed=8, scale=1e4)
    z = _clipper(big, spec).contributions(torch.ones(1, 36), torch.ones(1))
    assert not bool(z.any())


def test_the_exact_check_refuses_a_contribution_over_its_bound() -> None:
    spec = _spec(LAYERS["one layer"], classes=None, shape=(1, 6, 6))
    clip = _clipper(_model(spec, seed=8), spec)
    top = 2**GRID_BITS
    over = torch.zeros(2, clip.parameters, dtype=torch.float64)
    over[1, :2] = float(top)  # each entry ≤ 2^k, the norm √2·2^k
    with pytest.raises(GuardFailed):
        clip._check(over)
    # (2^k − 1)² + 2^22 > 2^2k by 2^21 + 1; (2^k − 1)² + 1448² < 2^2k by 447: decided
    # exactly, where the float norms of both round to 2^k
    just_over = torch.zeros(1, clip.parameters, dtype=torch.float64)
    just_over[0, 0], just_over[0, 1] = top - 1, 2**11
    with pytest.raises(GuardFailed):
        clip._check(just_over)
    just_inside = just_over.clone()
    just_inside[0, 1] = 1448
    clip._check(just_inside)
    single = torch.zeros(1, clip.parameters, dtype=torch.float64)
    single[0, 7] = top  # norm exactly 2^k: allowed
    clip._check(single)
    assert math.isclose(float(just_inside.norm()), top, rel_tol=1e-9)


GOLDEN_LAYERS: dict[str, tuple[list[dict[str, Any]], tuple[int, int, int]]] = {
    # the benchmark's digits CNN (two pooled layers)
    "digits": (
        [
            {"channels": 16, "kernel": 3, "padding": 1, "pool": "avg2"},
            {"channels": 32, "kernel": 3, "padding": 1, "pool": "avg2"},
        ],
        (1, 8, 8),
    ),
    # two input channels, an odd map pooled (a row and a column dropped), stride 2
    "pooled": (LAYERS["pooled"], (2, 7, 7)),
    # no padding, an even kernel, no pooling; stride 2 after an odd pooled map
    "strided": (
        [
            {"channels": 3, "kernel": 2, "pool": "avg2"},
            {"channels": 6, "kernel": 2, "stride": 2},
        ],
        (3, 9, 9),
    ),
}


def _awkward(n: int, d: int, k: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that hit every branch: a blank image (on the ReLU boundary of a zero-bias
    channel), a white one, values outside [0, 1] (clamped), ±inf and NaN features, labels
    that are fractional, negative, out of range or NaN (invalid rows), ties."""
    x, y = _data(n, d, k, seed=seed)
    x[0] = 0.0
    if n > 1:
        x[1] = 1.0
    if n > 9:
        x[2, :3] = torch.tensor([-0.5, 1.5, 2.0**-30])
        x[3, 4] = float("nan")
        x[4, 1] = float("inf")
        x[5, 2] = -float("inf")
        y[6], y[7], y[8], y[9] = 0.5, -1.0, float(k), float("nan")
        x[10:, ::5] = x[10:, 1:2]  # ties between pixels
    return x, y


def _golden_models(spec: CnnSpec) -> list[Cnn]:
    """Weight scales 0.2, 1 and 25 (a per-row shift of the first layer's patches), the
    head × 100 with the first layer × 4 (shifts of the output gradients), 1000 (every row
    invalid by the activation bound); each with a zero-bias channel."""
    models = [_model(spec, seed=61, scale=scale) for scale in (0.2, 1.0, 25.0, 1.0, 1000.0)]
    with torch.no_grad():
        models[3].head.weight.mul_(100.0)
        models[3].convs[0].weight.mul_(4.0)
        for module in models:
            module.convs[0].bias[0] = 0.0
    return models


def _golden_conv_digest() -> str:
    """sha256 over the exact CNN engine's per-row contributions z (rows, P), its int64 sums
    (whole and in chunks of 7 rows) and row_gradients, for the layer shapes above, binary
    and K-class heads, the models of _golden_models, C ∈ {1, 0.05}, grid bits 20 and 12,
    batches of 1, 13 and 150 rows."""
    digest = hashlib.sha256()
    for layers, shape in GOLDEN_LAYERS.values():
        d = shape[0] * shape[1] * shape[2]
        for classes in (None, 10):
            spec = _spec(layers, classes=classes, shape=shape)
            x, y = _awkward(150, d, classes or 2, seed=60)
            p = parameter_count(spec, d)
            for module in _golden_models(spec):
                digest.update(row_gradients(module, x[:13], y[:13]).numpy().tobytes())
                for clip_norm, grid_bits in ((1.0, GRID_BITS), (0.05, GRID_BITS), (1.0, 12)):
                    clip = ExactConvClipper(
                        module, grid_bits=grid_bits, max_grad_norm=clip_norm, parameters=p
                    )
                    for n in (1, 13, 150):
                        digest.update(clip.contributions(x[:n], y[:n]).numpy().tobytes())
                        digest.update(clip(x[:n], y[:n]).numpy().tobytes())
                clip._chunk = 7
                digest.update(clip(x, y).numpy().tobytes())
    return digest.hexdigest()


GOLDEN_CONV = "efefc5093fdbca35887cb6f5d9fbfb3854949b146508e0f92e697ad8f0e516de"


def test_the_contributions_are_the_golden_bits() -> None:
    """The exact CNN engine's outputs, bit for bit, as recorded before the speed work of
    issue 20 (commit 76fe2a6's code): a faster implementation must give the same per-row
    contributions, sums and gradients. The inputs come from torch's seeded generator
    (torch 2.13 CPU); the outputs are exact integer arithmetic and IEEE basic operations,
    so independent of the thread count (one thread here: the same digest as two, faster on
    a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert _golden_conv_digest() == GOLDEN_CONV
    finally:
        torch.set_num_threads(threads)
