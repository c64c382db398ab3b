"""The request bodies of a private evaluation: POST /v1/evaluations (issue 21) and the
``evaluate`` block of a training request (train then evaluate, one plan, one charge).
Both name the same field types below, so a bound cannot differ between the two doors."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.params import Delta, Epsilon, Probability
from service.schemas.common import ApiInput

EvaluationMetric = Literal["accuracy", "auc", "log_loss", "calibration_error", "confusion"]
"""The metrics of service/privacy/evaluation.py."""

EvaluationEpsilon = Annotated[
    Epsilon, Field(description="ε (nats) of the whole evaluation, split over the metrics.")
]
EvaluationDelta = Annotated[
    Delta, Field(description="δ of the whole evaluation (Gaussian noise needs δ > 0).")
]
EvaluationMetrics = Annotated[
    list[EvaluationMetric],
    Field(
        min_length=1,
        max_length=5,
        description="Distinct metrics; each gets an equal share of (ε, δ).",
    ),
]
EvaluationNoise = Annotated[
    Literal["laplace", "gaussian"],
    Field(
        description="Discrete Laplace (pure ε-DP) or rounded Gaussian noise, added in the worker."
    ),
]
EvaluationConfidence = Annotated[
    Probability,
    Field(description="Level of each metric's interval (sampling and DP noise together)."),
]
EvaluationSample = Annotated[
    int, Field(ge=0, le=99, description="Which released sample of the job to score.")
]


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
    epsilon: EvaluationEpsilon
    delta: EvaluationDelta = 0.0
    metrics: EvaluationMetrics = Field(default_factory=_default_metrics)
    noise: EvaluationNoise = "laplace"
    confidence: EvaluationConfidence = 0.95
    sample: EvaluationSample = 0


class TrainingEvaluation(ApiInput):
    """Evaluate the model this training job releases on its dataset's private holdout,
    as part of the same job: planned with the training, admitted with one ledger charge
    (their composition), released together (the card's ``evaluation``). The fields mean
    what they mean in an evaluation request (POST /v1/evaluations)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"epsilon": 0.5, "metrics": ["accuracy", "auc"]}]}
    )

    epsilon: EvaluationEpsilon
    delta: EvaluationDelta = 0.0
    metrics: EvaluationMetrics = Field(default_factory=_default_metrics)
    noise: EvaluationNoise = "laplace"
    confidence: EvaluationConfidence = 0.95
    sample: EvaluationSample = 0


class EvaluationMetricPlan(BaseModel):
    """One metric's public plan (service/privacy/evaluation.py ``MetricPlan``, every field
    written, null where it does not apply): its share of (ε, δ), its noise and the
    sensitivities that calibrate it. More keys may be added (never removed or changed in
    meaning)."""

    model_config = ConfigDict(extra="allow")

    metric: EvaluationMetric
    epsilon: float = Field(description="The metric's share of the evaluation's ε (nats).")
    delta: float = Field(description="The metric's share of the evaluation's δ.")
    noise: Literal["laplace", "gaussian"]
    sensitivity_l1: float = Field(description="L1 sensitivity of its integer statistic.")
    sensitivity_l2: float = Field(description="L2 sensitivity of its integer statistic.")
    scale: float = Field(
        description="The discrete Laplace b or the rounded Gaussian σ, per coordinate."
    )
    count_scale: float | None = Field(
        default=None, description="AUC only: the noise scale of its class counts."
    )
    count_epsilon: float | None = Field(
        default=None, description="AUC only: the class counts' part of the metric's ε."
    )
    count_delta: float | None = Field(
        default=None, description="AUC only: the class counts' part of the metric's δ."
    )
    count_sensitivity_l1: float | None = Field(
        default=None, description="AUC only: the class counts' L1 sensitivity."
    )
    count_sensitivity_l2: float | None = Field(
        default=None, description="AUC only: the class counts' L2 sensitivity."
    )


class EvaluationPublicPlan(BaseModel):
    """An evaluation's public plan (service/evaluations.py ``_public_plan``): the released
    sample it scores, the holdout's public size, the classes and each metric's share,
    sensitivity and noise scale. An evaluation job's mechanism and a train-then-evaluate
    plan's ``evaluation`` both state it. More keys may be added (never removed or changed
    in meaning)."""

    model_config = ConfigDict(extra="allow")

    sample: EvaluationSample
    holdout_rows: int = Field(description="The holdout's public size.")
    classes: int = Field(description="Classes of the target (public).")
    noise: Literal["laplace", "gaussian"]
    confidence: float = Field(description="Level of each metric's interval.")
    p_min: float = Field(
        description="The log loss clips predicted probabilities to [p_min, 1 − p_min]."
    )
    bins: int = Field(description="Bins of the calibration error.")
    neighbouring_relation: str
    metrics: list[EvaluationMetricPlan]


class PlanEvaluation(EvaluationPublicPlan):
    """A train-then-evaluate plan's ``evaluation`` (service/evaluations.py
    ``with_evaluation``): the evaluation's own (ε, δ), the training's, how they compose
    into the plan's, and the evaluation's public plan. More keys may be added (never
    removed or changed in meaning)."""

    epsilon: float = Field(description="ε (nats) of the evaluation alone.")
    delta: float = Field(description="δ of the evaluation alone.")
    training_epsilon: float = Field(description="ε (nats) of the training alone.")
    training_delta: float = Field(description="δ of the training alone.")
    composition: str = Field(description="How the two compose into the plan's charge, in words.")
    accountant: Literal["basic composition", "rdp"] = Field(
        description="The evaluation's accountant: basic composition (Laplace) or RDP (Gaussian)."
    )


class EvaluationMechanism(EvaluationPublicPlan):
    """An evaluation job's mechanism (method ``evaluation``, POST /v1/evaluations;
    service/evaluations.py ``plan_evaluation_job``): the evaluated job and the evaluation's
    public plan. Its (ε, δ) and accountant are the plan's own. More keys may be added
    (never removed or changed in meaning)."""

    evaluated_job: str = Field(description="The id of the training job whose release is scored.")
