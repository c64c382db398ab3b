"""Defence in depth (issue 19): hostile parameters injected *below* the API (past its
validated types, service/params.py) reach each mechanism, and the mechanism's own run-time
guard (worker/mechanisms/guards.py) fails closed before anything is released; and the
number of random-stopping runs K leaves no trace in the work a selection job does.

Both audits would have failed on the main of issue 19: a tuning grid's clip norm of −1e-4
was trained and released (per-row contributions ≈ 10⁶× the sensitivity bound), and a
selection job's duration grew with K (Spearman 0.95)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from service.modelspec import LogisticSpec, MlpSpec, parameter_count
from service.plans import build_plan
from service.privacy.sampling import GRID_BITS
from service.privacy.tuning import padded_runs
from service.schemas import DpsgdOptions, ExpmOptions, JobRequest
from service.selection.plans import (
    ArchitectureRequest,
    HyperparameterRequest,
    SelectionBudget,
    TnbRunsSpec,
    architecture_plan,
    hyperparameter_plan,
)
from service.selection.search_space import ArchitectureSearch, ArchitectureSpace
from worker.mechanisms import exact_net, grad_engines, model_selection
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.dpsgd import DpsgdParams, run_dpsgd
from worker.mechanisms.grad_engines import (
    clipped_integer_sum,
    ghost_integer_sum,
    jl_integer_sum,
)
from worker.mechanisms.guards import GuardFailed, finite_release
from worker.mechanisms.langevin import LangevinParams, run_expm_langevin
from worker.mechanisms.mcmc import McmcParams
from worker.models import build_module

HOSTILE = [-1.0, -1e-4, 0.0, math.nan, math.inf, -math.inf]
CPU = torch.device("cpu")


def _data(n: int = 200, d: int = 4) -> TabularTrainingSet:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, d, generator=g)
    y = (x[:, 0] + 0.2 * torch.rand(n, generator=g) > 0.6).float()
    return TabularTrainingSet(x, y)


def _plan_mechanism(request: JobRequest, n: int = 200, d: int = 4) -> dict[str, Any]:
    # Features in [0, 1]^4 plus the bias: ‖(x, 1)‖² ≤ 5 (the schema's public bound).
    bound = 5 if request.method == "expm" else None
    return dict(build_plan(request, n_rows=n, n_features=d, norm_sq_bound=bound).mechanism)


DPSGD = JobRequest(
    dataset="toy",
    method="dpsgd",
    epsilon=1.0,
    delta=1e-5,
    model=LogisticSpec(),
    dpsgd=DpsgdOptions(epochs=1, batch_size=50),
)


# ------------------------------------------------------------------ DP-SGD (every engine)


@pytest.mark.parametrize("value", HOSTILE, ids=str)
@pytest.mark.parametrize(
    "field", ["max_grad_norm", "learning_rate", "noise_multiplier", "sampling_rate"]
)
def test_dpsgd_refuses_a_hostile_plan_before_reading_a_row(field: str, value: float) -> None:
    mechanism = {**_plan_mechanism(DPSGD), field: value}
    with pytest.raises(GuardFailed, match=field):
        run_dpsgd(
            spec=LogisticSpec(),
            mechanism=mechanism,
            samples=1,
            data=_data(),
            device=CPU,
            progress=lambda a, b: None,
        )


def _engine_sum(engine: str, clip: float) -> None:
    data = _data(50)
    torch.manual_seed(0)
    module = build_module(MlpSpec(hidden=[3]), 4).double()
    size = parameter_count(MlpSpec(hidden=[3]), 4)
    x, y = data.x.double(), data.y.double()
    kw: dict[str, Any] = {"grid_bits": GRID_BITS, "max_grad_norm": clip, "parameters": size}
    if engine == "exact":
        clipped_integer_sum(module, x, y, **kw)
    elif engine == "ghost":
        ghost_integer_sum(module, x, y, **kw)
    else:
        rng = np.random.default_rng(0)
        jl_integer_sum(module, x, y, **kw, projections=2, kappa=2.0, rng=rng)


@pytest.mark.parametrize("clip", [-1.0, -1e-4, 0.0, math.nan])
@pytest.mark.parametrize("engine", ["exact", "ghost", "jl"])
def test_every_engine_refuses_a_clip_norm_no_proof_covers(engine: str, clip: float) -> None:
    """Below DpsgdParams too: an engine handed C ≤ 0 would weight each row by 2^k/C < 0."""
    with pytest.raises(GuardFailed, match="max_grad_norm"):
        _engine_sum(engine, clip)


@pytest.mark.parametrize("engine", ["exact", "ghost", "jl"])
def test_every_engine_checks_each_rows_contribution_on_the_real_batch(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault injected in the clipping itself (its safety margin made negative, so rows
    are scaled to 1.5× the bound the proof allows) is caught on the batch, per row."""
    monkeypatch.setattr(grad_engines, "_MARGIN", -0.5)  # the float engines (jl)
    monkeypatch.setattr(exact_net, "_MARGIN", -0.5)  # logistic and MLPs in exact and ghost
    with pytest.raises(GuardFailed, match="exceeds its bound"):
        _engine_sum(engine, 1e-3)  # every row clipped: each contribution at the cap


