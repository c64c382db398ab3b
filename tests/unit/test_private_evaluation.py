"""Private evaluation (issue 21): the stated sensitivities hold on enumerated and sampled
neighbours (and AUC's is attained), the intervals cover the population values over many
holdouts and noise draws, and an empirical distinguisher cannot show more ε than the
plan charges. Statistics: service/privacy/evaluation.py; mechanism:
worker/mechanisms/evaluation.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from service.privacy.audit import clopper_pearson_upper, threshold_bound
from service.privacy.evaluation import (
    ECE_GRID,
    LOG_LOSS_GRID,
    EvaluationPlan,
    auc_sensitivity,
    noise_tail,
    plan_evaluation,
    split_budget,
)
from service.privacy.evaluation_intervals import (
    Interval,
    auc_interval,
    bounded_mean_interval,
    calibration_error_interval,
    proportion_interval,
)
from worker.mechanisms.evaluation import (
    auc_exact,
    auc_twice_u,
    confusion_counts,
    correct_count,
    ece_units,
    evaluate,
    log_loss_units,
    probability_matrix,
)
from worker.noise import discrete_laplace, rounded_gaussian

# ------------------------------------------------------------------ (a) sensitivities


def _twice_u_brute(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(2U_k)_k by the definition, pair by pair (binary: (2U,) of column 1), written here
    rather than taken from the worker."""
    k = p.shape[1]
    problems = [1] if k == 2 else list(range(k))
    out = []
    for c in problems:
        total = 0
        for i in range(len(y)):
            for j in range(len(y)):
                if y[i] == c and y[j] != c:
                    total += 2 if p[i, c] > p[j, c] else 1 if p[i, c] == p[j, c] else 0
        out.append(total)
    return np.array(out, dtype=np.int64)


def test_binary_twice_u_sensitivity_holds_on_every_neighbour_and_is_attained() -> None:
    """Every holdout of n = 4 rows with scores in {0, ½, 1} (ties) and either label, and
    every replacement of one row (score and label): |Δ2U| ≤ 2(n − 1) = 6, attained; the
    worker's statistic equals the pairwise definition throughout."""
    n = 4
    bound, _ = auc_sensitivity(n=n, classes=2)
    assert bound == 2 * (n - 1)
    options = [(s, c) for s in (0.0, 0.5, 1.0) for c in (0, 1)]
    worst = 0
    for rows in itertools.product(options, repeat=n):
        p = probability_matrix(np.array([r[0] for r in rows]), classes=2)
        y = np.array([r[1] for r in rows], dtype=np.int64)
        base = int(auc_twice_u(p, y)[0])
        assert base == int(_twice_u_brute(p, y)[0])
        for i, (s, c) in itertools.product(range(n), options):
            p2, y2 = p.copy(), y.copy()
            p2[i] = (1.0 - s, s)
            y2[i] = c
            worst = max(worst, abs(int(auc_twice_u(p2, y2)[0]) - base))
    assert worst == bound


@pytest.mark.parametrize("n", [2, 5, 9])
def test_binary_twice_u_sensitivity_on_random_and_adversarial_holdouts(n: int) -> None:
    """Random float scores (and coarse ones, with ties) on holdouts of size n, every
    neighbour from a pool of replacement rows that includes the extremes; then the
    adversarial pair (one positive among n − 1 negatives, moved from top to bottom) attains
    2(n − 1)."""
    rng = np.random.default_rng(n)
    bound, _ = auc_sensitivity(n=n, classes=2)
    pool = [(s, c) for s in (0.0, 1.0, 0.5, *rng.random(3)) for c in (0, 1)]
    for trial in range(40):
        s = rng.random(n) if trial % 2 else rng.choice([0.0, 0.5, 1.0], n)
        y = rng.integers(0, 2, n)
        p = probability_matrix(s, classes=2)
        base = int(auc_twice_u(p, y)[0])
        for i, (v, c) in itertools.product(range(n), pool):
            p2, y2 = p.copy(), y.copy()
            p2[i] = (1.0 - v, v)
            y2[i] = c
            assert abs(int(auc_twice_u(p2, y2)[0]) - base) <= bound
    y = np.r_[1, np.zeros(n - 1, np.int64)]
    top = probability_matrix(np.r_[1.0, np.full(n - 1, 0.5)], classes=2)
    bottom = probability_matrix(np.r_[0.0, np.full(n - 1, 0.5)], classes=2)
    assert int(auc_twice_u(top, y)[0]) - int(auc_twice_u(bottom, y)[0]) == bound


