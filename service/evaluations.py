"""Private evaluation jobs (issue 21): a request to score a released model on its
dataset's private holdout becomes a job (method ``evaluation``) whose privacy plan is a
pure function of the request and public values, charged by the same admission as any job.

The statistics, sensitivities, budget split and intervals are service/privacy/evaluation.py
(its module docstring gives the neighbouring relation: replace one holdout row, holdout
size public; worker/registration.py ``register_dataset`` argues why the ledger's
add/remove-one relation on the whole dataset gives exactly that on the holdout). The
worker computes and noises the statistics (worker/mechanisms/evaluation.py).

The plan's event is the composition the evaluation charges, one leaf per metric:

* Laplace noise: each metric's integer statistic plus discrete Laplace noise with scale
  Δ₁/(ε_m − 2τ_m) is ε_m-DP for the metric's share ε_m, the sampler's pmf gap (τ_m over
  its coordinates, service/privacy/sampling.py ``noise_slack``) included (Ghosh,
  Roughgarden & Sundararajan 2009): a :class:`PureDpEvent` (ε_m). Their composition is
  pure, Σ ε_m = ε (basic composition, Dwork & Roth 2014 Thm 3.16), so it is admitted on
  pure datasets too.
* Gaussian noise: the rounded Gaussian ⌊σZ + ½⌋ added to an integer statistic of L2
  sensitivity Δ₂ is a post-processing of the Gaussian mechanism with noise multiplier
  σ/Δ₂, whose RDP is α/(2(σ/Δ₂)²) (Mironov 2017, Prop. 7): a
  :class:`PoissonSubsampledGaussianEvent` with sampling rate 1 and one step, composed
  with the sampler's :class:`PmfSlackEvent` over the metric's coordinates. The ledger
  charges that curve; the plan's stated (ε, δ) is the PLD calibration's
  (service/privacy/evaluation.py ``gaussian_scale``).

AUC (binary and macro one-vs-rest) is two leaves, each charged as above: its integer
statistic 2U (or the vector of each class's 2U_k) with sensitivity 2(n − 1) (6(n − 1) in
L1, 2√3(n − 1) in L2 for K ≥ 3), and the class counts (sensitivity 1; K ≥ 3: L1 2, L2
√2); the AUC is post-processing (service/privacy/evaluation.py ``auc_sensitivity``). It
replaced a propose-test-release mechanism that had no Rényi-DP curve and was refused.

Train then evaluate: a training request (POST /v1/jobs) may carry an ``evaluate`` block
(:class:`~service.schemas.evaluations.TrainingEvaluation`). Its plan
(:func:`with_evaluation`) is the training's plan with the evaluation of the released
model composed in: one event, the training's and the evaluation's (as above) side by side,
charged once at admission (:data:`COMPOSITION_RULE`). The worker trains, scores the model
it is about to release on the holdout and releases both; the card's ``evaluation`` holds
the noisy results and the card's ``evaluations`` lists them (:func:`evaluations_of`).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Final

from pydantic import TypeAdapter
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.datasets.kinds import parse_dataset_schema
from service.ledger.tables import Job, JobStatus, Release
from service.methods.common import PlanError
from service.modelspec import ModelSpec
from service.privacy.evaluation import EvaluationPlan, MetricPlan, plan_evaluation
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
    event_from_json,
)
from service.privacy.orders import ORDERS
from service.privacy.sampling import noise_slack
from service.schemas import JobRequest, PrivacyPlan
from service.schemas.common import EVALUATION_METHOD, TRAINING_METHODS
from service.schemas.evaluations import EvaluationRequest

__all__ = [
    "COMPOSITION_RULE",
    "REFUSED_METRICS",
    "EvaluationRefused",
    "evaluation_job_request",
    "evaluation_plan",
    "evaluations_of",
    "plan_evaluation_job",
    "trained_evaluation_plan",
    "training_part",
    "with_evaluation",
]

REFUSED_METRICS: Final[dict[str, str]] = {}
"""Metrics that service/privacy/evaluation.py computes but the ledger cannot charge (none
since AUC is charged as two fixed-sensitivity releases)."""

HOLDOUT_RELATION: Final[str] = (
    "replace one row of the holdout, whose size is public; it follows from the ledger's "
    "add/remove-one relation on the whole dataset (worker/registration.py)"
)


class EvaluationRefused(Exception):
    """An evaluation request that cannot be planned: ``status`` (404, 409, 422) and a
    problem ``kind`` for the API, and a message for the analyst."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def evaluation_job_request(
    body: EvaluationRequest,
    *,
    evaluated_request: dict[str, Any],
    evaluated_model: dict[str, Any],
    evaluated_status: str,
    evaluated_samples: int,
    dataset_name: str,
    holdout_rows: int | None,
) -> JobRequest:
    """The stored job request of an evaluation of a job the caller owns (the router checks
    ownership): its dataset and model are the evaluated job's (``evaluated_model``: its
    plan's model, fitted to the target's classes); ``evaluation`` holds the
    evaluated job, the metrics, noise, confidence and sample. Refuses (409) a job that is
    not released, (422) a job that is not a training job, a sample it did not release, a
    dataset without a holdout, and a metric the ledger cannot charge."""
    if evaluated_status != "released":
        raise EvaluationRefused(
            409,
            "release-not-ready",
            f"job {body.job_id} is {evaluated_status}: only a released job can be evaluated",
        )
    trained = JobRequest.model_validate(evaluated_request)
    if trained.method not in TRAINING_METHODS:
        raise EvaluationRefused(
            422,
            "invalid-plan",
            f"job {body.job_id} is a {trained.method} job: evaluations score training "
            f"jobs ({', '.join(TRAINING_METHODS)})",
        )
    if body.sample >= evaluated_samples:
        raise EvaluationRefused(
            422,
            "invalid-plan",
            f"job {body.job_id} released {evaluated_samples} sample(s): no sample {body.sample}",
        )
    if holdout_rows is None:
        raise EvaluationRefused(
            422,
            "invalid-plan",
            f"dataset {dataset_name!r} has no evaluation holdout (the admin reserves one at "
            "registration: enclave datasets register --holdout-fraction F)",
        )
    if len(set(body.metrics)) != len(body.metrics):
        raise EvaluationRefused(422, "invalid-plan", "each metric may be named once")
    for metric in body.metrics:
        if metric in REFUSED_METRICS:
            raise EvaluationRefused(422, "invalid-plan", REFUSED_METRICS[metric])
    return JobRequest(
        dataset=dataset_name,
        model=TypeAdapter(ModelSpec).validate_python(evaluated_model),
        method=EVALUATION_METHOD,
        epsilon=body.epsilon,
        delta=body.delta,
        evaluation={
            "job_id": body.job_id,
            "sample": body.sample,
            "metrics": list(body.metrics),
            "noise": body.noise,
            "confidence": body.confidence,
        },
    )


