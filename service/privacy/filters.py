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

Refunds: the filter's rounds are job STARTS. The proof above treats S as
monotone: a charge, once counted, is never taken back, or an order that died
could come back to life and the coupling of step 2 breaks. The ledger
(service/ledger/refunds.py) nevertheless returns budget in one case, and the
argument for it is that the rounds of the filter are not admissions but job
starts, where a job's START is its first read of private rows:

* A job that never read a private row (cancelled while queued, or failed before
  its first read) is refunded for real: an entry with the negated amounts.
* A job that did read private rows keeps its charge for ever. An admin may still
  record a refund for it (override), but that entry is information only:
  epsilon_micro = 0, rdp_micro = None, event {"refund_of": <charge entry id>,
  "information_only": true, "data_touched": true, ...}; the running totals do
  not move.

Claim: with refunds of this kind, the transcript of the interaction is still
(ε_total, δ_total)-DP. Let S_live(α) be the sum of the charges of the jobs that
are admitted and not refunded for real (plus charges without a job, such as the
registration's noisy row count, whose mechanism runs when it is charged: a start
like any other): the running total the ledger stores and admits against.
Invariant: at all times S_live = 0 or some α ∈ Λ has S_live(α) ≤ B_α.
Admission adds a charge only if some order stays within its budget; a real
refund lowers every S_live(α) (charges are ≥ 0 at every order), so an order
within budget stays within it; an information-only refund changes nothing.
Now let job j start. A started job is never refunded for real, and j is live
when it starts (a job refunded for real is cancelled or finished and never reads
data: the worker sets data_touched before its first read by an update of the job
row that succeeds only while the job is running under its run token, and
refunds lock that row and require a queued or finished job). So the jobs
started before j, and j, are all live, and because charges are ≥ 0,

    S_started(α) + c_j(α) ≤ S_live(α)   for every α,

where S_started sums the charges of the jobs started before j. The invariant
gives an α with S_live(α) ≤ B_α, and that α admits j in the *start-time filter*
F': this module's rule with rounds = job starts, in the order they happen, and
S = S_started. F' therefore admits every job that starts, i.e. it coincides with
what actually ran. F' is exactly the filter of the theorem: in each of its
rounds the "request" is the next job to start, chosen adaptively from the public
transcript (which job starts next depends on submissions, cancellations, refunds
and the queue, all public); admission refusals, cancellations and real refunds
are functions of that public record, i.e. further refusal rules of the kind the
setting allows; and a job cancelled before its start was never a round of F'.
So the transcript of the started mechanisms, with the public record, is
(ε_total, δ_total)-DP by the theorem. Had we refunded a started job for real,
S_started could exceed every B_α at a later start and this argument would fail;
hence information-only refunds. The same argument, with Σε for S(α) and ε_total
for B_α, covers the pure rule (basic-composition filter).

Assumption: the timing and order of job starts do not depend on the private
data beyond what earlier releases reveal (the queue is ordered by public
events; whether a job fails *before* its first read cannot depend on the data;
a failure after it is an output of the mechanism, which is why such a job keeps
its charge). Concurrency: see above; jobs running at the same time are rounds of
F' in the order of their starts. Budget changes by the admin (raising
ε_total) are outside this argument.