def test_macro_twice_u_sensitivity_holds_and_is_attained() -> None:
    """K = 3: (2U_k)_k changes by at most 6(n − 1) in L1 and 2√3(n − 1) in L2 on every
    neighbour from a pool (each label, extreme and tied score vectors) of random holdouts
    of n = 5 (scores not summing to one: the bound is for any scores in [0, 1]); the L1
    bound is attained by the proof's pair."""
    k, n = 3, 5
    l1, l2 = auc_sensitivity(n=n, classes=k)
    assert (l1, l2) == (6 * (n - 1), pytest.approx(2 * math.sqrt(3) * (n - 1)))
    levels = [0.0, 0.5, 1.0]
    pool = [(np.array(v), c) for v in itertools.product(levels, repeat=k) for c in range(k)]
    rng = np.random.default_rng(3)
    worst1, worst2 = 0, 0.0
    for _ in range(60):
        y = rng.integers(0, k, n)
        p = rng.choice(levels, size=(n, k))
        base = auc_twice_u(p, y)
        assert np.array_equal(base, _twice_u_brute(p, y))
        for i, (v, c) in itertools.product(range(n), pool):
            p2, y2 = p.copy(), y.copy()
            p2[i], y2[i] = v, c
            d = auc_twice_u(p2, y2) - base
            worst1 = max(worst1, int(np.abs(d).sum()))
            worst2 = max(worst2, float(np.sqrt((d.astype(float) ** 2).sum())))
    assert worst1 <= l1 and worst2 <= l2 + 1e-9
    # The row alone in class 0, the others in class 2; s_0, s_2 top -> bottom, s_1 up.
    y = np.r_[0, np.full(n - 1, 2)]
    rest = np.full((n - 1, k), 0.5)
    before = np.vstack([[1.0, 0.0, 1.0], rest])
    after = np.vstack([[0.0, 1.0, 0.0], rest])
    y_after = np.r_[1, np.full(n - 1, 2)]
    assert int(np.abs(auc_twice_u(after, y_after) - auc_twice_u(before, y)).sum()) == l1


@pytest.mark.parametrize("classes", [2, 3])
def test_count_and_sum_sensitivities_hold_on_sampled_neighbours(classes: int) -> None:
    """Accuracy (1), confusion (L1 2), log loss (G) and calibration error (2G) in grid
    units, with extreme and non-finite probabilities among the rows."""
    rng = np.random.default_rng(7 + classes)
    special = [0.0, 1.0, 1e-9, 1 - 1e-9, math.nan, 0.5]

    def row() -> np.ndarray:
        r = rng.random(classes) if classes > 2 else rng.random(1)
        if rng.random() < 0.3:
            r[int(rng.integers(r.size))] = special[int(rng.integers(len(special)))]
        return r

    def stats(p_raw: np.ndarray, y: np.ndarray) -> tuple[int, np.ndarray, int, int]:
        p = probability_matrix(p_raw[:, 0] if classes == 2 else p_raw, classes=classes)
        return (
            correct_count(p, y),
            confusion_counts(p, y),
            log_loss_units(p, y, p_min=1e-4),
            ece_units(p, y, bins=10),
        )

    worst_ll = 0
    for _ in range(120):
        n = 8
        p_raw = np.stack([row() for _ in range(n)])
        y = rng.integers(0, classes, n)
        a = stats(p_raw, y)
        for _ in range(15):
            i = int(rng.integers(n))
            p2, y2 = p_raw.copy(), y.copy()
            p2[i] = row()
            y2[i] = rng.integers(0, classes)
            b = stats(p2, y2)
            assert abs(a[0] - b[0]) <= 1
            assert int(np.abs(a[1] - b[1]).sum()) <= 2
            assert abs(a[2] - b[2]) <= LOG_LOSS_GRID
            assert abs(a[3] - b[3]) <= 2 * ECE_GRID
            worst_ll = max(worst_ll, abs(a[2] - b[2]))
    assert worst_ll >= LOG_LOSS_GRID - 1  # the clip range is reached: the bound is tight


def test_budget_split_sums_to_the_charge() -> None:
    metrics = ["accuracy", "auc", "log_loss", "calibration_error", "confusion"]
    lap = split_budget(metrics=metrics, epsilon=1.0, delta=1e-6, noise="laplace")  # type: ignore[arg-type]
    assert math.isclose(sum(s.epsilon for s in lap.values()), 1.0)
    assert all(s.delta == 0.0 for s in lap.values())  # Laplace: all pure, AUC included
    gau = split_budget(metrics=metrics, epsilon=1.0, delta=1e-6, noise="gaussian")  # type: ignore[arg-type]
    assert math.isclose(sum(s.delta for s in gau.values()), 1e-6)
    with pytest.raises(ValueError, match="delta > 0"):
        split_budget(metrics=["auc"], epsilon=1.0, delta=0.0, noise="gaussian")
    plan = plan_evaluation(
        metrics=metrics,  # type: ignore[arg-type]
        n=100,
        classes=2,
        epsilon=1.0,
        delta=1e-6,
        noise="laplace",
    )
    assert math.isclose(plan.epsilon, 1.0) and plan.delta == 0.0
    assert plan.metric("accuracy").scale == pytest.approx(5.0)  # Δ/ε = 1/(1/5)


def test_noise_tail_is_a_tail_bound() -> None:
    """Exact tails: discrete Laplace 2e^{−(t+1)/b}/(1+e^{−1/b}); rounded Gaussian
    P(|Z| ≥ (t+½)/σ)."""
    for b in (0.7, 3.0, 40.0):
        for p in (0.1, 1e-3, 1e-9):
            t = noise_tail(noise="laplace", scale=b, probability=p)
            assert 2 * math.exp(-(t + 1) / b) / (1 + math.exp(-1 / b)) <= p
    for s in (1.0, 5.0, 300.0):
        for p in (0.1, 1e-3, 1e-9):
            t = noise_tail(noise="gaussian", scale=s, probability=p)
            assert math.erfc((t + 0.5) / (s * math.sqrt(2))) <= p


# ------------------------------------------------------------------ (b) coverage

