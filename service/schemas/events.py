"""The JSON form of a DP event (``PrivacyPlan.event``, ``CardPrivacy.event``), as typed
models: one model per event type of :data:`service.privacy.events.EVENT_TYPES`, a union
discriminated on ``"type"``, recursive where an event holds events.

These models document and check the *shape* that ``DpEvent.to_json`` writes; the meaning of
an event, its range checks and its RDP curve stay with the decoder
(:func:`service.privacy.events.event_from_json`), which is what the ledger and the worker
use. The compatibility contract is the decoder's: an event's meaning never changes, a later
version only adds optional fields, so ``version`` is bounded by the class's ``VERSION``.
Unknown fields are refused here as the decoder refuses them.
Units: ε and τ in nats; sampling rates are probabilities.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.privacy.events import EVENT_TYPES

__all__ = [
    "AnyOfEventJson",
    "ComposedEventJson",
    "DpEventJson",
    "ExponentialMechanismEventJson",
    "PmfSlackEventJson",
    "PoissonRunsJson",
    "PoissonSubsampledGaussianEventJson",
    "PureDpEventJson",
    "RandomStoppingEventJson",
    "RunsJson",
    "SelfComposedEventJson",
    "TruncatedNegativeBinomialRunsJson",
]


def _version(type_name: str) -> Any:
    newest = EVENT_TYPES[type_name].VERSION
    return Field(
        ge=1,
        le=newest,
        description=f"The event type's format version (this service reads 1 to {newest}).",
    )


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PureDpEventJson(_Event):
    """Any ε-DP mechanism, one release (``pure_dp``)."""

    type: Literal["pure_dp"]
    version: int = _version("pure_dp")
    epsilon: float = Field(ge=0, description="ε (nats).")


class ExponentialMechanismEventJson(_Event):
    """One exponential-mechanism release, ε-DP and ε-bounded-range
    (``exponential_mechanism``)."""

    type: Literal["exponential_mechanism"]
    version: int = _version("exponential_mechanism")
    epsilon: float = Field(ge=0, description="ε (nats).")


class PoissonSubsampledGaussianEventJson(_Event):
    """``steps`` steps of the Poisson-subsampled Gaussian mechanism (DP-SGD; q = 1 is the
    full-batch Gaussian mechanism) (``poisson_subsampled_gaussian``)."""

    type: Literal["poisson_subsampled_gaussian"]
    version: int = _version("poisson_subsampled_gaussian")
    sampling_rate: float = Field(gt=0, le=1, description="q, each row's inclusion probability.")
    noise_multiplier: float = Field(gt=0, description="σ, noise std relative to the clip norm.")
    steps: int = Field(ge=1)


class PmfSlackEventJson(_Event):
    """The floating-point noise sampler's pointwise e^{±τ} gap, charged (``pmf_slack``)."""

    type: Literal["pmf_slack"]
    version: int = _version("pmf_slack")
    tau: float = Field(ge=0, description="τ (nats).")


class ComposedEventJson(_Event):
    """The events run one after another (``composed``)."""

    type: Literal["composed"]
    version: int = _version("composed")
    events: list[DpEventJson] = Field(min_length=1)


class SelfComposedEventJson(_Event):
    """``count`` independent runs of ``event`` (``self_composed``)."""

    type: Literal["self_composed"]
    version: int = _version("self_composed")
    event: DpEventJson
    count: int = Field(ge=1)


class AnyOfEventJson(_Event):
    """One run of one of ``events``, chosen from public values and earlier releases
    (``any_of``)."""

    type: Literal["any_of"]
    version: int = _version("any_of")
    events: list[DpEventJson] = Field(min_length=1)


class TruncatedNegativeBinomialRunsJson(BaseModel):
    """K ~ truncated negative binomial(η, γ) (Papernot & Steinke 2022)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["truncated_negative_binomial"]
    eta: float
    gamma: float
    max_runs: int | None = Field(default=None, description="A cap on K, where given.")


class PoissonRunsJson(BaseModel):
    """K ~ Poisson(μ) (Papernot & Steinke 2022)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["poisson"]
    mu: float
    max_runs: int | None = Field(default=None, description="A cap on K, where given.")


RunsJson = Annotated[
    TruncatedNegativeBinomialRunsJson | PoissonRunsJson, Field(discriminator="kind")
]
"""The public law of the number of runs K of random stopping (``RunsDistribution.to_json``)."""


class RandomStoppingEventJson(_Event):
    """Best of K runs of ``event``, K drawn from the public law ``runs``
    (``random_stopping``)."""

    type: Literal["random_stopping"]
    version: int = _version("random_stopping")
    event: DpEventJson
    runs: RunsJson


DpEventJson = Annotated[
    PureDpEventJson
    | ExponentialMechanismEventJson
    | PoissonSubsampledGaussianEventJson
    | PmfSlackEventJson
    | ComposedEventJson
    | SelfComposedEventJson
    | AnyOfEventJson
    | RandomStoppingEventJson,
    Field(discriminator="type"),
]
"""A DP event as ``DpEvent.to_json`` writes it, discriminated on ``"type"``."""

for _model in (ComposedEventJson, SelfComposedEventJson, AnyOfEventJson, RandomStoppingEventJson):
    _model.model_rebuild()
