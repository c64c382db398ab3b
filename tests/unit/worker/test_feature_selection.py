"""The ``features`` selection kind, worker side: the histograms' sensitivity (what the
plan's √H rests on), the noisy entropy estimator's bias and spread against ε, CFS-Greedy
against exhaustive search and the GA against the planted optimum (noise-free SU matrices:
pure functions, not reachable from the API), and whole runs on small synthetic data."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import torch

from service.datasets.tabular import parse_schema
from service.modelspec import MlpSpec
from service.schemas import DpsgdOptions
from service.selection.budget import SelectionBudget
from service.selection.features import FeatureGa, FeatureRequest, histogram_count
from service.selection.plans import plan_selection
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.feature_selection import (
    cfs_ga,
    cfs_greedy,
    count_histograms,
    discretise,
    entropy,
    mask_ga,
    merit,
    noisy_entropies,
    noisy_histograms,
    su_matrices,
)
from worker.mechanisms.model_selection import released_summary, run_selection

SCHEMA = parse_schema(
    {
        "name": "toy",
        "target": {"column": "y", "positive": ["1"], "negative": ["0"]},
        "columns": [
            {"name": "signal", "type": "numeric", "min": 0, "max": 1},
            {"name": "kind", "type": "categorical", "levels": ["a", "b", "c"]},
            {"name": "noise", "type": "numeric", "min": 0, "max": 1},
            {"name": "junk", "type": "categorical", "levels": ["u", "v"]},
            {"name": "copy", "type": "numeric", "min": 0, "max": 1},
        ],
    }
)


def _toy(n: int, seed: int = 0) -> TabularTrainingSet:
    """y depends on ``signal`` and ``kind``; ``copy`` duplicates ``signal``; ``noise`` and
    ``junk`` are independent of everything. Encoded as the schema encodes (numeric in
    [0, 1], categorical one-hot)."""
    rng = np.random.default_rng(seed)
    signal = rng.random(n)
    kind = rng.integers(3, size=n)
    logit = 6.0 * (signal - 0.5) + 2.0 * (kind == 2) - 2.0 * (kind == 0)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    x = np.column_stack(
        [
            signal,
            np.eye(3)[kind],
            rng.random(n),
            np.eye(2)[rng.integers(2, size=n)],
            signal,
        ]
    ).astype(np.float32)
    assert x.shape[1] == SCHEMA.n_features
    return TabularTrainingSet(torch.from_numpy(x), torch.from_numpy(y))


def _plan(request: FeatureRequest, n: int):  # type: ignore[no-untyped-def]
    return plan_selection(
        "features", request, dataset="toy", n_rows=n, n_features=SCHEMA.n_features, schema=SCHEMA
    )


def test_one_row_moves_every_histogram_by_exactly_one_cell() -> None:
    """The plan's ℓ2 sensitivity √H: removing a row changes H cells by 1, nothing else."""
    data = _toy(300)
    plan = _plan(FeatureRequest(epsilon=1.0, delta=1e-6), 300)
    assert plan.features is not None
    bins = [c.bins for c in plan.features.columns]
    codes, y = discretise(data, plan.features)
    full = count_histograms(codes, y, bins)
    for row in (0, 17, 299):
        keep = np.arange(300) != row
        less = count_histograms(codes[keep], y[keep], bins)
        diff = np.concatenate(
            [(a - b).ravel() for a, b in zip(full.fy, less.fy, strict=True)]
            + [(full.ff[k] - less.ff[k]).ravel() for k in full.ff]
        )
        assert set(np.unique(diff).tolist()) == {0, 1}
        assert int(diff.sum()) == plan.features.histograms == histogram_count(5)
        assert float(np.linalg.norm(diff)) == pytest.approx(np.sqrt(histogram_count(5)))
    assert sum(a.size for a in full.fy) + sum(a.size for a in full.ff.values()) == (
        plan.features.cells
    )


def test_discretise_uses_the_public_bins_and_levels() -> None:
    data = _toy(50)
    plan = _plan(FeatureRequest(epsilon=1.0, delta=1e-6, numeric_bins=4), 50)
    assert plan.features is not None
    codes, y = discretise(data, plan.features)
    x = data.x.numpy()
    assert np.array_equal(codes[:, 0], np.minimum(np.floor(x[:, 0] * 4), 3).astype(int))
    assert np.array_equal(codes[:, 1], np.argmax(x[:, 1:4], axis=1))
    assert codes[:, 1].max() <= 2 and codes[:, 0].max() <= 3
    assert np.array_equal(y, data.y.numpy().astype(int))


