"""DP events: immutable, versioned descriptions of what a job does to the data.

Compatibility contract (after dp_accounting's ``dp_event`` module): an event
type's meaning never changes. A stored event is decoded with the class registered
under its ``"type"`` in :data:`EVENT_TYPES`, never by importing a module named in
the data. A later version of a type may only add optional fields, so every
version ≤ the class's ``VERSION`` stays decodable with its original meaning; the
encoder always writes the current version. Unknown types, unknown or missing
fields, wrong value types and out-of-range values are all ``ValueError``.

Units: ε in nats; sampling rates and δ are probabilities; RDP values in nats.

Every event answers three questions, all pure functions of its fields:

* ``rdp(orders)`` — an upper bound on its Rényi-DP curve (add/remove-one
  neighbours), one value per order; composition adds curves, so a k-fold
  composition is exactly k times the curve (contract-tested for every type);
* ``is_pure`` — whether it is ε-DP for a finite ε (usable on a pure dataset);
* ``pure_epsilon()`` — that ε (basic composition: the sum), or None.

Why one module (over 500 lines): the event types and their decoder are one compatibility
contract (:data:`EVENT_TYPES` maps every stored ``"type"`` to its class), so every type
that a stored plan may name, its encoder and the decoder that must accept it stay together.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Final

import numpy as np

from service.privacy.orders import ORDERS
from service.privacy.rdp import (
    bounded_range_rdp,
    randomized_response_rdp,
    subsampled_gaussian_rdp,
    validate_orders,
)
from service.privacy.tuning import (
    PoissonRuns,
    RunsDistribution,
    TruncatedNegativeBinomialRuns,
    random_stopping_rdp,
    runs_distribution_from_json,
)

__all__ = [
    "EVENT_TYPES",
    "AnyOfEvent",
    "ComposedEvent",
    "DpEvent",
    "ExponentialMechanismEvent",
    "PmfSlackEvent",
    "PoissonSubsampledGaussianEvent",
    "PureDpEvent",
    "RandomStoppingEvent",
    "SelfComposedEvent",
    "event_from_json",
    "leaf_counts",
]

MAX_NESTING_DEPTH: Final[int] = 16
"""Deepest event tree accepted from JSON (guards the decoder against hostile input)."""


# ------------------------------------------------------------------ value checks


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    out = float(value) + 0.0  # + 0.0 turns -0.0 into 0.0: one canonical encoding
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def _nonneg_epsilon(value: object) -> float:
    eps = _real("epsilon", value)
    if eps < 0.0:
        raise ValueError(f"epsilon must be >= 0, got {value!r}")
    return eps


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return int(value)


# ------------------------------------------------------------------------ events


class DpEvent(ABC):
    """Base class of all events. Subclasses are frozen dataclasses registered in
    :data:`EVENT_TYPES` under their ``TYPE``."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int]

    def rdp(self, orders: Sequence[float] = ORDERS) -> np.ndarray:
        """Upper bound on the RDP curve (nats), one value per order (each > 1).

        Computed as the correctly rounded sum (math.fsum) of count × curve(leaf)
        over the leaves of the event tree, so regrouping or reordering the same
        leaves never changes a single bit of the result (plans are re-derived and
        compared by the worker).
        """
        alphas = validate_orders(orders)
        parts = [
            [count * v for v in leaf._leaf_curve(alphas)]
            for leaf, count in leaf_counts(self).items()
        ]
        return np.array([math.fsum(column) for column in zip(*parts, strict=True)])

    @property
    @abstractmethod
    def is_pure(self) -> bool:
        """True if the event is ε-DP for the finite ε of :meth:`pure_epsilon`."""

    @abstractmethod
    def pure_epsilon(self) -> float | None:
        """ε (nats) of the pure guarantee under basic composition, or None if not pure."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable dict with ``"type"`` and ``"version"`` keys."""

    @classmethod
    @abstractmethod
    def _from_fields(cls, d: Mapping[str, Any], depth: int) -> DpEvent: ...

    def _leaf_curve(self, orders: tuple[float, ...]) -> tuple[float, ...]:
        """Curve of a single leaf event (composites never get here)."""
        raise TypeError(f"{type(self).__name__} is not a leaf event")


