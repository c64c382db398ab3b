"""Architecture searches (RS, MGRS, PAAS) as pure functions over a fitness callback.

``fitness(candidate)`` trains one candidate with DP-SGD and returns its *noisy*
validation accuracy (:func:`noisy_accuracy`); the searches look at nothing else, so
every choice they make is post-processing of those releases, and each call is one
training plus one noisy score that the plan charged. Each search calls ``fitness``
exactly :func:`service.selection.search_space.planned_trainings` times (tested), whatever the
values it sees. ``rng`` drives the search's own choices (worker: ``secure_rng()``;
tests may pass a seeded generator since the choices are not what protects privacy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from service.selection.search_space import (
    ArchitectureCandidate,
    ArchitectureSearch,
    ArchitectureSpace,
)
from worker.noise import discrete_laplace

__all__ = ["SearchResult", "genetic_search", "noisy_accuracy", "run_search", "sample_candidate"]

T = TypeVar("T")
Fitness = Callable[[ArchitectureCandidate], float]


@dataclass(frozen=True)
class SearchResult:
    best: ArchitectureCandidate
    best_fitness: float  # noisy; releasable with the guarantee of the fitness events
    evaluations: int
    history: tuple[tuple[ArchitectureCandidate, float], ...]


def noisy_accuracy(
    *, correct: int, n_val_public: int, epsilon: float, rng: np.random.Generator
) -> float:
    """(correct + Lap(1/ε)) / n: ε-DP under add/remove-one (the count has sensitivity 1;
    ``n_val_public`` is public, never the loaded row count). Discrete Laplace (Ghosh,
    Roughgarden & Sundararajan 2009) drawn exactly by :func:`worker.noise.discrete_laplace`."""
    if epsilon <= 0.0:
        raise ValueError("epsilon must be > 0")
    noise = int(discrete_laplace(rng, scale=1.0 / epsilon, size=1)[0])
    return (correct + noise) / n_val_public


def _pick(rng: np.random.Generator, values: Sequence[T]) -> T:
    return values[int(rng.integers(len(values)))]


def sample_candidate(space: ArchitectureSpace, rng: np.random.Generator) -> ArchitectureCandidate:
    """A uniform draw from the space (a CNN space's also draws a kernel and a pooling; an
    MLP or GRU-D space draws exactly as before CNN spaces existed)."""
    depth = _pick(rng, space.depths)
    cnn = space.model == "cnn"
    return ArchitectureCandidate(
        hidden=tuple(_pick(rng, space.widths) for _ in range(depth)),
        activation=_pick(rng, space.activation_choices()),
        learning_rate=_pick(rng, space.learning_rates) if space.learning_rates else None,
        batch_size=_pick(rng, space.batch_sizes) if space.batch_sizes else None,
        kernel=_pick(rng, space.cnn_kernels) if cnn else None,
        pool=_pick(rng, space.cnn_pools) if cnn else None,
    )


def _mutate(
    c: ArchitectureCandidate, space: ArchitectureSpace, rate: float, rng: np.random.Generator
) -> ArchitectureCandidate:
    """Each gene is redrawn from the space with probability ``rate`` (depth changes add
    or drop the last layer)."""
    fresh = sample_candidate(space, rng)
    hidden = list(c.hidden)
    if rng.random() < rate:
        depth = _pick(rng, space.depths)
        hidden = (hidden + list(fresh.hidden) * 3)[:depth]
    hidden = [_pick(rng, space.widths) if rng.random() < rate else h for h in hidden]
    mutated = ArchitectureCandidate(
        hidden=tuple(hidden),
        activation=fresh.activation if rng.random() < rate else c.activation,
        learning_rate=fresh.learning_rate if rng.random() < rate else c.learning_rate,
        batch_size=fresh.batch_size if rng.random() < rate else c.batch_size,
        kernel=c.kernel,
        pool=c.pool,
    )
    return _cnn_genes(mutated, fresh, rng, rate)


def _cnn_genes(
    a: ArchitectureCandidate, b: ArchitectureCandidate, rng: np.random.Generator, rate: float
) -> ArchitectureCandidate:
    """``a`` with a CNN candidate's kernel and pooling each ``b``'s with probability
    ``rate`` (kept otherwise); an MLP or GRU-D candidate unchanged, with no draw (their
    searches draw exactly as before CNN spaces existed)."""
    if a.kernel is None:
        return a
    kernel = b.kernel if rng.random() < rate else a.kernel
    pool = b.pool if rng.random() < rate else a.pool
    return a.model_copy(update={"kernel": kernel, "pool": pool})


def _crossover(
    a: ArchitectureCandidate, b: ArchitectureCandidate, rng: np.random.Generator
) -> ArchitectureCandidate:
    """Uniform crossover; depth from one parent, each width from either where both have it."""
    base, other = (a, b) if rng.random() < 0.5 else (b, a)
    hidden = tuple(
        other.hidden[i] if i < len(other.hidden) and rng.random() < 0.5 else h
        for i, h in enumerate(base.hidden)
    )
    child = ArchitectureCandidate(
        hidden=hidden,
        activation=a.activation if rng.random() < 0.5 else b.activation,
        learning_rate=a.learning_rate if rng.random() < 0.5 else b.learning_rate,
        batch_size=a.batch_size if rng.random() < 0.5 else b.batch_size,
        kernel=a.kernel,
        pool=a.pool,
    )
    return _cnn_genes(child, b, rng, 0.5)


def _tournament(scored: list[tuple[T, float]], rng: np.random.Generator) -> T:
    i, j = rng.integers(len(scored), size=2)
    return scored[i][0] if scored[i][1] >= scored[j][1] else scored[j][0]


def genetic_search(
    *,
    sample: Callable[[], T],
    crossover: Callable[[T, T], T],
    mutate: Callable[[T], T],
    fitness: Callable[[T], float],
    population: int,
    generations: int,
    rng: np.random.Generator,
) -> tuple[T, float, list[tuple[T, float]]]:
    """The one genetic algorithm of the product (PAAS over architectures, PAFS and CFS-GA
    over feature subsets): ``population`` sampled genomes, then per further generation
    ``population`` children, each by two binary tournaments on fitness, ``crossover`` and
    ``mutate``; elitism keeps the best scored so far in the parents' pool (not re-scored).
    Calls ``fitness`` exactly population × generations times, whatever it returns.
    Returns (best genome, its fitness, every (genome, fitness) scored, in order)."""
    history: list[tuple[T, float]] = []

    def score(g: T) -> tuple[T, float]:
        out = (g, float(fitness(g)))
        history.append(out)
        return out

    pool = [score(sample()) for _ in range(population)]
    for _ in range(generations - 1):
        children = [
            mutate(crossover(_tournament(pool, rng), _tournament(pool, rng)))
            for _ in range(population)
        ]
        pool = [score(c) for c in children] + [max(history, key=lambda h: h[1])]
    best, value = max(history, key=lambda h: h[1])
    return best, value, history


def run_search(
    *,
    space: ArchitectureSpace,
    search: ArchitectureSearch,
    fitness: Fitness,
    rng: np.random.Generator,
) -> SearchResult:
    """Run the declared search; the best candidate by noisy fitness wins."""
    history: list[tuple[ArchitectureCandidate, float]] = []

    def score(c: ArchitectureCandidate) -> tuple[ArchitectureCandidate, float]:
        out = (c, float(fitness(c)))
        history.append(out)
        return out

    if search.algorithm == "rs":
        for _ in range(search.trainings):
            score(sample_candidate(space, rng))
    elif search.algorithm == "mgrs":
        for g in range(search.generations):
            best = max(history, key=lambda h: h[1])[0] if history else None
            for i in range(search.per_generation):
                if best is not None and i % 2 == 0:
                    score(_mutate(best, space, max(search.mutation_rate, 0.5), rng))
                else:
                    score(sample_candidate(space, rng))
            del g
    else:
        genetic_search(
            sample=lambda: sample_candidate(space, rng),
            crossover=lambda a, b: _crossover(a, b, rng),
            mutate=lambda c: _mutate(c, space, search.mutation_rate, rng),
            fitness=lambda c: score(c)[1],
            population=search.population,
            generations=search.generations,
            rng=rng,
        )
    best_c, best_f = max(history, key=lambda h: h[1])
    return SearchResult(
        best=best_c, best_fitness=best_f, evaluations=len(history), history=tuple(history)
    )
