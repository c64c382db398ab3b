"""Per-candidate privacy of the selection kinds that train candidates (architecture,
hyperparameters, PAFS feature selection); its own module so that both
:mod:`service.selection_plans` and :mod:`service.feature_selection` use one model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SelectionBudget"]


class SelectionBudget(BaseModel):
    """Per-candidate privacy: each training is (ε, δ)-DP-SGD, each score ε_fit-DP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    training_epsilon: float = Field(gt=0, le=100)
    training_delta: float = Field(gt=0, lt=1)
    fitness_epsilon: float = Field(default=0.1, gt=0, le=100)
    validation_fraction: float = Field(default=0.2, gt=0, lt=1)
