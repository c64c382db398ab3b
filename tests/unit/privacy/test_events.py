"""Contract tests that every event type passes, plus decoding/validation tests."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from service.privacy.amounts import curve_to_micro_up
from service.privacy.events import (
    EVENT_TYPES,
    MAX_NESTING_DEPTH,
    AnyOfEvent,
    ComposedEvent,
    DpEvent,
    ExponentialMechanismEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
    RandomStoppingEvent,
    SelfComposedEvent,
    event_from_json,
)
from service.privacy.orders import ORDERS
from service.privacy.rdp import bounded_range_rdp, randomized_response_rdp
from service.privacy.tuning import PoissonRuns, TruncatedNegativeBinomialRuns

SGM = PoissonSubsampledGaussianEvent(sampling_rate=0.01, noise_multiplier=1.1, steps=5)

# At least one example of every registered type (enforced below), pure and not.
EXAMPLES: list[DpEvent] = [
    PureDpEvent(epsilon=0.7),
    PureDpEvent(epsilon=0.0),
    ExponentialMechanismEvent(epsilon=1.3),
    ExponentialMechanismEvent(epsilon=12.0),
    SGM,
    PoissonSubsampledGaussianEvent(sampling_rate=1.0, noise_multiplier=3.0, steps=1),
    ComposedEvent(events=(PureDpEvent(epsilon=0.2), SGM)),
    PmfSlackEvent(tau=1e-9),
    ComposedEvent(events=(SGM, PmfSlackEvent(tau=3e-7))),
    ComposedEvent(events=(PureDpEvent(epsilon=0.2), ExponentialMechanismEvent(epsilon=0.4))),
    SelfComposedEvent(event=ExponentialMechanismEvent(epsilon=0.5), count=3),
    SelfComposedEvent(event=ComposedEvent(events=(SGM, PureDpEvent(epsilon=1.0))), count=2),
    RandomStoppingEvent(event=SGM, runs=TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.1)),
    RandomStoppingEvent(event=SGM, runs=PoissonRuns(mu=5.0)),
    AnyOfEvent(events=(SGM, PureDpEvent(epsilon=0.3))),
    AnyOfEvent(events=(PureDpEvent(epsilon=0.3), ExponentialMechanismEvent(epsilon=0.5))),
    RandomStoppingEvent(
        event=PureDpEvent(epsilon=0.3), runs=TruncatedNegativeBinomialRuns(eta=0.0, gamma=0.2)
    ),
]

# (type, valid JSON fields → list of invalid variants)
INVALID_FIELDS: dict[str, list[dict[str, Any]]] = {
    "pure_dp": [
        {"epsilon": -0.1},
        {"epsilon": math.inf},
        {"epsilon": math.nan},
        {"epsilon": "1.0"},
        {"epsilon": True},
        {"epsilon": None},
    ],
    "exponential_mechanism": [
        {"epsilon": -1.0},
        {"epsilon": math.inf},
        {"epsilon": "2"},
    ],
    "poisson_subsampled_gaussian": [
        {"sampling_rate": 0.0, "noise_multiplier": 1.0, "steps": 1},
        {"sampling_rate": 1.01, "noise_multiplier": 1.0, "steps": 1},
        {"sampling_rate": -0.1, "noise_multiplier": 1.0, "steps": 1},
        {"sampling_rate": math.nan, "noise_multiplier": 1.0, "steps": 1},
        {"sampling_rate": 0.1, "noise_multiplier": 0.0, "steps": 1},
        {"sampling_rate": 0.1, "noise_multiplier": -2.0, "steps": 1},
        {"sampling_rate": 0.1, "noise_multiplier": math.inf, "steps": 1},
        {"sampling_rate": 0.1, "noise_multiplier": 1.0, "steps": 0},
        {"sampling_rate": 0.1, "noise_multiplier": 1.0, "steps": -3},
        {"sampling_rate": 0.1, "noise_multiplier": 1.0, "steps": 2.0},
        {"sampling_rate": 0.1, "noise_multiplier": 1.0, "steps": 2.5},
        {"sampling_rate": 0.1, "noise_multiplier": 1.0, "steps": True},
    ],
    "pmf_slack": [
        {"tau": -1e-9},
        {"tau": math.inf},
        {"tau": "0"},
        {"tau": None},
    ],
    "composed": [
        {"events": []},
        {"events": "not a list"},
        {"events": [{"type": "pure_dp", "version": 1, "epsilon": -1.0}]},
        {"events": [42]},
    ],
    "self_composed": [
        {"event": {"type": "pure_dp", "version": 1, "epsilon": 1.0}, "count": 0},
        {"event": {"type": "pure_dp", "version": 1, "epsilon": 1.0}, "count": 1.5},
        {"event": {"type": "pure_dp", "version": 1, "epsilon": 1.0}, "count": False},
        {"event": {"type": "nope", "version": 1}, "count": 2},
        {"event": "pure_dp", "count": 2},
    ],
    "any_of": [
        {"events": []},
        {"events": "x"},
        {"events": [{"type": "pure_dp", "version": 1, "epsilon": -1.0}]},
    ],
    "random_stopping": [
        {"event": SGM.to_json(), "runs": {"kind": "poisson", "mu": 0.5}},
        {"event": SGM.to_json(), "runs": {"kind": "poisson", "mu": math.inf}},
        {"event": SGM.to_json(), "runs": {"kind": "poisson"}},
        {"event": SGM.to_json(), "runs": {"kind": "geometric", "gamma": 0.1}},
        {
            "event": SGM.to_json(),
            "runs": {"kind": "truncated_negative_binomial", "eta": -1.0, "gamma": 0.1},
        },
        {
            "event": SGM.to_json(),
            "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 1.0},
        },
        {"event": SGM.to_json(), "runs": "poisson"},
        {"event": {"type": "nope", "version": 1}, "runs": {"kind": "poisson", "mu": 1.0}},
    ],
}


def test_every_registered_type_has_examples_and_invalid_cases() -> None:
    assert {type(e).TYPE for e in EXAMPLES} == set(EVENT_TYPES)
    assert set(INVALID_FIELDS) == set(EVENT_TYPES)
    for name, cls in EVENT_TYPES.items():
        assert name == cls.TYPE
        assert isinstance(cls.VERSION, int) and cls.VERSION >= 1


# ----------------------------------------------------------------- the contract


@pytest.mark.parametrize("event", EXAMPLES, ids=repr)
@pytest.mark.parametrize("k", [1, 2, 7, 1000])
def test_k_fold_composition_is_k_times_the_curve(event: DpEvent, k: int) -> None:
    # An upstream accountant once ignored the repeat count for the exponential
    # mechanism; this must hold for every type, through every composition route.
    single = event.rdp(ORDERS)
    np.testing.assert_allclose(
        SelfComposedEvent(event=event, count=k).rdp(), k * single, rtol=1e-12
    )
    np.testing.assert_allclose(ComposedEvent(events=(event,) * k).rdp(), k * single, rtol=1e-12)
    nested = SelfComposedEvent(event=SelfComposedEvent(event=event, count=k), count=2)
    np.testing.assert_allclose(nested.rdp(), 2 * k * single, rtol=1e-12)
    if event.is_pure:
        eps = event.pure_epsilon()
        assert eps is not None
        assert SelfComposedEvent(event=event, count=k).pure_epsilon() == pytest.approx(k * eps)
        assert ComposedEvent(events=(event,) * k).pure_epsilon() == pytest.approx(k * eps)
    # k separate ledger charges are never smaller than one k-fold charge, and
    # exceed it only by rounding (≤ 1 micro-unit per charge per order).
    separate = np.asarray(curve_to_micro_up(single)) * k
    together = np.asarray(curve_to_micro_up(k * single))
    assert np.all(separate >= together)
    assert np.all(separate - together <= k)


@pytest.mark.parametrize("event", EXAMPLES, ids=repr)
def test_json_round_trip(event: DpEvent) -> None:
    d = event.to_json()
    assert d["type"] == type(event).TYPE
    assert d["version"] == type(event).VERSION
    wire = json.loads(json.dumps(d, allow_nan=False))
    back = event_from_json(wire)
    assert back == event
    assert type(back) is type(event)
    assert hash(back) == hash(event)
    assert back.to_json() == d
    np.testing.assert_array_equal(back.rdp(), event.rdp())


@pytest.mark.parametrize("event", EXAMPLES, ids=repr)
def test_rdp_is_finite_and_nonnegative(event: DpEvent) -> None:
    curve = event.rdp(ORDERS)
    assert curve.shape == (len(ORDERS),)
    assert np.all(np.isfinite(curve))
    assert np.all(curve >= 0)
    assert event.rdp([2.0, 3.5]).shape == (2,)


@pytest.mark.parametrize("event", EXAMPLES, ids=repr)
def test_pure_flags_are_consistent(event: DpEvent) -> None:
    eps = event.pure_epsilon()
    assert event.is_pure == (eps is not None)
    if eps is not None:
        assert eps >= 0
        # a pure event's curve never exceeds its ε (D_α ≤ D_∞ = ε)
        assert np.all(event.rdp() <= eps * (1 + 1e-12))


@pytest.mark.parametrize(
    ("type_name", "fields"), [(t, f) for t, variants in INVALID_FIELDS.items() for f in variants]
)
def test_invalid_values_raise(type_name: str, fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        event_from_json({"type": type_name, "version": 1, **fields})


# ----------------------------------------------------------------- type specifics


def test_pure_event_uses_randomized_response_curve() -> None:
    np.testing.assert_array_equal(
        PureDpEvent(epsilon=1.0).rdp(), randomized_response_rdp(epsilon=1.0, orders=ORDERS)
    )


def test_exponential_mechanism_uses_min_of_rr_and_bounded_range() -> None:
    for eps in (0.1, 1.0, 5.0, 30.0):
        expected = np.minimum(
            randomized_response_rdp(epsilon=eps, orders=ORDERS),
            bounded_range_rdp(epsilon=eps, orders=ORDERS),
        )
        np.testing.assert_array_equal(ExponentialMechanismEvent(epsilon=eps).rdp(), expected)
        assert np.all(
            ExponentialMechanismEvent(epsilon=eps).rdp() <= PureDpEvent(epsilon=eps).rdp()
        )


def test_steps_field_and_step_by_step_schedule_agree() -> None:
    one = PoissonSubsampledGaussianEvent(sampling_rate=0.02, noise_multiplier=0.9, steps=1)
    run = PoissonSubsampledGaussianEvent(sampling_rate=0.02, noise_multiplier=0.9, steps=40)
    np.testing.assert_allclose(run.rdp(), ComposedEvent(events=(one,) * 40).rdp(), rtol=1e-12)
    # a decaying noise schedule composes as the sum of its runs
    sched = ComposedEvent(
        events=tuple(
            PoissonSubsampledGaussianEvent(sampling_rate=0.02, noise_multiplier=s, steps=10)
            for s in (2.0, 1.5, 1.2)
        )
    )
    parts = sum(e.rdp() for e in sched.events)
    np.testing.assert_allclose(sched.rdp(), parts, rtol=1e-12)


def test_constructor_normalises_and_validates() -> None:
    e = PureDpEvent(epsilon=1)
    assert isinstance(e.epsilon, float)
    assert e == PureDpEvent(epsilon=1.0)
    assert e.to_json()["epsilon"] == 1.0
    assert ComposedEvent(events=[e]) == ComposedEvent(events=(e,))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ComposedEvent(events=(e, "x"))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SelfComposedEvent(event=e, count=0)
    with pytest.raises(ValueError):
        PoissonSubsampledGaussianEvent(sampling_rate=0.5, noise_multiplier=1.0, steps=0)
    assert PureDpEvent(epsilon=1.0) != ExponentialMechanismEvent(epsilon=1.0)


def test_events_are_immutable() -> None:
    e = PureDpEvent(epsilon=1.0)
    with pytest.raises(AttributeError):
        e.epsilon = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"type": "laplace", "version": 1, "epsilon": 1.0}, "unknown event type"),
        ({"type": "os.system", "version": 1}, "unknown event type"),
        ({"version": 1, "epsilon": 1.0}, "unknown event type"),
        ({"type": "pure_dp", "epsilon": 1.0}, "version"),
        ({"type": "pure_dp", "version": 2, "epsilon": 1.0}, "not supported"),
        ({"type": "pure_dp", "version": 0, "epsilon": 1.0}, "not supported"),
        ({"type": "pure_dp", "version": "1", "epsilon": 1.0}, "version"),
        ({"type": "pure_dp", "version": True, "epsilon": 1.0}, "version"),
        ({"type": "pure_dp", "version": 1}, "missing"),
        ({"type": "pure_dp", "version": 1, "epsilon": 1.0, "delta": 0.0}, "unknown field"),
    ],
)
def test_decoder_rejects_bad_envelopes(payload: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        event_from_json(payload)


def test_decoder_rejects_non_objects_and_deep_nesting() -> None:
    with pytest.raises(ValueError):
        event_from_json([1, 2])  # type: ignore[arg-type]
    deep: dict[str, Any] = {"type": "pure_dp", "version": 1, "epsilon": 0.1}
    for _ in range(MAX_NESTING_DEPTH + 1):
        deep = {"type": "self_composed", "version": 1, "event": deep, "count": 1}
    with pytest.raises(ValueError, match="nesting"):
        event_from_json(deep)


def test_curve_does_not_depend_on_grouping_or_order() -> None:
    a = PoissonSubsampledGaussianEvent(sampling_rate=0.013, noise_multiplier=0.93, steps=17)
    b = PureDpEvent(epsilon=0.37)
    c = ExponentialMechanismEvent(epsilon=1.1)
    flat = ComposedEvent(events=(a, b, c, b))
    regrouped = ComposedEvent(
        events=(ComposedEvent(events=(c, b)), SelfComposedEvent(event=b, count=1), a)
    )
    reordered = ComposedEvent(events=(b, SelfComposedEvent(event=b, count=1), c, a))
    np.testing.assert_array_equal(flat.rdp(), regrouped.rdp())
    np.testing.assert_array_equal(flat.rdp(), reordered.rdp())


def test_pmf_slack_curve_is_the_closed_form_bound() -> None:
    """D_α(P̂‖Q̂) ≤ D_α(P‖Q) + τ(2α−1)/(α−1) for P̂, Q̂ within e^{±τ} of P, Q.

    Checked on a worst case: P̂ = P scaled up by e^{τ} on one atom, Q̂ scaled down there
    (both renormalised), against the exact Rényi divergences of two-point laws."""
    tau = 0.01
    curve = PmfSlackEvent(tau=tau).rdp(ORDERS)
    assert np.allclose(curve, [tau * (2 * a - 1) / (a - 1) for a in ORDERS], rtol=0, atol=0)

    def renyi(p: np.ndarray, q: np.ndarray, a: float) -> float:
        return float(np.log(np.sum(p**a * q ** (1 - a))) / (a - 1))

    p, q = np.array([0.3, 0.7]), np.array([0.6, 0.4])
    for a, extra in zip(ORDERS, curve, strict=True):
        ph = np.array([p[0] * math.exp(tau), p[1] * math.exp(-tau)])
        qh = np.array([q[0] * math.exp(-tau), q[1] * math.exp(tau)])
        ph, qh = ph / ph.sum(), qh / qh.sum()
        # renormalising keeps each within e^{±2τ}; the bound at 2τ must hold
        assert renyi(ph, qh, a) <= renyi(p, q, a) + 2 * extra + 1e-12


def test_any_of_is_the_pointwise_maximum() -> None:
    small = PoissonSubsampledGaussianEvent(sampling_rate=0.01, noise_multiplier=2.0, steps=100)
    big = PoissonSubsampledGaussianEvent(sampling_rate=0.05, noise_multiplier=1.0, steps=50)
    pure = PureDpEvent(epsilon=0.2)
    e = AnyOfEvent(events=(small, big, pure))
    want = np.maximum(np.maximum(small.rdp(ORDERS), big.rdp(ORDERS)), pure.rdp(ORDERS))
    np.testing.assert_array_equal(e.rdp(ORDERS), want)
    assert AnyOfEvent(events=(pure, PureDpEvent(epsilon=0.5))).pure_epsilon() == 0.5
    assert e.pure_epsilon() is None
