"""The one-run audit's statistics (service/privacy/one_run_audit.py; Steinke, Nasr &
Jagielski 2023, Theorem 3.1): monotonicity, the paper's ceiling figure, agreement with a
brute-force binomial tail in exact rational arithmetic, and a Monte Carlo check of the
false-positive rate against a truly ε-DP randomized-response mechanism."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from service.privacy.one_run_audit import ceiling, epsilon_lower_bound, guess_tail


def _bound(m: int, r: int, v: int, *, confidence: float = 0.95, delta: float = 0.0) -> float:
    return epsilon_lower_bound(
        canaries=m, guesses=r, correct=v, confidence=confidence, delta=delta
    ).epsilon


def test_ceiling_with_1000_canaries_is_about_5_8_at_95_percent() -> None:
    # The figure the paper (§1, and issue 22) quotes: 1,000 canaries, all guessed right.
    c = ceiling(canaries=1000, confidence=0.95)
    q = 0.05 ** (1 / 1000)  # q^1000 = 0.05
    assert c == pytest.approx(math.log(q / (1 - q)), rel=1e-9)
    assert 5.75 < c < 5.85
    # Every other outcome with m = 1,000 shows less.
    assert _bound(1000, 1000, 999) < c
    assert _bound(1000, 100, 100) < c
    assert epsilon_lower_bound(
        canaries=1000, guesses=500, correct=480, confidence=0.95
    ).ceiling == pytest.approx(c)


def test_monotone_in_correct_guesses_confidence_and_delta() -> None:
    m, r = 200, 100
    vs = [_bound(m, r, v) for v in range(0, r + 1)]
    assert all(a <= b for a, b in itertools.pairwise(vs))
    assert vs[50] == 0.0  # chance-level accuracy shows nothing
    assert vs[-1] > 0.0
    assert _bound(m, r, 90, confidence=0.99) < _bound(m, r, 90, confidence=0.95)
    d = [_bound(m, r, 90, delta=x) for x in (0.0, 1e-6, 1e-4, 1e-3)]
    assert all(a >= b for a, b in itertools.pairwise(d))
    assert d[0] > d[-1]
    # More canaries, all right: a higher ceiling.
    cs = [ceiling(canaries=k, confidence=0.95) for k in (10, 100, 1000, 10000)]
    assert all(a < b for a, b in itertools.pairwise(cs))


def _exact_tail(r: int, v: int, q: Fraction) -> Fraction:
    return sum(
        (Fraction(math.comb(r, k)) * q**k * (1 - q) ** (r - k) for k in range(v, r + 1)),
        Fraction(0),
    )


def _exact_tail_delta(m: int, r: int, v: int, q: Fraction, delta: Fraction) -> Fraction:
    beta = _exact_tail(r, v, q)
    alpha = max(
        (_exact_tail(r, v - i, q) - beta) / i if v - i >= 0 else Fraction(0)
        for i in range(1, v + 1)
    )
    return beta + 2 * m * delta * alpha


def _brute_force(m: int, r: int, v: int, significance: Fraction, delta: Fraction) -> float:
    """The largest ε with tail ≤ α, by bisection on q in exact rationals (60 halvings)."""
    lo, hi = Fraction(1, 2), Fraction(1)

    def rejected(q: Fraction) -> bool:
        t = _exact_tail(r, v, q) if delta == 0 else _exact_tail_delta(m, r, v, q, delta)
        return t <= significance

    if not rejected(lo):
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rejected(mid) else (lo, mid)
        lo, hi = Fraction(float(lo)), Fraction(float(hi))  # keep the rationals short
    q = float(lo)
    return math.log(q / (1 - q))


@pytest.mark.parametrize(
    ("m", "r", "v", "delta"),
    [
        (6, 6, 6, 0),
        (10, 8, 7, 0),
        (12, 12, 10, 0),
        (12, 5, 5, 0),
        (10, 10, 10, Fraction(1, 1000)),
        (12, 12, 11, Fraction(1, 10000)),
        (8, 8, 8, Fraction(1, 100)),
    ],
)
def test_agrees_with_brute_force_binomial_tail(m: int, r: int, v: int, delta: Fraction) -> None:
    got = _bound(m, r, v, delta=float(delta))
    want = _brute_force(m, r, v, Fraction(1, 20), Fraction(delta))
    assert got == pytest.approx(want, abs=1e-6)


def test_guess_tail_matches_exact_tail() -> None:
    for eps in (0.0, 0.5, 2.0):
        q = math.exp(eps) / (1 + math.exp(eps))
        for delta in (0.0, 1e-3):
            got = guess_tail(canaries=9, guesses=7, correct=5, epsilon=eps, delta=delta)
            want = _exact_tail_delta(9, 7, 5, Fraction(q), Fraction(delta))
            assert got == pytest.approx(float(want), rel=1e-9)


@pytest.mark.parametrize("true_epsilon", [0.5, 2.0])
def test_false_positive_rate_against_randomized_response(true_epsilon: float) -> None:
    """Randomized response on m canaries is exactly ε-DP in S: Y_i = S_i with probability
    e^ε/(1+e^ε), else −S_i. The auditor guesses Y_i on the first r canaries. A bound above
    the true ε is a false positive; at 95% it must happen in ≤ 5% of audits (up to Monte
    Carlo error: 4,000 audits, the test allows 5% + 4 standard errors)."""
    rng = np.random.default_rng(20261125)
    m, r, trials = 500, 200, 4000
    q = math.exp(true_epsilon) / (1 + math.exp(true_epsilon))
    s = rng.choice([-1, 1], size=(trials, m))
    flip = rng.random((trials, m)) >= q
    y = np.where(flip, -s, s)
    correct = (y[:, :r] == s[:, :r]).sum(axis=1)
    over = 0
    cache: dict[int, float] = {}
    for v in correct.tolist():
        if v not in cache:
            cache[v] = _bound(m, r, v)
        over += cache[v] > true_epsilon
    rate = over / trials
    se = math.sqrt(0.05 * 0.95 / trials)
    assert rate <= 0.05 + 4 * se
    # And the bound is not vacuous here: the median audit shows a positive ε.
    assert _bound(m, r, int(np.median(correct))) > 0.0


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="correct"):
        epsilon_lower_bound(canaries=10, guesses=5, correct=6, confidence=0.95)
    with pytest.raises(ValueError, match="guesses"):
        epsilon_lower_bound(canaries=10, guesses=11, correct=1, confidence=0.95)
    with pytest.raises(ValueError, match="confidence"):
        epsilon_lower_bound(canaries=10, guesses=5, correct=5, confidence=1.0)
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound(canaries=10, guesses=5, correct=5, confidence=0.9, delta=-1e-9)
    with pytest.raises(TypeError):
        epsilon_lower_bound(canaries=10, guesses=5, correct=True, confidence=0.9)  # type: ignore[arg-type]


def test_false_positive_rate_with_delta_against_leaky_randomized_response() -> None:
    """An (ε, δ)-DP mechanism: with probability δ a canary's bit is output as it is,
    otherwise randomized response (P[Y = s | s] = δ + (1 − δ)q ≤ e^ε·(1 − δ)(1 − q) + δ).
    The δ > 0 bound must exceed ε in ≤ 5% of audits (+4 standard errors)."""
    rng = np.random.default_rng(20261126)
    eps, delta = 1.0, 2e-3
    m, r, trials = 300, 300, 4000
    q = math.exp(eps) / (1 + math.exp(eps))
    s = rng.choice([-1, 1], size=(trials, m))
    leak = rng.random((trials, m)) < delta
    flip = (rng.random((trials, m)) >= q) & ~leak
    y = np.where(flip, -s, s)
    correct = (y[:, :r] == s[:, :r]).sum(axis=1)
    cache: dict[int, float] = {}
    over = 0
    for v in correct.tolist():
        if v not in cache:
            cache[v] = _bound(m, r, v, delta=delta)
        over += cache[v] > eps
    assert over / trials <= 0.05 + 4 * math.sqrt(0.05 * 0.95 / trials)
    assert _bound(m, r, int(np.median(correct)), delta=delta) > 0.0