@dataclass(frozen=True)
class PureDpEvent(DpEvent):
    """Any ε-DP mechanism (one release). RDP: the randomized-response curve, valid
    for every ε-DP mechanism (see :func:`~service.privacy.rdp.randomized_response_rdp`)."""

    epsilon: float

    TYPE: ClassVar[str] = "pure_dp"
    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _nonneg_epsilon(self.epsilon))

    @property
    def is_pure(self) -> bool:
        return True

    def pure_epsilon(self) -> float | None:
        return self.epsilon

    def _leaf_curve(self, orders: tuple[float, ...]) -> tuple[float, ...]:
        return _pure_curve(self.epsilon, orders)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "version": self.VERSION, "epsilon": self.epsilon}

    @classmethod
    def _from_fields(cls, d: Mapping[str, Any], depth: int) -> DpEvent:
        _expect_keys(d, {"epsilon"})
        return cls(epsilon=d["epsilon"])


@lru_cache(maxsize=1024)
def _pure_curve(epsilon: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    """A :class:`PureDpEvent`'s curve, per exact (ε, orders): a pure function, so a hit is
    the tuple a miss computes (issue 26: a selection's score counts keep their ε while the
    per-training ε's search plans again and again, two curves per plan)."""
    return tuple(randomized_response_rdp(epsilon=epsilon, orders=orders).tolist())


@dataclass(frozen=True)
class ExponentialMechanismEvent(PureDpEvent):
    """One exponential-mechanism release (an ε-DP mechanism, hence a PureDpEvent, whose
    curve is sharper), calibrated to ε-DP by the standard McSherry–Talwar rule
    (density ∝ exp(ε u / (2Δu)), or ∝ exp(ε u / Δu) for a utility that is monotone
    in the data set), utility sensitivity folded into ε.

    Such a mechanism is ε-bounded-range, so its RDP is at most
    min(RR curve, α ε²/8) (Cesar & Rogers 2021; proof in
    :func:`~service.privacy.rdp.bounded_range_rdp`). The RR curve alone would be
    valid for any ε-DP mechanism; the α ε²/8 term is what this event type buys,
    and is only claimed for samplers calibrated as above. For ExpM+NF releases
    the ε is nominal (the flow only approximates the ExpM density).
    """

    TYPE: ClassVar[str] = "exponential_mechanism"
    VERSION: ClassVar[int] = 1

    def _leaf_curve(self, orders: tuple[float, ...]) -> tuple[float, ...]:
        rr = randomized_response_rdp(epsilon=self.epsilon, orders=orders)
        br = bounded_range_rdp(epsilon=self.epsilon, orders=orders)
        return tuple(np.minimum(rr, br).tolist())


@dataclass(frozen=True)
class PoissonSubsampledGaussianEvent(DpEvent):
    """``steps`` steps of DP-SGD: each record is included independently with
    probability ``sampling_rate`` (Poisson sampling), per-example gradients are
    clipped to L2 norm C and N(0, (σC)²I) noise is added, σ = ``noise_multiplier``.
    RDP: Mironov, Talwar & Zhang 2019 (see
    :func:`~service.privacy.rdp.subsampled_gaussian_rdp`), times ``steps``."""

    sampling_rate: float
    noise_multiplier: float
    steps: int

    TYPE: ClassVar[str] = "poisson_subsampled_gaussian"
    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        q = _real("sampling_rate", self.sampling_rate)
        if not 0.0 < q <= 1.0:
            raise ValueError(f"sampling_rate must be in (0, 1], got {self.sampling_rate!r}")
        sigma = _real("noise_multiplier", self.noise_multiplier)
        if sigma <= 0.0:
            raise ValueError(f"noise_multiplier must be > 0, got {self.noise_multiplier!r}")
        object.__setattr__(self, "sampling_rate", q)
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "steps", _positive_int("steps", self.steps))

    @property
    def is_pure(self) -> bool:
        return False

    def pure_epsilon(self) -> float | None:
        return None

    def _leaf_curve(self, orders: tuple[float, ...]) -> tuple[float, ...]:
        # One step; the step count is applied as a multiplicity in leaf_counts.
        one = subsampled_gaussian_rdp(
            sampling_rate=self.sampling_rate,
            noise_multiplier=self.noise_multiplier,
            orders=orders,
        )
        return tuple(one.tolist())

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "version": self.VERSION,
            "sampling_rate": self.sampling_rate,
            "noise_multiplier": self.noise_multiplier,
            "steps": self.steps,
        }

    @classmethod
    def _from_fields(cls, d: Mapping[str, Any], depth: int) -> DpEvent:
        _expect_keys(d, {"sampling_rate", "noise_multiplier", "steps"})
        return cls(
            sampling_rate=d["sampling_rate"],
            noise_multiplier=d["noise_multiplier"],
            steps=d["steps"],
        )