def test_the_guards_pass_an_honest_run() -> None:
    """The same checks never fire on valid parameters (no false alarm)."""
    out = run_dpsgd(
        spec=LogisticSpec(),
        mechanism=_plan_mechanism(DPSGD),
        samples=1,
        data=_data(),
        device=CPU,
        progress=lambda a, b: None,
    )
    finite_release(out.releases)
    params = DpsgdParams.from_plan(_plan_mechanism(DPSGD))
    assert params.max_grad_norm > 0


# ------------------------------------------------------------------ ExpM samplers


LANGEVIN = JobRequest(
    dataset="toy",
    method="expm",
    epsilon=1.0,
    delta=1e-5,
    expm=ExpmOptions(sampler="langevin", steps=5),
)
MCMC = JobRequest(
    dataset="toy",
    method="expm",
    epsilon=1.0,
    delta=1e-5,
    expm=ExpmOptions(sampler="mcmc", steps=5, warmup=5, chains=2),
)


@pytest.mark.parametrize("value", HOSTILE, ids=str)
@pytest.mark.parametrize("field", ["learning_rate", "noise_multiplier"])
def test_langevin_refuses_a_hostile_plan(field: str, value: float) -> None:
    mechanism = {**_plan_mechanism(LANGEVIN), field: value}
    with pytest.raises(GuardFailed, match=field):
        LangevinParams.from_plan(mechanism)
    with pytest.raises(GuardFailed):
        run_expm_langevin(
            spec=LogisticSpec(),
            mechanism=mechanism,
            samples=1,
            data=_data(),
            device=CPU,
            progress=lambda a, b: None,
        )


@pytest.mark.parametrize("value", HOSTILE, ids=str)
@pytest.mark.parametrize("field", ["inverse_temperature", "l2", "step_size"])
def test_mcmc_refuses_a_hostile_plan(field: str, value: float) -> None:
    mechanism = {**_plan_mechanism(MCMC), field: value}
    with pytest.raises(GuardFailed, match=field):
        McmcParams.from_plan(mechanism)


@pytest.mark.parametrize("value", [-1.0, 0.0, math.nan, math.inf])
def test_the_flow_refuses_a_hostile_epsilon(value: float) -> None:
    from worker.mechanisms.expm_nf import ExpmNfParams

    with pytest.raises(ValueError, match="epsilon"):
        ExpmNfParams(epsilon=value)


