"""What a plan will cost the worker, estimated from public values before anything is
charged (issue 11: an expm_nf MLP [256, 256, 256] with Sylvester layers passed planning
and then tried to allocate ~100 GB after its data was touched, keeping its charge).

Each method's estimate lives in its own module (service/methods: dpsgd, expm, expm_nf),
named by its entry in :data:`service.methods.METHODS` (issue 23); this module looks it up,
estimates selection jobs (their candidates' DP-SGD or ExpM+NF estimates), and refuses what
is over the worker's limits. The estimates are deliberately simple and on the high side;
they refuse at quote time what the worker cannot hold, they do not guarantee that an
admitted plan fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.datasets.kinds import DatasetSchema
from service.datasets.timeseries import TimeSeriesSchema
from service.methods import METHODS, method_key, plan_key
from service.methods.common import ResourceEstimate, ResourceFacts
from service.methods.dpsgd import dpsgd_training_memory_bytes, dpsgd_training_seconds
from service.methods.expm_nf import expm_memory_bytes
from service.modelspec import MODEL_SPEC, ModelSpec
from service.privacy.tuning import padded_runs, runs_distribution_from_json
from service.schemas import JobRequest, PrivacyPlan


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
    memory at the costliest candidate's. Scoring and the features kind's histogram pass
    are single passes over the rows, small beside one training, and not counted. ExpM+NF
    candidates: the flow's memory only (0 s: no time estimate)."""
    spec: ModelSpec = MODEL_SPEC.validate_python(plan.model)
    expm = plan.mechanism.get("expm_nf")
    if expm is not None:
        # ExpM+NF candidates: the flow's memory for the largest model; no time estimate
        # exists for the flow (as for expm_nf jobs): the hard time limit is the backstop.
        flow = plan.model_copy(update={"method": "expm_nf", "mechanism": expm})
        memory = expm_memory_bytes(flow, n_features=n_features, series_steps=series_steps)
        return 0.0, memory or 0
    candidates = plan.mechanism.get("candidates") or []
    if not candidates:
        return 0.0, 0
    per = max(dpsgd_training_seconds(spec, c, series_steps=series_steps) for c in candidates)
    memory = max(
        dpsgd_training_memory_bytes(spec, c, n_features=n_features, series_steps=series_steps)
        for c in candidates
    )
    return selection_trainings(plan) * per, memory


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
    """:func:`selection_estimate` with the refusal's hints. No time estimate for ExpM+NF
    candidates (0 s, as for expm_nf jobs)."""
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


def plan_resources(plan: PrivacyPlan, *, schema: DatasetSchema) -> ResourceEstimate:
    """The estimate of ``plan``: its method's entry in :data:`service.methods.METHODS`
    (no estimate for a key no entry names), or a selection job's."""
    facts = ResourceFacts(n_features=schema.n_features, series_steps=_series_steps(schema))
    if plan.method == "selection":  # not a method of the table: its own workflow
        return selection_resources(plan, facts)
    entry = METHODS.get(plan_key(plan))
    return ResourceEstimate() if entry is None else entry.resources(plan, facts)


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
