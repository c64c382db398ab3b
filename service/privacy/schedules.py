"""Decaying noise for DP-SGD: σ₀ calibrated on the step-by-step composition of a
heterogeneous history, plus the closed-form tCDP estimate shown for comparison only.

The schedule (Zhang, Ding, Wu, Wong, Nguyen & Pan 2021, "Adaptive Privacy Preserving
Deep Learning Algorithms for Medical Data", WACV 2021: decaying Gaussian noise
σ_t² = σ₀²·Rᵗ, 0 < R < 1, so the noise *decreases* as training proceeds) is run here with
the time index t = the **epoch**:

    σ_e = σ₀ · R^{e/2},   e = 0, …, E − 1,

constant within an epoch (steps_per_epoch steps each). Why per epoch and not per step:
the accounting cost grows with the number of *distinct* noise levels, since every
distinct σ needs its own RDP curve on the 170 calibration orders (or its own PLD), and
calibration evaluates the whole history about 10 times. Measured on the 2-core dev
container (q = 256/30162, δ = 1e-5, one evaluation of ε for a per-step history of T
distinct σ): RDP 7.3 s at T = 354 and 78 s at T = 3540; PLD 8.5 s at T = 354. A per-step
plan would thus take over a minute (T = 354) to over 13 minutes (T = 3540), and the
worker re-derives every plan before it runs. Per epoch costs E distinct curves
(E ≤ 100), see :func:`calibrate_sigma0` for measured times. A per-step decay r
corresponds to R = r^{steps_per_epoch} per epoch (the same noise at each epoch's start,
piecewise constant in between).

Accounting (what is charged): the ledger charges the event's RDP curve, the sum over the
steps of each step's subsampled-Gaussian curve (Mironov 2017, Prop. 1: RDP composes
additively, also for different mechanisms at each step; Mironov, Talwar & Zhang 2019 for
each step's curve). :func:`decaying_event` is a ComposedEvent of one
PoissonSubsampledGaussianEvent per epoch, whose curve ``rdp()`` is exactly that sum
(``steps_per_epoch`` × the one-step curve of each epoch, summed with math.fsum).
Calibration may use either accountant on the same history (both sound for one job whose
parameters are fixed in advance, see calibrate.py); the tCDP estimate never enters
calibration or the charge.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from service.privacy.calibrate import (
    NOISE_MULTIPLIER_MAX,
    NOISE_MULTIPLIER_MIN,
    Accountant,
    calibrate_noise_multiplier,
    epsilon_for,
    pld_value_discretization,
)
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
)
from service.privacy.guided_search import guided_walk

__all__ = [
    "TcdpEstimate",
    "calibrate_sigma0",
    "decaying_event",
    "epoch_noise_multipliers",
    "tcdp_estimate",
]


def _check_decay(decay: float) -> float:
    if isinstance(decay, bool) or not isinstance(decay, int | float):
        raise ValueError(f"decay must be a real number, got {decay!r}")
    r = float(decay)
    # R = 1 is the constant schedule (allowed here for comparisons; the API asks R < 1).
    if not (math.isfinite(r) and 0.0 < r <= 1.0):
        raise ValueError(f"decay must be in (0, 1], got {decay!r}")
    return r


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def epoch_noise_multipliers(*, sigma0: float, decay: float, epochs: int) -> tuple[float, ...]:
    """σ_e = σ₀·R^{e/2} for e = 0 … epochs − 1 (Zhang et al. 2021: σ_t² = σ₀²Rᵗ, t = epoch).

    Raises ValueError on invalid input, or when a σ_e underflows to 0 (R too small for
    this many epochs: no finite noise level to account).
    """
    r = _check_decay(decay)
    n = _check_count("epochs", epochs)
    if isinstance(sigma0, bool) or not isinstance(sigma0, int | float):
        raise ValueError(f"sigma0 must be a real number, got {sigma0!r}")
    s0 = float(sigma0)
    if not (math.isfinite(s0) and s0 > 0.0):
        raise ValueError(f"sigma0 must be finite and > 0, got {sigma0!r}")
    sigmas = tuple(s0 * math.pow(r, 0.5 * e) for e in range(n))
    if sigmas[-1] <= 0.0:
        raise ValueError(f"noise decay {r!r} over {n} epochs drives the noise to 0")
    return sigmas


def decaying_event(
    *, sampling_rate: float, sigma0: float, decay: float, steps_per_epoch: int, epochs: int
) -> DpEvent:
    """The DP event of DP-SGD with Poisson sampling at rate q and per-epoch noise σ_e:
    ComposedEvent of PoissonSubsampledGaussianEvent(q, σ_e, steps_per_epoch), e = 0 … E−1.

    Its RDP curve is Σ_e steps_per_epoch · RDP_1step(q, σ_e), i.e. the step-by-step
    composition of the whole history (Mironov 2017, Prop. 1).
    """
    spe = _check_count("steps_per_epoch", steps_per_epoch)
    sigmas = epoch_noise_multipliers(sigma0=sigma0, decay=decay, epochs=epochs)
    return ComposedEvent(
        events=tuple(
            PoissonSubsampledGaussianEvent(
                sampling_rate=sampling_rate, noise_multiplier=s, steps=spe
            )
            for s in sigmas
        )
    )


@lru_cache(maxsize=512)
def calibrate_sigma0(
    *,
    sampling_rate: float,
    decay: float,
    steps_per_epoch: int,
    epochs: int,
    epsilon: float,
    delta: float,
    accountant: Accountant,
    slack: PmfSlackEvent | None = None,
    rel_tol: float = 1e-3,
) -> float:
    """Smallest σ₀ (up to ``rel_tol``, rounded towards more noise) such that
    ComposedEvent(decaying_event(σ₀), slack) is (ε, δ)-DP under ``accountant``. Cached
    per exact input (bounded LRU, 512 entries; a pure function, so a hit is the float a
    fresh call returns): a repeated quote with the decaying schedule recomputed it, 45 to
    65 ms each (benchmarks/results/quote_latency.md).

    ε in nats, δ a probability. ε(σ₀) is non-increasing in σ₀ (every σ_e grows with σ₀,
    and more Gaussian noise is a post-processing), so a monotone bisection applies (the
    contract of calibrate.py's, started from a guess): the result σ₀ satisfies
    ε(σ₀) ≤ ``epsilon`` and ε(σ₀·(1 − rel_tol)) > ``epsilon``, unless σ₀ is
    NOISE_MULTIPLIER_MIN (the floor). A σ₀ whose last epoch would run with
    σ_{E−1} < NOISE_MULTIPLIER_MIN counts as insufficient (as calibrate.py never
    returns less noise than that floor).
    ε(σ₀) is :func:`~service.privacy.calibrate.epsilon_for` of that event:

    * ``"rdp"``: its RDP curve on CALIBRATION_ORDERS (slack leaf included exactly,
      τ(2α−1)/(α−1) per order) and the CKS conversion;
    * ``"pld"``: calibrate.py's pessimistic PLD of the heterogeneous composition (its own
      connect-the-dots FFT PLD for Gaussian histories, one per epoch, self-composed
      steps_per_epoch times, then composed; RDP where it declines), at the discretisation
      calibrate.py uses, pld_value_discretization(ε, T) with T = steps_per_epoch·epochs;
      the slack enters as (ε' + 2τ, δ·e^{τ}).

    Measured cost of a whole exponential plan with the *earlier* calibrate.py (dp_accounting
    PLD, per-order RDP; build_plan, 2-core dev container, fresh process, n̂ = 30162,
    batch 256, δ = 1e-5, R = 0.9; constant plan in brackets) — the fast paths added since
    make these much shorter; benchmarks/calibration.py measures the constant case:

        ε     epochs  T      rdp             pld
        1     3       354    0.75 s (0.21)   2.4 s (1.5)
        1     30      3540   6.3 s  (0.36)   7.2 s (1.4)
        0.1   30      3540   39 s            6.0 s
        10    30      3540   7.3 s           22 s

    (RDP at ε = 0.1: σ₀ ≈ 45, where the fractional-order series of rdp.py needs many
    terms, now for 30 noise levels per evaluation.)
    Raises ValueError on invalid input or when σ₀ > NOISE_MULTIPLIER_MAX would be needed.
    """
    spe = _check_count("steps_per_epoch", steps_per_epoch)
    n_epochs = _check_count("epochs", epochs)
    r = _check_decay(decay)
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise ValueError(f"epsilon must be a real number, got {epsilon!r}")
    target = float(epsilon)
    if not (math.isfinite(target) and target > 0.0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if accountant not in ("rdp", "pld"):
        raise ValueError(f"accountant must be 'rdp' or 'pld', got {accountant!r}")
    if slack is not None and not isinstance(slack, PmfSlackEvent):
        raise ValueError(f"slack must be a PmfSlackEvent, got {slack!r}")
    if not 0.0 < rel_tol < 0.5:
        raise ValueError(f"rel_tol must be in (0, 0.5), got {rel_tol!r}")
    # Validates q (and δ below, through epsilon_for) before the search starts.
    decaying_event(
        sampling_rate=sampling_rate, sigma0=1.0, decay=r, steps_per_epoch=spe, epochs=n_epochs
    )
    slack_part: tuple[DpEvent, ...] = () if slack is None else (slack,)
    vdi = pld_value_discretization(epsilon=target, steps=spe * n_epochs)

    def eps_of_sigma0(sigma0: float) -> float:
        # No epoch may run below the floor of calibrate.py (σ_E−1 is the smallest σ_e):
        # treating such σ₀ as insufficient keeps ε(σ₀) non-increasing, and spares the
        # accountants noise levels they cannot represent (e.g. PLD grids at σ ≈ 1e-10).
        if sigma0 * math.pow(r, 0.5 * (n_epochs - 1)) < NOISE_MULTIPLIER_MIN:
            return math.inf
        history = decaying_event(
            sampling_rate=sampling_rate,
            sigma0=sigma0,
            decay=r,
            steps_per_epoch=spe,
            epochs=n_epochs,
        )
        return epsilon_for(
            event=ComposedEvent(events=(history, *slack_part)),
            delta=delta,
            accountant=accountant,
            value_discretization_interval=vdi,
        )

    what = (
        f"q = {sampling_rate:g}, {n_epochs} epochs × {spe} steps, decay R = {r:g}, "
        f"δ = {delta:g} ({accountant})"
    )
    return _smallest_sufficient_sigma0(
        eps_of_sigma0,
        target=target,
        start=_starting_guess(
            sampling_rate=sampling_rate,
            decay=r,
            steps_per_epoch=spe,
            epochs=n_epochs,
            epsilon=target,
            delta=delta,
        ),
        rel_tol=rel_tol,
        what=what,
    )


def _starting_guess(
    *,
    sampling_rate: float,
    decay: float,
    steps_per_epoch: int,
    epochs: int,
    epsilon: float,
    delta: float,
) -> float:
    """Where the search for σ₀ starts (speed only: the result does not depend on it
    beyond the bisection's tolerance). The constant schedule's RDP σ_c for the same T
    steps, scaled so that Σ_e 1/σ_e² matches E/σ_c² (the small-q regime, where one
    step's RDP is ≈ q²α/σ²): σ₀ = σ_c·√(mean_e R^{−e})."""
    try:
        sigma_c = calibrate_noise_multiplier(
            sampling_rate=sampling_rate,
            steps=steps_per_epoch * epochs,
            epsilon=epsilon,
            delta=delta,
            accountant="rdp",
            rel_tol=0.02,
        )
    except ValueError:
        return NOISE_MULTIPLIER_MAX
    mean_inverse = math.fsum(math.pow(decay, -e) for e in range(epochs)) / epochs
    return sigma_c * math.sqrt(mean_inverse)


def _smallest_sufficient_sigma0(
    eps_of_sigma0: Callable[[float], float],
    *,
    target: float,
    start: float,
    rel_tol: float,
    what: str,
) -> float:
    """Smallest σ₀ in [NOISE_MULTIPLIER_MIN, NOISE_MULTIPLIER_MAX] (up to rel_tol, rounded
    towards more noise) with eps(σ₀) ≤ target, for eps non-increasing in σ₀: the result of
    :func:`_bisection_walk` (bracketing from a guess, then a geometric bisection), with
    fewer evaluations of eps (issue 26: ~10 per plan, ~4.5 ms each for 5 epochs by PLD,
    most of a decaying-schedule quote).

    The walk asks "eps(x) ≤ target?" at a sequence of points, each depending on the answers
    before it. An answer is not always evaluated at x: eps is non-increasing, so an
    evaluated y ≤ x with eps(y) ≤ target answers yes at x, and an evaluated y ≥ x with
    eps(y) > target answers no (where evaluated points disagree with each other, x itself is
    evaluated: service/privacy/guided_search.py runs the walk this way). Where the walk
    reaches a point that no evaluation answers yet, we evaluate where its end is most
    likely: the walk is replayed with the unanswered points decided by an estimate of the
    root (:func:`_root_estimate`: log eps against log σ₀ interpolated through the evaluated
    points nearest the target, or extrapolated from one with a guessed slope), and the
    replay's last two points (its final hi and lo) are evaluated. When the estimate is
    right, the walk then completes with both of them evaluated: 3–6 evaluations instead
    of 10. After 8 such guesses, the walk's own next unanswered point is evaluated, as the
    plain walk does.

    The result is the walk's: it ends at the same hi whenever eps, as computed, is
    non-increasing over the points evaluated and asked (the test
    tests/unit/privacy/test_schedules.py compares the two on random cases, and the plan
    digests pin the API's plans). It is safe in any case: the walk's final hi and lo are
    both evaluated (eps(hi) ≤ target, eps(lo) > target, as in the plain walk), and every
    answer the walk used is either evaluated or implied by an evaluated one through the
    monotonicity of the true ε (more noise per epoch is a post-processing of less), of
    which the accountants' eps are upper bounds.
    """
    hi, _ = guided_walk(
        lambda sufficient: _bisection_walk(
            sufficient, target=target, start=start, rel_tol=rel_tol, what=what
        ),
        evaluate=eps_of_sigma0,
        sufficient=lambda eps: eps <= target,
        yes_upward=True,
        estimate=lambda known: _root_estimate(known, target),
        max_guesses=_MAX_GUESSES,
    )
    return hi


_MAX_GUESSES = 8
"""Evaluations at guessed points per σ₀ search; after them, the walk's own points."""

_STEP = 1.25
"""The walk's bracketing step (×1.25 or ÷1.25 from the start)."""

_SLOPE_GUESS = -2.0
"""d log ε / d log σ₀ assumed with one evaluated point (measured: −1.1 … −3.4; −2.0 and
−2.4 near the root of benchmarks/quote_latency.py's two kinds of exponential-schedule
requests; −1.5 until issue 26's ninth session)."""


def _root_estimate(known: dict[float, float], target: float) -> float | None:
    """Where eps(σ₀) = target, estimated from the evaluated points (speed only: a wrong
    estimate costs evaluations, never changes the result). In x = log σ₀, g = log eps:
    the parabola through the three finite, positive points nearest the target (its root
    by Newton's method from the secant's), else the secant through the two nearest, else
    the line through the nearest with the slope :data:`_SLOPE_GUESS`, falling back to the
    next of these where one has no decreasing root; kept inside the bracket the points
    give, or within one step of the walk where they give one side only; None where there
    is no such guess (or no point with a finite, positive eps, e.g. a PLD's 0 near the
    floor).

    Evaluations per σ₀ search (issue 26; the same σ₀ in every case), with the secant and
    a slope of −1.5 before / now: 5.75 / 4.25 on the never-seen requests of
    benchmarks/quote_latency.py's exponential schedule, 3.1 / 3.0 on its new-inputs
    requests, 4.6 / 4.6 on 300 random searches (both accountants, slack, floors). A
    third point lands the parabola's estimate in the walk's final bracket more often
    than the secant; the slope decides whether the first guess does."""
    log_t = math.log(target)
    points = sorted(
        (abs(math.log(e) - log_t), math.log(y), math.log(e))
        for y, e in known.items()
        if 0.0 < e < math.inf
    )
    if not points:
        return None
    _, x0, g0 = points[0]
    log_estimate = x0 + (log_t - g0) / _SLOPE_GUESS
    if len(points) > 1:
        _, x1, g1 = points[1]
        d01 = (g1 - g0) / (x1 - x0) if x1 != x0 else 0.0
        if d01 < 0.0:
            log_estimate = x0 + (log_t - g0) / d01
            if len(points) > 2:
                log_estimate = _parabola_root(points[:3], log_t, log_estimate)
    log_range = (math.log(NOISE_MULTIPLIER_MIN), math.log(NOISE_MULTIPLIER_MAX))
    estimate = math.exp(min(max(log_estimate, log_range[0]), log_range[1]))
    below = max((y for y, e in known.items() if e > target), default=0.0)
    above = min((y for y, e in known.items() if e <= target), default=math.inf)
    if below > 0.0 and above < math.inf:
        return estimate if below < estimate < above else math.sqrt(below * above)
    # One side only: the walk is still bracketing, a step of _STEP at a time. No guess
    # beyond its next step (a far extrapolation can be a costly σ₀, e.g. a PLD near the
    # floor: ~0.4 s where the walk's own points take ~5 ms).
    if above < math.inf:
        return estimate if above / _STEP <= estimate < above else None
    return estimate if below < estimate <= below * _STEP else None


def _parabola_root(
    points: list[tuple[float, float, float]], log_t: float, secant_root: float
) -> float:
    """The root of g(x) = log_t on the parabola through three (·, x, g) points, by three
    Newton steps from ``secant_root`` (that of its first two points); ``secant_root``
    where the points repeat an x or a step meets a non-decreasing g (speed only)."""
    (_, x0, g0), (_, x1, g1), (_, x2, g2) = points
    if x2 in (x0, x1):
        return secant_root
    d01 = (g1 - g0) / (x1 - x0)
    c2 = ((g2 - g1) / (x2 - x1) - d01) / (x2 - x0)  # Newton's divided differences
    x = secant_root
    for _ in range(3):
        dg = d01 + c2 * (2.0 * x - x0 - x1)
        if not dg < 0.0:
            return secant_root
        x -= (g0 + d01 * (x - x0) + c2 * (x - x0) * (x - x1) - log_t) / dg
    return x if math.isfinite(x) else secant_root


def _bisection_walk(
    sufficient: Callable[[float], bool],
    *,
    target: float,
    start: float,
    rel_tol: float,
    what: str,
) -> tuple[float, float | None]:
    """The search of :func:`_smallest_sufficient_sigma0` with ``sufficient(σ₀)`` for
    eps(σ₀) ≤ target: (the result hi, the last insufficient lo, None where the result
    is the floor NOISE_MULTIPLIER_MIN); ``target`` only for the message of the ValueError
    raised where even NOISE_MULTIPLIER_MAX is insufficient.

    Same contract as calibrate.py's bisection, but starting from a guess and bracketing
    with steps of 1.25 instead of 2 (each evaluation costs E curves here, not one)."""
    step = _STEP
    s = min(max(start, NOISE_MULTIPLIER_MIN), NOISE_MULTIPLIER_MAX)
    if sufficient(s):
        hi = s
        lo = max(s / step, NOISE_MULTIPLIER_MIN)
        while sufficient(lo):
            if lo <= NOISE_MULTIPLIER_MIN:
                return NOISE_MULTIPLIER_MIN, None
            hi = lo
            lo = max(lo / step, NOISE_MULTIPLIER_MIN)
    else:
        lo = s
        hi = min(s * step, NOISE_MULTIPLIER_MAX)
        while not sufficient(hi):
            if hi >= NOISE_MULTIPLIER_MAX:
                raise ValueError(
                    f"cannot reach ε = {target:g} for {what}: it would need "
                    f"sigma0 > {NOISE_MULTIPLIER_MAX:g}"
                )
            lo = hi
            hi = min(hi * step, NOISE_MULTIPLIER_MAX)
    # Invariant: eps(lo) > target ≥ eps(hi). Geometric bisection until hi/lo ≤ 1 + tol, so
    # hi·(1 − tol) < hi/(1 + tol) ≤ lo and eps(hi·(1 − tol)) ≥ eps(lo) > target.
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        if sufficient(mid):
            hi = mid
        else:
            lo = mid
    return hi, lo


# ------------------------------------------------------------------ tCDP (display only)


@dataclass(frozen=True)
class TcdpEstimate:
    """The closed-form tCDP estimate of a decaying schedule. DISPLAY ONLY: never used to
    calibrate or to charge (the charge is the RDP curve of :func:`decaying_event`).

    ``rho``, ``omega``: the (ρ, ω)-tCDP parameters; ``epsilon``: nats at the given δ;
    ``conditions_hold``: whether every step meets the hypotheses of the subsampling
    theorem used (ρ_t ≤ 0.1, q ≤ 0.1, log(1/q) ≥ 3ρ_t(2 + log₂(1/ρ_t)),
    log(1/q)/(2ρ_t) ≥ 3). Even when they
    hold, the theorem is stated for sampling a fixed-size subset under replace-one
    neighbours, not for Poisson sampling under add/remove-one: an estimate, not a bound
    for the mechanism that runs.
    """

    rho: float
    omega: float
    epsilon: float
    conditions_hold: bool


def tcdp_estimate(
    *,
    sampling_rate: float,
    sigma0: float,
    decay: float,
    steps_per_epoch: int,
    epochs: int,
    delta: float,
) -> TcdpEstimate:
    """Closed-form tCDP ε estimate of the per-epoch decaying schedule (planning comparison).

    Built as Zhang et al. 2021 do, from truncated CDP (Bun, Dwork, Rothblum & Steinke
    2018, "Composable and Versatile Privacy via Truncated CDP", STOC):

    * one Gaussian step with ℓ2 sensitivity 1 and noise σ_t is (ρ_t, ∞)-tCDP,
      ρ_t = 1/(2σ_t²) (Bun et al. 2018; as for zCDP, Bun & Steinke 2016, Prop. 1.6);
    * amplification by subsampling at rate q (Bun et al. 2018, the subsampling theorem):
      (13 q² ρ_t, ω_t)-tCDP with ω_t = log(1/q)/(4ρ_t), when ρ_t, q ≤ 0.1,
      log(1/q) ≥ 3ρ_t(2 + log₂(1/ρ_t)) and log(1/q)/(2ρ_t) ≥ 3;
    * composition adds ρ and takes the smallest ω:
      ρ = 13q² Σ_t 1/(2σ_t²) = (13 q² S / (2σ₀²)) · Σ_{e<E} R^{−e}
        = (13 q² S / (2σ₀²)) · (R^{−E} − 1)/(R^{−1} − 1)   (S steps per epoch; E·S at R = 1),
      ω = log(1/q)·σ_{E−1}²/2 (the last, least noisy epoch);
    * to (ε, δ) (Bun et al. 2018, tCDP → approximate DP):
      ε = ρ + 2√(ρ log(1/δ)) if log(1/δ) ≤ (ω − 1)²ρ, else ε = ρω + log(1/δ)/(ω − 1).

    Caveat: the constants and hypotheses above are as stated in Bun et al. 2018 to the
    best of our reading; the exact closed form printed by Zhang et al. was not available
    to check against. Hence display only, and labelled an estimate.
    """
    q = float(sampling_rate)
    if not (0.0 < q <= 1.0):
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
    spe = _check_count("steps_per_epoch", steps_per_epoch)
    sigmas = epoch_noise_multipliers(sigma0=sigma0, decay=decay, epochs=epochs)
    r = float(decay)
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    n_epochs = len(sigmas)
    # Σ_{e<E} R^{−e}: geometric sum, written with expm1 to stay accurate as R → 1.
    if r == 1.0:
        geometric = float(n_epochs)
    else:
        log_inv_r = -math.log(r)
        geometric = math.expm1(n_epochs * log_inv_r) / math.expm1(log_inv_r)
    rho = 13.0 * q * q * spe / (2.0 * sigmas[0] ** 2) * geometric
    log_inv_q = -math.log(q)
    omega = log_inv_q * sigmas[-1] ** 2 / 2.0 if q < 1.0 else 0.0
    log_inv_d = -math.log(d)
    if omega > 1.0 and log_inv_d <= (omega - 1.0) ** 2 * rho:
        eps = rho + 2.0 * math.sqrt(rho * log_inv_d)
    elif omega > 1.0:
        eps = rho * omega + log_inv_d / (omega - 1.0)
    else:
        eps = math.inf
    conditions = q <= 0.1 and all(
        (rho_t := 1.0 / (2.0 * s * s)) <= 0.1
        and log_inv_q >= 3.0 * rho_t * (2.0 + math.log2(1.0 / rho_t))
        and log_inv_q / (2.0 * rho_t) >= 3.0
        for s in sigmas
    )
    return TcdpEstimate(rho=rho, omega=omega, epsilon=eps, conditions_hold=conditions)