def test_a_non_finite_release_is_refused() -> None:
    with pytest.raises(GuardFailed, match="not finite"):
        finite_release([{"w": torch.tensor([1.0, math.inf])}])
    with pytest.raises(GuardFailed, match="not finite"):
        finite_release([{"w": torch.tensor([math.nan])}])


# ------------------------------------------------------------------ selection kinds


BUDGET = SelectionBudget(training_epsilon=2.0, training_delta=1e-6, fitness_epsilon=0.5)
HYPER = HyperparameterRequest(
    model=MlpSpec(hidden=[3]),
    learning_rates=[0.5],
    batch_sizes=[50],
    epochs=[1],
    runs=TnbRunsSpec(eta=1.0, gamma=0.5, max_runs=3),
    budget=BUDGET,
)
ARCH = ArchitectureRequest(
    space=ArchitectureSpace(depths=[1], widths=[2, 3]),
    search=ArchitectureSearch(algorithm="rs", trainings=2),
    training=DpsgdOptions(epochs=1, batch_size=50),
    runs=TnbRunsSpec(eta=1.0, gamma=0.5, max_runs=3),
    budget=BUDGET,
)


@pytest.mark.parametrize(
    "update",
    [
        {"max_grad_norms": [-1e-4]},
        {"max_grad_norms": [-1.0]},
        {"max_grad_norms": [math.inf]},
        {"learning_rates": [-1.0]},
        {"learning_rates": [math.nan]},
    ],
    ids=str,
)
def test_hyperparameter_selection_with_a_hostile_grid_releases_nothing(
    update: dict[str, Any],
) -> None:
    """The issue's case: `max_grad_norms: [-0.0001]` trained and released as proven.
    Injected with model_copy (no validation), it must stop inside the mechanism."""
    request = HYPER.model_copy(update=update)
    plan = hyperparameter_plan(HYPER, dataset="toy", n_rows=200, n_features=4)
    # A non-finite value is already refused by the candidate's own model (ValueError).
    with pytest.raises((GuardFailed, ValueError)):
        model_selection.run_hyperparameter_selection(
            request=request, plan=plan, data=_data(), device=CPU, progress=lambda a, b: None
        )


def test_architecture_selection_with_a_hostile_learning_rate_releases_nothing() -> None:
    request = ARCH.model_copy(
        update={
            "training": DpsgdOptions.model_construct(
                **{
                    **DpsgdOptions(epochs=1, batch_size=50).__dict__,
                    "learning_rate": -1.0,
                }
            )
        }
    )
    plan = architecture_plan(ARCH, dataset="toy", n_rows=200, n_features=4)
    with pytest.raises(GuardFailed, match="learning_rate"):
        model_selection.run_architecture_selection(
            request=request, plan=plan, data=_data(), device=CPU, progress=lambda a, b: None
        )


# ------------------------------------------------------------------ K leaves no trace


def _work_and_progress(
    monkeypatch: pytest.MonkeyPatch, kind: str, k: int
) -> tuple[int, list[tuple[int, int]], bool]:
    """Trainings performed, progress reported and whether a model came out, with K
    forced to ``k`` (the law's draw replaced; the work counted, nothing else changed)."""
    calls = {"n": 0}
    real = model_selection.train_and_score

    def counted(**kw: Any) -> Any:
        calls["n"] += 1
        return real(**kw)

    monkeypatch.setattr(model_selection, "train_and_score", counted)
    monkeypatch.setattr(model_selection, "draw_runs", lambda plan, rng: k)
    seen: list[tuple[int, int]] = []
    if kind == "hyperparameters":
        plan = hyperparameter_plan(HYPER, dataset="toy", n_rows=200, n_features=4)
        out = model_selection.run_hyperparameter_selection(
            request=HYPER, plan=plan, data=_data(), device=CPU, progress=lambda *a: seen.append(a)
        )
    else:
        plan = architecture_plan(ARCH, dataset="toy", n_rows=200, n_features=4)
        out = model_selection.run_architecture_selection(
            request=ARCH, plan=plan, data=_data(), device=CPU, progress=lambda *a: seen.append(a)
        )
    assert out.trainings == k  # the enclave log's count stays the real K
    return calls["n"], seen, out.weights is not None


