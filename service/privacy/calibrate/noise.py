"""Noise calibration for one DP-SGD job: the smallest σ meeting (ε, δ) under the
requested accountant (:func:`calibrate`, :func:`calibrate_noise_multiplier`).

Search (:func:`~service.privacy.calibrate.search.search_sigma`). σ starts at the
central-limit (μ-GDP) estimate and a guarded secant on log ε against log σ needs 4–5
evaluations, against 12–17 for the bisection from σ = 1 it replaces; the result is
verified on both sides (ε(σ) ≤ target, ε(σ·(1 − rel_tol)) > target, both evaluated).
Everything is a deterministic function of the inputs, so the worker re-derives
bit-identical σ; :func:`calibrate` also caches results per exact input (bounded LRU,
512 entries), and a cache hit returns the object the miss computed. (Plans calibrated
before this version have slightly different σ and would be refused by the worker's
re-derivation: an accepted, one-time cost.)

Measured (benchmarks/results/calibration.md; q = 256/30162, δ = 1e-5, 2-core container;
cold = first call in a fresh process, imports ≈ 0.3 s excluded; warm = cache hit;
gap = σ over the tightest σ we can compute, bisection on an 8× finer grid or on every
order). Before (the previous version, same grid, fresh processes): PLD 0.22–7.1 s,
RDP 0.24–6.0 s per calibration.

    accountant  T      ε: 0.01     0.1      1        10       cold      warm    gap
    pld         354    39.076   5.0549   0.98668  0.46986   6–12 ms   < 6 µs  ≤ 0.29 %
    pld         3540   123.37   15.617   2.0434   0.62076   9–11 ms   < 6 µs  ≤ 0.39 %
    rdp         354    44.948   5.5748   1.1437   0.49859   4–10 ms   < 6 µs  ≤ 0.08 %
    rdp         3540   141.84   17.216   2.1923   0.64324   3–8 ms    < 6 µs  ≤ 0.05 %
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import special

from service.privacy.calibrate.common import (
    NOISE_MULTIPLIER_MAX,
    NOISE_MULTIPLIER_MIN,
    Accountant,
    check_accountant,
    check_delta,
    check_epsilon,
    pld_value_discretization,
)
from service.privacy.calibrate.fast_pld import GaussianParts, fast_pld_epsilon
from service.privacy.calibrate.pld_steps import FastPldUnavailable, log_gaussian_delta
from service.privacy.calibrate.rdp_epsilon import rdp_epsilon_of
from service.privacy.calibrate.search import Unreachable, search_sigma
from service.privacy.events import PoissonSubsampledGaussianEvent

__all__ = ["NoiseCalibration", "calibrate", "calibrate_noise_multiplier"]


def _gdp_sigma(*, sampling_rate: float, steps: int, epsilon: float, delta: float) -> float:
    """A starting guess for σ from the central limit theorem of DP-SGD (speed only).

    T steps of the Poisson-subsampled Gaussian are ≈ μ-GDP with
    μ = q √(T (e^{1/σ²} − 1)) (Bu, Dong, Long & Su 2020, "Deep Learning with Gaussian
    Differential Privacy", Thm. 5; exact for q = 1 with μ = √T/σ), and μ-GDP is (ε, δ)-DP
    iff δ ≥ δ_μ(ε) (Dong, Roth & Su 2022, Cor. 2.13). We solve δ_μ(ε) = δ for μ (a
    monotone bisection on a closed form) and invert μ(σ).
    """
    mu = _gdp_mu(epsilon, delta)
    if sampling_rate == 1.0:
        sigma = math.sqrt(steps) / mu
    else:
        sigma = 1.0 / math.sqrt(math.log1p(mu * mu / (sampling_rate * sampling_rate * steps)))
    return min(max(sigma, NOISE_MULTIPLIER_MIN), NOISE_MULTIPLIER_MAX)


@lru_cache(maxsize=1024)
def _gdp_mu(epsilon: float, delta: float) -> float:
    """The μ with δ_μ(ε) = δ of :func:`_gdp_sigma` (a 48-step bisection in log μ), per
    exact (ε, δ): every training of a selection plan with its own (q, T) at the same
    per-training ε reads it (speed only; the same float).

    The bisection's path is guessed from an estimate of the root (:func:`_gdp_root_guess`)
    and checked (:func:`_walk_guessed`): every branch it takes is decided by the value at
    that level's midpoint, the float the step-by-step bisection computes there, so the
    result is the bisection's whatever the estimate (a wrong guess only costs another
    evaluation from where it went wrong; tests/unit/privacy/test_calibrate_exact.py
    compares with the step-by-step bisection). Without an estimate, the tree of
    :func:`_bisect_levels` as before."""
    log_delta = math.log(delta)
    lo, hi = math.log(1e-8), math.log(1e4)
    guess = _gdp_root_guess(epsilon, log_delta, lo, hi)
    if guess is None:
        for _ in range(48 // _GDP_LEVELS):  # δ_μ(ε) increases with μ
            lo, hi = _bisect_levels(epsilon, log_delta, lo, hi)
    else:
        lo, hi = _walk_guessed(epsilon, log_delta, lo, hi, guess, 48)
    return math.exp(0.5 * (lo + hi))


def _log_gaussian_delta_scalar(epsilon: float, x: float) -> float:
    """log δ_μ(ε) at μ = e^x, as :func:`log_gaussian_delta` writes it, in scalar
    arithmetic (for :func:`_gdp_root_guess` only: an estimate, never a decision)."""
    mu = math.exp(x)
    a = float(special.log_ndtr(0.5 * mu - epsilon / mu))
    b = epsilon + float(special.log_ndtr(-0.5 * mu - epsilon / mu))
    d = -math.expm1(min(b - a, 0.0))
    return a + math.log(d) if d > 0.0 else -math.inf


def _gdp_root_guess(epsilon: float, log_delta: float, lo: float, hi: float) -> float | None:
    """An estimate of the x in (lo, hi) with log δ_{e^x}(ε) = log δ (speed only: it only
    guesses the bisection's path), or None where it finds none. Newton's method in x from
    the μ with Φ(μ/2 − ε/μ) = δ (δ_μ(ε) is below that Φ, so the root lies above), kept in
    a bracket; d log δ_μ / d log μ = μ φ(μ/2 − ε/μ) / δ_μ(ε) (the derivative of Balle &
    Wang's δ_μ(ε) in μ is φ(μ/2 − ε/μ), as e^ε φ(−μ/2 − ε/μ) = φ(μ/2 − ε/μ))."""
    try:
        z = float(special.ndtri(math.exp(log_delta)))
        x = math.log(z + math.sqrt(z * z + 2.0 * epsilon))
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
    if not lo < x < hi:
        x = 0.5 * (lo + hi)
    half_log_2pi = 0.5 * math.log(2.0 * math.pi)
    for _ in range(40):
        f = _log_gaussian_delta_scalar(epsilon, x)
        if not math.isfinite(f):
            return None
        if f > log_delta:
            hi = x
        else:
            lo = x
        mu = math.exp(x)
        u = 0.5 * mu - epsilon / mu
        log_slope = x - 0.5 * u * u - half_log_2pi - f
        if log_slope > 700.0:
            return None
        step = (log_delta - f) / math.exp(log_slope) if log_slope > -700.0 else math.inf
        new = x + step
        if not lo < new < hi:
            new = 0.5 * (lo + hi)  # Newton left the bracket: bisect
        if abs(new - x) <= 1e-15 * max(1.0, abs(x)):
            return new
        x = new
    return x if math.isfinite(x) else None


def _walk_guessed(
    epsilon: float, log_delta: float, lo: float, hi: float, guess: float, levels: int
) -> tuple[float, float]:
    """``levels`` steps of the bisection ``mid = (lo + hi)/2; δ_μ(ε) > δ at μ = e^mid ?
    hi = mid : lo = mid``, the same steps as one at a time: the midpoints of the path that
    ``guess`` (an estimate of the root) predicts are evaluated in one call of
    :func:`log_gaussian_delta` (elementwise: each value is the one a single-point call
    gives), and the walk follows the values, not the guess. Where a value contradicts the
    guess, that level's branch is the value's, and the levels below are guessed again
    from just past that midpoint (the root lies between it and the old guess's mirror)."""
    while levels > 0:
        mids: list[float] = []
        a, b = lo, hi
        for _ in range(levels):  # the path the guess predicts
            mid = 0.5 * (a + b)
            mids.append(mid)
            if mid > guess:
                b = mid
            else:
                a = mid
        mus = np.array([math.exp(m) for m in mids])
        above = (log_gaussian_delta(np.full(len(mus), epsilon), mus) > log_delta).tolist()
        for mid, up in zip(mids, above, strict=True):
            levels -= 1
            if up:
                hi = mid
            else:
                lo = mid
            if up != (mid > guess):  # the guess was on the wrong side of this midpoint
                guess = min(max(2.0 * mid - guess, lo), hi)
                break
    return lo, hi


_GDP_LEVELS = 4
"""Bisection steps of :func:`_gdp_sigma` decided by one vectorised evaluation (48 in all)."""


def _bisect_levels(epsilon: float, log_delta: float, lo: float, hi: float) -> tuple[float, float]:
    """``_GDP_LEVELS`` steps of the bisection ``mid = (lo + hi)/2; δ_μ(ε) > δ at
    μ = e^mid ? hi = mid : lo = mid``, the same steps as one at a time, in one call of
    :func:`log_gaussian_delta`: it evaluates every midpoint the next levels could visit
    (2^levels − 1 of them, each computed as the step-by-step bisection would) and the
    walk down that tree takes the same branches. Elementwise, so each value is the one
    a single-point call gives (tests/unit/privacy/test_calibrate_exact.py)."""
    intervals = [(lo, hi)]
    mids: list[float] = []
    for _ in range(_GDP_LEVELS):  # level j: the 2^j intervals the walk may be in, in order
        below: list[tuple[float, float]] = []
        for a, b in intervals:
            mid = 0.5 * (a + b)
            mids.append(mid)
            below += ((a, mid), (mid, b))
        intervals = below
    mus = np.array([math.exp(m) for m in mids])
    above = (log_gaussian_delta(np.full(len(mus), epsilon), mus) > log_delta).tolist()
    node = 0  # breadth-first index into mids: level j starts at 2^j − 1
    for level in range(_GDP_LEVELS):
        mid = mids[node]
        if above[node]:
            hi, branch = mid, 0
        else:
            lo, branch = mid, 1
        first = (1 << level) - 1
        node = (1 << (level + 1)) - 1 + 2 * (node - first) + branch
    return lo, hi


@dataclass(frozen=True)
class NoiseCalibration:
    """A calibrated noise multiplier and what it was proven against.

    ``noise_multiplier``: σ (std of the noise per unit of clipping norm).
    ``accountant``: the accountant whose upper bound ``epsilon`` is: the requested one,
    or "rdp" when a PLD calibration fell back to RDP (``fell_back``).
    ``epsilon``: ε (nats) at the requested δ of DP-SGD with this σ by that accountant,
    ≤ the target: the *stated* guarantee of the job. (What the ledger charges is the
    event's RDP curve, a different and larger number for PLD-calibrated jobs.)
    ``value_discretization_interval``: the PLD grid used (None for RDP).
    ``evaluations``: how many ε(σ) the search evaluated (diagnostics).
    """

    noise_multiplier: float
    accountant: Accountant
    epsilon: float
    fell_back: bool
    value_discretization_interval: float | None
    evaluations: int


def calibrate(
    *,
    sampling_rate: float,
    steps: int,
    epsilon: float,
    delta: float,
    accountant: Accountant,
    rel_tol: float = 1e-3,
) -> NoiseCalibration:
    """Smallest noise multiplier σ such that DP-SGD with Poisson sampling at rate
    ``sampling_rate`` for ``steps`` steps is (ε, δ)-DP under ``accountant``.

    ε(σ) ≤ ``epsilon`` and ε(σ·(1 − rel_tol)) > ``epsilon`` (σ rounded towards more
    noise), both evaluated, with ε(·) the fast PLD at
    :func:`pld_value_discretization` ("pld") or
    :func:`~service.privacy.calibrate.rdp_epsilon.rdp_epsilon_of` ("rdp"); a PLD
    calibration that finds no σ the fast PLD can certify falls back to RDP (never to a
    guess), and raises ValueError when neither can. Never returns less than
    NOISE_MULTIPLIER_MIN. Results are cached per exact input (a pure function, so a
    cached answer is bit-identical to a fresh one).
    """
    event = PoissonSubsampledGaussianEvent(
        sampling_rate=sampling_rate, noise_multiplier=1.0, steps=steps
    )  # validates q and steps
    target = check_epsilon(epsilon)
    d = check_delta(delta)
    acc = check_accountant(accountant)
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, int | float):
        raise ValueError(f"rel_tol must be a real number, got {rel_tol!r}")
    if not 0.0 < rel_tol < 0.5:
        raise ValueError(f"rel_tol must be in (0, 0.5), got {rel_tol!r}")
    return _calibrate_cached(event.sampling_rate, event.steps, target, d, acc, float(rel_tol))


@lru_cache(maxsize=512)
def _calibrate_cached(
    q: float, steps: int, target: float, delta: float, accountant: Accountant, rel_tol: float
) -> NoiseCalibration:
    what = f"q = {q:g}, steps = {steps}, δ = {delta:g} ({accountant})"
    start = _gdp_sigma(sampling_rate=q, steps=steps, epsilon=target, delta=delta)
    # d log ε / d log σ of the same approximation, for the first secant step
    nudged = _gdp_sigma(sampling_rate=q, steps=steps, epsilon=target * 1.05, delta=delta)
    slope = math.log(1.05) / math.log(nudged / start) if nudged != start else -1.0
    pld_result: NoiseCalibration | None = None
    if accountant == "pld":
        vdi = pld_value_discretization(epsilon=target, steps=steps)
        unavailable = False

        def pld_eps(sigma: float) -> float:
            nonlocal unavailable
            parts = GaussianParts(gaussians=((q, sigma, steps),), slack_tau=0.0)
            try:
                return fast_pld_epsilon(parts, delta, vdi)
            except FastPldUnavailable:
                unavailable = True
                return math.inf  # not certified at this σ: counts as insufficient

        try:
            found = search_sigma(
                pld_eps, target=target, rel_tol=rel_tol, what=what, initial=start, slope=slope
            )
            pld_result = NoiseCalibration(
                noise_multiplier=found.sigma,
                accountant="pld",
                epsilon=found.epsilon,
                fell_back=False,
                value_discretization_interval=vdi,
                evaluations=found.evaluations,
            )
        except Unreachable:
            pass  # no σ ≤ NOISE_MULTIPLIER_MAX certified by the PLD: RDP decides
        if pld_result is not None and not unavailable:
            return pld_result
        # The PLD failed somewhere on the way, so its σ may be needlessly large: RDP too,
        # and the smaller σ wins (each is certified by its own upper bound).

    def rdp_eps(sigma: float) -> float:
        return _rdp_epsilon(q, steps, sigma, delta)

    try:
        found = search_sigma(
            rdp_eps, target=target, rel_tol=rel_tol, what=what, initial=start, slope=slope
        )
    except Unreachable:
        if pld_result is not None:
            return pld_result
        raise  # fail closed: neither accountant certifies any σ ≤ NOISE_MULTIPLIER_MAX
    if pld_result is not None and pld_result.noise_multiplier <= found.sigma:
        return pld_result
    return NoiseCalibration(
        noise_multiplier=found.sigma,
        accountant="rdp",
        epsilon=found.epsilon,
        fell_back=accountant == "pld",
        value_discretization_interval=None,
        evaluations=found.evaluations,
    )


@lru_cache(maxsize=8192)
def _rdp_epsilon(q: float, steps: int, sigma: float, delta: float) -> float:
    """ε at ``delta`` of ``steps`` DP-SGD steps at (q, σ) by RDP (:func:`rdp_epsilon_of`),
    remembered per exact input (a pure function: a hit is the float a miss computes).

    Searches for nearby targets walk the same grid points (search.py: every σ evaluated
    is on the public grid), so a repeated or nearby request finds its σ evaluated. The
    selections' per-training ε search (service.selection.kinds ``largest_within``) is now a
    regula falsi of a dozen or so plans, not the ~44-step bisection this cache was sized
    for: a never-seen selection quote hits it for about 1 % of its evaluations (measured
    2026-11-26; it was ~40 % under the bisection). Bounded: 8,192 floats and keys, < 2 MB."""
    one = PoissonSubsampledGaussianEvent(sampling_rate=q, noise_multiplier=sigma, steps=steps)
    return rdp_epsilon_of(one, delta)


def calibrate_noise_multiplier(
    *,
    sampling_rate: float,
    steps: int,
    epsilon: float,
    delta: float,
    accountant: Accountant,
    rel_tol: float = 1e-3,
) -> float:
    """σ of :func:`calibrate` (same contract): the smallest noise multiplier such that
    DP-SGD with Poisson sampling at rate ``sampling_rate`` for ``steps`` steps is
    (ε, δ)-DP under ``accountant``, with ε(σ) ≤ ``epsilon`` and
    ε(σ·(1 − rel_tol)) > ``epsilon``. Raises ValueError on invalid input or when the
    target would need σ > NOISE_MULTIPLIER_MAX; never returns less than
    NOISE_MULTIPLIER_MIN.
    """
    return calibrate(
        sampling_rate=sampling_rate,
        steps=steps,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        rel_tol=rel_tol,
    ).noise_multiplier
