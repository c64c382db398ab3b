"""What a plan will cost the worker, estimated from public values before anything is
charged (issue 11: an expm_nf MLP [256, 256, 256] with Sylvester layers passed planning
and then tried to allocate ~100 GB after its data was touched, keeping its charge).

Each method's estimate lives in its own module (service/methods: dpsgd, expm, expm_nf),
named by its entry in :data:`service.methods.METHODS` (issue 23); this module looks it up,
estimates selection jobs (their candidates' DP-SGD or ExpM+NF estimates), evaluations
(:func:`evaluation_seconds`) and a training's ``evaluate`` block, and refuses what is over
the worker's limits. Every job kind the worker runs has a time estimate, a function of the
plan and the public schema only: the release hold (service/release_hold.py) is set from
it. The estimates are deliberately simple and on the high side; they refuse at quote time
what the worker cannot hold, they do not guarantee that an admitted plan fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from service.datasets.kinds import DatasetSchema
from service.datasets.timeseries import TimeSeriesSchema
from service.methods import METHODS, method_key, plan_key
from service.methods.common import ResourceEstimate, ResourceFacts
from service.methods.dpsgd import dpsgd_training_memory_bytes, dpsgd_training_seconds
from service.methods.expm_nf import expm_memory_bytes, expm_nf_seconds
from service.modelspec import (
    MODEL_SPEC,
    CnnSpec,
    GrudSpec,
    ModelSpec,
    cnn_row_macs,
    parameter_count,
)
from service.privacy.tuning import padded_runs, runs_distribution_from_json
from service.schemas import JobRequest, PrivacyPlan
from service.schemas.common import EVALUATION_METHOD


def _series_steps(schema: DatasetSchema) -> int | None:
    return schema.grid.steps if isinstance(schema, TimeSeriesSchema) else None


def selection_trainings(plan: PrivacyPlan) -> int:
    """How many candidate trainings a ``selection`` plan's work estimate counts: the fixed
    number, or the cap on K (random stopping), or K's ``RUNS_WORK_QUANTILE`` quantile
    where the law is uncapped (a larger K then runs into the job's hard time limit, and
    the job fails with its charge kept: its data was read)."""
    m = plan.mechanism
    if m.get("trainings") is not None:
        return int(m["trainings"])
    return padded_runs(runs_distribution_from_json(m["runs"]))


def selection_estimate(
    plan: PrivacyPlan, *, n_features: int, series_steps: int | None = None
) -> tuple[float, int]:
    """(seconds, peak bytes) of a ``selection`` plan: the counted trainings (see
    :func:`selection_trainings`) each at the costliest candidate's DP-SGD estimate, its
    memory at the costliest candidate's (a CNN search's: the largest over the plan's
    ``cost_models``, the space's extremes, each with the charged mechanism). Scoring and
    the features kind's histogram pass are single passes over the rows, small beside one
    training, and not counted. ExpM+NF
    candidates: the counted trainings each at the largest model's flow estimate (on all
    n̂ rows: a ceiling for the training split), its memory."""
    spec: ModelSpec = MODEL_SPEC.validate_python(plan.model)
    expm = plan.mechanism.get("expm_nf")
    if expm is not None:
        flow = plan.model_copy(update={"method": "expm_nf", "mechanism": expm})
        memory = expm_memory_bytes(flow, n_features=n_features, series_steps=series_steps)
        seconds = expm_nf_seconds(flow, n_features=n_features, series_steps=series_steps)
        return selection_trainings(plan) * (seconds or 0.0), memory or 0
    statistics = features_statistics_seconds(plan)
    candidates = plan.mechanism.get("candidates") or []
    if not candidates:
        return statistics, 0
    # A CNN search's candidates cost at most one of its extreme models each (cost_models).
    specs = [MODEL_SPEC.validate_python(m) for m in plan.mechanism.get("cost_models") or []]
    specs = specs or [spec]
    per = max(
        dpsgd_training_seconds(s, c, series_steps=series_steps) for s in specs for c in candidates
    )
    memory = max(
        dpsgd_training_memory_bytes(s, c, n_features=n_features, series_steps=series_steps)
        for s in specs
        for c in candidates
    )
    return statistics + selection_trainings(plan) * per, memory


# The features kind's statistics stage (service/selection/feature_plan.py): one pass over
# the n̂ training rows filling its noisy histograms (counts per cell), with a fixed cost
# for the rows' load and encoding; measured by benchmarks/job_estimates.py and set below
# the busy machine's rate.
FEATURES_STATISTICS_OVERHEAD_S = 1.0
FEATURES_HISTOGRAM_ROWS_PER_S = 2e6


def features_statistics_seconds(plan: PrivacyPlan) -> float:
    """Estimated worker time of a features selection's statistics stage (0 for other
    kinds): histograms × n̂ training rows at :data:`FEATURES_HISTOGRAM_ROWS_PER_S`."""
    stats = (plan.mechanism.get("stages") or {}).get("statistics")
    if not stats:
        return 0.0
    rows = int(plan.mechanism.get("n_train_public") or plan.n_rows)
    return FEATURES_STATISTICS_OVERHEAD_S + int(stats["histograms"]) * rows / (
        FEATURES_HISTOGRAM_ROWS_PER_S
    )


@dataclass(frozen=True)
class ResourceLimits:
    """What one job may use in the worker (Settings.job_time_limit_s, worker_memory_bytes)."""

    seconds: float
    memory_bytes: int


def work_twin(request: JobRequest) -> JobRequest | None:
    """A request whose plan costs the worker exactly what ``request``'s does but is cheap to
    plan, or None when planning ``request`` is cheap already (issue 19): the method's
    METHODS entry says (DP-SGD's, service/methods/dpsgd.py ``dpsgd_work_twin``). The
    service refuses a plan over the limits from the twin before calibrating the real
    one."""
    entry = METHODS.get(method_key(request))
    return None if entry is None else entry.work_twin(request)


def selection_resources(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    """:func:`selection_estimate` with the refusal's hints."""
    seconds, memory = selection_estimate(
        plan, n_features=facts.n_features, series_steps=facts.series_steps
    )
    return ResourceEstimate(
        seconds=seconds,
        memory_bytes=memory,
        time_hint=(
            "train fewer candidates (or cap the number of runs with max_runs), with "
            "fewer epochs, smaller batches or smaller models"
        ),
        memory_hint="use smaller batches or smaller models",
    )


# Evaluations (issue 21): the worker reads the holdout (a gzip CSV parsed and encoded by
# the schema; a time series' long-format observations; an image array), scores every row
# with the model (one forward pass, no gradient) and computes the metrics (AUC sorts the
# scores). Per holdout row: its encoded values (T·V for a time series) at the load rate
# and its forward work (parameters, × T for GRU-D; a CNN's multiply-adds) at the forward
# rate, plus a fixed cost (the released weights, the metrics, the release files).
# Measured by benchmarks/job_estimates.py (benchmarks/results/job_estimates.md) on the
# busy 2-core machine and set below its rates, as DP-SGD's constants.
EVALUATION_OVERHEAD_S = 1.0
EVALUATION_LOAD_VALUES_PER_S = 5e5
EVALUATION_FORWARD_ELEMENTS_PER_S = 5e8


def evaluation_seconds(
    spec: ModelSpec, *, holdout_rows: int, n_features: int, series_steps: int | None = None
) -> float:
    """Estimated worker time (s) of scoring a model of ``spec`` on ``holdout_rows`` rows
    (the holdout's public size), from public values only."""
    t = series_steps or 1
    if isinstance(spec, CnnSpec):
        forward = float(cnn_row_macs(spec))
    else:
        forward = float(parameter_count(spec, n_features)) * (
            t if isinstance(spec, GrudSpec) else 1
        )
    values = n_features * (3 * t if isinstance(spec, GrudSpec) else 1)
    per_row = values / EVALUATION_LOAD_VALUES_PER_S + forward / EVALUATION_FORWARD_ELEMENTS_PER_S
    return EVALUATION_OVERHEAD_S + holdout_rows * per_row


def _evaluated_spec(plan: PrivacyPlan) -> ModelSpec:
    """The plan's model as the worker builds it (a K-class logistic model its classes)."""
    return MODEL_SPEC.validate_python(plan.model)


def evaluation_resources(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    """An evaluation job's estimate: its time (:func:`evaluation_seconds`, ``n_rows`` the
    holdout's public size); no memory estimate (one forward pass over the holdout)."""
    return ResourceEstimate(
        seconds=evaluation_seconds(
            _evaluated_spec(plan),
            holdout_rows=plan.n_rows,
            n_features=facts.n_features,
            series_steps=facts.series_steps,
        ),
        time_hint="evaluate fewer metrics (the holdout's size is fixed at registration)",
    )


def with_evaluation_time(
    estimate: ResourceEstimate, plan: PrivacyPlan, facts: ResourceFacts
) -> ResourceEstimate:
    """A training plan's estimate with its ``evaluate`` block's (train then evaluate: the
    training's time plus the evaluation's on the plan's public holdout size)."""
    if plan.evaluation is None or estimate.seconds is None:
        return estimate
    extra = evaluation_seconds(
        _evaluated_spec(plan),
        holdout_rows=int(plan.evaluation["holdout_rows"]),
        n_features=facts.n_features,
        series_steps=facts.series_steps,
    )
    return replace(estimate, seconds=estimate.seconds + extra)


def plan_resources(plan: PrivacyPlan, *, schema: DatasetSchema) -> ResourceEstimate:
    """The estimate of ``plan``: its method's entry in :data:`service.methods.METHODS`
    (no estimate for a key no entry names), a selection job's or an evaluation's; a
    training's ``evaluate`` block adds the evaluation's time."""
    facts = ResourceFacts(n_features=schema.n_features, series_steps=_series_steps(schema))
    if plan.method == "selection":  # not a method of the table: its own workflow
        return selection_resources(plan, facts)
    if plan.method == EVALUATION_METHOD:
        return evaluation_resources(plan, facts)
    entry = METHODS.get(plan_key(plan))
    estimate = ResourceEstimate() if entry is None else entry.resources(plan, facts)
    return with_evaluation_time(estimate, plan, facts)


def resource_refusal(
    plan: PrivacyPlan, *, schema: DatasetSchema, limits: ResourceLimits
) -> str | None:
    """Why the worker cannot run this plan within its limits (an estimate from public
    values), or None. Asked at quote and submission time, before anything is charged."""
    return limits_refusal(plan_resources(plan, schema=schema), limits)


def limits_refusal(estimate: ResourceEstimate, limits: ResourceLimits) -> str | None:
    """Why a plan of this estimate is over the worker's limits, or None."""
    memory, seconds = estimate.memory_bytes, estimate.seconds
    if memory is not None and memory > limits.memory_bytes:
        return (
            f"this plan needs about {memory / 2**30:.3g} GiB in the worker (estimate), "
            f"more than the {limits.memory_bytes / 2**30:.3g} GiB it may use: "
            f"{estimate.memory_hint}"
        )
    if seconds is not None and seconds > limits.seconds:
        return (
            f"this plan needs about {seconds:.3g} s of worker time (estimate), more than "
            f"the {limits.seconds:g} s a job may run: {estimate.time_hint}"
        )
    return None