def test_noisy_entropy_bias_and_spread_shrink_as_epsilon_grows() -> None:
    """Noisy counts are unbiased; the plug-in entropy of clamped noisy counts is not. We
    quantify its bias and spread at the plan's σ for ε = 0.1, 1, 10 (H of a 5-column
    schema, n = 2000 rows in a 8 × 2 joint): both shrink with ε, and at ε = 10 the bias is
    below 0.01 nats."""
    rng = np.random.default_rng(1)
    truth = rng.multinomial(2000, np.linspace(1.0, 3.0, 16) / np.linspace(1.0, 3.0, 16).sum())
    joint = truth.reshape(8, 2)
    h_true = entropy(joint)
    bias, spread = [], []
    for eps in (0.1, 1.0, 10.0):
        plan = _plan(FeatureRequest(epsilon=eps, delta=1e-6), 2000)
        assert plan.features is not None and plan.features.cell_scale is not None
        scale = plan.features.cell_scale
        draws = np.array(
            [entropy(noisy_histograms(_one(joint), scale=scale, rng=rng).fy[0]) for _ in range(300)]
        )
        err = draws - h_true
        bias.append(abs(float(err.mean())))
        spread.append(float(err.std()))
        # the noisy counts themselves are unbiased (mean of the noise ≈ 0)
        noise = np.concatenate(
            [noisy_histograms(_one(joint), scale=scale, rng=rng).fy[0] - joint for _ in range(50)]
        )
        assert abs(float(noise.mean())) < 5.0 * scale / np.sqrt(noise.size)
    assert bias[0] > bias[1] > bias[2] and spread[0] > spread[1] > spread[2]
    assert bias[2] < 0.01


def test_bootstrap_correction_removes_most_of_the_noisy_mutual_informations_bias() -> None:
    """The issue asks for unbiased noisy entropy estimates. What we reach, measured here: a
    40-level column weakly tied to y (n = 30,000, true MI ≈ 0.002 nats) at the plan's σ;
    over 80 noise draws the plug-in MI of the noisy joint is too high (the issue's
    many-level bias: ≈ 0.06 nats at ε = 0.1, ≈ 0.003 at ε = 1); the bootstrap-corrected MI
    keeps under half of that bias (measured 0.03 and 0.001: about 35–55 %), so it is
    less biased but NOT unbiased, and its spread shrinks as ε grows."""
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.full(40, 0.5))
    counts = rng.multinomial(30_000, p)
    pos = rng.binomial(counts, 0.3 + 0.1 * rng.random(40))
    joint = np.stack([counts - pos, pos], axis=1)

    def mi(h: tuple[float, float, float]) -> float:
        return h[0] + h[1] - h[2]

    truth = mi(noisy_entropies(joint, noise_scale=None))
    spreads = []
    for eps in (0.1, 1.0, 10.0):
        plan = _plan(FeatureRequest(epsilon=eps, delta=1e-6), 30_000)
        assert plan.features is not None and plan.features.cell_scale is not None
        scale = plan.features.cell_scale
        plug, corr = [], []
        for _ in range(80):
            noisy = noisy_histograms(_one(joint), scale=scale, rng=rng).fy[0]
            plug.append(mi(noisy_entropies(noisy, noise_scale=None)))
            corr.append(mi(noisy_entropies(noisy, noise_scale=scale, rng=rng)))
        plug_bias = float(np.mean(plug)) - truth
        corr_bias = float(np.mean(corr)) - truth
        se = float(np.std(corr)) / np.sqrt(len(corr))
        spreads.append(float(np.std(corr)))
        if eps < 10.0:
            assert plug_bias > 10 * se  # the plug-in's bias is real, not sampling error
            assert abs(corr_bias) < 0.6 * plug_bias
    assert spreads[0] > spreads[1] > spreads[2]


def _one(joint: np.ndarray):  # type: ignore[no-untyped-def]
    from worker.mechanisms.feature_selection import Histograms

    return Histograms(fy=(joint,), ff={})


def _exhaustive(su_fy: np.ndarray, su_ff: np.ndarray) -> list[int]:
    """Test-only: the merit-maximising subset by enumeration (ties: the first found)."""
    f = len(su_fy)
    best: tuple[float, list[int]] = (-1.0, [])
    for k in range(1, f + 1):
        for s in combinations(range(f), k):
            m = merit(list(s), su_fy, su_ff)
            if m > best[0] + 1e-12:
                best = (m, list(s))
    return best[1]


def _exact_su(data: TabularTrainingSet) -> tuple[np.ndarray, np.ndarray]:
    plan = _plan(FeatureRequest(epsilon=1.0, delta=1e-6), data.n)
    assert plan.features is not None
    codes, y = discretise(data, plan.features)
    return su_matrices(count_histograms(codes, y, [c.bins for c in plan.features.columns]))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_greedy_equals_exhaustive_without_noise(seed: int) -> None:
    su_fy, su_ff = _exact_su(_toy(4000, seed))
    greedy, best = cfs_greedy(su_fy, su_ff), _exhaustive(su_fy, su_ff)
    # ``copy`` duplicates ``signal``: their SU agree up to rounding, so the optimum is
    # tied; the merit must agree, and the sets up to that swap.
    assert merit(greedy, su_fy, su_ff) == pytest.approx(merit(best, su_fy, su_ff), abs=1e-12)
    assert {({4: 0}).get(i, i) for i in greedy} == {({4: 0}).get(i, i) for i in best}
    assert 2 not in cfs_greedy(su_fy, su_ff) and 3 not in cfs_greedy(su_fy, su_ff)


