"""worker/kernel_warm_up.py: in a fresh process (numba's dispatchers start empty there), the
warm-up compiles every kernel worker/ieee_jit.py made, with the specialisations a release
selects (a release's calls after it add none); every ``@ieee_njit`` function in worker/ is in
the registry the warm-up reads; a kernel without a warm-up example stops the warm-up and
the worker's start-up hook (SystemExit). No timing is asserted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]

_SCRIPT = r"""
import json

import numpy as np
import torch
from randomgen import ChaCha

from worker.ieee_jit import compiled_kernels, ieee_njit
from worker.kernel_warm_up import KernelWarmUpError, warm_up


def name(k):
    return f"{k.py_func.__module__}.{k.py_func.__qualname__}"


def signatures():
    return {name(k): [str(s) for s in k.signatures] for k in compiled_kernels()}


report = {"before": signatures()}
done = warm_up()
report["warmed"] = list(done.kernels)
report["after"] = signatures()

# Calls as a release makes them (public inputs): the noise draw, sigma and tanh on the grid,
# the binary one-hot step of the Langevin sampler's exact sums.
from worker import noise
from worker.mechanisms import fixed_point as fp
from worker.mechanisms.langevin import ExactRowSums, quantised_features

noise.rounded_gaussian(np.random.Generator(ChaCha(key=3, rounds=20)), scale=1107296.256, size=50000)
z = torch.from_numpy(np.linspace(-9.0, 9.0, 300))
fp.sigmoid_basic(z)
grid = torch.round(z.reshape(30, 10) * 2.0**20)
fp.tanh_on_grid(grid, scale_bits=-20, out_bits=16)
fp.tanh_on_grid(grid, scale_bits=-20, out_bits=16, append=1.0)
rng = np.random.default_rng(0)
x = np.zeros((200, 6), dtype=np.float32)
x[:, 0] = rng.random(200)
x[np.arange(200), 1 + rng.integers(0, 4, 200)] = 1.0
x_int = quantised_features(torch.from_numpy(x), feature_bits=8, norm_sq_bound=6)
y = torch.from_numpy(rng.integers(0, 2, 200).astype(np.float32))
sums = ExactRowSums(
    x_int, y, feature_bits=8, residual_bits=16, theta_bits=20, one_hot=((1, 4),), parts=2
)
sums.gradient_sum(torch.from_numpy(np.round(rng.standard_normal(7) * 2.0**20)))
# the hidden-iterate chain's compiled steps (one part), noise rows as the chain takes them
from worker.mechanisms.dpsgd import NoiseStream
from worker.mechanisms.langevin import lattice_steps_kernel

single = ExactRowSums(x_int, y, feature_bits=8, residual_bits=16, theta_bits=20, one_hot=((1, 4),))
stream = NoiseStream(rng=np.random.Generator(ChaCha(key=4, rounds=20)), size=7, steps=5)
block = stream.draw_steps(scale=30.0, same_scale_ahead=5, most=5).numpy()
fused = single.binary_cells_inputs()
lattice_steps_kernel(np.zeros(7), block[1:], 0.99, 2.0**-20, 2.0**30, *fused)
report["after_release_calls"] = signatures()


def unlisted(x):
    return x + 1.0


ieee_njit(unlisted)
try:
    warm_up()
except KernelWarmUpError as exc:
    report["unlisted_error"] = str(exc)
from worker.celery_app import warm_up_kernels

try:
    warm_up_kernels()
except SystemExit as exc:
    report["hook_exit"] = str(exc)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _decorated_kernels() -> set[str]:
    """Every function decorated ``@ieee_njit`` in worker/'s sources, as module.name."""
    found = set()
    for path in (ROOT / "worker").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for match in re.finditer(r"^@ieee_njit\s*\n(?:@.*\n)*def (\w+)", path.read_text(), re.M):
            found.add(f"{module}.{match.group(1)}")
    return found


def test_the_warm_up_compiles_every_kernel_with_a_releases_specialisations(
    report: dict[str, Any],
) -> None:
    before, after = report["before"], report["after"]
    assert len(before) >= 11 and set(before) == set(after)
    assert all(not sigs for sigs in before.values())  # nothing compiled before the warm-up
    assert report["warmed"] == list(after)
    assert all(after.values()), [k for k, sigs in after.items() if not sigs]
    # the release's calls found every specialisation compiled (none added)
    assert report["after_release_calls"] == after


def test_every_ieee_njit_kernel_is_in_the_warm_up(report: dict[str, Any]) -> None:
    decorated = _decorated_kernels()
    assert "worker.noise._screen_kernel" in decorated  # the scan finds the kernels
    assert decorated == set(report["warmed"])


def test_a_kernel_without_a_warm_up_example_stops_the_worker(report: dict[str, Any]) -> None:
    assert "no warm-up example for __main__.unlisted" in report["unlisted_error"]
    assert "compiled kernel warm-up failed" in report["hook_exit"]
    assert "__main__.unlisted" in report["hook_exit"]
