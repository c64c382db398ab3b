"""The mechanism parameters of a selection plan (``PrivacyPlan.mechanism`` of a
``selection`` job), as service/selection/api_bodies.py writes them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.dpsgd import DpsgdMechanism
from service.schemas.events import RunsJson
from service.schemas.expm_nf import ExpmNfMechanism

__all__ = ["SelectionMechanism", "SelectionStage"]


class SelectionStage(BaseModel):
    """One stage of a selection workflow and its share of the budget: the candidates'
    ``training``, their ``fitness`` scores, DP-CFS's noisy ``statistics`` (with the
    histograms' public noise) or the ``final`` model's training."""

    model_config = ConfigDict(extra="allow")

    epsilon: float = Field(description="ε (nats) of one use of the stage's mechanism.")
    delta: float
    mechanism: str = Field(description="dpsgd, expm_nf, noisy count, or the noise, in words.")
    histograms: int | None = None
    noise_multiplier: float | None = None
    cell_noise_std: float | None = None


class SelectionMechanism(BaseModel):
    """The public schedule of a selection job: its kind, the number of trainings (null
    when random: then ``runs`` is the public law of K, never K itself), the public split
    counts, the stages and the DP-SGD mechanism of each privacy key's largest candidate
    (``expm_nf``: the ExpM+NF candidates' mechanism, when they are ExpM+NF). More keys may
    be added (never removed or changed in meaning)."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["architecture", "hyperparameters", "features"]
    trainings: int | None
    runs: RunsJson | None
    n_train_public: int
    n_val_public: int
    validation_fraction: float | None
    stages: dict[str, SelectionStage]
    candidates: list[DpsgdMechanism]
    expm_nf: ExpmNfMechanism | None = None
    cost_models: list[dict[str, Any]] | None = Field(
        default=None,
        description=(
            "An architecture search over CNNs only: the space's extreme models (every layer "
            "at the most channels, one per depth, kernel and pooling); each candidate's "
            "DP-SGD time and memory is at most one of theirs, and the estimate takes the "
            "largest."
        ),
    )