def test_greedy_equals_exhaustive_on_small_planted_su_matrices() -> None:
    """Random 'planted' problems: r relevant, mutually weakly correlated features and
    redundant near-copies; noise-free SU; 6 features."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        f = 6
        su_fy = rng.uniform(0.0, 0.05, f)
        relevant = rng.choice(f, size=3, replace=False)
        su_fy[relevant] = rng.uniform(0.2, 0.5, 3)
        su_ff = rng.uniform(0.0, 0.05, (f, f))
        su_ff = (su_ff + su_ff.T) / 2
        a, b = relevant[:2]
        su_ff[a, b] = su_ff[b, a] = 0.9  # one redundant pair
        np.fill_diagonal(su_ff, 1.0)
        assert cfs_greedy(su_fy, su_ff) == _exhaustive(su_fy, su_ff)


def test_greedy_respects_the_public_max_size() -> None:
    su_fy, su_ff = _exact_su(_toy(4000))
    assert len(cfs_greedy(su_fy, su_ff, max_size=1)) == 1


def test_ga_finds_the_planted_optimum_and_calls_fitness_as_planned() -> None:
    su_fy, su_ff = _exact_su(_toy(4000))
    target = _exhaustive(su_fy, su_ff)
    calls = 0

    def fit(s: tuple[int, ...]) -> float:
        nonlocal calls
        calls += 1
        return merit(list(s), su_fy, su_ff)

    best, _, n = mask_ga(
        fit,
        n=5,
        population=8,
        generations=6,
        mutation_rate=0.2,
        rng=np.random.default_rng(3),
    )
    assert merit(list(best), su_fy, su_ff) == pytest.approx(merit(target, su_fy, su_ff), abs=1e-12)
    assert n == calls == 48
    chosen = cfs_ga(
        su_fy, su_ff, population=8, generations=6, mutation_rate=0.2, rng=np.random.default_rng(4)
    )
    assert merit(chosen, su_fy, su_ff) == pytest.approx(merit(target, su_fy, su_ff), abs=1e-12)


@pytest.mark.parametrize("method", ["cfs_greedy", "cfs_ga"])
def test_worker_run_selects_the_relevant_features_at_large_epsilon(method: str) -> None:
    data = _toy(4000)
    request = FeatureRequest(method=method, epsilon=20.0, delta=1e-6)  # type: ignore[arg-type]
    plan = _plan(request, 4000)
    seen: list[tuple[int, int]] = []
    out = run_selection(
        request,
        plan,
        data=data,
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    summary = released_summary(out)
    features = set(summary["selected"]["features"])  # type: ignore[index]
    assert "kind" in features and features & {"signal", "copy"}
    assert not features & {"noise", "junk"}
    assert summary["model"] is None and summary["noisy_validation_accuracy"] is None
    assert seen == [(1, 2), (2, 2)]  # fixed progress: nothing data-dependent


def test_pafs_trains_population_times_generations_and_releases_a_noisy_score() -> None:
    data = _toy(600)
    request = FeatureRequest(
        method="pafs",
        ga=FeatureGa(population=2, generations=2),
        model=MlpSpec(hidden=[4]),
        training=DpsgdOptions(epochs=1, learning_rate=1.0),
        budget=SelectionBudget(training_epsilon=2.0, training_delta=1e-6, fitness_epsilon=0.5),
    )
    plan = _plan(request, 600)
    assert plan.trainings == 4
    seen: list[tuple[int, int]] = []
    out = run_selection(
        request,
        plan,
        data=data,
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    assert out.trainings == 4 and seen == [(i, 4) for i in range(1, 5)]
    summary = released_summary(out)
    names = summary["selected"]["features"]  # type: ignore[index]
    assert set(names) <= {c.name for c in SCHEMA.columns} and names
    assert isinstance(summary["noisy_validation_accuracy"], float)
    assert out.weights is not None
    widths = {"signal": 1, "kind": 3, "noise": 1, "junk": 2, "copy": 1}
    first = next(v for k, v in out.weights.items() if k.endswith("weight"))
    assert first.shape[1] == sum(widths[n] for n in names)


def test_cfs_with_a_final_model_trains_it_on_the_selected_columns() -> None:
    from service.selection.features import FinalTraining

    data = _toy(800)
    request = FeatureRequest(
        epsilon=20.0,
        delta=1e-6,
        final=FinalTraining(
            epsilon=2.0,
            delta=1e-6,
            model=MlpSpec(hidden=[4]),
            training=DpsgdOptions(epochs=1, learning_rate=1.0),
        ),
    )
    plan = _plan(request, 800)
    out = run_selection(
        request, plan, data=data, device=torch.device("cpu"), progress=lambda a, b: None
    )
    summary = released_summary(out)
    names = summary["selected"]["features"]  # type: ignore[index]
    assert summary["model"] == MlpSpec(hidden=[4]).model_dump() and out.weights is not None
    widths = {"signal": 1, "kind": 3, "noise": 1, "junk": 2, "copy": 1}
    first = next(v for k, v in out.weights.items() if k.endswith("weight"))
    assert first.shape == (4, sum(widths[n] for n in names))