# A discrete population: x in five levels with P(x), P(y = 1 | x) and the model's p(x);
# every population metric is an exact finite sum.
_PX = np.array([0.15, 0.25, 0.2, 0.25, 0.15])
_RX = np.array([0.1, 0.3, 0.45, 0.7, 0.85])
_PMODEL = np.array([0.05, 0.35, 0.4, 0.65, 0.97])


def _population_binary(p_min: float, bins: int) -> dict[str, float]:
    px, rx, pm = _PX, _RX, _PMODEL
    acc = float(np.sum(px * np.where(pm > 0.5, rx, 1 - rx)))
    f1 = px * rx / np.sum(px * rx)
    f0 = px * (1 - rx) / np.sum(px * (1 - rx))
    auc = sum(
        f1[i] * f0[j] * (1.0 if pm[i] > pm[j] else 0.5 if pm[i] == pm[j] else 0.0)
        for i in range(5)
        for j in range(5)
    )
    pc = np.clip(pm, p_min, 1 - p_min)
    ll = float(np.sum(px * (rx * -np.log(pc) + (1 - rx) * -np.log(1 - pc))))
    b = np.minimum((pm * bins).astype(int), bins - 1)
    ece = float(sum(abs(np.sum((px * (rx - pm))[b == k])) for k in range(bins)))
    return {"accuracy": acc, "auc": float(auc), "log_loss": ll, "calibration_error": ece}


def _draw_binary(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.choice(5, size=n, p=_PX)
    y = (rng.random(n) < _RX[x]).astype(np.int64)
    return _PMODEL[x], y


def _inside(value: float, interval: Interval) -> bool:
    return interval.lower <= value <= interval.upper


def _assert_coverage(covered: int, runs: int, level: float) -> None:
    """Coverage is not shown to be below the level: the one-sided 99.9% Clopper–Pearson
    upper bound of the observed coverage reaches it."""
    assert clopper_pearson_upper(successes=covered, trials=runs, alpha=1e-3) >= level, (
        covered,
        runs,
    )


@pytest.mark.parametrize(("noise", "runs"), [("laplace", 250), ("gaussian", 150)])
def test_intervals_cover_the_population_binary(noise: str, runs: int) -> None:
    truth = _population_binary(1e-4, 10)
    pi_cells = {
        (i, j): float(
            np.sum(_PX * np.where(_PMODEL > 0.5, j == 1, j == 0) * (_RX if i == 1 else 1 - _RX))
        )
        for i in (0, 1)
        for j in (0, 1)
    }
    plan = plan_evaluation(
        metrics=["accuracy", "auc", "log_loss", "calibration_error", "confusion"],
        n=300,
        classes=2,
        epsilon=4.0,
        delta=1e-6,
        noise=noise,  # type: ignore[arg-type]
        confidence=0.9,
    )
    rng = np.random.default_rng(2021)
    covered = dict.fromkeys([*truth, "confusion"], 0)
    for _ in range(runs):
        p, y = _draw_binary(rng, plan.n)
        r = evaluate(plan=plan, probabilities=p, labels=y)
        assert r.accuracy and r.auc and r.log_loss and r.calibration_error and r.confusion
        covered["accuracy"] += _inside(truth["accuracy"], r.accuracy.interval)
        covered["auc"] += _inside(truth["auc"], r.auc.interval)
        covered["log_loss"] += _inside(truth["log_loss"], r.log_loss.interval)
        covered["calibration_error"] += _inside(
            truth["calibration_error"], r.calibration_error.interval
        )
        covered["confusion"] += _inside(pi_cells[(1, 0)], r.confusion.intervals[1][0])
    for _name, c in covered.items():
        _assert_coverage(c, runs, plan.confidence)


def test_intervals_cover_the_population_three_classes() -> None:
    """K = 3 (accuracy, log loss, top-label calibration error): five score levels, each
    with a class distribution and a model probability vector."""
    px = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    rx = np.array(
        [[0.7, 0.2, 0.1], [0.2, 0.6, 0.2], [0.1, 0.2, 0.7], [0.4, 0.4, 0.2], [0.3, 0.3, 0.4]]
    )
    pm = np.array(
        [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6], [0.5, 0.3, 0.2], [0.3, 0.3, 0.4]]
    )
    top = pm.argmax(1)
    acc = float(np.sum(px * rx[np.arange(5), top]))
    pc = np.clip(pm, 1e-4, 1 - 1e-4)
    ll = float(np.sum(px * np.sum(rx * -np.log(pc), axis=1)))
    conf = pm.max(1)
    b = np.minimum((conf * 10).astype(int), 9)
    ece = sum(abs(np.sum((px * (rx[np.arange(5), top] - conf))[b == k])) for k in range(10))
    plan = plan_evaluation(
        metrics=["accuracy", "log_loss", "calibration_error"],
        n=300,
        classes=3,
        epsilon=3.0,
        delta=0.0,
        noise="laplace",
        confidence=0.9,
    )
    rng = np.random.default_rng(3)
    runs = 250
    hits = [0, 0, 0]
    for _ in range(runs):
        x = rng.choice(5, size=plan.n, p=px)
        u = rng.random(plan.n)[:, None]
        y = (u > np.cumsum(rx[x], axis=1)).sum(axis=1)
        r = evaluate(plan=plan, probabilities=pm[x], labels=y)
        assert r.accuracy and r.log_loss and r.calibration_error
        hits[0] += _inside(acc, r.accuracy.interval)
        hits[1] += _inside(ll, r.log_loss.interval)
        hits[2] += _inside(ece, r.calibration_error.interval)
    for h in hits:
        _assert_coverage(h, runs, plan.confidence)


