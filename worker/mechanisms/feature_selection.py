"""Worker side of the ``features`` selection kind (plan: :mod:`service.selection.features`).

DP-CFS: discretise each schema column from the encoded rows by the public layout
(numeric: ⌊v·B⌋ of the [0, 1]-scaled value, clipped to B − 1; categorical: the one-hot
block's level), count the H joint histograms, add integer rounded-Gaussian noise of the
planned σ_cell to every cell (server-side CSPRNG) — the search's only access to the
rows. The search is post-processing of the noisy counts: entropies of the clamped,
normalised noisy counts, each corrected for the noise's bias by a parametric bootstrap
(:func:`noisy_entropies`), symmetrical uncertainty SU(a, b) = 2·I(a; b)/(H(a) + H(b)),
merit(S) = k·mean SU_fy / sqrt(k + k(k − 1)·mean SU_ff), searched greedily (forward
selection) or by a GA over bit masks. With ``final``, the product's DP-SGD then trains
one model on the selected columns with the planned mechanism.

PAFS: the same GA, with fitness = the noisy validation accuracy of a DP-SGD model trained
on the subset's encoded columns (the architecture kind's train-and-score); exactly
population × generations trainings, as planned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch

from service.modelspec import parameter_count
from service.selection.features import FeatureCandidate, FeatureLayout, FeatureRequest
from service.selection.plans import SelectionPlan, candidate_mechanism
from worker.mechanisms.base import ProgressFn, TabularTrainingSet
from worker.mechanisms.candidates import SelectionOutput, split_rows, train_and_score
from worker.mechanisms.dpsgd import run_dpsgd
from worker.mechanisms.guards import GuardFailed, positive_finite
from worker.mechanisms.search import genetic_search
from worker.noise import rounded_gaussian, secure_rng

__all__ = [
    "Histograms",
    "cfs_ga",
    "cfs_greedy",
    "count_histograms",
    "discretise",
    "entropy",
    "mask_ga",
    "merit",
    "noisy_entropies",
    "noisy_histograms",
    "run_feature_selection",
    "su_from_joint",
    "su_matrices",
]


@dataclass(frozen=True)
class Histograms:
    """Joint counts: fy[i] (bins_i × 2), ff[(i, j)] (bins_i × bins_j) for i < j."""

    fy: tuple[np.ndarray, ...]
    ff: dict[tuple[int, int], np.ndarray]


def discretise(data: TabularTrainingSet, layout: FeatureLayout) -> tuple[np.ndarray, np.ndarray]:
    """Codes (n, F) int64 and target codes (n,) from the encoded rows, by the public layout."""
    x = data.x.detach().cpu().numpy()
    codes = np.empty((x.shape[0], len(layout.columns)), dtype=np.int64)
    for i, c in enumerate(layout.columns):
        block = x[:, c.start : c.start + c.width]
        if c.categorical:
            codes[:, i] = np.argmax(block, axis=1)
        else:
            codes[:, i] = np.clip(np.floor(block[:, 0] * c.bins), 0, c.bins - 1)
    y = (data.y.detach().cpu().numpy() > 0.5).astype(np.int64)
    return codes, y


def _joint(a: np.ndarray, na: int, b: np.ndarray, nb: int) -> np.ndarray:
    return np.bincount(a * nb + b, minlength=na * nb).reshape(na, nb).astype(np.int64)


def count_histograms(codes: np.ndarray, y: np.ndarray, bins: list[int]) -> Histograms:
    f = len(bins)
    fy = tuple(_joint(codes[:, i], bins[i], y, 2) for i in range(f))
    ff = {
        (i, j): _joint(codes[:, i], bins[i], codes[:, j], bins[j])
        for i, j in combinations(range(f), 2)
    }
    return Histograms(fy=fy, ff=ff)


def one_cell_per_row(h: Histograms, *, rows: int, bins: list[int]) -> None:
    """The invariant the cells' charge rests on (ℓ2 sensitivity √H for H histograms):
    every row adds exactly one count to each histogram, whose shape is the public layout's.
    Checked on the real counts before any noise (worker/mechanisms/guards.py)."""
    parts = [(a, (b, 2)) for a, b in zip(h.fy, bins, strict=True)]
    parts += [(a, (bins[i], bins[j])) for (i, j), a in h.ff.items()]
    for counts, shape in parts:
        if counts.shape != shape or int(counts.min(initial=0)) < 0 or int(counts.sum()) != rows:
            raise GuardFailed("features cfs: a row is not in exactly one cell of a histogram")


def noisy_histograms(h: Histograms, *, scale: float, rng: np.random.Generator) -> Histograms:
    """Every cell + ⌊scale·Z + ½⌋ (exact integer sampler)."""

    def noisy(a: np.ndarray) -> np.ndarray:
        return a + rounded_gaussian(rng, scale=scale, size=a.size).reshape(a.shape)

    return Histograms(fy=tuple(noisy(a) for a in h.fy), ff={k: noisy(v) for k, v in h.ff.items()})


def entropy(counts: np.ndarray) -> float:
    """Plug-in entropy (nats) of (noisy) counts: negatives clamped to 0, normalised;
    0 for an all-zero histogram."""
    c = np.clip(np.asarray(counts, dtype=np.float64).ravel(), 0.0, None)
    total = c.sum()
    if total <= 0.0:
        return 0.0
    p = c[c > 0] / total
    return float(-(p * np.log(p)).sum())


def _entropies(joints: np.ndarray) -> np.ndarray:
    """(H(a), H(b), H(a, b)) per leading index of a stack of joints (R, na, nb): plug-in
    entropies of the clamped cells, marginals summed from them (as :func:`entropy`)."""
    j = np.clip(joints, 0.0, None)

    def h(c: np.ndarray) -> np.ndarray:
        c = c.reshape(c.shape[0], -1)
        total = c.sum(axis=1, keepdims=True)
        p = np.divide(c, total, out=np.zeros_like(c), where=total > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
        return -terms.sum(axis=1)

    return np.stack([h(j.sum(axis=2)), h(j.sum(axis=1)), h(j)], axis=1)


BOOTSTRAP_REPS = 64
"""Noise replicates per histogram for the bias correction of :func:`noisy_entropies`."""


def noisy_entropies(
    joint: np.ndarray, *, noise_scale: float | None, rng: np.random.Generator | None = None
) -> tuple[float, float, float]:
    """(H(a), H(b), H(a, b)) in nats from a noisy joint histogram.

    The plug-in entropy of noisy counts is biased (it is concave in the counts, and
    clamping negative counts to 0 adds mass to empty cells), and a joint, with many more
    cells than its marginals, is biased differently from them: the plug-in mutual
    information of a column with many levels came out too high (issue 10: native-country
    crept in at ε = 0.1). We correct each entropy by a parametric bootstrap of the noise,
    whose law is public: with Ĥ the plug-in value at the noisy counts ĉ and H̄ the mean plug-in value
    over ``BOOTSTRAP_REPS`` copies ĉ + Z*, Z* rounded N(0, noise_scale²) per cell, the
    estimate is 2Ĥ − H̄ (the bias of H at ĉ estimates the bias at the true counts; the
    first-order correction of Efron & Tibshirani 1993, ch. 10). It removes about half to
    two thirds of the bias of a many-level column's mutual information, not all of it
    (tests/unit/worker/test_feature_selection.py measures it); we have no exactly unbiased
    estimator (a second bootstrap level, i.e. SIMEX's quadratic extrapolation, removed a
    little more bias for more variance in our trials, and was not kept). Post-processing of the
    released noisy counts only: no privacy cost. ``noise_scale`` None: plug-in values
    (no noise, test-only ε = ∞). The bootstrap's randomness is not a privacy mechanism;
    it comes from ``rng`` (the worker passes its CSPRNG)."""
    c = np.asarray(joint, dtype=np.float64)
    plug = _entropies(c[None])[0]
    if noise_scale is None:
        return float(plug[0]), float(plug[1]), float(plug[2])
    gen = rng if rng is not None else np.random.default_rng()
    z = np.rint(gen.normal(0.0, noise_scale, size=(BOOTSTRAP_REPS, *c.shape)))
    again = _entropies(c[None] + z).mean(axis=0)
    out = np.maximum(2.0 * plug - again, 0.0)
    return float(out[0]), float(out[1]), float(out[2])


def su_from_joint(
    joint: np.ndarray, *, noise_scale: float | None = None, rng: np.random.Generator | None = None
) -> float:
    """SU(a, b) = 2·(H(a) + H(b) − H(a, b)) / (H(a) + H(b)) from one (noisy) joint, the
    entropies from :func:`noisy_entropies`; clipped to [0, 1]."""
    ha, hb, hab = noisy_entropies(joint, noise_scale=noise_scale, rng=rng)
    if ha + hb <= 0.0:
        return 0.0
    return float(np.clip(2.0 * (ha + hb - hab) / (ha + hb), 0.0, 1.0))


def su_matrices(
    h: Histograms, *, noise_scale: float | None = None, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """SU_fy (F,) and the symmetric SU_ff (F, F) (diagonal 1); ``noise_scale``: the cells'
    noise std, for the bias correction (None: plug-in, no noise)."""
    f = len(h.fy)
    fy = np.array([su_from_joint(a, noise_scale=noise_scale, rng=rng) for a in h.fy])
    ff = np.eye(f)
    for (i, j), a in h.ff.items():
        ff[i, j] = ff[j, i] = su_from_joint(a, noise_scale=noise_scale, rng=rng)
    return fy, ff


def merit(subset: np.ndarray | list[int], su_fy: np.ndarray, su_ff: np.ndarray) -> float:
    """k·mean SU_fy / sqrt(k + k(k − 1)·mean SU_ff); 0 for the empty set."""
    s = np.asarray(subset, dtype=np.int64)
    k = len(s)
    if k == 0:
        return 0.0
    r_fy = float(su_fy[s].mean())
    r_ff = 0.0 if k == 1 else float((su_ff[np.ix_(s, s)].sum() - k) / (k * (k - 1)))
    return k * r_fy / float(np.sqrt(k + k * (k - 1) * r_ff))


def cfs_greedy(su_fy: np.ndarray, su_ff: np.ndarray, *, max_size: int | None = None) -> list[int]:
    """Forward selection: add the feature that raises the merit most; stop when none
    raises it, or at ``max_size``. Ties: the lowest index."""
    chosen: list[int] = []
    best = 0.0
    limit = len(su_fy) if max_size is None else min(max_size, len(su_fy))
    while len(chosen) < limit:
        scores = [
            (merit([*chosen, i], su_fy, su_ff), -i) for i in range(len(su_fy)) if i not in chosen
        ]
        value, neg_i = max(scores)
        if value <= best:
            break
        chosen.append(-neg_i)
        best = value
    return sorted(chosen)


def mask_ga(
    fitness: Callable[[tuple[int, ...]], float],
    *,
    n: int,
    population: int,
    generations: int,
    mutation_rate: float,
    rng: np.random.Generator,
    max_size: int | None = None,
) -> tuple[tuple[int, ...], float, int]:
    """The product's GA (:func:`worker.mechanisms.search.genetic_search`) over non-empty
    subsets of range(n) (at most ``max_size``): random initial masks, uniform crossover,
    bit-flip mutation, each child repaired to a valid subset. Calls ``fitness`` exactly
    population × generations times. Returns (best subset, its fitness, calls)."""
    limit = n if max_size is None else min(max_size, n)

    def repair(m: np.ndarray) -> tuple[int, ...]:
        idx = np.flatnonzero(m)
        if len(idx) == 0:
            idx = np.array([int(rng.integers(n))])
        if len(idx) > limit:
            idx = np.sort(rng.choice(idx, size=limit, replace=False))
        return tuple(int(i) for i in idx)

    def as_mask(s: tuple[int, ...]) -> np.ndarray:
        m = np.zeros(n, dtype=bool)
        m[list(s)] = True
        return m

    def crossover(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
        # uniform crossover; the child may be empty or too large until mutate repairs it
        child = np.where(rng.random(n) < 0.5, as_mask(a), as_mask(b))
        return tuple(int(i) for i in np.flatnonzero(child))

    def mutate(child: tuple[int, ...]) -> tuple[int, ...]:
        return repair(as_mask(child) ^ (rng.random(n) < mutation_rate))

    best, value, history = genetic_search(
        sample=lambda: repair(rng.random(n) < 0.5),
        crossover=crossover,
        mutate=mutate,
        fitness=fitness,
        population=population,
        generations=generations,
        rng=rng,
    )
    return best, value, len(history)


def cfs_ga(
    su_fy: np.ndarray,
    su_ff: np.ndarray,
    *,
    population: int,
    generations: int,
    mutation_rate: float,
    rng: np.random.Generator,
    max_size: int | None = None,
) -> list[int]:
    best, _, _ = mask_ga(
        lambda s: merit(list(s), su_fy, su_ff),
        n=len(su_fy),
        population=population,
        generations=generations,
        mutation_rate=mutation_rate,
        rng=rng,
        max_size=max_size,
    )
    return sorted(best)


def _encoded_columns(layout: FeatureLayout, subset: tuple[int, ...]) -> list[int]:
    cols = [layout.columns[s] for s in subset]
    return [i for c in cols for i in range(c.start, c.start + c.width)]


def run_feature_selection(
    *,
    request: FeatureRequest,
    plan: SelectionPlan,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> SelectionOutput:
    layout = plan.features
    assert layout is not None
    rng = secure_rng()
    names = [c.name for c in layout.columns]
    ga = request.ga
    if request.method != "pafs":
        assert layout.cell_scale is not None
        codes, y = discretise(data, layout)
        counts = count_histograms(codes, y, [c.bins for c in layout.columns])
        one_cell_per_row(counts, rows=int(codes.shape[0]), bins=[c.bins for c in layout.columns])
        positive_finite("features cfs", cell_scale=layout.cell_scale)
        noisy = noisy_histograms(counts, scale=layout.cell_scale, rng=rng)
        del counts, codes, y
        progress(1, 2)
        su_fy, su_ff = su_matrices(noisy, noise_scale=layout.cell_scale, rng=rng)
        if request.method == "cfs_greedy":
            chosen = cfs_greedy(su_fy, su_ff, max_size=request.max_selected)
        else:
            chosen = cfs_ga(
                su_fy,
                su_ff,
                population=ga.population,
                generations=ga.generations,
                mutation_rate=ga.mutation_rate,
                rng=rng,
                max_size=request.max_selected,
            )
        progress(2, 2)
        selected = FeatureCandidate(method=request.method, features=tuple(names[i] for i in chosen))
        final = request.final
        if final is None:
            return SelectionOutput(selected, None, None, None, trainings=0)
        assert layout.training_key is not None
        cols = torch.as_tensor(_encoded_columns(layout, tuple(chosen)), device=data.x.device)
        mech = candidate_mechanism(
            plan,
            key=layout.training_key,
            parameters=parameter_count(final.model, len(cols)),
            learning_rate=final.training.learning_rate,
        )
        out = run_dpsgd(
            spec=final.model,
            mechanism=mech,
            samples=1,
            data=TabularTrainingSet(data.x[:, cols], data.y, None),
            device=device,
            progress=lambda a, b: None,
        )
        return SelectionOutput(
            selected, final.model.model_dump(), out.releases[0], None, trainings=1
        )

    # PAFS
    assert request.budget is not None and layout.training_key is not None
    key, fitness_epsilon = layout.training_key, request.budget.fitness_epsilon
    train, val = split_rows(data, validation_fraction=request.budget.validation_fraction, rng=rng)
    total = plan.trainings or 0
    models: dict[tuple[int, ...], dict[str, torch.Tensor]] = {}
    done = 0

    def fitness(subset: tuple[int, ...]) -> float:
        nonlocal done
        cols = torch.as_tensor(_encoded_columns(layout, subset), device=train.x.device)
        tr = TabularTrainingSet(train.x[:, cols], train.y, None)
        va = TabularTrainingSet(val.x[:, cols], val.y, None)
        mech = candidate_mechanism(
            plan,
            key=key,
            parameters=parameter_count(request.model, len(cols)),
            learning_rate=request.training.learning_rate,
        )
        weights, score = train_and_score(
            spec=request.model,
            mechanism=mech,
            train=tr,
            val=va,
            n_val_public=plan.n_val,
            fitness_epsilon=fitness_epsilon,
            device=device,
            rng=rng,
        )
        models[subset] = weights
        done += 1
        progress(done, total)
        return score

    best, value, calls = mask_ga(
        fitness,
        n=len(names),
        population=ga.population,
        generations=ga.generations,
        mutation_rate=ga.mutation_rate,
        rng=rng,
        max_size=request.max_selected,
    )
    return SelectionOutput(
        selected=FeatureCandidate(method="pafs", features=tuple(names[i] for i in sorted(best))),
        model=request.model.model_dump(),
        weights=models[best],
        noisy_accuracy=value,
        trainings=calls,
    )