What the ledger may show as "spent" (:func:`epsilon_spent`). For the spent
vector S = S_live, ε_spent(S) is the smallest ε_now whose budgets
B_α(ε_now, δ_total) cover S at some order: min over α of the CKS conversion of
S(α) at δ_total/|Λ| (0 if nothing was charged). Its meaning, valid under full
adaptivity: let α* be the minimising order. Every job started so far was
admitted by the start-time filter F' run with budget ε_now at order α*, because
S_started only grows and S_started ≤ S_live ≤ B_α*(ε_now) (the argument above,
with ε_now in place of ε_total). So the same ledger, with jobs allowed to start
only within the budget (ε_now, δ_total) from the beginning, would have run
exactly the same jobs on this history, and its transcript is (ε_now, δ_total)-DP
by the theorem. Formally, for every fixed e: let I_e be the real ledger in
which, in addition, a job may start only if the start-time filter with budget
(e, δ_total) admits it (a public rule; F' at level e is the theorem's filter).
I_e is (e, δ_total)-DP, and by the coupling of step 2 (S_started is monotone)
its transcript equals the real one on the event {ε_spent ≤ e}, so for every set
O of transcripts P_D(τ ∈ O, ε_spent(τ) ≤ e) ≤ e^e P_{D'}(τ ∈ O, ε_spent(τ) ≤ e)
+ δ_total. (Checking e at admission instead would not do: a job admitted while
S_live still held a charge refunded later may exceed level e then.)
Caveat: ε_spent is computed from the transcript, so reading it as a
data-independent "ε so far" is a privacy-odometer statement (Rogers, Roth,
Ullman & Vadhan 2016), which this does not claim; the unconditional guarantee
remains (ε_total, δ_total). The CKS conversion of S at the full δ_total with the
best order picked afterwards (what the accounting page showed before) is valid
for a composition fixed in advance, but not justified here: picking the order
after seeing an adaptively grown S needs the union bound over Λ, which
ε_spent pays exactly as admission does.

What the ledger shows as "remaining" (:func:`max_admissible_pure_epsilon`): the
largest ε of ONE further pure ε-DP request (charged with the randomized-response
RDP curve) that the filter would still admit. It is below ε_total even before
any charge: order α can only absorb B_α = ε_total − log((α−1)/α) −
(log(|Λ|/δ_total) − log α)/(α − 1), which is ε_total − 0.032 at α = 256 for
δ_total = 1e-5 and |Λ| = 25 (δ_total is split over the |Λ| orders, and the RDP →
(ε, δ) conversion has its own cost), while the RR curve of ε-DP tends to ε at
large α. Hence 9.968 on a fresh (10, 1e-5) budget and 0.969 on (1, 1e-5): the
price of an RDP filter, which also admits (ε, δ) mechanisms. A pure dataset
(δ_total = 0) uses basic composition and has remaining = ε_total − Σε exactly.

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
    to_micro_up,
)
from service.privacy.events import DpEvent, PureDpEvent
from service.privacy.guided_search import guided_walk
from service.privacy.orders import ORDERS
from service.privacy.rdp import validate_orders

