"""Issue 25 on a GPU: the exact engine's integer sum S (worker/mechanisms/exact_net.py) for
logistic regression and MLPs, computed on CUDA (its general path: fixed-point rows, exact
integer products) is the same int64 vector, bit for bit, as on the CPU (the compiled
per-row path), for batches around the kernels' block sizes and with a row on a ReLU unit's
boundary: a release on CUDA rests on the same sums as the proof's. Skipped without CUDA
(CI has none; run on a lent GPU machine)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.unit.test_exact_net import SPECS, _boundary_model, _clipper, _data, _model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _both(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    d = x.shape[1]
    on_cpu = _clipper(module, d, clip=0.5)(x, y)
    gpu = copy.deepcopy(module).to("cuda")
    on_gpu = _clipper(gpu, d, clip=0.5)(x.to("cuda"), y.to("cuda"))
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_cpu, on_gpu.cpu())


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", [1, 3, 4, 7, 255, 256, 1025])
def test_cuda_sum_is_the_cpu_sum(spec: Any, n: int) -> None:
    d = 20
    x, y = _data(n, d, seed=26 + n)
    _both(_model(spec, d, seed=25, std=2.0), x, y)


def test_cuda_sum_with_a_row_on_a_relu_boundary() -> None:
    d = 10
    module, x_star = _boundary_model(d)
    x, y = _data(67, d, seed=9)
    _both(module, torch.cat((x, x_star)), torch.cat((y, torch.ones(1))))