# Exact law of the released count X = C + N for the tests below, written from the noise's
# closed forms here (not from the module's code): discrete Laplace p(k) = (1 − r)/(1 + r)·
# r^|k|, r = e^{−1/b}; rounded Gaussian p(k) = Φ((k + ½)/σ) − Φ((k − ½)/σ).
def _noise_law(noise: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    reach = math.ceil(60 * scale) + 5
    k = np.arange(-reach, reach + 1)
    if noise == "laplace":
        r = math.exp(-1 / scale)
        return k, (1 - r) / (1 + r) * r ** np.abs(k)
    return k, stats.norm.cdf((k + 0.5) / scale) - stats.norm.cdf((k - 0.5) / scale)


def _count_law(pi: float, n: int, noise: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    k, q = _noise_law(noise, scale)
    mass = np.convolve(stats.binom.pmf(np.arange(n + 1), n, pi), q)
    return np.arange(mass.size) + k[0], mass


def _scalar_plan(noise: str, epsilon: float) -> EvaluationPlan:
    """The benchmark's plan (benchmarks/private_evaluation.py): the four scalar metrics of a
    binary holdout of n = 300 at (ε, 1e-6), nominal level 0.90."""
    return plan_evaluation(
        metrics=["accuracy", "auc", "log_loss", "calibration_error"],
        n=300,
        classes=2,
        epsilon=epsilon,
        delta=1e-6,
        noise=noise,  # type: ignore[arg-type]
        confidence=0.9,
    )


class _Intervals:
    """proportion_interval for one (n, noise, scale, level), memoised on the noisy count
    (the interval is a function of it alone)."""

    def __init__(self, n: int, noise: str, scale: float, confidence: float) -> None:
        self.n, self.noise, self.scale, self.confidence = n, noise, scale, confidence
        self.table: dict[int, Interval] = {}

    def __call__(self, x: int) -> Interval:
        if x not in self.table:
            self.table[x] = proportion_interval(
                noisy_count=x,
                trials=self.n,
                noise=self.noise,  # type: ignore[arg-type]
                scale=self.scale,
                confidence=self.confidence,
            )
        return self.table[x]

    def exact_coverage(self, pi: float) -> tuple[float, float]:
        """P_π(π ∈ interval(X)) and E_π[width], summed over every x of mass > 1e-13 (the
        dropped mass is at most 1e-13 per value: < 1e-9 in these tests)."""
        xs, mass = _count_law(pi, self.n, self.noise, self.scale)
        keep = mass > 1e-13
        cover = width = 0.0
        for x, m in zip(xs[keep], mass[keep], strict=True):
            iv = self(int(x))
            cover += m * _inside(pi, iv)
            width += m * (iv.upper - iv.lower)
        return cover, width


@pytest.mark.parametrize(("noise", "scale"), [("laplace", 2.0), ("gaussian", 3.0)])
def test_proportion_interval_is_valid_for_every_proportion(noise: str, scale: float) -> None:
    """Exact coverage (no simulation) over a grid of π, n = 40: never below the level (the
    Clopper–Pearson guarantee of the inversion), and on average within 3 points of it: at
    this small n the count’s discreteness is the slack (measured means 0.918 and 0.925; the
    union bound it replaces covered ≥ 0.98 at a nominal 0.90)."""
    intervals = _Intervals(40, noise, scale, 0.9)
    grid = np.linspace(0.005, 0.995, 45)
    covers = [intervals.exact_coverage(float(pi))[0] for pi in grid]
    assert min(covers) >= 0.9 - 1e-10, min(covers)
    assert float(np.mean(covers)) <= 0.93, float(np.mean(covers))


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_accuracy_interval_coverage_is_within_a_point_of_the_level(noise: str) -> None:
    """The benchmark's accuracy release (n = 300, four metrics at ε = 1, nominal 0.90, the
    population accuracy π = 0.7225): the exact coverage lies in [0.90, 0.91], and 20,000
    seeded simulated releases (the count drawn as Bin(n, π), the noise by the worker's own
    sampler) cover π in a fraction within [0.89, 0.92]. Monte Carlo tolerance: the
    simulated fraction has standard deviation √(0.1·0.9/20000) ≈ 0.0021, so the window
    lies ≥ 6 standard deviations from the exact value (a false failure has probability
    < 1e-8)."""
    plan = _scalar_plan(noise, 1.0)
    scale = plan.metric("accuracy").scale
    pi = _population_binary(1e-4, 10)["accuracy"]
    intervals = _Intervals(plan.n, noise, scale, plan.confidence)
    exact, _width = intervals.exact_coverage(pi)
    assert 0.90 - 1e-10 <= exact <= 0.91, exact
    rng = np.random.default_rng(2126)
    runs = 20_000
    sampler = discrete_laplace if noise == "laplace" else rounded_gaussian
    released = rng.binomial(plan.n, pi, runs) + sampler(rng, scale=scale, size=runs)
    covered = sum(_inside(pi, intervals(int(x))) for x in released)
    assert 0.89 <= covered / runs <= 0.92, covered / runs


def test_log_loss_interval_covers_two_point_rows() -> None:
    """Rows whose clipped log loss is 0 or L, the population for which the log-loss
    interval's sampling bound (the binomial worst case of the convex order) is tightest:
    150 seeded releases (n = 300, mean 0.3·L, the benchmark's Laplace noise at ε = 1)
    cover the mean at a rate not shown below the level (measured 0.97 at 300 runs)."""
    plan = _scalar_plan("laplace", 1.0)
    entry = plan.metric("log_loss")
    width = -math.log(plan.p_min)
    rng = np.random.default_rng(77)
    runs, covered = 150, 0
    sums = rng.binomial(plan.n, 0.3, runs) * LOG_LOSS_GRID
    released = sums + discrete_laplace(rng, scale=entry.scale, size=runs)
    for s in released:
        iv = bounded_mean_interval(
            noisy_sum=int(s),
            trials=plan.n,
            unit=width / LOG_LOSS_GRID,
            width=width,
            noise="laplace",
            scale=entry.scale,
            confidence=plan.confidence,
        )
        covered += _inside(0.3 * width, iv)
    _assert_coverage(covered, runs, plan.confidence)


def _assert_coverage_within_3_se(covered: int, runs: int, level: float) -> None:
    """Simulated coverage ≥ level − 3 Monte Carlo standard errors √(level(1 − level)/runs)."""
    assert covered / runs >= level - 3.0 * math.sqrt(level * (1.0 - level) / runs), (covered, runs)


@pytest.mark.parametrize(("noise", "old_width"), [("laplace", 0.453), ("gaussian", 0.583)])
def test_binary_auc_interval_is_valid_and_narrower_than_the_union_bound(
    noise: str, old_width: float
) -> None:
    """The benchmark's AUC at ε = 4 (four metrics, so ε = 1 and δ = 2.5e-7 to the AUC; here
    a plan of the AUC alone with that share, the same noise scales), n = 300, nominal 0.90,
    400 seeded holdouts and noise draws: coverage ≥ level − 3 Monte Carlo s.e., and the mean
    width is below 0.8 of the union bound's (McDiarmid + two noise quantiles, α/3 each),
    which measured ``old_width`` on these holdouts (the joint bound: 0.220 Laplace, 0.441
    Gaussian). Same plan, the union bound's width also checked here from its formula on a
    released pair, so the comparison does not rest on a remembered figure alone."""
    truth = _population_binary(1e-4, 10)["auc"]
    plan = plan_evaluation(
        metrics=["auc"],
        n=300,
        classes=2,
        epsilon=1.0,
        delta=2.5e-7 if noise == "gaussian" else 0.0,
        noise=noise,  # type: ignore[arg-type]
        confidence=0.9,
    )
    four = _scalar_plan(noise, 4.0).metric("auc")
    assert plan.metric("auc").scale == pytest.approx(four.scale, rel=1e-6)
    rng = np.random.default_rng(404)
    runs, covered, width = 400, 0, 0.0
    for _ in range(runs):
        p, y = _draw_binary(rng, plan.n)
        r = evaluate(plan=plan, probabilities=p, labels=y).auc
        assert r is not None and 0.0 <= r.interval.lower <= r.interval.upper <= 1.0
        covered += _inside(truth, r.interval)
        width += r.interval.upper - r.interval.lower
    _assert_coverage_within_3_se(covered, runs, plan.confidence)
    assert width / runs < 0.8 * old_width, width / runs
    # The union bound at a typical release (ũ = 2·A·n₊n₋, ñ₊ = 145): noise t and count τ
    # at α/3, McDiarmid at the box's smallest counts, as in commit 56fecf9's auc_interval.
    e = plan.metric("auc")
    assert e.count_scale is not None
    a = 0.1 / 3
    t = noise_tail(noise=noise, scale=e.scale, probability=a)  # type: ignore[arg-type]
    tau = noise_tail(noise=noise, scale=e.count_scale, probability=a)  # type: ignore[arg-type]
    u, c, n = round(2 * truth * 145 * 155), 145, plan.n
    lo, hi = c - tau, c + tau
    d_lo, d_hi = min(lo * (n - lo), hi * (n - hi)), (n / 2) ** 2
    s = math.sqrt(math.log(2 / a) * (1 / lo + 1 / (n - hi)) / 2)
    union = min(1.0, (u + t) / (2 * d_lo) + s) - max(0.0, (u - t) / (2 * d_hi) - s)
    joint = auc_interval(plan=plan, noisy_twice_u=[u], noisy_counts=[c])
    assert joint.upper - joint.lower < 0.8 * union, (joint, union)


def test_binary_auc_interval_covers_separable_and_random_scores() -> None:
    """Populations where the AUC's kernel is far from its mean's worst case: a perfect
    ranking (A = 1, Â = 1 always: only the noise and the counts move the release) and an
    uninformative one (A = ½, every score tied); n = 200, Laplace, ε = 2 to the AUC, 300
    releases each: coverage ≥ level − 3 Monte Carlo s.e."""
    plan = plan_evaluation(
        metrics=["auc"], n=200, classes=2, epsilon=2.0, delta=0.0, noise="laplace", confidence=0.9
    )
    rng = np.random.default_rng(9)
    runs = 300
    for truth in (1.0, 0.5):
        covered = 0
        for _ in range(runs):
            y = (rng.random(plan.n) < 0.4).astype(np.int64)
            p = np.where(y == 1, 0.8, 0.2) if truth == 1.0 else np.full(plan.n, 0.5)
            r = evaluate(plan=plan, probabilities=p, labels=y).auc
            assert r is not None
            covered += _inside(truth, r.interval)
        _assert_coverage_within_3_se(covered, runs, plan.confidence)


def test_calibration_error_upper_end_is_valid_and_narrower() -> None:
    """(1) The benchmark's calibration error at ε = 1 (four metrics: ε = ¼ to it; here a plan
    of it alone with that share), Laplace, n = 300, nominal 0.90, 400 seeded holdouts:
    coverage ≥ level − 3 Monte Carlo s.e., and the mean width below 0.8 of the union
    bound's (McDiarmid's √(2 ln(4/α)/n) plus the noise quantile above f), which measured
    0.303 here (the joint upper end: 0.209). (2) Rows whose confidence is 0 or 1 (so each
    row's signed error is 0 or 1, a Bernoulli: the tightest population for the upper end's
    convex-order step that a calibration error allows), ECE = 0.3, 400 releases straight
    from the count: coverage ≥ level − 3 s.e."""
    truth = _population_binary(1e-4, 10)["calibration_error"]
    plan = plan_evaluation(
        metrics=["calibration_error"],
        n=300,
        classes=2,
        epsilon=0.25,
        delta=0.0,
        noise="laplace",
        confidence=0.9,
    )
    e = plan.metric("calibration_error")
    assert e.scale == pytest.approx(_scalar_plan("laplace", 1.0).metric("calibration_error").scale)
    rng = np.random.default_rng(31)
    runs, covered, width, union = 400, 0, 0.0, 0.0
    a = 0.05
    for _ in range(runs):
        p, y = _draw_binary(rng, plan.n)
        r = evaluate(plan=plan, probabilities=p, labels=y).calibration_error
        assert r is not None
        covered += _inside(truth, r.interval)
        width += r.interval.upper - r.interval.lower
        t = noise_tail(noise="laplace", scale=e.scale, probability=a) / (ECE_GRID * plan.n)
        s = math.sqrt(2 * math.log(2 / a) / plan.n)
        union += min(1.0, r.value + t + s + 0.5 / ECE_GRID) - r.interval.lower
    _assert_coverage_within_3_se(covered, runs, plan.confidence)
    assert width < 0.8 * union, (width / runs, union / runs)
    # (2) Bernoulli rows: T = G·#{rows in error}, #{...} ~ Bin(n, 0.3).
    released = rng.binomial(plan.n, 0.3, runs) * ECE_GRID + discrete_laplace(
        rng, scale=e.scale, size=runs
    )
    hits = 0
    for x in released:
        iv = calibration_error_interval(
            noisy_total=int(x),
            trials=plan.n,
            bins=plan.bins,
            noise="laplace",
            scale=e.scale,
            confidence=plan.confidence,
        )
        hits += _inside(0.3, iv)
    _assert_coverage_within_3_se(hits, runs, plan.confidence)


# ------------------------------------------------------------------ (c) distinguishers


def _releases(
    plan: EvaluationPlan, p: np.ndarray, y: np.ndarray, runs: int, what: str
) -> np.ndarray:
    out = []
    for _ in range(runs):
        r = evaluate(plan=plan, probabilities=p, labels=y)
        value = getattr(r, what).value
        out.append(-1.0 if value is None else value)
    return np.array(out)


def test_distinguisher_on_accuracy_stays_below_the_charge() -> None:
    """Two holdouts differing in one row (wrong in world 0, right in world 1); the test
    "released accuracy > (C₀ + ½)/n" on 1000 releases each. Its 95% lower bound on ε must
    not exceed the charged ε = 1, and should come near it (the test is not powerless)."""
    n = 50
    y = np.r_[np.zeros(25, np.int64), np.ones(25, np.int64)]
    p0 = np.r_[np.full(25, 0.2), np.full(25, 0.8)]
    p0[0] = 0.9  # one wrong prediction in world 0
    p1 = p0.copy()
    p1[0] = 0.1
    plan = plan_evaluation(
        metrics=["accuracy"], n=n, classes=2, epsilon=1.0, delta=0.0, noise="laplace"
    )
    c0 = correct_count(probability_matrix(p0, classes=2), y)
    s0 = _releases(plan, p0, y, 1000, "accuracy")
    s1 = _releases(plan, p1, y, 1000, "accuracy")
    bound = threshold_bound(
        stats_world0=s0, stats_world1=s1, threshold=(c0 + 0.5) / n, delta=0.0, confidence=0.95
    )
    assert bound.epsilon <= plan.epsilon
    assert bound.epsilon >= 0.5


def test_distinguisher_on_auc_stays_below_the_charge() -> None:
    """The pair that attains 2U's sensitivity: one positive among 49 negatives, its score
    below every negative in world 0 and above in world 1 (2U moves by 2(n − 1) = 98; the
    class counts are equal, so only the 2U release can tell them apart). The test
    "released 2U > midpoint" on 1000 releases each: its 95% lower bound on ε must not
    exceed 2U's part of the charge, (1 − AUC_COUNT_SHARE)·ε = 0.75, and should come near
    it. The released AUC, a function of the two releases, is checked to be theirs."""
    n = 50
    y = np.r_[1, np.zeros(n - 1, np.int64)]
    p1 = np.r_[1.0, np.linspace(0.2, 0.8, n - 1)]
    p0 = np.r_[0.0, p1[1:]]
    plan = plan_evaluation(metrics=["auc"], n=n, classes=2, epsilon=1.0, delta=0.0, noise="laplace")
    entry = plan.metric("auc")
    assert entry.count_epsilon is not None
    u0 = int(auc_twice_u(probability_matrix(p0, classes=2), y)[0])
    u1 = int(auc_twice_u(probability_matrix(p1, classes=2), y)[0])
    assert u1 - u0 == auc_sensitivity(n=n, classes=2)[0]

    def released(p: np.ndarray) -> np.ndarray:
        out = []
        for _ in range(1000):
            r = evaluate(plan=plan, probabilities=p, labels=y).auc
            assert r is not None
            (u,), (c,) = r.noisy_twice_u, r.noisy_class_counts
            ratio = u / (2.0 * min(max(c, 1), n - 1) * (n - min(max(c, 1), n - 1)))
            assert r.value == min(max(ratio, 0.0), 1.0)
            assert r.twice_u_noise_scale == entry.scale
            pairs = 2.0 * min(max(c, 1), n - 1) * (n - min(max(c, 1), n - 1))
            assert r.noise_scale == pytest.approx(entry.scale / pairs)
            out.append(float(u))
        return np.array(out)

    bound = threshold_bound(
        stats_world0=released(p0),
        stats_world1=released(p1),
        threshold=(u0 + u1) / 2,
        delta=0.0,
        confidence=0.95,
    )
    assert bound.epsilon <= entry.epsilon - entry.count_epsilon
    assert bound.epsilon >= 0.35


@pytest.mark.parametrize(("classes", "noise"), [(2, "laplace"), (2, "gaussian"), (3, "gaussian")])
def test_auc_charge_is_its_two_releases(classes: int, noise: str) -> None:
    """The ledger's event for an AUC evaluation: Laplace, two pure leaves summing to the
    plan's ε; Gaussian, two Gaussian mechanisms (2U at σ/Δ₂ = σ/(2(n − 1)) binary,
    σ/(2√3(n − 1)) for K = 3; the counts at σ'/1 or σ'/√2) plus the sampler's slack, whose
    RDP curve is Σ α/(2m²) + the slack's (Mironov 2017, Prop. 7), computed here from the
    plan's scales."""
    from pydantic import TypeAdapter

    from service.evaluations import plan_evaluation_job
    from service.modelspec import ModelSpec
    from service.privacy.events import PmfSlackEvent
    from service.privacy.orders import ORDERS
    from service.schemas import JobRequest
    from tests.conftest import SMALL_SCHEMA

    n = 300
    schema = SMALL_SCHEMA
    if classes == 3:
        schema = {**SMALL_SCHEMA, "target": {"column": "label", "classes": ["a", "b", "c"]}}
    request = JobRequest(
        dataset="toy",
        model=TypeAdapter(ModelSpec).validate_python({"kind": "logistic"}),
        method="evaluation",
        epsilon=1.0,
        delta=1e-6 if noise == "gaussian" else 0.0,
        evaluation={
            "job_id": "j",
            "sample": 0,
            "metrics": ["auc"],
            "noise": noise,
            "confidence": 0.9,
        },
    )
    plan = plan_evaluation_job(request, holdout_rows=n, public_schema=schema)
    (auc,) = plan.event["events"]
    leaves = auc["events"]
    assert len(leaves) == 2
    if noise == "laplace":
        assert [leaf["type"] for leaf in leaves] == ["pure_dp", "pure_dp"]
        assert sum(leaf["epsilon"] for leaf in leaves) == pytest.approx(1.0)
        assert leaves[1]["epsilon"] == pytest.approx(0.25)
        return
    entry = plan.mechanism["metrics"][0]
    l2 = 2.0 * (n - 1) * (1.0 if classes == 2 else math.sqrt(3.0))
    c2 = 1.0 if classes == 2 else math.sqrt(2.0)
    assert entry["sensitivity_l2"] == pytest.approx(l2)
    m_u, m_c = entry["scale"] / l2, entry["count_scale"] / c2
    got = [leaf["events"][0]["noise_multiplier"] for leaf in leaves]
    assert got == [pytest.approx(m_u), pytest.approx(m_c)]
    slack = PmfSlackEvent(tau=leaves[0]["events"][1]["tau"]).rdp(ORDERS)
    want = [a / (2 * m_u**2) + a / (2 * m_c**2) for a in ORDERS] + 2 * np.asarray(slack)
    assert np.allclose(plan.rdp_curve, want, rtol=1e-9)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_auc_interval_covers_an_imbalanced_population(noise: str) -> None:
    """Binary AUC, 15% positives (the counts' noise matters in U/(n₊n₋) when the classes
    are unequal), n = 400, AUC only, ε = 1, nominal 0.90, 300 holdouts and noise draws:
    coverage not shown below the level."""
    px = np.array([0.3, 0.3, 0.2, 0.2])
    rx = np.array([0.02, 0.1, 0.2, 0.35])
    pm = np.array([0.1, 0.3, 0.3, 0.8])  # a tie between two levels
    f1, f0 = px * rx / np.sum(px * rx), px * (1 - rx) / np.sum(px * (1 - rx))
    truth = sum(
        f1[i] * f0[j] * (1.0 if pm[i] > pm[j] else 0.5 if pm[i] == pm[j] else 0.0)
        for i in range(4)
        for j in range(4)
    )
    plan = plan_evaluation(
        metrics=["auc"],
        n=400,
        classes=2,
        epsilon=1.0,
        delta=1e-6 if noise == "gaussian" else 0.0,
        noise=noise,  # type: ignore[arg-type]
        confidence=0.9,
    )
    rng = np.random.default_rng(77)
    runs, covered = 300, 0
    for _ in range(runs):
        x = rng.choice(4, size=plan.n, p=px)
        y = (rng.random(plan.n) < rx[x]).astype(np.int64)
        r = evaluate(plan=plan, probabilities=pm[x], labels=y).auc
        assert r is not None and 0.0 <= r.interval.lower <= r.interval.upper <= 1.0
        covered += _inside(truth, r.interval)
    _assert_coverage(covered, runs, plan.confidence)


def test_macro_auc_interval_covers_the_label_conditional_value() -> None:
    """K = 3: the interval's stated target, the macro one-vs-rest AUC with the holdout's
    class mix weighting each problem's negative classes, i.e. (1/K) Σ_k Σ_{j≠k}
    n_j/(n − n_k)·A_kj with A_kj = P(s_k(X) > s_k(X') | y = k, y' = j) + ½P(=), computed
    per holdout from the discrete population; n = 300, ε = 3 (AUC only), nominal 0.90."""
    px = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    rx = np.array(
        [[0.7, 0.2, 0.1], [0.2, 0.6, 0.2], [0.1, 0.2, 0.7], [0.4, 0.4, 0.2], [0.3, 0.3, 0.4]]
    )
    pm = np.array(
        [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6], [0.5, 0.3, 0.2], [0.3, 0.3, 0.4]]
    )
    k = 3
    f = px[:, None] * rx / np.sum(px[:, None] * rx, axis=0)  # P(x | y = c), columns c
    pair = np.zeros((k, k))
    for c, j in itertools.product(range(k), range(k)):
        s = pm[:, c]
        wins = (s[:, None] > s[None, :]) + 0.5 * (s[:, None] == s[None, :])
        pair[c, j] = f[:, c] @ wins @ f[:, j]
    plan = plan_evaluation(
        metrics=["auc"], n=300, classes=k, epsilon=3.0, delta=0.0, noise="laplace", confidence=0.9
    )
    rng = np.random.default_rng(5)
    runs, covered = 200, 0
    for _ in range(runs):
        x = rng.choice(5, size=plan.n, p=px)
        y = (rng.random(plan.n)[:, None] > np.cumsum(rx[x], axis=1)).sum(axis=1)
        counts = np.bincount(y, minlength=k)
        target = np.mean(
            [
                sum(counts[j] / (plan.n - counts[c]) * pair[c, j] for j in range(k) if j != c)
                for c in range(k)
            ]
        )
        r = evaluate(plan=plan, probabilities=pm[x], labels=y).auc
        assert r is not None and len(r.noisy_twice_u) == k
        covered += _inside(float(target), r.interval)
    _assert_coverage(covered, runs, plan.confidence)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_accuracy_interval_accounts_for_the_noise(noise: str) -> None:
    """A model that is always right: the holdout's accuracy is 1 with no sampling error,
    so the interval covers 1 only if it is widened by the noise's quantile (without it,
    about half the releases fall below n and would miss)."""
    plan = plan_evaluation(
        metrics=["accuracy"],
        n=100,
        classes=2,
        epsilon=0.5,
        delta=1e-6,
        noise=noise,  # type: ignore[arg-type]
        confidence=0.9,
    )
    y = np.ones(100, np.int64)
    p = np.full(100, 0.9)
    runs = 300
    covered = 0
    for _ in range(runs):
        r = evaluate(plan=plan, probabilities=p, labels=y)
        assert r.accuracy is not None
        covered += _inside(1.0, r.accuracy.interval)
    _assert_coverage(covered, runs, plan.confidence)


def test_three_class_auc_release_and_torch_inputs() -> None:
    """K = 3: the macro AUC is released with three noisy class counts, and CPU torch
    tensors give the same statistics as numpy arrays."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    n, k = 3000, 3
    y = rng.integers(0, k, n)
    logits = rng.normal(0.0, 1.0, (n, k))
    logits[np.arange(n), y] += 1.5
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    pm = probability_matrix(p, classes=k)
    pt = probability_matrix(torch.from_numpy(p), classes=k)
    assert np.array_equal(pm, pt)
    assert log_loss_units(pm, y, p_min=1e-4) == log_loss_units(
        pt, np.asarray(torch.from_numpy(y)), p_min=1e-4
    )
    plan = plan_evaluation(
        metrics=["auc"], n=n, classes=k, epsilon=4.0, delta=1e-6, noise="laplace"
    )
    r = evaluate(plan=plan, probabilities=torch.from_numpy(p), labels=torch.from_numpy(y))
    assert r.auc is not None and r.auc.value is not None
    assert len(r.auc.noisy_class_counts) == k
    truth = float(auc_exact(pm, y))
    assert abs(r.auc.value - truth) < 0.05  # noise scale ≈ 0.001 here
