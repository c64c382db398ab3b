"""The model card of a release."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.common import Guarantee


class CardPreprocessing(BaseModel):
    model_config = ConfigDict(extra="allow")

    description: str
    feature_names: list[str] = Field(description="Model input columns, in order.")
    public_schema: dict[str, Any]


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
    event: dict[str, Any] = Field(description="The DP event charged, as data.")


class ModelCard(BaseModel):
    """The model card of a release: the model, its preprocessing, the mechanism and the
    privacy guarantee (proven or nominal). Fields may be added in later card versions."""

    model_config = ConfigDict(extra="allow")

    card_version: int
    job_id: str
    run_token: str
    model: dict[str, Any]
    samples: int
    weights_layout: str
    output: str
    preprocessing: CardPreprocessing
    mechanism: dict[str, Any]
    privacy: CardPrivacy
    weights_sha256: str = Field(description="SHA-256 (hex) of the weights file.")
