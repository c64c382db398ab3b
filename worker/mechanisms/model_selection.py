"""Worker side of the ``architecture`` and ``hyperparameters`` selection kinds: split,
train every candidate with the product's DP-SGD, score it with a noisy validation
accuracy, select. Exactly the plan of :mod:`service.selection.plans`: the number of
trainings (architecture) or the law of K (hyperparameters) and each candidate's σ and
schedule come from the plan; K is drawn here from the CSPRNG, never by the caller.

What is released: the selected candidate (architecture or settings), its noisy score and
its DP-SGD weights. All of them are outputs the plan charged (each training and each
score), and choosing among them looks at noisy scores only (post-processing). For
hyperparameters the number of runs K is *not* released, not even as progress: the
Papernot–Steinke bound covers the best run with K hidden.

Nor is K observable through time (issue 19: a selection job's duration rose with K,
Spearman 0.95 over 12 jobs). Under random stopping the worker always performs
N = :func:`service.privacy.tuning.padded_runs` trainings (the cap, or K's 0.999 quantile
without one), the first K real and the rest decoys: drawn, trained and scored exactly as
a real run (same code, same data, same amount of work), then discarded. The job's
duration is then that of max(K, N) trainings, a function of the plan alone whenever
K ≤ N (always, with a cap); progress stays 0 of 1 → 1 of 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from service.modelspec import ModelSpec, parameter_count
from service.privacy.tuning import padded_runs
from service.selection.features import FeatureRequest
from service.selection.plans import (
    ArchitectureRequest,
    HyperparameterCandidate,
    HyperparameterRequest,
    SelectionPlan,
    architecture_key,
    candidate_mechanism,
)
from service.selection.search_space import ArchitectureCandidate
from worker.mechanisms.base import ProgressFn, TabularTrainingSet
from worker.mechanisms.candidates import (
    SelectionOutput,
    split_rows,
    train_and_count,
    train_and_score,
)
from worker.mechanisms.feature_selection import run_feature_selection
from worker.mechanisms.search import run_search, sample_candidate
from worker.noise import discrete_laplace, secure_rng

__all__ = [
    "SelectionOutput",
    "draw_runs",
    "released_summary",
    "run_architecture_selection",
    "run_hyperparameter_selection",
    "run_selection",
    "split_rows",
]


def draw_runs(plan: SelectionPlan, rng: np.random.Generator) -> int:
    """K from the plan's public law by inversion of its cdf (server-side CSPRNG)."""
    assert plan.runs is not None
    u = float(rng.random())
    start = 0 if plan.runs.kind == "poisson" else 1
    total, k = 0.0, start
    while True:
        total += float(np.exp(plan.runs.log_pmf(np.array([float(k)])))[0])
        if u < total or k > 1_000_000:
            return k
        k += 1