def _classes(public_schema: dict[str, Any]) -> int:
    """K of the dataset's target, public, for every kind: 2 for a binary target (a time
    series' outcome, two image classes), K for declared classes or image classes (the
    worker scores sigmoid outputs for K = 2, softmax over K logits else)."""
    return parse_dataset_schema(public_schema).n_classes


def evaluation_plan(
    request: JobRequest, *, holdout_rows: int | None, public_schema: dict[str, Any]
) -> EvaluationPlan:
    """The statistics' plan (service/privacy/evaluation.py ``plan_evaluation``) of a stored
    evaluation request: public values only (the holdout's public size, the schema's
    classes). The worker calls this again to noise the statistics."""
    spec = request.evaluation
    if request.method != EVALUATION_METHOD or spec is None:
        raise PlanError("not an evaluation request")
    if holdout_rows is None:
        raise PlanError(f"dataset {request.dataset!r} has no evaluation holdout")
    for metric in spec["metrics"]:
        if metric in REFUSED_METRICS:
            raise PlanError(REFUSED_METRICS[metric])
    try:
        return plan_evaluation(
            metrics=spec["metrics"],
            n=holdout_rows,
            classes=_classes(public_schema),
            epsilon=request.epsilon,
            delta=request.delta,
            noise=spec["noise"],
            confidence=spec["confidence"],
        )
    except ValueError as exc:
        raise PlanError(str(exc)) from exc


