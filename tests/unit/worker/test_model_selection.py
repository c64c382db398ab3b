"""Selection plans (architecture, hyperparameters) and their worker runs on a small
synthetic problem: the charge is the declared composition, the worker trains exactly
what was charged, and nothing about K leaves through progress."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from service.modelspec import MlpSpec, parameter_count
from service.plans import PlanError
from service.privacy.events import (
    ComposedEvent,
    PoissonSubsampledGaussianEvent,
    RandomStoppingEvent,
    SelfComposedEvent,
    event_from_json,
)
from service.privacy.orders import ORDERS
from service.privacy.sampling import count_event, noise_slack
from service.schemas import DpsgdOptions
from service.selection.plans import (
    ArchitectureRequest,
    HyperparameterRequest,
    SelectionBudget,
    TnbRunsSpec,
    architecture_plan,
    candidate_mechanism,
    hyperparameter_plan,
    plan_selection,
    plan_summary,
    with_total_epsilon,
    workflow_epsilon,
)
from service.selection.search_space import ArchitectureSearch, ArchitectureSpace
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.model_selection import (
    draw_runs,
    released_summary,
    run_architecture_selection,
    run_hyperparameter_selection,
    run_selection,
)

BUDGET = SelectionBudget(training_epsilon=2.0, training_delta=1e-6, fitness_epsilon=0.5)


def _data(n: int = 600, d: int = 4) -> TabularTrainingSet:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, d, generator=g)
    y = (x[:, 0] + 0.2 * torch.rand(n, generator=g) > 0.6).float()
    return TabularTrainingSet(x, y)


ARCH = ArchitectureRequest(
    space=ArchitectureSpace(depths=[1, 2], widths=[2, 4], batch_sizes=[32, 64]),
    search=ArchitectureSearch(algorithm="paas", population=2, generations=2),
    training=DpsgdOptions(epochs=1, learning_rate=1.0),
    budget=BUDGET,
)


def test_architecture_charge_is_trainings_times_worst_training_plus_score() -> None:
    plan = architecture_plan(ARCH, dataset="toy", n_rows=600, n_features=4)
    assert plan.trainings == 4 and (plan.n_train, plan.n_val) == (480, 120)
    training_curves = [
        event_from_json(
            {
                "type": "composed",
                "version": 1,
                "events": [
                    {
                        "type": "poisson_subsampled_gaussian",
                        "version": 1,
                        "sampling_rate": m["sampling_rate"],
                        "noise_multiplier": m["noise_multiplier"],
                        "steps": m["steps"],
                    }
                ],
            }
        ).rdp(ORDERS)
        for m in plan.mechanisms.values()
    ]
    one = np.max(training_curves, axis=0)
    fit = count_event(epsilon=0.5).rdp(ORDERS)
    # ≥ the Gaussian part of the worst training (plus the charged slack), per training.
    assert np.all(plan.event.rdp(ORDERS) >= 4 * (one + fit) - 1e-12)
    assert np.all(plan.event.rdp(ORDERS) <= 4 * (one + fit) * (1 + 1e-3) + 1e-9)
    assert event_from_json(plan.event.to_json()) == plan.event
    # The largest model's slack is charged: every candidate is at most that big.
    biggest = parameter_count(MlpSpec(hidden=[4, 4]), 4)
    assert all(m["parameters"] == biggest for m in plan.mechanisms.values())


def test_architecture_selection_runs_the_planned_trainings() -> None:
    plan = architecture_plan(ARCH, dataset="toy", n_rows=600, n_features=4)
    seen: list[tuple[int, int]] = []
    out = run_architecture_selection(
        request=ARCH,
        plan=plan,
        data=_data(),
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    assert out.trainings == 4 and seen[-1] == (4, 4)
    assert out.selected is not None and out.weights is not None
    assert len(out.selected.hidden) in (1, 2) and out.model is not None


HYPER = HyperparameterRequest(
    model=MlpSpec(hidden=[4]),
    learning_rates=[0.5, 2.0],
    batch_sizes=[32, 64],
    epochs=[1],
    runs=TnbRunsSpec(eta=1.0, gamma=0.5),
    budget=BUDGET,
)


def test_hyperparameter_charge_is_the_papernot_steinke_bound() -> None:
    plan = hyperparameter_plan(HYPER, dataset="toy", n_rows=600, n_features=4)
    assert isinstance(plan.event, RandomStoppingEvent)
    inner = plan.event.event
    assert isinstance(inner, ComposedEvent) and inner.events[1] == count_event(epsilon=0.5)
    # Geometric K with γ = 0.5: E[K] = 2; the charge is at least one run.
    ek = plan.runs.expected_runs() if plan.runs else 0
    assert ek == pytest.approx(2.0)
    assert np.all(plan.event.rdp(ORDERS) >= inner.rdp(ORDERS))
    assert event_from_json(plan.event.to_json()) == plan.event


def test_hyperparameter_run_hides_k_and_k_follows_the_declared_law() -> None:
    plan = hyperparameter_plan(HYPER, dataset="toy", n_rows=600, n_features=4)
    rng = np.random.default_rng(5)
    ks = np.array([draw_runs(plan, rng) for _ in range(4000)])
    assert ks.min() >= 1 and ks.mean() == pytest.approx(2.0, abs=0.1)  # geometric, γ = 0.5
    seen: list[tuple[int, int]] = []
    out = run_hyperparameter_selection(
        request=HYPER,
        plan=plan,
        data=_data(),
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    assert seen == [(0, 1), (1, 1)]  # progress says nothing about K
    assert out.selected is not None and out.selected.learning_rate in (0.5, 2.0)


def test_capped_runs_never_exceed_the_cap_and_follow_the_conditioned_law() -> None:
    capped = HYPER.model_copy(update={"runs": TnbRunsSpec(eta=1.0, gamma=0.5, max_runs=2)})
    plan = hyperparameter_plan(capped, dataset="toy", n_rows=600, n_features=4)
    assert plan.runs is not None and plan.runs.max_runs == 2
    rng = np.random.default_rng(6)
    ks = np.array([draw_runs(plan, rng) for _ in range(4000)])
    # Geometric γ = 0.5 conditioned on K ≤ 2: P[K = 1] = 0.5/0.75 = 2/3.
    assert set(ks.tolist()) == {1, 2}
    assert float(np.mean(ks == 1)) == pytest.approx(2 / 3, abs=0.03)
    # charged by PS22's generic bound: one run + log(E[K]/P[K = 1]) + log(E[K])/(λ − 1),
    # with E[K] = 4/3 and P[K = 1] = 2/3 for this capped law
    assert isinstance(plan.event, RandomStoppingEvent)
    lams = np.asarray(ORDERS)
    one = np.asarray(plan.event.event.rdp(ORDERS))
    expected = one + math.log(2.0) + math.log(4 / 3) / (lams - 1)
    np.testing.assert_allclose(plan.event.rdp(ORDERS), expected, rtol=1e-9)
    assert event_from_json(plan.event.to_json()) == plan.event


def test_self_composed_architecture_event_equals_separate_charges() -> None:
    plan = architecture_plan(ARCH, dataset="toy", n_rows=600, n_features=4)
    assert isinstance(plan.event, SelfComposedEvent)
    np.testing.assert_allclose(
        plan.event.rdp(ORDERS), plan.event.count * plan.event.event.rdp(ORDERS), rtol=1e-12
    )


def test_every_candidate_run_is_covered_by_the_charged_training_event() -> None:
    # Each candidate runs the charged σ, q, T with its own parameter count; its true event
    # (Gaussian steps + its own noise slack) must be ≤ the plan's per-training AnyOf.
    plan = architecture_plan(ARCH, dataset="toy", n_rows=600, n_features=4)
    per_training = plan.event.event.events[0]  # SelfComposed(Composed(AnyOf, score))
    for hidden in ([2], [4], [2, 4], [4, 4]):
        params = parameter_count(MlpSpec(hidden=hidden), 4)
        for key in plan.mechanisms:
            m = candidate_mechanism(plan, key=key, parameters=params, learning_rate=0.3)
            true = ComposedEvent(
                events=(
                    PoissonSubsampledGaussianEvent(
                        sampling_rate=m["sampling_rate"],
                        noise_multiplier=m["noise_multiplier"],
                        steps=m["steps"],
                    ),
                    noise_slack(draws=params * m["steps"]),
                )
            )
            assert np.all(true.rdp(ORDERS) <= per_training.rdp(ORDERS))
    with pytest.raises(ValueError, match="larger than the charged"):
        candidate_mechanism(
            plan, key=next(iter(plan.mechanisms)), parameters=10**6, learning_rate=1
        )


def test_random_search_with_random_stopping_hides_k() -> None:
    request = ARCH.model_copy(
        update={"search": ArchitectureSearch(algorithm="rs"), "runs": TnbRunsSpec(gamma=0.6)}
    )
    plan = architecture_plan(request, dataset="toy", n_rows=600, n_features=4)
    assert isinstance(plan.event, RandomStoppingEvent) and plan.trainings is None
    seen: list[tuple[int, int]] = []
    out = run_architecture_selection(
        request=request,
        plan=plan,
        data=_data(),
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    assert seen == [(0, 1), (1, 1)] and out.selected is not None
    with pytest.raises(ValueError, match=r"random search \(rs\) only"):
        ArchitectureRequest.model_validate(
            {"budget": BUDGET.model_dump(), "runs": {"kind": "poisson", "mu": 2}}
        )


@pytest.mark.parametrize("request_", [ARCH, HYPER], ids=["architecture", "hyperparameters"])
def test_total_epsilon_split_spends_the_whole_budget_and_no_more(request_: object) -> None:
    assert isinstance(request_, ArchitectureRequest | HyperparameterRequest)
    r = with_total_epsilon(
        request_, epsilon=3.0, delta=1e-5, dataset="toy", n_rows=600, n_features=4
    )
    plan = (
        architecture_plan(r, dataset="toy", n_rows=600, n_features=4)
        if isinstance(r, ArchitectureRequest)
        else hyperparameter_plan(r, dataset="toy", n_rows=600, n_features=4)
    )
    assert 0.99 * 3.0 <= workflow_epsilon(plan, delta=1e-5) <= 3.0
    with pytest.raises(PlanError):
        with_total_epsilon(
            request_, epsilon=0.01, delta=1e-5, dataset="toy", n_rows=600, n_features=4
        )


def test_kind_adapter_summary_states_the_whole_workflow_and_never_k() -> None:
    plan = plan_selection("hyperparameters", HYPER, dataset="toy", n_rows=600, n_features=4)
    summary = plan_summary(plan, delta=1e-5)
    assert summary["event"] == plan.event.to_json()
    assert summary["epsilon"] == pytest.approx(workflow_epsilon(plan, delta=1e-5))
    assert summary["trainings"] is None and summary["runs"]["kind"] == "truncated_negative_binomial"
    with pytest.raises(PlanError):
        plan_selection("architecture", HYPER, dataset="toy", n_rows=600, n_features=4)
    out = run_selection(
        HYPER, plan, data=_data(), device=torch.device("cpu"), progress=lambda a, b: None
    )
    released = released_summary(out)
    assert set(released) == {"selected", "model", "noisy_validation_accuracy"}


def test_report_noisy_max_charges_one_score_and_releases_no_score() -> None:
    rnm = ARCH.model_copy(
        update={
            "search": ArchitectureSearch(algorithm="rs", trainings=3),
            "scoring": "report_noisy_max",
        }
    )
    noisy = rnm.model_copy(update={"scoring": "noisy_scores"})
    p_rnm = architecture_plan(rnm, dataset="toy", n_rows=600, n_features=4)
    p_all = architecture_plan(noisy, dataset="toy", n_rows=600, n_features=4)
    fit = count_event(epsilon=0.5).rdp(ORDERS)
    np.testing.assert_allclose(
        p_all.event.rdp(ORDERS) - p_rnm.event.rdp(ORDERS), 2 * fit, rtol=1e-9
    )
    out = run_architecture_selection(
        request=rnm,
        plan=p_rnm,
        data=_data(),
        device=torch.device("cpu"),
        progress=lambda a, b: None,
    )
    assert out.noisy_accuracy is None and out.selected is not None and out.trainings == 3
    with pytest.raises(ValueError, match="report_noisy_max"):
        ARCH.model_validate({**ARCH.model_dump(), "scoring": "report_noisy_max"})


@pytest.mark.parametrize("eps", [0.3, 1.0])
def test_report_noisy_max_with_geometric_noise_is_epsilon_dp_exactly(eps: float) -> None:
    # Exact winner probabilities of argmax(c + Z), Z two-sided geometric with scale 1/ε,
    # ties to the lower index (as the worker's max over an insertion-ordered dict), for
    # neighbouring count vectors (add one validation row: each count +0 or +1).
    k = np.arange(-400, 401)
    pmf = np.exp(-eps * np.abs(k))
    pmf /= pmf.sum()

    def winner_probs(c: tuple[int, int, int]) -> np.ndarray:
        # P[i wins] = Σ_z P[Z_i = z] Π_{j<i} P[c_j + Z_j < c_i + z] Π_{j>i} P[c_j + Z_j ≤ c_i + z]
        cdf = np.cumsum(pmf)  # P[Z ≤ k]

        def below(v: np.ndarray, strict: bool) -> np.ndarray:
            idx = v - (1 if strict else 0) + 400
            return np.where(idx < 0, 0.0, cdf[np.clip(idx, 0, len(k) - 1)])

        out = []
        for i in range(3):
            v = c[i] + k
            p = pmf.copy()
            for j in range(3):
                if j != i:
                    p = p * below(v - c[j], strict=j < i)
            out.append(p.sum())
        return np.array(out)

    for base in [(5, 5, 5), (0, 3, 1), (10, 2, 9)]:
        for delta in [(1, 0, 0), (0, 1, 1), (1, 1, 1), (0, 0, 1)]:
            a = winner_probs(base)
            b = winner_probs(tuple(x + d for x, d in zip(base, delta, strict=True)))  # type: ignore[arg-type]
            assert a.sum() == pytest.approx(1.0) and b.sum() == pytest.approx(1.0)
            assert np.all(np.abs(np.log(a / b)) <= eps + 1e-9)