def run_architecture_selection(
    *,
    request: ArchitectureRequest,
    plan: SelectionPlan,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> SelectionOutput:
    rng = secure_rng()
    train, val = split_rows(data, validation_fraction=request.budget.validation_fraction, rng=rng)
    models: dict[ArchitectureCandidate, dict[str, torch.Tensor]] = {}
    total = plan.trainings or 0  # 0 (random stopping): no progress per training
    done = 0

    def spec_and_mechanism(c: ArchitectureCandidate) -> tuple[ModelSpec, dict[str, Any]]:
        """The candidate's model and the charged mechanism it runs (ExpM+NF: the same
        exponential mechanism at the same ε for every model, see the plan)."""
        spec = request.space.spec_of(c)
        if plan.expm_mechanism is not None:
            return spec, dict(plan.expm_mechanism)
        mech = candidate_mechanism(
            plan,
            key=architecture_key(plan, c),
            parameters=parameter_count(spec, train.n_features),
            learning_rate=c.learning_rate or request.training.learning_rate,
        )
        return spec, mech

    def fitness(c: ArchitectureCandidate) -> float:
        nonlocal done
        spec, mech = spec_and_mechanism(c)
        weights, score = train_and_score(
            spec=spec,
            mechanism=mech,
            train=train,
            val=val,
            n_val_public=plan.n_val,
            fitness_epsilon=request.budget.fitness_epsilon,
            device=device,
            rng=rng,
            method=request.method,
        )
        models[c] = weights  # same candidate twice: keep the latest (its score is latest too)
        done += 1
        if total > 0:
            progress(done, total)
        return score

    if plan.runs is not None:
        # Random stopping: K hidden (no progress per run, decoy runs up to the padded
        # count, module docstring), uniform candidates, best wins.
        k = draw_runs(plan, rng)
        progress(0, 1)
        runs: list[tuple[ArchitectureCandidate, float, dict[str, torch.Tensor]]] = []
        for i in range(max(k, padded_runs(plan.runs))):
            c = sample_candidate(request.space, rng)
            score = fitness(c)
            if i < k:
                runs.append((c, score, models[c]))
        progress(1, 1)
        if not runs:
            return SelectionOutput(None, None, None, None, trainings=0)
        best, best_fitness, weights = max(runs, key=lambda h: h[1])
        return SelectionOutput(
            selected=best,
            model=request.space.spec_of(best).model_dump(),
            weights=weights,
            noisy_accuracy=best_fitness,
            trainings=k,
        )
    elif request.scoring == "report_noisy_max":
        # Report Noisy Max (plan: service/selection/plans.py): the winner only, no score.
        counts = {}
        for _ in range(request.search.trainings):
            c = sample_candidate(request.space, rng)
            spec, mech = spec_and_mechanism(c)
            weights, correct = train_and_count(
                spec=spec,
                mechanism=mech,
                train=train,
                val=val,
                device=device,
                method=request.method,
            )
            models[c] = weights
            counts[c] = correct
            done += 1
            progress(done, total)
        noisy = {
            c: n + int(discrete_laplace(rng, scale=1.0 / request.budget.fitness_epsilon, size=1)[0])
            for c, n in counts.items()
        }
        best = max(noisy, key=noisy.__getitem__)
        best_fitness, evaluations = None, request.search.trainings
    else:
        result = run_search(space=request.space, search=request.search, fitness=fitness, rng=rng)
        best, best_fitness, evaluations = result.best, result.best_fitness, result.evaluations
    return SelectionOutput(
        selected=best,
        model=request.space.spec_of(best).model_dump(),
        weights=models[best],
        noisy_accuracy=best_fitness,
        trainings=evaluations,
    )


def run_hyperparameter_selection(
    *,
    request: HyperparameterRequest,
    plan: SelectionPlan,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> SelectionOutput:
    rng = secure_rng()
    train, val = split_rows(data, validation_fraction=request.budget.validation_fraction, rng=rng)
    k = draw_runs(plan, rng)
    progress(0, 1)
    best: tuple[float, HyperparameterCandidate, dict[str, torch.Tensor]] | None = None
    parameters = parameter_count(request.model, train.n_features)
    assert plan.runs is not None
    for run in range(max(k, padded_runs(plan.runs))):  # runs ≥ K: decoys (docstring)
        c = HyperparameterCandidate(
            learning_rate=request.learning_rates[int(rng.integers(len(request.learning_rates)))],
            batch_size=request.batch_sizes[int(rng.integers(len(request.batch_sizes)))],
            epochs=request.epochs[int(rng.integers(len(request.epochs)))],
            max_grad_norm=request.max_grad_norms[int(rng.integers(len(request.max_grad_norms)))],
            noise_decay=request.noise_decays[int(rng.integers(len(request.noise_decays)))],
        )
        mech = candidate_mechanism(
            plan,
            key=(c.batch_size, c.epochs, c.noise_decay),
            parameters=parameters,
            learning_rate=c.learning_rate,
            max_grad_norm=c.max_grad_norm,
        )
        weights, score = train_and_score(
            spec=request.model,
            mechanism=mech,
            train=train,
            val=val,
            n_val_public=plan.n_val,
            fitness_epsilon=request.budget.fitness_epsilon,
            device=device,
            rng=rng,
        )
        if run < k and (best is None or score > best[0]):
            best = (score, c, weights)
        # No progress per run: K must stay secret. PS22's bound is for the best run alone;
        # with K known the release would be best-of-k, whose cost grows with k.
    progress(1, 1)
    if best is None:
        return SelectionOutput(None, None, None, None, trainings=0)
    return SelectionOutput(
        selected=best[1],
        model=request.model.model_dump(),
        weights=best[2],
        noisy_accuracy=best[0],
        trainings=k,
    )


def run_selection(
    request: ArchitectureRequest | HyperparameterRequest | FeatureRequest,
    plan: SelectionPlan,
    *,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> SelectionOutput:
    """Worker entry point of every kind (the request's type picks the kind)."""
    if isinstance(request, FeatureRequest):
        return run_feature_selection(
            request=request, plan=plan, data=data, device=device, progress=progress
        )
    if isinstance(request, ArchitectureRequest):
        return run_architecture_selection(
            request=request, plan=plan, data=data, device=device, progress=progress
        )
    return run_hyperparameter_selection(
        request=request, plan=plan, data=data, device=device, progress=progress
    )


def released_summary(output: SelectionOutput) -> dict[str, object]:
    """What the analyst receives besides the weights: the selected candidate, its model
    spec and its noisy score (all charged). Never the number of trainings (K is secret
    for random stopping)."""
    return {
        "selected": None if output.selected is None else output.selected.model_dump(),
        "model": output.model,
        "noisy_validation_accuracy": output.noisy_accuracy,
    }
