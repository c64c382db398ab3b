"""The fast PLD's Chernoff window (service/privacy/calibrate/fast_pld.py) computed in one
array pass per part: the same window as the per-(t, sign) loop it replaced, which this test
keeps as its reference (the window decides the FFT length and so every composed ε's bits;
tests/unit/test_plan_digests.py pins those)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.privacy.calibrate.fast_pld import _chernoff_window
from service.privacy.calibrate.pld_steps import GridPld, add_step_pld, remove_step_pld


def _reference_window(parts: list[tuple[GridPld, int]], tau: float) -> tuple[int, int]:
    log_2_tau = math.log(2.0 / tau)
    mean_total, var_total, top = 0.0, 0.0, 0
    stats = []
    for pld, count in parts:
        positive = pld.probs > 0.0
        y = np.arange(len(pld.probs), dtype=np.float64)[positive]
        p = pld.probs[positive]
        mass = float(np.sum(p))
        m = float(np.dot(p, y)) / mass
        v = float(np.dot(p, (y - m) ** 2)) / mass
        stats.append((y - m, np.log(p)))
        mean_total += count * m
        var_total += count * v
        top += count * (len(pld.probs) - 1)
    t_star = math.sqrt(2.0 * log_2_tau / max(var_total, 1.0))
    ts = t_star * np.array([1.0 / 32.0, 1.0 / 8.0, 0.25, 0.5, 1.0, 2.0])
    up, down = np.full(len(ts), log_2_tau), np.full(len(ts), log_2_tau)
    for (_pld, count), (x, log_p) in zip(parts, stats, strict=True):
        for j, t in enumerate(ts):
            for sign, acc in ((1.0, up), (-1.0, down)):
                z = (sign * t) * x + log_p
                peak = float(np.max(z))
                lm = peak + math.log(float(np.sum(np.exp(z - peak))))
                acc[j] += count * (lm + 1e-9)
    hi = min(math.ceil(mean_total + float(np.min(up / ts))), top)
    lo = max(math.floor(mean_total - float(np.min(down / ts))), 0)
    return lo, hi


@pytest.mark.parametrize("q", [1e-3, 0.0085, 0.3, 0.9])
@pytest.mark.parametrize("sigma", [0.6, 1.1, 4.0])
@pytest.mark.parametrize("h", [1e-4, 1e-2])
def test_window_is_the_per_row_loops_window(q: float, sigma: float, h: float) -> None:
    for step in (add_step_pld, remove_step_pld):
        parts = [(step(q, sigma, h, 1e-12), 118), (step(q, 1.1 * sigma, h, 1e-12), 37)]
        for tau in (1e-11, 1e-5):
            assert _chernoff_window(parts, tau) == _reference_window(parts, tau)