@pytest.mark.parametrize("kind", ["hyperparameters", "architecture"])
def test_k_leaves_no_trace_in_the_work_or_the_progress(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """K = 1 and K = cap do the same number of trainings (the cap's), so a job's duration,
    the analyst's only view of its progress besides 0/1 → 1/1, does not depend on K.
    Measured as work, not seconds: tests never assume how fast a job runs."""
    cap = 3
    assert (
        padded_runs(hyperparameter_plan(HYPER, dataset="t", n_rows=200, n_features=4).runs) == cap
    )  # type: ignore[arg-type]
    one = _work_and_progress(monkeypatch, kind, 1)
    full = _work_and_progress(monkeypatch, kind, cap)
    assert one[0] == full[0] == cap
    assert one[1] == full[1] == [(0, 1), (1, 1)]
    assert one[2] and full[2]


def test_uncapped_laws_are_padded_to_the_work_quantile() -> None:
    from service.privacy.tuning import RUNS_WORK_QUANTILE, runs_quantile

    free = HYPER.model_copy(update={"runs": TnbRunsSpec(eta=1.0, gamma=0.5)})
    plan = hyperparameter_plan(free, dataset="toy", n_rows=200, n_features=4)
    assert plan.runs is not None
    assert padded_runs(plan.runs) == runs_quantile(plan.runs, RUNS_WORK_QUANTILE) == 10


# ------------------------------------------------------------------ decaying σ, features


@pytest.mark.parametrize("value", HOSTILE, ids=str)
def test_a_decaying_schedule_refuses_a_hostile_sigma(value: float) -> None:
    request = DPSGD.model_copy(
        update={
            "dpsgd": DpsgdOptions(
                epochs=2, batch_size=50, noise_schedule="exponential", noise_decay=0.9
            )
        }
    )
    mechanism = _plan_mechanism(request)
    sigmas = list(mechanism["noise_multipliers"])
    sigmas[-1] = value
    with pytest.raises(GuardFailed, match="sigma_1"):
        DpsgdParams.from_plan({**mechanism, "noise_multipliers": sigmas})


def test_feature_selection_checks_one_cell_per_row_and_its_noise() -> None:
    """cfs: the cells' charge (ℓ2 sensitivity √H) needs every row in exactly one cell of
    each histogram; a corrupted count (as a NaN code would give) or a hostile noise scale
    fails before any noise is drawn."""
    from dataclasses import replace

    from service.selection.features import FeatureRequest
    from service.selection.plans import plan_selection
    from tests.unit.worker.test_feature_selection import SCHEMA, _toy
    from worker.mechanisms.feature_selection import (
        count_histograms,
        discretise,
        one_cell_per_row,
        run_feature_selection,
    )

    request = FeatureRequest(epsilon=1.0, delta=1e-6)
    plan = plan_selection(
        "features", request, dataset="toy", n_rows=300, n_features=SCHEMA.n_features, schema=SCHEMA
    )
    assert plan.features is not None
    data = _toy(300)
    bins = [c.bins for c in plan.features.columns]
    codes, y = discretise(data, plan.features)
    counts = count_histograms(codes, y, bins)
    one_cell_per_row(counts, rows=300, bins=bins)  # the honest counts pass
    counts.fy[0][0, 0] += 1  # one row counted twice
    with pytest.raises(GuardFailed, match="exactly one cell"):
        one_cell_per_row(counts, rows=300, bins=bins)
    hostile = replace(plan, features=replace(plan.features, cell_scale=-1.0))
    with pytest.raises(GuardFailed, match="cell_scale"):
        run_feature_selection(
            request=request, plan=hostile, data=data, device=CPU, progress=lambda a, b: None
        )