@dataclass(frozen=True)
class PmfSlackEvent(DpEvent):
    """A correction, not a mechanism: the job's output law is within a factor e^{±τ}
    (pointwise, on every output) of the law of the mechanism the rest of its event tree
    describes; ``tau`` = τ (nats).

    Where it comes from: noise drawn in floating point (worker/noise.py) has every pmf
    value within a relative error η of the exact law; a d-dimensional draw is then within
    e^{±d·(−log(1−η))}, and a job of T such draws within e^{±T·d·(−log(1−η))} = e^{±τ}.
    Mixtures (Poisson subsampling) keep the same factor, since each component does.

    RDP: if P̂ ∈ [e^{−τ}P, e^{τ}P] and Q̂ ∈ [e^{−τ}Q, e^{τ}Q] pointwise, then for α > 1
    E_Q̂[(P̂/Q̂)^α] = Σ P̂^α Q̂^{1−α} ≤ e^{τα} e^{τ(α−1)} Σ P^α Q^{1−α}, so
    D_α(P̂ ‖ Q̂) ≤ D_α(P ‖ Q) + τ(2α − 1)/(α − 1): the curve of this leaf, added to the
    rest of the tree by composition. It is linear in τ, so k copies are k charges.
    """

    tau: float

    TYPE: ClassVar[str] = "pmf_slack"
    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        tau = _real("tau", self.tau)
        if tau < 0.0:
            raise ValueError(f"tau must be >= 0, got {self.tau!r}")
        object.__setattr__(self, "tau", tau)

    @property
    def is_pure(self) -> bool:
        return False

    def pure_epsilon(self) -> float | None:
        return None

    def _leaf_curve(self, orders: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(self.tau * (2.0 * a - 1.0) / (a - 1.0) for a in orders)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "version": self.VERSION, "tau": self.tau}

    @classmethod
    def _from_fields(cls, d: Mapping[str, Any], depth: int) -> DpEvent:
        _expect_keys(d, {"tau"})
        return cls(tau=d["tau"])


@dataclass(frozen=True)
class _EventList(DpEvent):
    """An event made of a non-empty list of events (stored as a tuple), JSON
    ``{"events": [...]}``; pure iff every member is. Not registered itself."""

    events: tuple[DpEvent, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.events, list | tuple):
            raise ValueError(f"events must be a tuple of DpEvent, got {self.events!r}")
        events = tuple(self.events)
        if not events:
            raise ValueError(f"a {type(self).__name__} needs at least one event")
        for e in events:
            if not isinstance(e, DpEvent):
                raise ValueError(f"events must be DpEvent instances, got {e!r}")
        object.__setattr__(self, "events", events)

    @property
    def is_pure(self) -> bool:
        return all(e.is_pure for e in self.events)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "version": self.VERSION,
            "events": [e.to_json() for e in self.events],
        }

    @classmethod
    def _from_fields(cls, d: Mapping[str, Any], depth: int) -> DpEvent:
        _expect_keys(d, {"events"})
        raw = d["events"]
        if not isinstance(raw, list | tuple):
            raise ValueError(f"'events' must be a list, got {type(raw).__name__}")
        return cls(events=tuple(_decode(e, depth + 1) for e in raw))