def _gaussian_leaf(scale: float, sensitivity_l2: float, dims: int) -> DpEvent:
    """The rounded Gaussian of σ on an integer statistic of L2 sensitivity Δ₂ (``dims``
    coordinates): the Gaussian mechanism of multiplier σ/Δ₂ and the sampler's pmf slack."""
    return ComposedEvent(
        events=(
            PoissonSubsampledGaussianEvent(
                sampling_rate=1.0, noise_multiplier=scale / sensitivity_l2, steps=1
            ),
            noise_slack(draws=dims),
        )
    )


def _metric_event(entry: MetricPlan, *, classes: int) -> DpEvent:
    """One metric's leaf (module docstring): pure ε_m for Laplace; for the rounded Gaussian,
    :func:`_gaussian_leaf`. AUC: its 2U release and its counts' release, composed."""
    if entry.metric == "auc":
        assert entry.count_scale is not None and entry.count_epsilon is not None
        assert entry.count_sensitivity_l2 is not None
        dims = 1 if classes == 2 else classes
        if entry.noise == "laplace":
            parts: tuple[DpEvent, DpEvent] = (
                PureDpEvent(epsilon=entry.epsilon - entry.count_epsilon),
                PureDpEvent(epsilon=entry.count_epsilon),
            )
        else:
            parts = (
                _gaussian_leaf(entry.scale, entry.sensitivity_l2, dims),
                _gaussian_leaf(entry.count_scale, entry.count_sensitivity_l2, dims),
            )
        return ComposedEvent(events=parts)
    if entry.noise == "laplace":
        return PureDpEvent(epsilon=entry.epsilon)
    dims = classes * classes if entry.metric == "confusion" else 1
    return _gaussian_leaf(entry.scale, entry.sensitivity_l2, dims)


def _evaluation_event(plan: EvaluationPlan) -> ComposedEvent:
    """The evaluation's event: its metrics' leaves, composed (module docstring)."""
    return ComposedEvent(events=tuple(_metric_event(m, classes=plan.classes) for m in plan.metrics))


def _public_plan(plan: EvaluationPlan) -> dict[str, Any]:
    """The evaluation's public plan values, as its plan (or a training plan's
    ``evaluation``) states them."""
    return {
        "holdout_rows": plan.n,
        "classes": plan.classes,
        "noise": plan.noise,
        "confidence": plan.confidence,
        "p_min": plan.p_min,
        "bins": plan.bins,
        "neighbouring_relation": HOLDOUT_RELATION,
        "metrics": [asdict(m) for m in plan.metrics],
    }


def plan_evaluation_job(
    request: JobRequest, *, holdout_rows: int | None, public_schema: dict[str, Any]
) -> PrivacyPlan:
    """An evaluation's privacy plan (:class:`PlanError` on bad input): the API (quote,
    admission) and the worker (re-derivation before it reads the holdout) both call this.
    ``n_rows`` is the holdout's public size, the only count the plan uses."""
    plan = evaluation_plan(request, holdout_rows=holdout_rows, public_schema=public_schema)
    spec = request.evaluation
    assert spec is not None
    event = _evaluation_event(plan)
    return PrivacyPlan(
        method=EVALUATION_METHOD,
        dataset=request.dataset,
        n_rows=plan.n,
        model=request.model.model_dump(mode="json"),
        epsilon=plan.epsilon,
        delta=plan.delta,
        guarantee="proven",
        accountant="basic composition" if plan.noise == "laplace" else "rdp",
        samples=1,
        event=event.to_json(),
        rdp_orders=list(ORDERS),
        rdp_curve=[float(v) for v in event.rdp(ORDERS)],
        mechanism={
            "evaluated_job": spec["job_id"],
            "sample": spec["sample"],
            **_public_plan(plan),
        },
    )


COMPOSITION_RULE: Final[str] = (
    "the training and the evaluation composed as one event: RDP curves add "
    "(Mironov 2017, Prop. 1), which the ledger's Rényi filter charges on approximate "
    "datasets; ε and δ add (basic composition, Dwork & Roth 2014, Thm 3.16), which pure "
    "datasets charge; exactly the charges of the two as separate jobs"
)


