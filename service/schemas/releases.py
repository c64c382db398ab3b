"""The model card of a release."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationInfo

from service.modelspec import ModelSpec
from service.schemas.common import Guarantee
from service.schemas.dpsgd import DpsgdMechanism
from service.schemas.evaluations import EvaluationMechanism
from service.schemas.events import DpEventJson
from service.schemas.expm import ExpmLangevinMechanism, ExpmMcmcMechanism
from service.schemas.expm_nf import ExpmNfMechanism
from service.schemas.jobs import MethodChoice
from service.schemas.selection import SelectionMechanism
from service.schemas.stored import Typed, mechanism_union, one_of


class CardPreprocessing(BaseModel):
    model_config = ConfigDict(extra="allow")

    description: str
    feature_names: list[str] = Field(description="Model input columns, in order.")
    public_schema: dict[str, Any]


class CardAudit(BaseModel):
    """The audit that let the job through its dataset's release gate (service/audit_gate.py):
    a one-run audit of the job's configuration whose lower bound was at most its claimed ε.
    Passing is not a proof."""

    model_config = ConfigDict(extra="forbid")

    id: str
    epsilon_lower_bound: float = Field(description="The audit's ε lower bound (nats).")
    ceiling: float = Field(description="The most ε the same test could show.")
    claimed_epsilon: float = Field(description="The ε the audited configuration claimed.")
    noise_multiplier: float | None = Field(description="σ of the audited run (≤ the job's).")
    finished_at: str | None = Field(description="When the audit finished (ISO 8601, UTC).")
    reading: str = Field(description="What the figure means and does not.")


class CardPrivacy(BaseModel):
    model_config = ConfigDict(extra="allow")

    epsilon: float = Field(description="ε of the whole job (all released models), nats.")
    delta: float
    units: str
    accountant: str
    guarantee: Guarantee = Field(
        description="proven (DP-SGD) or nominal (ExpM sampled through a normalizing flow)."
    )
    statement: str = Field(description="What the guarantee covers, in words.")
    neighbouring_relation: str | None = None
    public_values: dict[str, str] | None = Field(
        default=None, description="What the mechanism may depend on besides the private rows."
    )
    event: Annotated[dict[str, Any], Typed(DpEventJson)] = Field(
        description="The DP event charged, as data."
    )


# The card's mechanism is the plan's, with the method first (worker/release.py).
class DpsgdCardMechanism(DpsgdMechanism):
    """A DP-SGD release's mechanism; its card states the engine (``exact`` included)."""

    method: Literal["dpsgd"]


class ExpmLangevinCardMechanism(ExpmLangevinMechanism):
    """An ExpM release's mechanism, Langevin sampler (proven)."""

    method: Literal["expm"]


class ExpmMcmcCardMechanism(ExpmMcmcMechanism):
    """An ExpM release's mechanism, HMC sampler (asymptotic)."""

    method: Literal["expm"]


class ExpmNfCardMechanism(ExpmNfMechanism):
    """An ExpM+NF release's mechanism (nominal)."""

    method: Literal["expm_nf"]


class SelectionCardMechanism(SelectionMechanism):
    """A selection job's mechanism: the whole workflow's public schedule."""

    method: Literal["selection"]


class EvaluationCardMechanism(EvaluationMechanism):
    """An evaluation job's mechanism: the evaluated job and the evaluation's public plan."""

    method: Literal["evaluation"]


CARD_MECHANISMS: dict[str, TypeAdapter[Any]] = {
    "dpsgd": TypeAdapter(DpsgdCardMechanism),
    "expm": TypeAdapter(
        Annotated[ExpmLangevinCardMechanism | ExpmMcmcCardMechanism, Field(discriminator="sampler")]
    ),
    "expm_nf": TypeAdapter(ExpmNfCardMechanism),
    "selection": TypeAdapter(SelectionCardMechanism),
    "evaluation": TypeAdapter(EvaluationCardMechanism),
}
"""The type of a card's mechanism, by its ``method`` (for ``expm``, then its ``sampler``);
a method without an entry has an untyped mechanism."""


def _card_mechanism_type(value: Any, info: ValidationInfo) -> TypeAdapter[Any] | None:
    method = value.get("method") if isinstance(value, dict) else None
    return CARD_MECHANISMS.get(method) if isinstance(method, str) else None


_CARD_MECHANISM_DOC, _CARD_MECHANISM_EXTRA = mechanism_union(
    (
        DpsgdCardMechanism,
        ExpmLangevinCardMechanism,
        ExpmMcmcCardMechanism,
        ExpmNfCardMechanism,
        SelectionCardMechanism,
        EvaluationCardMechanism,
    ),
    typed=CARD_MECHANISMS,
)


class NoModel(BaseModel):
    """No model: a selection that released none (DP-CFS without a final model, K = 0)."""

    model_config = ConfigDict(extra="forbid")


class ModelCard(BaseModel):
    """The model card of a release: the model, its preprocessing, the mechanism and the
    privacy guarantee (proven or nominal). Fields may be added in later card versions."""

    model_config = ConfigDict(extra="allow")

    card_version: int
    job_id: str
    run_token: str
    model: Annotated[dict[str, Any], Typed(ModelSpec | NoModel)] = Field(
        description="The released model (a selection's: the selected one, or {} for none).",
        json_schema_extra=one_of,
    )
    samples: int
    weights_layout: str
    output: str
    preprocessing: CardPreprocessing
    mechanism: Annotated[dict[str, Any], Typed(_CARD_MECHANISM_DOC, pick=_card_mechanism_type)] = (
        Field(
            description=(
                "The mechanism's resolved parameters, by ``method`` (for expm, then ``sampler``)."
            ),
            json_schema_extra=_CARD_MECHANISM_EXTRA,
        )
    )
    privacy: CardPrivacy
    weights_sha256: str = Field(description="SHA-256 (hex) of the weights file.")
    method_choice: MethodChoice | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="Set when the job's request had method 'auto': the plan's record of it.",
    )
    audit: CardAudit | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="Set when the dataset's release gate admitted the job: the audit it used.",
    )