@dataclass(frozen=True)
class ComposedEvent(_EventList):
    """A heterogeneous sequence of events run one after another (e.g. a decaying
    noise schedule as a list of PoissonSubsampledGaussianEvent runs). A list given
    for ``events`` is stored as a tuple. RDP: the sum (Mironov 2017, Prop. 1)."""

    TYPE: ClassVar[str] = "composed"
    VERSION: ClassVar[int] = 1

    def pure_epsilon(self) -> float | None:
        parts = [e.pure_epsilon() for e in self.events]
        if any(p is None for p in parts):
            return None
        # Basic composition (Dwork et al. 2006): ε adds up. fsum: correctly rounded.
        return math.fsum(p for p in parts if p is not None)


@dataclass(frozen=True)
class SelfComposedEvent(DpEvent):
    """``count`` independent runs of ``event`` (k releases). RDP: count × curve."""

    event: DpEvent
    count: int

    TYPE: ClassVar[str] = "self_composed"
    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if not isinstance(self.event, DpEvent):
            raise ValueError(f"event must be a DpEvent, got {self.event!r}")
        object.__setattr__(self, "count", _positive_int("count", self.count))

    @property
    def is_pure(self) -> bool:
        return self.event.is_pure

    def pure_epsilon(self) -> float | None:
        inner = self.event.pure_epsilon()
        return None if inner is None else self.count * inner

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "version": self.VERSION,
            "event": self.event.to_json(),
            "count": self.count,
        }

    @classmethod
    def _from_fields(cls, d: Mapping[str, Any], depth: int) -> DpEvent:
        _expect_keys(d, {"event", "count"})
        return cls(event=_decode(d["event"], depth + 1), count=d["count"])


@dataclass(frozen=True)
class AnyOfEvent(_EventList):
    """One run of *one* of ``events``, whichever is chosen, by a rule that depends only on
    public values and on earlier released outputs (a search picking the next candidate's
    batch size, or a random draw independent of the data).

    RDP: the pointwise maximum of the curves. At a fixed order α each possible choice is
    (α, max_i ρ_i(α))-RDP, and adaptive composition of RDP mechanisms (Mironov 2017,
    Prop. 1) only needs that per-step bound; for a data-independent random choice the law
    is a mixture with common weights, and D_α is jointly quasi-convex (van Erven &
    Harremoës 2014, Thm. 13), so the mixture is within the maximum too. Pure iff every
    member is pure, with the maximum ε. One leaf: k copies are k times its curve.
    """

    TYPE: ClassVar[str] = "any_of"
    VERSION: ClassVar[int] = 1

    def pure_epsilon(self) -> float | None:
        parts = [e.pure_epsilon() for e in self.events]
        return None if any(p is None for p in parts) else max(p for p in parts if p is not None)

    def _leaf_curve(self, orders: tuple[float, ...]) -> tuple[float, ...]:
        curves = np.array([e.rdp(orders) for e in self.events])
        return tuple(curves.max(axis=0).tolist())


@dataclass(frozen=True)
class RandomStoppingEvent(DpEvent):
    """Best of K independent runs of ``event``, K drawn server-side from the public
    ``runs`` distribution, only the best run released (hyperparameter tuning by random
    search). RDP: Papernot & Steinke 2022, Theorems 2 and 6 (formulas, citations and
    the pure-DP case in :mod:`service.privacy.tuning`), the free order λ̂ ranging over
    the fixed grid ORDERS so the curve at an order never depends on which other orders
    are asked for; a law capped at ``max_runs`` uses PS22's generic Lemma 7 instead. Pure
    iff the runs are pure and K is uncapped truncated negative binomial: (2 + η)·ε (Liu &
    Talwar 2019 for η = 1: 3ε). One leaf: k copies are k charges
    (k separate tuning jobs)."""

    event: DpEvent
    runs: RunsDistribution

    TYPE: ClassVar[str] = "random_stopping"
    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if not isinstance(self.event, DpEvent):
            raise ValueError(f"event must be a DpEvent, got {self.event!r}")
        if not isinstance(self.runs, TruncatedNegativeBinomialRuns | PoissonRuns):
            raise ValueError(f"runs must be a runs distribution, got {self.runs!r}")

    def _pure_law(self) -> bool:
        return isinstance(self.runs, TruncatedNegativeBinomialRuns) and self.runs.max_runs is None

    @property
    def is_pure(self) -> bool:
        return self.event.is_pure and self._pure_law()

    def pure_epsilon(self) -> float | None:
        inner = self.event.pure_epsilon()
        if inner is None or not self._pure_law():
            return None
        assert isinstance(self.runs, TruncatedNegativeBinomialRuns)
        return (2.0 + self.runs.eta) * inner

    def _leaf_curve(self, orders: tuple[float, ...]) -> tuple[float, ...]:
        curve = random_stopping_rdp(
            dist=self.runs,
            base_rdp=self.event.rdp(orders),
            orders=orders,
            hat_rdp=self.event.rdp(ORDERS),
            hat_orders=ORDERS,
            base_pure_epsilon=self.event.pure_epsilon(),
        )
        pure = self.pure_epsilon()
        if pure is not None:
            curve = np.minimum(curve, randomized_response_rdp(epsilon=pure, orders=orders))
        return tuple(curve.tolist())

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "version": self.VERSION,
            "event": self.event.to_json(),
            "runs": self.runs.to_json(),
        }

    @classmethod
    def _from_fields(cls, d: Mapping[str, Any], depth: int) -> DpEvent:
        _expect_keys(d, {"event", "runs"})
        return cls(
            event=_decode(d["event"], depth + 1), runs=runs_distribution_from_json(d["runs"])
        )


