"""What a plan will cost the worker, estimated from public values before anything is
charged (issue 11: an expm_nf MLP [256, 256, 256] with Sylvester layers passed planning
and then tried to allocate ~100 GB after its data was touched, keeping its charge).

The estimate is deliberately simple and on the high side: float32 tensors, parameters
counted with their gradients and Adam's two moments, autograd activations counted three
times. It is used to refuse at quote time what the worker cannot hold; it is not a
guarantee that an admitted plan fits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from service.datasets.kinds import DatasetSchema
from service.datasets.timeseries import TimeSeriesSchema
from service.modelspec import GrudSpec, MlpSpec, ModelSpec, parameter_count
from service.privacy.tuning import padded_runs, runs_distribution_from_json
from service.schemas import JobRequest, PrivacyPlan

_FLOAT = 4
_WITH_GRAD_AND_ADAM = 4  # the value, its gradient, Adam's first and second moments
_REFLECTIONS = 8  # Householder reflections per Sylvester layer (worker default)


# GRU-D keeps its gates' activations for every (θ, row) pair and grid step: measured
# ≈ 1.4 KiB per pair and step at H = 16, V = 8 (4.37 MiB per θ for 64 rows × 48 steps,
# forward and backward, benchmarks/results/grud_memory.md), i.e. ≈ 360 floats; counted
# here as 3·(12·H + 10·V) floats (816 at H = 16, V = 8), on the high side.
def _grud_floats_per_pair_step(*, hidden: int, n_vars: int) -> int:
    return 3 * (12 * hidden + 10 * n_vars)


def expm_memory_bytes(
    plan: PrivacyPlan, *, n_features: int, series_steps: int | None = None
) -> int | None:
    """Peak bytes of an expm_nf plan's flow training, or None where no estimate exists.
    ``n_features`` is the model's width (V for GRU-D); ``series_steps`` the time grid's T
    (GRU-D only)."""
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(plan.model)
    if isinstance(spec, GrudSpec) and series_steps is None:
        return None
    d = parameter_count(spec, n_features)
    m = plan.mechanism
    layers, samples, batch = int(m["layers"]), int(m["n_samples_per_step"]), int(m["batch_size"])
    if m["flow"] == "sylvester":
        # two dense D×D triangular factors, the reflections, diagonals and bias per layer,
        # plus Q (D×D) and the masked factors rebuilt in each forward pass
        per_layer = _WITH_GRAD_AND_ADAM * (2 * d * d + (_REFLECTIONS + 3) * d) + 3 * 3 * d * d
    else:  # planar: w, u (D each) and a scalar
        per_layer = _WITH_GRAD_AND_ADAM * (2 * d + 1)
    flow = layers * per_layer + _WITH_GRAD_AND_ADAM * 2 * d  # + the affine layer
    # N sampled parameter vectors through every layer, and the batched model evaluation
    if isinstance(spec, GrudSpec):
        assert series_steps is not None
        per_pair = series_steps * _grud_floats_per_pair_step(hidden=spec.hidden, n_vars=n_features)
    else:
        widths = n_features + (sum(spec.hidden) if isinstance(spec, MlpSpec) else 0) + 1
        per_pair = 3 * widths
    evaluation = 3 * samples * (layers + 2) * d + samples * batch * per_pair
    return _FLOAT * (flow + evaluation)


# Worst-case rate of the Langevin sampler's work, in (row × parameter) elements per second:
# measured ≈ 2.3e9 on Adult (30,162 rows × 105 parameters × 300 steps in 0.41 s, 2 CPU
# threads, benchmarks/results/expm_proven.md); 2e8 leaves a 10× margin for slower or
# busier machines.
LANGEVIN_ELEMENTS_PER_S = 2e8


def expm_langevin_seconds(plan: PrivacyPlan) -> float:
    """Estimated worker time of an ``expm`` (Langevin) plan: each of the T steps of each
    released chain touches every (row, parameter) element a few times (two matrix-vector
    products and the fixed-point quantisation), at :data:`LANGEVIN_ELEMENTS_PER_S`."""
    m = plan.mechanism
    elements = int(m["public_n_rows"]) * int(m["parameters"]) * int(m["steps"]) * plan.samples
    return elements / LANGEVIN_ELEMENTS_PER_S


# DP-SGD (worker/mechanisms/dpsgd.py). Work per step: the Poisson batch's per-example
# gradients (the Linear layers' hook formula for logistic and MLP models, torch.func's
# vmap of grad for GRU-D), their clipping and integer sum: ≈ B·P elements for a tabular
# model and ≈ B·P·T for GRU-D (its cell's parameters are used at each of the T grid
# steps); plus a per-step cost (the Poisson coins, P noise coordinates, the update) and,
# for GRU-D, a per-grid-step cost of the vmapped recurrence (Python-level ops whatever the
# batch). Measured with benchmarks/dpsgd_work.py (benchmarks/results/dpsgd_work.md) on
# this 2-core machine, quiet and shared (load 2-3.5 from other jobs, which made the same
# run 10-25x slower): element rates 3.5e7/s quiet, 1.6e7/s shared (Linear path, MLP
# [256]*3, B = 256); GRU-D 3e7-5e8/s quiet, 1e7-4.5e7/s shared (H = 16-64, T = 48);
# per-step costs 1-20 ms, per grid step ~1 ms quiet, up to ~50 ms shared. The constants
# sit at or below the shared machine's figures: the estimate is a ceiling for a busy
# machine, not a prediction (10-100x above a quiet machine's time; under the heaviest
# load a small GRU-D batch measured up to ~2.5x above it; the worker's hard time limit
# is the backstop).
DPSGD_STEP_OVERHEAD_S = 0.02
DPSGD_GRID_STEP_OVERHEAD_S = 0.01
DPSGD_ELEMENTS_PER_S = 5e6  # Linear path (logistic, MLP)
DPSGD_GRUD_ELEMENTS_PER_S = 1e7  # torch.func vmap over GRU-D, elements = B·P·T
# Elements per per-example-gradient slice: mirrors worker/mechanisms/grad_engines.py's
# _CHUNK_ELEMENTS (a unit test checks they agree; the worker's slice is also at most
# REDUCE_CHUNK rows, so this stays on the high side).
DPSGD_CHUNK_ELEMENTS = 1 << 24


def _series_steps(schema: DatasetSchema) -> int | None:
    return schema.grid.steps if isinstance(schema, TimeSeriesSchema) else None


def _dpsgd_batch_ceiling(m: Mapping[str, Any]) -> int:
    """A Poisson batch size that is practically never exceeded: B + 10√B + 10 rows (B the
    expected batch), at most the public row count (``m``: a DP-SGD plan's mechanism)."""
    b = float(m["expected_batch_size"])
    n = int(m["public_n_rows"])
    return min(n, math.ceil(b + 10 * math.sqrt(b) + 10))


def dpsgd_seconds(plan: PrivacyPlan, *, series_steps: int | None = None) -> float:
    """Estimated worker time (s) of a ``dpsgd`` plan, from public values only: samples ×
    steps × (per-step cost [+ T × per-grid-step cost for GRU-D] + expected batch ×
    parameters [× T for GRU-D] / the path's element rate)."""
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(plan.model)
    return plan.samples * _training_seconds(spec, plan.mechanism, series_steps=series_steps)


def _training_seconds(
    spec: ModelSpec, m: Mapping[str, Any], *, series_steps: int | None = None
) -> float:
    """One DP-SGD training of ``spec`` with mechanism ``m`` (see :func:`dpsgd_seconds`)."""
    elements = float(m["expected_batch_size"]) * int(m["parameters"])
    per_step = DPSGD_STEP_OVERHEAD_S
    if isinstance(spec, GrudSpec):
        t = series_steps or 1
        per_step += t * DPSGD_GRID_STEP_OVERHEAD_S + elements * t / DPSGD_GRUD_ELEMENTS_PER_S
    else:
        per_step += elements / DPSGD_ELEMENTS_PER_S
    return int(m["steps"]) * per_step


def dpsgd_memory_bytes(
    plan: PrivacyPlan, *, n_features: int, series_steps: int | None = None
) -> int:
    """Peak bytes of a ``dpsgd`` plan in the worker: the encoded rows (n̂ public rows of d
    floats, or 3·T·V for GRU-D), and per chunk of rows the float64 per-example gradients
    with their clipped and integer copies (4 buffers), plus GRU-D's autograd activations
    for every row and grid step (as for expm_nf). Rows per chunk: the worker's chunk
    (``DPSGD_CHUNK_ELEMENTS`` / P) or a batch ceiling, whichever is smaller."""
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(plan.model)
    return _training_memory_bytes(
        spec, plan.mechanism, n_features=n_features, series_steps=series_steps
    )


def _training_memory_bytes(
    spec: ModelSpec, m: Mapping[str, Any], *, n_features: int, series_steps: int | None
) -> int:
    p = int(m["parameters"])
    n = int(m["public_n_rows"])
    rows = min(max(1, DPSGD_CHUNK_ELEMENTS // p), _dpsgd_batch_ceiling(m))
    grads = 4 * 8 * rows * p
    if isinstance(spec, GrudSpec):
        t = series_steps or 1
        data = _FLOAT * n * 3 * t * n_features
        activations = (
            _FLOAT * rows * t * _grud_floats_per_pair_step(hidden=spec.hidden, n_vars=n_features)
        )
    else:
        data = _FLOAT * n * n_features
        widths = n_features + (sum(spec.hidden) if isinstance(spec, MlpSpec) else 0) + 1
        activations = _FLOAT * rows * 3 * widths
    return data + grads + activations + _FLOAT * _WITH_GRAD_AND_ADAM * p


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
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(plan.model)
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
    per = max(_training_seconds(spec, c, series_steps=series_steps) for c in candidates)
    memory = max(
        _training_memory_bytes(spec, c, n_features=n_features, series_steps=series_steps)
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
    plan, or None when planning ``request`` is cheap already (issue 19: four analysts held
    every planning slot with DP-SGD plans whose PLD or decaying-schedule calibration took
    ~20 s and then failed the work limit). The work and memory estimates of a DP-SGD plan
    depend on its steps, batch, model and engine, never on σ, its accountant or its noise
    schedule; the twin keeps those and calibrates one constant σ by RDP (milliseconds).
    The service refuses a plan over the limits from the twin before calibrating the real
    one."""
    options = request.dpsgd
    if request.method != "dpsgd" or options is None:
        return None
    if options.accountant == "rdp" and options.noise_schedule == "constant":
        return None
    cheap = options.model_copy(
        update={"accountant": "rdp", "noise_schedule": "constant", "noise_decay": None}
    )
    return request.model_copy(update={"dpsgd": cheap})


def resource_refusal(
    plan: PrivacyPlan, *, schema: DatasetSchema, limits: ResourceLimits
) -> str | None:
    """Why the worker cannot run this plan within its limits (an estimate from public
    values), or None. Asked at quote and submission time, before anything is charged."""
    steps = _series_steps(schema)
    memory: int | None = None
    seconds: float | None = None
    if plan.method == "expm_nf":
        memory = expm_memory_bytes(plan, n_features=schema.n_features, series_steps=steps)
    elif plan.method == "dpsgd":
        memory = dpsgd_memory_bytes(plan, n_features=schema.n_features, series_steps=steps)
        seconds = dpsgd_seconds(plan, series_steps=steps)
    elif plan.method == "expm" and plan.mechanism.get("sampler") == "langevin":
        seconds = expm_langevin_seconds(plan)
    elif plan.method == "selection":
        seconds, memory = selection_estimate(plan, n_features=schema.n_features, series_steps=steps)
    if memory is not None and memory > limits.memory_bytes:
        hint = {
            "dpsgd": "use fewer samples per step or a smaller batch",
            "selection": "use smaller batches or smaller models",
        }.get(
            plan.method,
            "use the planar flow, fewer layers, a smaller model or fewer samples per step",
        )
        return (
            f"this plan needs about {memory / 2**30:.3g} GiB in the worker (estimate), "
            f"more than the {limits.memory_bytes / 2**30:.3g} GiB it may use: {hint}"
        )
    if seconds is not None and seconds > limits.seconds:
        hint = {
            "dpsgd": "use fewer epochs, a smaller batch or a smaller model",
            "selection": (
                "train fewer candidates (or cap the number of runs with max_runs), with "
                "fewer epochs, smaller batches or smaller models"
            ),
        }.get(plan.method, "use fewer steps or samples")
        return (
            f"this plan needs about {seconds:.3g} s of worker time (estimate), more than "
            f"the {limits.seconds:g} s a job may run: {hint}"
        )
    return None
