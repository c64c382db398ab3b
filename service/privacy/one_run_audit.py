"""One-run privacy audit: an ε lower bound from guesses about m randomly included canaries.

Source: Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1) training run"
(NeurIPS 2023, arXiv:2305.08846), Theorem 3.1 (their main theorem) and §5 (its proof).

Setting. m canaries; each is included in the training data independently with probability
1/2 (S_i ∈ {−1, +1} uniform). After ONE run the auditor guesses membership for r of the
m canaries (abstaining on the rest); v of the r guesses are correct. Write

    q = e^ε / (1 + e^ε)        (the best per-guess accuracy ε-DP allows).

Theorem 3.1, δ = 0: if the mechanism is ε-DP, the number W of correct guesses is
stochastically dominated by Binomial(r, q), so

    P[W ≥ v] ≤ β(ε) := P[Binomial(r, q) ≥ v].

Theorem 3.1, δ > 0: if it is (ε, δ)-DP,

    P[W ≥ v] ≤ β(ε) + 2·m·δ·max_{i = 1..v} P[v − i ≤ Binomial(r, q) < v] / i.

The audit rejects "the mechanism is (ε, δ)-DP" at level α = 1 − confidence when that
tail is ≤ α; the bound ε_lb is the largest ε rejected (0 when none is). Both tails grow
with ε, so the rejected set is an interval [0, ε_lb].

δ = 0 in closed form: P[Binomial(r, q) ≥ v] ≤ α ⇔ q ≤ Beta⁻¹(α; v, r − v + 1), the
one-sided Clopper–Pearson lower bound on a proportion (Clopper & Pearson 1934; reused
from :mod:`service.privacy.audit`), so ε_lb = logit(CP_lower(v of r, α)). δ > 0 is solved
numerically (bisection on the tail above; the result is ≤ the δ = 0 bound).

The ceiling. With m canaries the largest bound this test can ever show is the one where
the auditor guesses all m and is right every time: ceiling(m) = ε_lb(r = v = m). At 95%
confidence and δ = 0 that is logit(0.05^(1/m)) ≈ 5.8 for m = 1,000 (q^1000 = 0.05). A
bound near the ceiling means "at least this much"; a bound far below the claimed ε is NOT
evidence that the mechanism meets its claim: this is a lower bound, never a proof.

Guesses must be chosen before the bound is computed: r (how many guesses, and which
scores count as "in") is fixed in advance; trying several r and keeping the best would
need a Bonferroni correction that this module does not apply.

Units: ε in nats; δ a probability; confidence = 1 − α, the probability (over the
inclusion coins and the mechanism's randomness) that ε_lb ≤ the true ε.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from service.privacy.audit import clopper_pearson_lower

__all__ = [
    "OneRunBound",
    "ceiling",
    "epsilon_lower_bound",
    "guess_tail",
]

_EPS_SEARCH_MAX = 200.0  # nats; logit of the largest q below 1 in float64 is ≈ 36.7


@dataclass(frozen=True)
class OneRunBound:
    """The audit's figure and the largest figure the same test could have shown."""

    epsilon: float  # ε_lb, nats, ≥ 0
    ceiling: float  # ε_lb with r = v = m at the same confidence and δ
    canaries: int  # m
    guesses: int  # r
    correct: int  # v
    confidence: float
    delta: float


def _check(canaries: int, guesses: int, correct: int, confidence: float, delta: float) -> None:
    for name, value in (("canaries", canaries), ("guesses", guesses), ("correct", correct)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    if canaries < 1:
        raise ValueError(f"canaries must be ≥ 1, got {canaries}")
    if not 0 <= guesses <= canaries:
        raise ValueError(f"guesses must be in [0, canaries = {canaries}], got {guesses}")
    if not 0 <= correct <= guesses:
        raise ValueError(f"correct must be in [0, guesses = {guesses}], got {correct}")
    if not (math.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not (math.isfinite(delta) and 0.0 <= delta < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta}")


def guess_tail(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Theorem 3.1's bound on P[W ≥ v] for an (ε, δ)-DP mechanism (see the module text):
    β + 2·m·δ·max_{i=1..v} P[v − i ≤ Bin(r, q) < v]/i, β = P[Bin(r, q) ≥ v], q = e^ε/(1+e^ε);
    capped at 1."""
    m, r, v = canaries, guesses, correct
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ValueError(f"epsilon must be finite and ≥ 0, got {epsilon}")
    if v == 0:
        return 1.0
    q = float(special.expit(epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))  # P[Bin ≥ v]
    if delta == 0.0:
        return min(beta, 1.0)
    i = np.arange(1, v + 1)
    between = stats.binom.sf(v - i - 1, r, q) - beta  # P[v − i ≤ Bin < v]
    alpha = float(np.max(between / i))
    return min(beta + 2.0 * m * delta * alpha, 1.0)


def _bound(m: int, r: int, v: int, confidence: float, delta: float) -> float:
    significance = 1.0 - confidence
    if v == 0:
        return 0.0
    # δ = 0: the closed form (module text). It also bounds the δ > 0 search from above.
    q_low = clopper_pearson_lower(successes=v, trials=r, alpha=significance)
    if q_low <= 0.5:
        return 0.0
    eps0 = float(special.logit(q_low)) if q_low < 1.0 else _EPS_SEARCH_MAX
    if delta == 0.0:
        return eps0

    def excess(eps: float) -> float:  # > 0: the (ε, δ) claim is rejected
        return significance - guess_tail(canaries=m, guesses=r, correct=v, epsilon=eps, delta=delta)

    if excess(0.0) <= 0.0:
        return 0.0
    if excess(eps0) > 0.0:  # cannot happen (the δ term is ≥ 0); keep the safe side
        return eps0
    return float(optimize.brentq(excess, 0.0, eps0, xtol=1e-9, rtol=1e-12))


def ceiling(*, canaries: int, confidence: float, delta: float = 0.0) -> float:
    """The largest ε_lb this test can show with m canaries: every one guessed, all right."""
    _check(canaries, canaries, canaries, confidence, delta)
    return _bound(canaries, canaries, canaries, confidence, delta)


def epsilon_lower_bound(
    *, canaries: int, guesses: int, correct: int, confidence: float, delta: float = 0.0
) -> OneRunBound:
    """ε_lb from Theorem 3.1 of Steinke, Nasr & Jagielski 2023 (module text), with the
    ceiling of the same test beside it."""
    _check(canaries, guesses, correct, confidence, delta)
    return OneRunBound(
        epsilon=_bound(canaries, guesses, correct, confidence, delta),
        ceiling=_bound(canaries, canaries, canaries, confidence, delta),
        canaries=canaries,
        guesses=guesses,
        correct=correct,
        confidence=confidence,
        delta=delta,
    )
