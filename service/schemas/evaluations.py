"""The request body of a private evaluation (POST /v1/evaluations, issue 21)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from service.params import Delta, Epsilon, Probability
from service.schemas.common import ApiInput

EvaluationMetric = Literal["accuracy", "auc", "log_loss", "calibration_error", "confusion"]
"""The metrics of service/privacy/evaluation.py."""


def _default_metrics() -> list[EvaluationMetric]:
    return ["accuracy", "log_loss"]


class EvaluationRequest(ApiInput):
    """Score a released training job's model on its dataset's private holdout. ε in nats;
    δ a probability (0 is allowed with Laplace noise)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "job_id": "8a1f…",
                    "epsilon": 0.5,
                    "delta": 0,
                    "metrics": ["accuracy", "log_loss"],
                    "noise": "laplace",
                    "confidence": 0.95,
                }
            ]
        }
    )

    job_id: str = Field(
        min_length=1, max_length=36, description="A released training job of yours."
    )
    epsilon: Epsilon = Field(
        description="ε (nats) of the whole evaluation, split over the metrics."
    )
    delta: Delta = Field(
        default=0.0, description="δ of the whole evaluation (Gaussian noise needs δ > 0)."
    )
    metrics: list[EvaluationMetric] = Field(
        default_factory=_default_metrics,
        min_length=1,
        max_length=5,
        description="Distinct metrics; each gets an equal share of (ε, δ).",
    )
    noise: Literal["laplace", "gaussian"] = Field(
        default="laplace",
        description="Discrete Laplace (pure ε-DP) or rounded Gaussian noise, added in the worker.",
    )
    confidence: Probability = Field(
        default=0.95,
        description="Level of each metric's interval (sampling and DP noise together).",
    )
    sample: int = Field(
        default=0, ge=0, le=99, description="Which released sample of the job to score."
    )
