"""Per-candidate privacy of the selection kinds that train candidates (architecture,
hyperparameters, PAFS feature selection); its own module so that both
:mod:`service.selection.plans` and :mod:`service.selection.features` use one model."""

from __future__ import annotations

from pydantic import Field

from service.params import Epsilon, InputModel, PositiveDelta, Probability

__all__ = ["SelectionBudget"]


class SelectionBudget(InputModel):
    """Per-candidate privacy: each training is (ε, δ)-DP-SGD, each score ε_fit-DP."""

    training_epsilon: Epsilon
    training_delta: PositiveDelta
    fitness_epsilon: Epsilon = 0.1
    validation_fraction: Probability = Field(default=0.2)
