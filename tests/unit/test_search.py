"""Architecture searches (RS, MGRS, PAAS) and the crossover-ε report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.selection.crossover import crossover_epsilon
from service.selection.search_space import (
    ArchitectureCandidate,
    ArchitectureSearch,
    ArchitectureSpace,
    planned_trainings,
)
from worker.mechanisms.search import noisy_accuracy, run_search

SPACE = ArchitectureSpace(
    depths=[1, 2, 3], widths=[4, 8, 16, 32], activations=["tanh", "relu"], learning_rates=[0.1, 1.0]
)
SEARCHES = [
    ArchitectureSearch(algorithm="rs", trainings=7),
    ArchitectureSearch(algorithm="mgrs", generations=3, per_generation=5),
    ArchitectureSearch(algorithm="paas", generations=4, population=6),
]


def _in_space(c: ArchitectureCandidate) -> bool:
    return (
        len(c.hidden) in SPACE.depths
        and all(h in SPACE.widths for h in c.hidden)
        and c.activation in SPACE.activations
        and c.learning_rate in SPACE.learning_rates
    )


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: s.algorithm)
def test_search_trains_exactly_the_planned_number_inside_the_space(
    search: ArchitectureSearch,
) -> None:
    # The charge is fixed up front from planned_trainings: whatever fitness values come
    # back (here arbitrary noise), the search must call fitness exactly that many times.
    calls: list[ArchitectureCandidate] = []
    noise = np.random.default_rng(1)

    def fitness(c: ArchitectureCandidate) -> float:
        calls.append(c)
        return float(noise.normal())

    out = run_search(space=SPACE, search=search, fitness=fitness, rng=np.random.default_rng(0))
    assert len(calls) == out.evaluations == planned_trainings(search)
    assert all(_in_space(c) for c in calls)
    assert out.best_fitness == max(f for _, f in out.history)


def _target_fitness(c: ArchitectureCandidate) -> float:
    # Peak at hidden (16, 16), relu, lr 1.0: a smooth landscape the searches should climb.
    score = -abs(len(c.hidden) - 2) - sum(abs(math.log2(h) - 4) for h in c.hidden) / 4
    return score + (c.activation == "relu") + (c.learning_rate == 1.0)


@pytest.mark.parametrize("algorithm", ["mgrs", "paas"])
def test_guided_searches_beat_random_search_on_average(algorithm: str) -> None:
    # Same budget (24 trainings), noiseless fitness: the guided searches' best is at least
    # as good as random search's best on average over 100 (fixed) seeds.
    budget = {
        "mgrs": ArchitectureSearch(algorithm="mgrs", generations=4, per_generation=6),
        "paas": ArchitectureSearch(
            algorithm="paas", generations=4, population=6, mutation_rate=0.2
        ),
    }[algorithm]
    rs = ArchitectureSearch(algorithm="rs", trainings=planned_trainings(budget))
    guided = [
        run_search(
            space=SPACE, search=budget, fitness=_target_fitness, rng=np.random.default_rng(s)
        )
        for s in range(100)
    ]
    rand = [
        run_search(space=SPACE, search=rs, fitness=_target_fitness, rng=np.random.default_rng(s))
        for s in range(100)
    ]
    assert np.mean([g.best_fitness for g in guided]) >= np.mean([r.best_fitness for r in rand])


def test_noisy_accuracy_is_unbiased_with_laplace_spread() -> None:
    rng = np.random.default_rng(3)
    eps, n = 0.5, 1000
    draws = np.array(
        [noisy_accuracy(correct=800, n_val_public=n, epsilon=eps, rng=rng) for _ in range(4000)]
    )
    # Laplace(1/ε) on the count: mean 800/n, std √2/ε / n.
    assert draws.mean() == pytest.approx(0.8, abs=4 * math.sqrt(2) / eps / n / math.sqrt(4000))
    assert draws.std() == pytest.approx(math.sqrt(2) / eps / n, rel=0.1)


def test_search_sizes_are_bounded() -> None:
    with pytest.raises(ValueError, match="at most 200"):
        ArchitectureSearch(algorithm="paas", generations=50, population=50)


# ---------------------------------------------------------------------- crossover


def test_crossover_of_two_monotone_curves_is_where_they_cross() -> None:
    # simple: 0.8 − 0.1/ε^0.5, complex: 0.9 − 0.4/ε^0.5: equal where 0.1 = 0.3/√ε, ε = 9.
    eps = np.geomspace(0.1, 100, 31)
    simple = 0.8 - 0.1 / np.sqrt(eps)
    complex_ = 0.9 - 0.4 / np.sqrt(eps)
    r = crossover_epsilon(epsilons=eps.tolist(), simple=simple.tolist(), complex=complex_.tolist())
    assert r.crossover == pytest.approx(9.0, rel=0.02)
    assert not r.simple_wins_everywhere and not r.complex_wins_everywhere
    assert all(s >= c for e, s, c in zip(eps, simple, complex_, strict=True) if e < r.crossover)


def test_crossover_when_one_model_always_wins_and_bad_grids() -> None:
    r = crossover_epsilon(epsilons=[0.1, 1, 10], simple=[0.9, 0.9, 0.9], complex=[0.5, 0.6, 0.7])
    assert r.crossover is None and r.simple_wins_everywhere
    r = crossover_epsilon(epsilons=[0.1, 1, 10], simple=[0.1, 0.1, 0.1], complex=[0.5, 0.6, 0.7])
    assert r.crossover is None and r.complex_wins_everywhere
    with pytest.raises(ValueError):
        crossover_epsilon(epsilons=[1, 1], simple=[0, 0], complex=[0, 0])
    with pytest.raises(ValueError):
        crossover_epsilon(epsilons=[-1, 1], simple=[0, 0], complex=[0, 0])
