"""Plans do not depend on the last bits of the accountants' floats (search.py's σ grid).

The PLD accountant's ε(σ) goes through numpy, scipy and an FFT whose last bits differ
between machines; before the grid, the same request planned on two machines gave σ 3e-11
apart (so different plan digests, and a worker on another machine would refuse the API's
plan). Here ε(σ) is perturbed by ±1e-13 relative (hundreds of ulps, far more than the
machine differences seen) in a fresh process, and the plans must not move."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from service.privacy.calibrate.search import grid_bits, grid_up, search_sigma
from tests.unit.test_plan_digests import GOLDEN

REPO = Path(__file__).resolve().parents[2]
PLD_CASES = ["dpsgd pld", "dpsgd pld exponential", "expm langevin", "hyperparameters tnb"]

_PERTURBED = """
import sys
import service.privacy.calibrate.epsilon as epsilon_module
import service.privacy.calibrate.noise as noise_module
from tests.plan_cases import REQUESTS, plan_digest

factor = float(sys.argv[1])
for module in (noise_module, epsilon_module):
    exact = module.fast_pld_epsilon
    module.fast_pld_epsilon = lambda *a, _f=exact: _f(*a) * factor
for name in sys.argv[2:]:
    print(name + "\t" + plan_digest(*REQUESTS[name]))
"""


def test_grid_up_rounds_up_onto_the_grid_exactly() -> None:
    for bits in (20, 24):
        for s in (0.01, 0.7, 1.0, 1.0510163986477254, 64.91170720583965, 9999.5, 1e4):
            g = grid_up(s, bits)
            _, e = math.frexp(s)
            step = math.ldexp(1.0, e - bits)
            assert s <= g < s + step and (g / step).is_integer()
            assert grid_up(g, bits) == g  # a grid point stays
    assert grid_bits(1e-3) == 20 and grid_bits(0.02) == 20 and grid_bits(1e-6) == 24


def test_every_evaluated_sigma_is_on_the_grid_and_the_contract_holds() -> None:
    evaluated: list[float] = []

    def eps(s: float) -> float:
        evaluated.append(s)
        return 3.0 / s

    found = search_sigma(eps, target=1.7, rel_tol=1e-3, what="test", initial=1.0, slope=-1.0)
    bits = grid_bits(1e-3)
    assert all(grid_up(s, bits) == s for s in evaluated)
    assert 3.0 / found.sigma <= 1.7 < 3.0 / (found.sigma * (1 - 1e-3))
    assert found.sigma == grid_up(3.0 / 1.7, bits) or found.sigma in evaluated


@pytest.mark.parametrize("factor", ["1.0000000000001", "0.9999999999999"])
def test_pld_plans_do_not_move_when_the_accountant_moves_by_ulps(factor: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PERTURBED, factor, *PLD_CASES],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    digests = dict(line.split("\t") for line in out.strip().splitlines() if "\t" in line)
    assert digests == {k: GOLDEN[k] for k in PLD_CASES}
