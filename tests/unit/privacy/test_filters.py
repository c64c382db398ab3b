"""Composition rules: pure basic composition and the RDP filter over ORDERS."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.privacy import filters
from service.privacy.amounts import MICRO_CAP, curve_to_micro_up, from_micro, to_micro_up
from service.privacy.events import (
    DpEvent,
    ExponentialMechanismEvent,
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
)
from service.privacy.filters import (
    EPSILON_TOTAL_MAX,
    epsilon_spent,
    max_admissible_epsilon,
    max_admissible_pure_epsilon,
    pure_admits,
    pure_max_admissible_epsilon,
    rdp_admits,
    rdp_budget_micro,
)
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp

N = len(ORDERS)
micro = st.integers(min_value=0, max_value=50_000_000)
vectors = st.lists(micro, min_size=N, max_size=N)
budgets = st.builds(
    lambda e, d: rdp_budget_micro(epsilon_total=e, delta_total=d),
    st.floats(0.05, 60.0),
    st.sampled_from([1e-3, 1e-5, 1e-7, 1e-9]),
)


# ------------------------------------------------------------------ pure rule


@given(spent=micro, charge=micro, total=micro, smaller=micro)
def test_pure_admits_is_basic_composition_and_monotone(
    spent: int, charge: int, total: int, smaller: int
) -> None:
    ok = pure_admits(spent_micro=spent, charge_micro=charge, total_micro=total)
    assert ok == (spent + charge <= total)
    if ok:
        assert pure_admits(spent_micro=spent, charge_micro=min(smaller, charge), total_micro=total)


@given(st.lists(st.floats(0.0, 3.0), max_size=40), st.floats(0.01, 10.0))
def test_pure_dataset_never_exceeds_total(requests: list[float], eps_total: float) -> None:
    total = int(eps_total * 1_000_000)
    spent = 0
    for eps in requests:
        charge = to_micro_up(eps)
        if pure_admits(spent_micro=spent, charge_micro=charge, total_micro=total):
            spent += charge
        assert spent <= total
    remaining = pure_max_admissible_epsilon(spent_micro=spent, total_micro=total)
    assert pure_admits(spent_micro=spent, charge_micro=to_micro_up(remaining), total_micro=total)
    assert not pure_admits(
        spent_micro=spent, charge_micro=to_micro_up(remaining) + 1, total_micro=total
    )


def test_pure_rule_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        pure_admits(spent_micro=-1, charge_micro=0, total_micro=1)
    with pytest.raises(ValueError):
        pure_admits(spent_micro=0, charge_micro=0.5, total_micro=1)  # type: ignore[arg-type]
    assert not pure_admits(spent_micro=0, charge_micro=MICRO_CAP, total_micro=MICRO_CAP)


# ------------------------------------------------------------------ budgets


@pytest.mark.parametrize("eps_total", [0.1, 1.0, 3.0, 10.0, 50.0])
@pytest.mark.parametrize("delta_total", [1e-5, 1e-8])
def test_budget_is_the_cks_conversion_at_delta_share(eps_total: float, delta_total: float) -> None:
    budget = rdp_budget_micro(epsilon_total=eps_total, delta_total=delta_total)
    assert len(budget) == N
    share = delta_total / N
    for alpha, b in zip(ORDERS, budget, strict=True):
        if b < 0:
            continue
        # spending exactly B_α at order α converts back to ≤ ε_total at δ_total/|Λ|
        eps = epsilon_from_rdp(rdp=[from_micro(b)], orders=[alpha], delta=share)
        assert eps <= eps_total + 1e-9
        assert eps >= eps_total - 2e-6  # rounded down by at most one micro-unit


def test_budget_is_at_least_the_simple_conversion() -> None:
    eps_total, delta_total = 2.0, 1e-6
    budget = rdp_budget_micro(epsilon_total=eps_total, delta_total=delta_total)
    for alpha, b in zip(ORDERS, budget, strict=True):
        simple = eps_total - math.log(N / delta_total) / (alpha - 1)
        assert from_micro(b) >= simple - 1e-6


def test_large_budgets_use_small_orders() -> None:
    budget = rdp_budget_micro(epsilon_total=10.0, delta_total=1e-5)
    usable = [a for a, b in zip(ORDERS, budget, strict=True) if b >= 0]
    assert min(usable) <= 2.5
    assert all(b >= 0 for b in rdp_budget_micro(epsilon_total=60.0, delta_total=1e-5))
    tiny = rdp_budget_micro(epsilon_total=0.05, delta_total=1e-5)
    assert any(b > 0 for b in tiny)


@pytest.mark.parametrize(
    ("eps", "delta"),
    [
        (0.0, 1e-5),
        (-1.0, 1e-5),
        (math.inf, 1e-5),
        (math.nan, 1e-5),
        (1e7, 1e-5),
        (1.0, 0.0),
        (1.0, 1.0),
        (1.0, -1e-5),
        (1.0, math.nan),
        (True, 1e-5),
    ],
)
def test_budget_rejects_bad_input(eps: float, delta: float) -> None:
    with pytest.raises(ValueError):
        rdp_budget_micro(epsilon_total=eps, delta_total=delta)


# ------------------------------------------------------------------ RDP filter


@given(
    spent=vectors,
    charge=vectors,
    budget=budgets,
    shrink=st.lists(st.floats(0, 1), min_size=N, max_size=N),
)
def test_rdp_admits_is_monotone(
    spent: list[int], charge: list[int], budget: list[int], shrink: list[float]
) -> None:
    ok = rdp_admits(spent_micro=spent, charge_micro=charge, budget_micro=budget)
    assert ok == any(s + c <= b for s, c, b in zip(spent, charge, budget, strict=True))
    smaller = [int(c * f) for c, f in zip(charge, shrink, strict=True)]
    if ok:
        assert rdp_admits(spent_micro=spent, charge_micro=smaller, budget_micro=budget)
        less_spent = [int(s * f) for s, f in zip(spent, shrink, strict=True)]
        assert rdp_admits(spent_micro=less_spent, charge_micro=charge, budget_micro=budget)


request_events = st.one_of(
    st.builds(PureDpEvent, epsilon=st.floats(0.0, 2.0)),
    st.builds(ExponentialMechanismEvent, epsilon=st.floats(0.0, 2.0)),
    st.builds(
        PoissonSubsampledGaussianEvent,
        sampling_rate=st.sampled_from([0.001, 0.01, 0.05, 1.0]),
        noise_multiplier=st.sampled_from([0.7, 1.0, 2.0, 5.0]),
        steps=st.sampled_from([1, 10, 500]),
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(request_events, max_size=25),
    eps_total=st.floats(0.2, 20.0),
    delta_total=st.sampled_from([1e-5, 1e-8]),
)
def test_filter_run_keeps_an_order_alive(
    requests: list[PureDpEvent], eps_total: float, delta_total: float
) -> None:
    """Simulate a ledger: after every admission some order stays within its budget,
    so the interaction is (ε_total, δ_total)-DP by the theorem in filters.py."""
    budget = rdp_budget_micro(epsilon_total=eps_total, delta_total=delta_total)
    spent = [0] * N
    admitted = []
    for ev in requests:
        charge = curve_to_micro_up(ev.rdp(ORDERS))
        if rdp_admits(spent_micro=spent, charge_micro=charge, budget_micro=budget):
            spent = [s + c for s, c in zip(spent, charge, strict=True)]
            admitted.append(ev)
            assert any(s <= b for s, b in zip(spent, budget, strict=True))
    if admitted:
        # the real-valued RDP of what was admitted converts to ≤ ε_total at δ_total/|Λ|
        true_rdp = np.sum([e.rdp(ORDERS) for e in admitted], axis=0)
        eps = epsilon_from_rdp(rdp=true_rdp, orders=ORDERS, delta=delta_total / N)
        assert eps <= eps_total + 1e-9


def test_rdp_admits_validates_and_ignores_saturated_orders() -> None:
    with pytest.raises(ValueError, match="lengths"):
        rdp_admits(spent_micro=[0], charge_micro=[0, 0], budget_micro=[1, 1])
    with pytest.raises(ValueError):
        rdp_admits(spent_micro=[-1], charge_micro=[0], budget_micro=[1])
    assert not rdp_admits(spent_micro=[0], charge_micro=[MICRO_CAP], budget_micro=[MICRO_CAP])
    assert not rdp_admits(spent_micro=[0], charge_micro=[0], budget_micro=[-1])
    assert rdp_admits(spent_micro=[5, 0], charge_micro=[0, 3], budget_micro=[4, 3])


# ------------------------------------------------------------------ remaining ε


@settings(max_examples=40, deadline=None)
@given(eps_total=st.floats(0.1, 30.0), used=st.lists(st.floats(0.0, 1.5), max_size=6))
def test_max_admissible_pure_epsilon_is_tight(eps_total: float, used: list[float]) -> None:
    budget = rdp_budget_micro(epsilon_total=eps_total, delta_total=1e-5)
    spent = [0] * N
    for eps in used:
        charge = curve_to_micro_up(PureDpEvent(epsilon=eps).rdp())
        if rdp_admits(spent_micro=spent, charge_micro=charge, budget_micro=budget):
            spent = [s + c for s, c in zip(spent, charge, strict=True)]
    best = max_admissible_pure_epsilon(spent_micro=spent, budget_micro=budget)
    assert best >= 0
    assert best == round(best, 6)

    def admitted(eps: float) -> bool:
        charge = curve_to_micro_up(PureDpEvent(epsilon=eps).rdp())
        return rdp_admits(spent_micro=spent, charge_micro=charge, budget_micro=budget)

    if admitted(0.0):
        assert admitted(best)
    assert not admitted(best + 1e-6)


def test_remaining_epsilon_examples() -> None:
    # an untouched ε_total = 1 budget (δ = 1e-5) admits one pure release of a little
    # less than ε = 1 (0.969: the price of splitting δ over the grid)
    budget = rdp_budget_micro(epsilon_total=1.0, delta_total=1e-5)
    fresh = max_admissible_pure_epsilon(spent_micro=[0] * N, budget_micro=budget)
    assert 0.95 < fresh <= 1.0
    # the exponential mechanism's bounded-range curve leaves more room
    expm = max_admissible_epsilon(
        spent_micro=[0] * N,
        budget_micro=budget,
        event_for_epsilon=lambda e: ExponentialMechanismEvent(epsilon=e),
    )
    assert expm >= fresh
    # exhausted: nothing admissible
    assert max_admissible_pure_epsilon(spent_micro=[10**9] * N, budget_micro=budget) == 0.0


def test_dp_sgd_job_then_pure_queries() -> None:
    budget = rdp_budget_micro(epsilon_total=3.0, delta_total=1e-5)
    job = PoissonSubsampledGaussianEvent(sampling_rate=256 / 30000, noise_multiplier=1.0, steps=351)
    charge = curve_to_micro_up(job.rdp())
    spent = [0] * N
    assert rdp_admits(spent_micro=spent, charge_micro=charge, budget_micro=budget)
    spent = charge
    remaining = max_admissible_pure_epsilon(spent_micro=spent, budget_micro=budget)
    fresh = max_admissible_pure_epsilon(spent_micro=[0] * N, budget_micro=budget)
    assert 0 < remaining < fresh
    assert np.all(np.asarray(spent) >= 0)


def _releases_until_refused(
    event: PureDpEvent | ExponentialMechanismEvent, budget: list[int]
) -> int:
    charge = curve_to_micro_up(event.rdp())
    spent, n = [0] * N, 0
    while rdp_admits(spent_micro=spent, charge_micro=charge, budget_micro=budget):
        spent = [s + c for s, c in zip(spent, charge, strict=True)]
        n += 1
    return n


def test_repeated_releases_are_counted() -> None:
    budget = rdp_budget_micro(epsilon_total=10.0, delta_total=1e-5)
    pure = _releases_until_refused(PureDpEvent(epsilon=0.5), budget)
    expm = _releases_until_refused(ExponentialMechanismEvent(epsilon=0.5), budget)
    assert pure == 20  # no better than basic composition at this scale, never worse
    assert expm == 46  # the bounded-range bound (α ε²/8) pays off over many releases


# ------------------------------------------------------------------ spent ε and refunds


def _covers(spent: list[int], eps: float, delta: float) -> bool:
    budget = rdp_budget_micro(epsilon_total=eps, delta_total=delta)
    return any(s <= b for s, b in zip(spent, budget, strict=True))


@settings(max_examples=100, deadline=None)
@given(spent=vectors, delta=st.sampled_from([1e-3, 1e-5, 1e-9]))
def test_epsilon_spent_is_the_smallest_budget_that_covers_the_spending(
    spent: list[int], delta: float
) -> None:
    eps = epsilon_spent(spent_micro=spent, delta_total=delta)
    if not any(spent):
        assert eps == 0.0
        return
    assert eps == round(eps, 6) and 0.0 <= eps < EPSILON_TOTAL_MAX
    assert _covers(spent, eps + 2e-6, delta)  # 2e-6: the budgets round down
    if eps > 1e-5:
        assert not _covers(spent, eps - 1e-5, delta)
    # The old "RDP-implied ε" (full δ_total, no union bound over the grid) is never larger:
    # it is what the spending converts to if the order had been fixed in advance.
    old = epsilon_from_rdp(rdp=[from_micro(v) for v in spent], orders=ORDERS, delta=delta)
    assert old <= eps + 1e-6


def test_epsilon_spent_edge_cases() -> None:
    assert epsilon_spent(spent_micro=[0] * N, delta_total=1e-5) == 0.0
    saturated = [MICRO_CAP] * N
    assert epsilon_spent(spent_micro=saturated, delta_total=1e-5) == math.inf
    saturated[-1] = 1_000_000
    assert epsilon_spent(spent_micro=saturated, delta_total=1e-5) < math.inf
    for bad in ({"spent_micro": [0] * (N - 1)}, {"delta_total": 0.0}, {"spent_micro": [-1] * N}):
        args: dict[str, object] = {"spent_micro": [0] * N, "delta_total": 1e-5, **bad}
        with pytest.raises(ValueError):
            epsilon_spent(**args)  # type: ignore[arg-type]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), request_events),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("start"), st.integers(0, 30)),
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(ops=ops, eps_total=st.floats(0.3, 15.0), delta_total=st.sampled_from([1e-5, 1e-8]))
def test_refunds_of_unstarted_jobs_keep_every_start_within_the_start_time_filter(
    ops: list[tuple[str, object]], eps_total: float, delta_total: float
) -> None:
    """The argument of filters.py ("Refunds: the filter's rounds are job STARTS"), run
    on random histories: admission against S_live, real refunds of jobs that never
    started, starts of live jobs. Every start is admitted by the start-time filter F'
    (S_started + c ≤ B_α at some α), at ε_total and at the level ε_spent of the end."""
    budget = rdp_budget_micro(epsilon_total=eps_total, delta_total=delta_total)
    live: dict[int, list[int]] = {}  # admitted, not refunded, not started
    started: list[list[int]] = []  # charges in the order the jobs started
    s_live, s_started = [0] * N, [0] * N
    next_id = 0
    for op, arg in ops:
        if op == "submit":
            assert isinstance(arg, DpEvent)
            charge = curve_to_micro_up(arg.rdp(ORDERS))
            if rdp_admits(spent_micro=s_live, charge_micro=charge, budget_micro=budget):
                live[next_id] = charge
                s_live = [a + b for a, b in zip(s_live, charge, strict=True)]
            next_id += 1
        elif live:
            job = sorted(live)[int(str(arg)) % len(live)]
            charge = live.pop(job)
            if op == "cancel":  # a real refund: never read a row
                s_live = [a - b for a, b in zip(s_live, charge, strict=True)]
            else:  # the job starts: a round of F'
                assert rdp_admits(spent_micro=s_started, charge_micro=charge, budget_micro=budget)
                s_started = [a + b for a, b in zip(s_started, charge, strict=True)]
                started.append(charge)
        # the invariant: S_live = 0 or some order within budget; started ⊆ live
        assert not any(s_live) or any(a <= b for a, b in zip(s_live, budget, strict=True))
        assert all(a <= b for a, b in zip(s_started, s_live, strict=True))
    # ε_spent of the final S_live: F' at that level would have admitted every start.
    level = epsilon_spent(spent_micro=s_live, delta_total=delta_total)
    assert level <= eps_total + 1e-6
    if level == 0.0:  # nothing spent: every started job had a zero charge (ε = 0)
        assert not any(any(c) for c in started)
    elif started:
        at_level = rdp_budget_micro(epsilon_total=level + 2e-6, delta_total=delta_total)
        replay = [0] * N
        for charge in started:
            assert rdp_admits(spent_micro=replay, charge_micro=charge, budget_micro=at_level)
            replay = [a + b for a, b in zip(replay, charge, strict=True)]


def test_remaining_epsilon_of_a_fresh_budget_is_explained() -> None:
    # 9.968 on a fresh (10, 1e-5) budget: B_256 = ε_total − log(255/256)
    # − (log(|Λ|/δ_total) − log 256)/255, and the RR curve of ε-DP is ≈ ε at α = 256.
    budget = rdp_budget_micro(epsilon_total=10.0, delta_total=1e-5)
    fresh = max_admissible_pure_epsilon(spent_micro=[0] * N, budget_micro=budget)
    overhead = math.log(255 / 256) + (math.log(N / 1e-5) - math.log(256)) / 255
    assert overhead == pytest.approx(0.0321, abs=1e-4)
    assert fresh == pytest.approx(10.0 - overhead, abs=2e-6)


# ------------------------------------------- the remaining ε's answers (issue 26)


def _plain_remaining(
    spent: list[int], budget: list[int], event_for_epsilon: Callable[[float], DpEvent]
) -> tuple[float, int]:
    """The bisection as it was before issue 26's change: rdp_admits on the curve at every
    point it asks at. (the answer, curves computed)."""
    calls: list[int] = []

    def admitted(m: int) -> bool:
        calls.append(m)
        charge = curve_to_micro_up(event_for_epsilon(from_micro(m)).rdp(ORDERS))
        return rdp_admits(spent_micro=spent, charge_micro=charge, budget_micro=budget)

    answer, _ = filters._admissible_walk(admitted)
    return from_micro(answer), len(calls)


@pytest.mark.parametrize("seed", range(6))
def test_remaining_epsilon_answers_as_the_plain_bisection(seed: int) -> None:
    """max_admissible_epsilon against the bisection that evaluates every point: the same
    float on ledgers of pure, exponential-mechanism and DP-SGD charges (budgets from 0.1
    to 10⁶ nats, exhausted ones too), with a fraction of its curves; the answer is
    admitted and the answer + 1e-6 refused, both evaluated."""
    rng = np.random.default_rng(seed)
    n_fast = n_plain = 0
    for _ in range(40):
        total = float(rng.choice([0.1, 1.0, 3.0, 10.0, 1e2, 1e4, 1e6]))
        budget = rdp_budget_micro(epsilon_total=total, delta_total=float(rng.choice([1e-3, 1e-6])))
        spent = [0] * N
        for _ in range(int(rng.integers(0, 7))):
            kind = rng.uniform()
            event: DpEvent
            if kind < 0.4:
                event = PureDpEvent(epsilon=float(rng.uniform(0.0, total / 3)))
            elif kind < 0.7:
                event = ExponentialMechanismEvent(epsilon=float(rng.uniform(0.0, total / 3)))
            else:
                event = PoissonSubsampledGaussianEvent(
                    sampling_rate=float(rng.choice([0.001, 0.01, 0.1])),
                    noise_multiplier=float(rng.uniform(0.5, 5.0)),
                    steps=int(rng.integers(1, 2000)),
                )
            spent = [s + c for s, c in zip(spent, curve_to_micro_up(event.rdp()), strict=True)]
        pure = rng.uniform() < 0.7
        evaluated: list[float] = []

        def event_for(eps: float, pure: bool = pure, evaluated: list[float] = evaluated) -> DpEvent:
            evaluated.append(eps)
            return PureDpEvent(epsilon=eps) if pure else ExponentialMechanismEvent(epsilon=eps)

        found = max_admissible_epsilon(
            spent_micro=spent, budget_micro=budget, event_for_epsilon=event_for
        )
        plain, count = _plain_remaining(spent, budget, event_for)
        assert repr(found) == repr(plain)
        fast_count = len(evaluated) - count
        n_fast += fast_count
        n_plain += count
        assert fast_count <= count
        assert found in evaluated[:fast_count]
        if found > 0.0:
            assert from_micro(to_micro_up(found) + 1) in evaluated[:fast_count]
    assert n_fast < 0.3 * n_plain
