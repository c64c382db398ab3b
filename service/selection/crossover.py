"""Crossover ε: below which privacy budget the simpler of two architectures wins.

Given both architectures' accuracy measured (under DP) on a common grid of ε, the
crossover is where d(ε) = acc_complex(ε) − acc_simple(ε) turns from ≤ 0 to > 0. Between
two grid points that bracket the change of sign, it is placed by linear interpolation of
d in log ε (the grid is usually geometric). The report is post-processing of whatever
accuracies are passed in; it adds no privacy cost of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

__all__ = ["CrossoverReport", "crossover_epsilon"]


@dataclass(frozen=True)
class CrossoverReport:
    epsilons: tuple[float, ...]
    simple: tuple[float, ...]
    complex: tuple[float, ...]
    # The last ε at which the complex model starts to win for good (None: it never does
    # on the grid, or it wins everywhere, see the two flags).
    crossover: float | None
    simple_wins_everywhere: bool
    complex_wins_everywhere: bool


def crossover_epsilon(
    *, epsilons: Sequence[float], simple: Sequence[float], complex: Sequence[float]
) -> CrossoverReport:
    """The ε above which ``complex`` beats ``simple`` on the rest of the grid.

    ``epsilons`` must be strictly increasing and positive. If the curves cross several
    times (noise), the crossover reported is the last change from "simple ≥ complex" to
    "complex >" — the point above which the complex model wins at every grid ε.
    """
    eps = [float(e) for e in epsilons]
    if len(eps) < 2 or len(simple) != len(eps) or len(complex) != len(eps):
        raise ValueError("need at least two ε and one accuracy per ε for each model")
    if any(e <= 0.0 or not math.isfinite(e) for e in eps) or any(b <= a for a, b in pairwise(eps)):
        raise ValueError("epsilons must be finite, positive and strictly increasing")
    d = [float(c) - float(s) for s, c in zip(simple, complex, strict=True)]

    def report(
        at: float | None, *, simple_all: bool = False, complex_all: bool = False
    ) -> CrossoverReport:
        return CrossoverReport(
            epsilons=tuple(eps),
            simple=tuple(float(s) for s in simple),
            complex=tuple(float(c) for c in complex),
            crossover=at,
            simple_wins_everywhere=simple_all,
            complex_wins_everywhere=complex_all,
        )

    if all(v <= 0.0 for v in d):
        return report(None, simple_all=True)
    if all(v > 0.0 for v in d):
        return report(None, complex_all=True)
    last = max(i for i in range(len(d)) if d[i] <= 0.0)
    if last == len(d) - 1:
        # The simple model wins at the largest ε: no point above which complex wins.
        return report(None)
    lo, hi = math.log(eps[last]), math.log(eps[last + 1])
    d_lo, d_hi = d[last], d[last + 1]
    t = (0.0 - d_lo) / (d_hi - d_lo)  # d_hi > 0 ≥ d_lo: no division by zero
    return report(math.exp(lo + t * (hi - lo)))