__all__ = [
    "EPSILON_TOTAL_MAX",
    "epsilon_spent",
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


def epsilon_spent(
    *, spent_micro: Sequence[int], delta_total: float, orders: Sequence[float] = ORDERS
) -> float:
    """The smallest ε_now (nats, rounded up to 1e-6, ≥ 0) whose RDP budgets
    B_α(ε_now, δ_total) cover the spent vector at some order α ∈ ``orders``:

        ε_spent = max(0, min_α [ S(α) + log((α−1)/α) − (log(δ_total/|Λ|) + log α)/(α−1) ]),

    the CKS conversion (Canonne, Kamath & Steinke 2020, Prop. 12) of S(α) at
    δ_total/|Λ|, minimised over the grid; 0.0 when nothing is spent (every job that
    ran had a zero charge, so its output did not depend on the data). Orders
    saturated at MICRO_CAP are skipped; +inf if all are.

    Valid under full adaptivity in the sense proven in the module docstring ("What
    the ledger may show as spent"): a filter with budget (ε_spent, δ_total) from the
    start would have admitted every job started so far, so the transcript is
    (ε_spent, δ_total)-DP on the event that spending stays ≤ ε_spent; the
    unconditional guarantee remains the budget (ε_total, δ_total). ``spent_micro``
    is the running total in micro-units (rounded up, so the result is an upper
    bound on the same quantity for the exact charges).
    """
    alphas = validate_orders(orders)
    spent = _check_vector("spent_micro", spent_micro)
    if len(spent) != len(alphas):
        raise ValueError(f"spent_micro has {len(spent)} entries but orders has {len(alphas)}")
    if isinstance(delta_total, bool) or not isinstance(delta_total, int | float):
        raise ValueError(f"delta_total must be a real number, got {delta_total!r}")
    if not (0.0 < float(delta_total) < 1.0):
        raise ValueError(f"delta_total must be in (0, 1), got {delta_total!r}")
    if not any(spent):
        return 0.0
    log_delta_share = math.log(float(delta_total)) - math.log(len(alphas))
    best = math.inf
    for a, m in zip(alphas, spent, strict=True):
        if m >= MICRO_CAP:
            continue
        eps = from_micro(m) + math.log1p(-1.0 / a) - (log_delta_share + math.log(a)) / (a - 1.0)
        best = min(best, eps)
    if math.isinf(best):
        return math.inf
    # The relative slack covers the few roundings above; then round up to micro-units.
    return from_micro(to_micro_up(max(0.0, best) * (1.0 + 1e-12)))


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
    is not (both evaluated). Returns 0.0 when not even ε = 0 is admitted.

    The bisection (:func:`_admissible_walk`) is answered as :func:`rdp_admits` would,
    but not always by a curve at its own point (issue 26: ~49 curves per answer, ~5 ms,
    in every quote's "remaining after"): admission at m micro-units implies it below m,
    refusal implies it above, so an evaluated point answers every point on its side;
    where none answers, the walk is replayed on a secant estimate of where the
    filter's margin (the largest b_α − s_α − c_α(m) over the orders with finite
    charge, ≥ 0 iff admitted) crosses 0, and the replay's final pair is evaluated:
    5.5 curves on average instead of 32 (1,300 random ledgers). The same answer as the
    walk that evaluates every point, wherever the computed charge is monotone in ε
    (tests/unit/privacy/test_filters.py compares them).
    """
    alphas = validate_orders(orders)
    spent = _check_vector("spent_micro", spent_micro)
    budget = _check_vector("budget_micro", budget_micro, allow_negative=True)
    if len(spent) != len(budget):
        raise ValueError(f"vector lengths differ: spent {len(spent)}, budget {len(budget)}")

    def margin(m: int) -> float:
        """The filter's margin at ε = m micro-units (≥ 0 iff admitted)."""
        charge = curve_to_micro_up(event_for_epsilon(from_micro(m)).rdp(alphas))
        if len(charge) != len(spent):
            raise ValueError(f"vector lengths differ: spent {len(spent)}, charge {len(charge)}")
        usable = [b - s - c for s, c, b in zip(spent, charge, budget, strict=True) if c < MICRO_CAP]
        return max(usable) if usable else -math.inf

    last, _ = guided_walk(
        _admissible_walk,
        evaluate=margin,
        sufficient=lambda g: g >= 0,
        yes_upward=False,
        estimate=_margin_root,
        max_guesses=_MAX_MICRO_GUESSES,
    )
    return from_micro(last)


_MAX_MICRO_GUESSES = 16
"""Evaluations at guessed points per :func:`max_admissible_epsilon`; then the walk's."""

_MICRO_SEARCH_CAP = int(EPSILON_TOTAL_MAX * 1_000_000) * 4
"""The largest ε (micro-units) :func:`max_admissible_epsilon` tries."""


def _margin_root(margins: dict[int, float]) -> float | None:
    """Where the margin crosses 0 (speed only: a wrong estimate costs evaluations, never
    changes the answer): the secant through the largest admitted and the smallest
    refused point evaluated (regula falsi), or through the two points of finite margin
    nearest 0 while none is refused; the bracket's middle where the secant leaves it
    (twice the largest admitted point while none is refused); None before two points."""
    admitted = max((k for k, g in margins.items() if g >= 0), default=None)
    refused = min((k for k, g in margins.items() if g < 0), default=None)
    if admitted is None or len(margins) < 2:
        return None
    if refused is not None and math.isfinite(margins[refused]):
        (k0, g0), (k1, g1) = (admitted, margins[admitted]), (refused, margins[refused])
    else:
        finite = sorted((abs(g), k, g) for k, g in margins.items() if math.isfinite(g))
        if len(finite) < 2:
            return None if refused is None else 0.5 * (admitted + refused)
        (_, k0, g0), (_, k1, g1) = finite[0], finite[1]
    estimate = k0 - g0 * (k1 - k0) / (g1 - g0) if g1 != g0 else math.nan
    if refused is None:
        return estimate if admitted < estimate else 2.0 * max(admitted, 1)
    return estimate if admitted <= estimate < refused else 0.5 * (admitted + refused)


def _admissible_walk(admitted: Callable[[int], bool]) -> tuple[int, int | None]:
    """The bisection of :func:`max_admissible_epsilon` on ``admitted(m)`` (ε = m
    micro-units): (the answer in micro-units, the refused point next to it, None where
    there is none: nothing admitted, or the cap reached)."""
    if not admitted(0):
        return 0, None
    cap = _MICRO_SEARCH_CAP
    lo, hi = 0, 1_000_000  # invariant once bracketed: admitted(lo), not admitted(hi)
    while admitted(hi):
        lo = hi
        if hi >= cap:
            return hi, None
        hi = min(2 * hi, cap)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if admitted(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def max_admissible_pure_epsilon(
    *,
    spent_micro: Sequence[int],
    budget_micro: Sequence[int],
    orders: Sequence[float] = ORDERS,
) -> float:
    """Largest ε (nats, rounded down to 1e-6, ≥ 0) such that a PureDpEvent(ε) would
    still be admitted by the RDP filter: the remaining budget "in ε terms".

    It is the ε of ONE further pure request, charged with the randomized-response
    curve; several smaller requests may add up to more, and even a fresh budget gives
    less than ε_total (0.032 less at δ_total = 1e-5; module docstring, "remaining")."""
    return max_admissible_epsilon(
        spent_micro=spent_micro,
        budget_micro=budget_micro,
        event_for_epsilon=lambda eps: PureDpEvent(epsilon=eps),
        orders=orders,
    )
