r"""Composition rules ("privacy filters") in integer micro-units.

Two rules, chosen per dataset by its budget:

Pure datasets (δ_total = 0): basic composition. Admit a pure ε-DP request iff
Σ ε_i ≤ ε_total (:func:`pure_admits`); only pure events may be charged there.
Valid under fully adaptive choice of the ε_i (the basic-composition filter of
Rogers, Roth, Ullman & Vadhan 2016, "Privacy Odometers and Filters:
Pay-as-you-Go Composition"): the likelihood ratio of a transcript factorises
over rounds, an admitted round contributes a factor within e^{±ε_t} (ε_t-DP
given the past) and a refused round a factor 1, and Σ_{admitted} ε_t ≤ ε_total
on every transcript, so every transcript's likelihood ratio lies within
e^{±ε_total}.

Approximate datasets (δ_total > 0): an RDP filter over the public grid Λ
(``ORDERS``). Each request carries a charge vector c(α), α ∈ Λ, rounded up to
micro-units, with c(α) ≥ the request's RDP at order α (events.py). The ledger
keeps the spent vector S(α) = Σ c_i(α) over admitted requests and admits a new
request iff SOME order keeps S(α) + c(α) ≤ B_α (:func:`rdp_admits`), where

    B_α = ε_total − log((α−1)/α) + (log(δ_total/|Λ|) + log α)/(α − 1)

rounded down to micro-units (:func:`rdp_budget_micro`). B_α is what the
Canonne–Kamath–Steinke conversion (rdp.epsilon_from_rdp) allows at order α
for the target (ε_total, δ_total/|Λ|). A negative B_α makes order α unusable.

Theorem. For any (randomised, fully adaptive) analyst and any finite horizon,
the transcript of the interaction with this ledger is (ε_total, δ_total)-DP.

Setting. In round t the analyst, as a function of its randomness and the
transcript so far, submits a request; its charge vector c_t is a deterministic
function of the request and public metadata (plans are priced before any
private row is read), and its mechanism M_t is (α, c_t(α))-RDP for every α ∈ Λ
(add/remove-one neighbours). The ledger admits or refuses by the rule above; if
admitted, M_t runs on the data and its output y_t is appended to the transcript,
otherwise "refused" is. Refusals are visible to the analyst; they are a
deterministic function of the public charges in the transcript, so they leak
nothing beyond it. Any further refusal rule that is also a deterministic
function of the public transcript (per-analyst caps, an admin pause) may be
added: it enters every copy below identically and the proof is unchanged.

Step 1: one order (Feldman & Zrnic 2021, "Individual Privacy Accounting via a
Rényi Filter", NeurIPS 2021, arXiv:2008.11193). Fix α ∈ Λ and let F_α be the
ledger that admits iff S^α + c_t(α) ≤ B_α, with S^α summing only F_α's own
admissions. A refused round runs the constant mechanism (0-RDP), and whether F_α
refuses is a function of the past transcript; so F_α is a Rényi filter in the
sense of Feldman–Zrnic with adaptively chosen ρ_t = c_t(α)·1[admitted] and
Σ_t ρ_t ≤ B_α surely. Their filter theorem gives: the laws P^α_D, P^α_{D'} of
F_α's transcript satisfy D_α(P^α_D ‖ P^α_{D'}) ≤ B_α for all neighbours D, D'
(in both orders). The CKS conversion is a statement about one pair of
distributions, so for every set O of transcripts
P^α_D(O) ≤ e^{ε_total} P^α_{D'}(O) + δ_total/|Λ|. (If B_α < 0, F_α admits
nothing, its transcript does not depend on the data and the inequality holds
trivially; such an α is also never α* below.)

Step 2: coupling. Run the real ledger and every F_α on the same analyst
randomness and give the t-th mechanism the same random seed in every copy. For
a transcript τ let S_τ be the spent vector after its last round (computed from
the public charges of the rounds marked admitted), A(τ) = {α : S_τ(α) ≤ B_α}
the orders alive at the end, and α*(τ) = min A(τ) (⊥ if empty). Let G be the set
of transcripts whose admit/refuse marks agree with the real rule. Claim: for
each α, {τ_real ∈ O, α*(τ_real) = α} = {τ_α ∈ O ∩ G, α*(τ_α) = α} as events.
(⊆) S(α) only grows, so α alive at the end is alive after every round. By
induction over rounds, if both copies agree so far then the analyst submits
the same request with the same charge and S^α = S(α); if the real ledger
admitted, then S(α) + c_t(α) ≤ B_α (α is alive afterwards), so F_α admits; if
it refused, every order failed, α included, so F_α refuses. Same decision and
same seed give the same output, so τ_α = τ_real. (⊇) If τ_α ∈ G then at every
round the real ledger, seeing the same prefix, takes the decision recorded in
τ_α, so again τ_real = τ_α.

Step 3: union bound over the partition by α*. If α*(τ) = ⊥ no request was ever
admitted (the last admitted request leaves the order that admitted it alive,
as nothing is added after it), so on that event the transcript does not depend
on the data and has the same law under D and D'. Hence for every O

    P_D(τ ∈ O) = Σ_{α∈Λ} P^α_D(O ∩ G ∩ {α* = α}) + P_D(τ ∈ O, α* = ⊥)
              ≤ Σ_α [e^{ε_total} P^α_{D'}(O ∩ G ∩ {α* = α}) + δ_total/|Λ|]
                + P_{D'}(τ ∈ O, α* = ⊥)
              = e^{ε_total} Σ_α P_{D'}(τ ∈ O, α* = α) + δ_total + P_{D'}(τ ∈ O, α* = ⊥)
              ≤ e^{ε_total} P_{D'}(τ ∈ O) + δ_total.                              ∎

Why the tighter conversion is fine here: step 1 only needs *some* valid
RDP → (ε, δ) conversion for a single pair of distributions with
D_α ≤ B_α, and the CKS bound (arXiv:2004.00010v4, Prop. 12) is one; adaptivity
is handled entirely by the Feldman–Zrnic filter theorem and the coupling.
Compared with the simpler B_α = ε_total − log(|Λ|/δ_total)/(α−1) (Mironov 2017,
Prop. 3 in arXiv v3, as cited by dp_accounting) it adds
log(α)/(α−1) − log((α−1)/α) > 0 to every order.

Rounding: charges are rounded up and budgets down (amounts.py), so the integer
inequality implies the real one. Concurrency: jobs are one-shot mechanisms, so
running admitted jobs concurrently only reveals outputs later than the
sequential model assumes (a post-processing of it); Haney et al. 2023
("Concurrent Composition for Interactive Differential Privacy with Adaptive
Privacy-Loss Parameters", CCS 2023) extend fixed-order RDP filters to
concurrently interleaved interactive mechanisms.

Scope, to be respected by the ledger: the proof needs S to be monotone, i.e.
charges are made (under the row lock) before a job touches data and are never
taken back. Returning budget to the filter (a refund) is NOT covered: an order
that died could come back to life and the coupling of step 2 breaks. Safe
options are to keep refunded amounts in the filter state (show refunds as
information only), or to make the filter decision when the worker starts the
job, counting only started jobs, so that a job cancelled before it touched data
was never a round of the filter.

Tighter PLD/PRV numbers across jobs are not used here: natural f-DP filters are
not valid under full adaptivity (Tran, Koskela, Räisä & Honkela 2026,
"f-Differential Privacy Filters: Validity and Approximate Solutions").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

from service.privacy.amounts import (
    MICRO_CAP,
    curve_to_micro_up,
    from_micro,
    signed_to_micro_down,
)
from service.privacy.events import DpEvent, PureDpEvent
from service.privacy.orders import ORDERS
from service.privacy.rdp import validate_orders

__all__ = [
    "EPSILON_TOTAL_MAX",
    "max_admissible_epsilon",
    "max_admissible_pure_epsilon",
    "pure_admits",
    "pure_max_admissible_epsilon",
    "rdp_admits",
    "rdp_budget_micro",
]

EPSILON_TOTAL_MAX: Final[float] = 1e6
"""Largest accepted ε_total (nats); keeps every budget far below MICRO_CAP."""


def _check_micro(name: str, value: object, *, allow_negative: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int (micro-units), got {value!r}")
    if not allow_negative and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _check_vector(name: str, values: Sequence[int], *, allow_negative: bool = False) -> list[int]:
    return [_check_micro(name, v, allow_negative=allow_negative) for v in values]


# ------------------------------------------------------------------ pure rule


def pure_admits(*, spent_micro: int, charge_micro: int, total_micro: int) -> bool:
    """Basic composition: admit iff spent + charge ≤ total (all in micro-units).

    The charge of a pure event is ``to_micro_up(event.pure_epsilon())``; non-pure
    events must not be charged against a pure (δ_total = 0) budget.

    A charge at the saturation value MICRO_CAP (no finite ε) is never admitted.
    """
    spent = _check_micro("spent_micro", spent_micro)
    charge = _check_micro("charge_micro", charge_micro)
    total = _check_micro("total_micro", total_micro)
    return charge < MICRO_CAP and spent + charge <= total


def pure_max_admissible_epsilon(*, spent_micro: int, total_micro: int) -> float:
    """Largest ε (nats, a multiple of 1e-6, ≥ 0) still admissible under basic composition."""
    spent = _check_micro("spent_micro", spent_micro)
    total = _check_micro("total_micro", total_micro)
    return from_micro(max(0, total - spent))


# ------------------------------------------------------------------- RDP rule


def rdp_budget_micro(
    *, epsilon_total: float, delta_total: float, orders: Sequence[float] = ORDERS
) -> list[int]:
    """Per-order RDP budgets B_α in micro-units (rounded down; may be negative).

    B_α = ε_total − log((α−1)/α) + (log(δ_total/|Λ|) + log α)/(α − 1), with
    |Λ| = len(orders) (the CKS conversion at δ_total/|Λ|; see the module
    docstring for why this is valid under full adaptivity). ε_total in nats,
    0 < ε_total ≤ EPSILON_TOTAL_MAX; 0 < δ_total < 1.
    """
    if isinstance(epsilon_total, bool) or not isinstance(epsilon_total, int | float):
        raise ValueError(f"epsilon_total must be a real number, got {epsilon_total!r}")
    if not (0.0 < float(epsilon_total) <= EPSILON_TOTAL_MAX):
        raise ValueError(
            f"epsilon_total must be in (0, {EPSILON_TOTAL_MAX:g}], got {epsilon_total!r}"
        )
    if isinstance(delta_total, bool) or not isinstance(delta_total, int | float):
        raise ValueError(f"delta_total must be a real number, got {delta_total!r}")
    if not (0.0 < float(delta_total) < 1.0):
        raise ValueError(
            f"delta_total must be in (0, 1) for the RDP filter, got {delta_total!r} "
            "(use the pure rule for δ_total = 0)"
        )
    alphas = validate_orders(orders)
    if len(set(alphas)) != len(alphas):
        raise ValueError("orders must be distinct")
    eps = float(epsilon_total)
    log_delta_share = math.log(float(delta_total)) - math.log(len(alphas))
    out = []
    for a in alphas:
        b = eps - math.log1p(-1.0 / a) + (log_delta_share + math.log(a)) / (a - 1.0)
        out.append(signed_to_micro_down(b))
    return out


def rdp_admits(
    *,
    spent_micro: Sequence[int],
    charge_micro: Sequence[int],
    budget_micro: Sequence[int],
) -> bool:
    """Admit iff some order α keeps spent(α) + charge(α) ≤ B_α (micro-units).

    All three vectors are over the same grid of orders. Orders whose charge is
    at the saturation value MICRO_CAP (no finite RDP bound) are never used.
    """
    spent = _check_vector("spent_micro", spent_micro)
    charge = _check_vector("charge_micro", charge_micro)
    budget = _check_vector("budget_micro", budget_micro, allow_negative=True)
    if not len(spent) == len(charge) == len(budget):
        raise ValueError(
            f"vector lengths differ: spent {len(spent)}, charge {len(charge)}, budget {len(budget)}"
        )
    return any(c < MICRO_CAP and s + c <= b for s, c, b in zip(spent, charge, budget, strict=True))


def max_admissible_epsilon(
    *,
    spent_micro: Sequence[int],
    budget_micro: Sequence[int],
    event_for_epsilon: Callable[[float], DpEvent],
    orders: Sequence[float] = ORDERS,
) -> float:
    """Largest ε (nats, a multiple of 1e-6, ≥ 0) such that ``event_for_epsilon(ε)``
    would still be admitted by the RDP filter, found by bisection on micro-units.

    ``event_for_epsilon`` must be monotone (a larger ε never has a smaller RDP
    curve), as ε ↦ PureDpEvent(ε) and ε ↦ ExponentialMechanismEvent(ε) are. The
    charge is computed exactly as the ledger does (``curve_to_micro_up`` of the
    event's curve on ``orders``), so the answer is admitted and answer + 1e-6
    is not. Returns 0.0 when not even ε = 0 is admitted.
    """
    alphas = validate_orders(orders)
    spent = _check_vector("spent_micro", spent_micro)
    budget = _check_vector("budget_micro", budget_micro, allow_negative=True)

    def admitted(m: int) -> bool:
        charge = curve_to_micro_up(event_for_epsilon(from_micro(m)).rdp(alphas))
        return rdp_admits(spent_micro=spent, charge_micro=charge, budget_micro=budget)

    if not admitted(0):
        return 0.0
    cap = int(EPSILON_TOTAL_MAX * 1_000_000) * 4
    lo, hi = 0, 1_000_000  # invariant once bracketed: admitted(lo), not admitted(hi)
    while admitted(hi):
        lo = hi
        if hi >= cap:
            return from_micro(hi)
        hi = min(2 * hi, cap)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if admitted(mid):
            lo = mid
        else:
            hi = mid
    return from_micro(lo)


def max_admissible_pure_epsilon(
    *,
    spent_micro: Sequence[int],
    budget_micro: Sequence[int],
    orders: Sequence[float] = ORDERS,
) -> float:
    """Largest ε (nats, rounded down to 1e-6, ≥ 0) such that a PureDpEvent(ε) would
    still be admitted by the RDP filter: the remaining budget "in ε terms"."""
    return max_admissible_epsilon(
        spent_micro=spent_micro,
        budget_micro=budget_micro,
        event_for_epsilon=lambda eps: PureDpEvent(epsilon=eps),
        orders=orders,
    )
