"""The σ search: the smallest σ in [NOISE_MULTIPLIER_MIN, NOISE_MULTIPLIER_MAX] (up to a
relative tolerance, rounded towards more noise) whose ε(σ) meets a target, for any ε(·)
non-increasing in σ. A guarded secant on log ε against log σ (:func:`search_sigma`); the
result is verified on both sides (ε(σ) ≤ target, ε(σ·(1 − rel_tol)) > target, both
evaluated), and the sequence of evaluations is a deterministic function of the inputs.

**Every σ evaluated lies on a public grid** or is an end of the range (:func:`grid_up`:
σ rounded up to a multiple of 2^(e − k), e = σ's binary exponent, k ≥ 20 bits and 4 bits
finer than ``rel_tol``). The accountants' ε(σ) are floats computed through libraries
(numpy, scipy, the PLD's FFT) whose last bits differ between machines (CPU features,
library builds): the same request planned on two machines gave σ differing by 3e-11
relative (the plan digests of tests/unit/test_plan_digests.py, seen 2026-11-25 on an AMD
EPYC without AVX-512), so a plan admitted by the API on one machine could fail the
worker's re-derivation on another. With the grid, a perturbation of ε(·) by a few ulps
moves a secant proposal by ~1e-11 relative, which rounds to the same grid point unless a
grid point lies in between (probability ~1e-11 / 2^-20 ≈ 1e-5 per evaluation): plans are
the same on every machine with high probability, not certainly. Rounding up
adds noise (at most 2^-k relative), never removes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from service.privacy.calibrate.common import NOISE_MULTIPLIER_MAX, NOISE_MULTIPLIER_MIN
from service.privacy.deadline import check_deadline

__all__ = ["Search", "Unreachable", "grid_bits", "grid_up", "search_sigma"]


def grid_bits(rel_tol: float) -> int:
    """Bits k of the σ grid: at least 20, and 2^-k ≤ rel_tol/16 (so the search's closing
    shot hi·(1 − rel_tol), rounded up, still lies strictly between lo and hi)."""
    return max(20, math.ceil(math.log2(16.0 / rel_tol)))


def grid_up(s: float, bits: int) -> float:
    """The smallest multiple of 2^(e − bits) that is ≥ s > 0, where s = m·2^e, m ∈ [0.5, 1).
    Exact in IEEE-754 doubles: s·2^(bits − e) and the product back are scalings by powers
    of two (no rounding in range), ceil is exact."""
    _, e = math.frexp(s)
    return math.ldexp(math.ceil(math.ldexp(s, bits - e)), e - bits)


class Unreachable(ValueError):
    """No σ ≤ NOISE_MULTIPLIER_MAX meets the target (a ValueError for callers)."""


@dataclass(frozen=True)
class Search:
    """Result of the σ search: σ, the ε evaluated there, and how many evaluations it took."""

    sigma: float
    epsilon: float
    evaluations: int


def search_sigma(
    eps_of_sigma: Callable[[float], float],
    *,
    target: float,
    rel_tol: float,
    what: str,
    initial: float,
    slope: float,
) -> Search:
    """Smallest σ in [NOISE_MULTIPLIER_MIN, NOISE_MULTIPLIER_MAX] (up to rel_tol, rounded
    towards more noise) with eps(σ) ≤ target, for eps non-increasing in σ.

    Guarded secant (regula falsi, Illinois variant) on g(σ) = log(eps(σ)/target) against
    log σ, started at ``initial`` with the slope guess ``slope`` = d log ε / d log σ:
    g is smooth and nearly linear there, so a good start needs ~4 evaluations where the
    bisection from σ = 1 needed 12–17. Guards: steps of at most ×8 while bracketing,
    a bisection whenever the bracket did not halve in two steps, and a closing shot at
    exactly hi·(1 − rel_tol). Result: eps(σ) ≤ target was evaluated at the returned σ,
    and eps(σ·(1 − rel_tol)) > target too (or σ = NOISE_MULTIPLIER_MIN). The sequence
    of evaluations is a deterministic function of the inputs, so is σ.
    """
    evaluations = 0
    bits = grid_bits(rel_tol)
    seen: dict[float, float] = {}  # σ → ε(σ)
    seen_g: dict[float, float] = {}  # σ → log(ε(σ)/target)
    order: list[float] = []

    def evaluate(s: float) -> tuple[float, bool, float]:
        nonlocal evaluations
        # On the grid (module docstring); the range's ends are constants, kept as they are.
        if NOISE_MULTIPLIER_MIN < s < NOISE_MULTIPLIER_MAX:
            s = min(grid_up(s, bits), NOISE_MULTIPLIER_MAX)
        if s not in seen:
            check_deadline()  # the API bounds a request's planning (deadline.py)
            evaluations += 1
            e = float(eps_of_sigma(s))
            if math.isnan(e):
                e = math.inf  # an unusable evaluation counts as insufficient
            seen[s] = e
            if e <= 0.0:
                seen_g[s] = -math.inf
            else:
                seen_g[s] = math.log(e / target) if math.isfinite(e) else math.inf
            order.append(s)
        return s, seen[s] <= target, seen_g[s]

    def done(s: float) -> Search:
        return Search(sigma=s, epsilon=seen[s], evaluations=evaluations)

    lo_s = NOISE_MULTIPLIER_MIN
    hi_s = NOISE_MULTIPLIER_MAX
    s = min(max(initial, NOISE_MULTIPLIER_MIN), NOISE_MULTIPLIER_MAX)
    s, ok, g = evaluate(s)
    lo: tuple[float, float] | None = None  # (σ, g) with eps > target
    hi: tuple[float, float] | None = None  # (σ, g) with eps ≤ target
    if ok:
        hi = (s, g)
    else:
        lo = (s, g)
    b = slope if math.isfinite(slope) and slope < -0.05 else -1.0
    prev: tuple[float, float] | None = None
    # Phase 1: bracket the threshold.
    while lo is None or hi is None:
        cur = hi if lo is None else lo
        assert cur is not None
        if prev is not None and math.isfinite(prev[1]) and math.isfinite(cur[1]):
            secant = (cur[1] - prev[1]) / (math.log(cur[0]) - math.log(prev[0]))
            if secant < -0.05:
                b = secant
        if lo is None:  # everything so far suffices: go down
            if cur[0] <= lo_s:
                return done(cur[0])
            step = -cur[1] / b if math.isfinite(cur[1]) else -math.log(8.0)
            factor = min(max(math.exp(step) * (1.0 - 2.0 * rel_tol), 1.0 / 8.0), 1.0 - rel_tol)
            s = max(cur[0] * factor, lo_s)
        else:  # nothing suffices yet: go up
            if cur[0] >= hi_s:
                raise Unreachable(
                    f"cannot reach ε = {target:g} for {what}: it would need "
                    f"noise_multiplier > {NOISE_MULTIPLIER_MAX:g}"
                )
            step = -cur[1] / b if math.isfinite(cur[1]) else math.log(8.0)
            factor = max(min(math.exp(step) * (1.0 + 2.0 * rel_tol), 8.0), 1.0 + rel_tol)
            s = min(cur[0] * factor, hi_s)
        prev = cur
        s, ok, g = evaluate(s)
        if ok:
            hi = (s, g)
        else:
            lo = (s, g)
    # Phase 2: shrink [lo, hi] until lo ≥ hi·(1 − rel_tol).
    widths = [math.log(hi[0] / lo[0])]
    last_root = math.nan
    while lo[0] < hi[0] * (1.0 - rel_tol):
        closing = hi[0] * (1.0 - rel_tol)
        x_lo, x_hi = math.log(lo[0]), math.log(hi[0])
        width = x_hi - x_lo
        # secant through the two latest finite evaluations (both near the root soon)
        finite = [(math.log(p), seen_g[p]) for p in order if math.isfinite(seen_g[p])]
        root = x_lo + 0.5 * width
        if len(finite) >= 2 and finite[-1][1] != finite[-2][1]:
            (xa, ga), (xb, gb) = finite[-2], finite[-1]
            cand = xb - gb * (xb - xa) / (gb - ga)
            if (gb - ga) / (xb - xa) < 0.0 and math.isfinite(cand):
                root = cand
        root = min(max(root, x_lo + 0.01 * width), x_hi - 0.01 * width)
        if len(widths) >= 4 and widths[-1] > 0.5 * widths[-4]:
            s = math.exp(0.5 * (x_lo + x_hi))  # guard: bisect when the secant stalls
        elif x_hi <= root + 1.5 * rel_tol:
            s = closing  # hi is next to the root: the evaluation that can finish
        elif abs(root - last_root) <= rel_tol:
            # the estimate has settled: aim just above it, for a hi close enough to finish
            s = math.exp(min(root + 0.5 * rel_tol, x_hi - 0.01 * width))
        else:
            s = math.exp(root)  # a plain secant step
        last_root = root
        s = min(s, closing)
        s, ok, g = evaluate(s)
        if ok:
            hi = (s, g)
        else:
            lo = (s, g)
        widths.append(math.log(hi[0] / lo[0]))
    return done(hi[0])


def _smallest_sufficient_sigma(
    eps_of_sigma: Callable[[float], float],
    *,
    target: float,
    rel_tol: float,
    what: str,
    initial: float = 1.0,
    slope: float = -1.0,
) -> float:
    """Smallest σ (up to rel_tol, rounded towards more noise) with eps(σ) ≤ target,
    assuming eps is non-increasing in σ (more Gaussian noise is a post-processing).

    The result σ satisfies eps(σ) ≤ target and eps(σ·(1 − rel_tol)) > target (both
    evaluated), unless σ = NOISE_MULTIPLIER_MIN; ValueError if even
    NOISE_MULTIPLIER_MAX does not suffice. ``initial`` and ``slope`` (a guess of
    d log ε / d log σ) only change how fast it gets there. See :func:`search_sigma`.
    """
    return search_sigma(
        eps_of_sigma, target=target, rel_tol=rel_tol, what=what, initial=initial, slope=slope
    ).sigma