# ---------------------------------------------------------------------- registry

EVENT_TYPES: Final[Mapping[str, type[DpEvent]]] = {
    cls.TYPE: cls
    for cls in (
        PureDpEvent,
        ExponentialMechanismEvent,
        PoissonSubsampledGaussianEvent,
        PmfSlackEvent,
        ComposedEvent,
        SelfComposedEvent,
        RandomStoppingEvent,
        AnyOfEvent,
    )
}
"""The explicit ``{type name: class}`` registry used to decode events."""


def _expect_keys(d: Mapping[str, Any], fields: set[str]) -> None:
    keys = set(d) - {"type", "version"}
    missing = fields - keys
    extra = keys - fields
    if missing:
        raise ValueError(f"event {d.get('type')!r} is missing field(s) {sorted(missing)}")
    if extra:
        raise ValueError(f"event {d.get('type')!r} has unknown field(s) {sorted(extra)}")


def _decode(d: object, depth: int) -> DpEvent:
    if depth > MAX_NESTING_DEPTH:
        raise ValueError(f"event nesting deeper than {MAX_NESTING_DEPTH}")
    if not isinstance(d, Mapping):
        raise ValueError(f"an event must be a JSON object, got {type(d).__name__}")
    type_name = d.get("type")
    if not isinstance(type_name, str) or type_name not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type_name!r}; known types: {sorted(EVENT_TYPES)}")
    cls = EVENT_TYPES[type_name]
    version = d.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"event {type_name!r} needs an integer 'version', got {version!r}")
    if not 1 <= version <= cls.VERSION:
        raise ValueError(
            f"event {type_name!r} version {version} is not supported "
            f"(this code understands versions 1..{cls.VERSION})"
        )
    return cls._from_fields(d, depth)


def event_from_json(d: Mapping[str, Any]) -> DpEvent:
    """Decode and validate an event produced by ``to_json`` (possibly after a JSON
    round trip). Raises ValueError with a clear message on any problem."""
    return _decode(d, 0)


# ------------------------------------------------------------- curve machinery


def leaf_counts(event: DpEvent) -> Counter[DpEvent]:
    """Multiset of single-step leaves of an event tree with their multiplicities.

    A PoissonSubsampledGaussianEvent with ``steps`` = s counts as s copies of its
    one-step version, so ``(q, σ, s)`` and ``s × (q, σ, 1)`` give the same curve.
    """
    counts: Counter[DpEvent] = Counter()
    stack: list[tuple[DpEvent, int]] = [(event, 1)]
    while stack:
        e, mult = stack.pop()
        if isinstance(e, ComposedEvent):
            stack.extend((child, mult) for child in e.events)
        elif isinstance(e, SelfComposedEvent):
            stack.append((e.event, mult * e.count))
        elif isinstance(e, PoissonSubsampledGaussianEvent):
            one = PoissonSubsampledGaussianEvent(
                sampling_rate=e.sampling_rate, noise_multiplier=e.noise_multiplier, steps=1
            )
            counts[one] += mult * e.steps
        else:
            counts[e] += mult
    return counts