def training_part(request: JobRequest) -> JobRequest:
    """``request`` without its ``evaluate`` block: what its training's plan is built from
    (service/plans.py knows nothing of evaluations)."""
    return request if request.evaluate is None else request.model_copy(update={"evaluate": None})


def trained_evaluation_plan(
    request: JobRequest, *, holdout_rows: int | None, public_schema: dict[str, Any]
) -> EvaluationPlan:
    """The statistics' plan of a training request's ``evaluate`` block (train then
    evaluate): public values only, as :func:`evaluation_plan`. :class:`PlanError` for a
    request without one, or a dataset without a holdout."""
    spec = request.evaluate
    if spec is None:
        raise PlanError("the request asks for no evaluation")
    if holdout_rows is None:
        raise PlanError(
            f"dataset {request.dataset!r} has no evaluation holdout, so the trained model "
            "cannot be evaluated (the admin reserves one at registration: enclave datasets "
            "register --holdout-fraction F)"
        )
    for metric in spec.metrics:
        if metric in REFUSED_METRICS:
            raise PlanError(REFUSED_METRICS[metric])
    try:
        return plan_evaluation(
            metrics=list(spec.metrics),
            n=holdout_rows,
            classes=_classes(public_schema),
            epsilon=spec.epsilon,
            delta=spec.delta,
            noise=spec.noise,
            confidence=spec.confidence,
        )
    except ValueError as exc:
        raise PlanError(f"evaluate: {exc}") from exc


def with_evaluation(
    training: PrivacyPlan,
    request: JobRequest,
    *,
    holdout_rows: int | None,
    public_schema: dict[str, Any],
) -> PrivacyPlan:
    """The plan of a training request with an ``evaluate`` block: ``training`` (the plan of
    :func:`training_part`) composed with the evaluation of its released model, one plan
    charged once (:data:`COMPOSITION_RULE`). ``training`` itself where the request asks
    for no evaluation. The API (quote, admission) and the worker (re-derivation) call
    this; :class:`PlanError` on bad input (no holdout, Gaussian noise without δ, …)."""
    spec = request.evaluate
    if spec is None:
        return training
    plan = trained_evaluation_plan(request, holdout_rows=holdout_rows, public_schema=public_schema)
    event = ComposedEvent(events=(event_from_json(training.event), _evaluation_event(plan)))
    delta = training.delta + plan.delta
    if delta >= 1:
        raise PlanError(f"the job's δ (training and evaluation) is {delta:g}: it must be below 1")
    return PrivacyPlan.model_validate(
        {
            **training.model_dump(mode="json"),
            "epsilon": math.fsum((training.epsilon, plan.epsilon)),
            "delta": delta,
            "event": event.to_json(),
            "rdp_curve": [float(v) for v in event.rdp(ORDERS)],
            "evaluation": {
                "epsilon": plan.epsilon,
                "delta": plan.delta,
                "training_epsilon": training.epsilon,
                "training_delta": training.delta,
                "composition": COMPOSITION_RULE,
                "accountant": "basic composition" if plan.noise == "laplace" else "rdp",
                "sample": spec.sample,
                **_public_plan(plan),
            },
        }
    )


def evaluations_of(s: Session, job: Job) -> list[dict[str, Any]]:
    """The released evaluations of ``job`` (a read-time join for its model card): each
    evaluation's job id and its released results, oldest first. Only the job's owner can
    evaluate it, so only the owner's evaluation jobs on its dataset are read."""
    rows = s.execute(
        select(Job.id, Release.card)
        .join(Release, Release.job_id == Job.id)
        .where(
            Job.dataset_id == job.dataset_id,
            Job.analyst_id == job.analyst_id,
            Job.status == JobStatus.released,
        )
        .order_by(Release.created_at, Job.id)
    ).all()
    out: list[dict[str, Any]] = []
    for evaluation_id, card in rows:
        results = card.get("evaluation") if isinstance(card, dict) else None
        if isinstance(results, dict) and results.get("job_id") == job.id:
            out.append({"evaluation_job": evaluation_id, **results})
    return out
