"""Private evaluation of a released model on a private holdout: sensitivities, noise,
budget split and confidence intervals (pure math; the worker computes the statistics,
worker/mechanisms/evaluation.py).

Neighbouring relation
---------------------
**Replace one row** of a holdout whose size ``n`` is public. Everything else the
mechanisms use is public too: the number of classes K, the decision rule (arg-max, or
p ≥ ½ for binary), the log-loss clip p_min, the calibration bins and the grids below.

Why replace-one with a public n fits a ledger that counts add/remove-one on the whole
dataset: if the holdout is the ``n`` rows with the smallest keyed hash h(seed, row id)
(seed drawn by the enclave, n fixed at registration from public values), adding a row x
either leaves the holdout unchanged (h(x) above the n-th smallest) or puts x in and
pushes the n-th row out: a replacement. Removing is symmetric. (The training part loses
or gains at most one row at the same time, so "train then evaluate" on one neighbouring
pair composes by summing the two charges.) This is the wiring proposed in the report of
issue 21, not yet built.

Every released statistic is an *integer* on a public grid plus integer noise from
worker/noise.py (discrete Laplace or rounded Gaussian), so no float noise ever touches a
data-dependent value (Mironov 2012). The integer statistics and their L1/L2
sensitivities Δ₁, Δ₂ (grid units) are:

=================  =========================================  =========  ==========
metric             integer statistic                          Δ₁         Δ₂
=================  =========================================  =========  ==========
accuracy           C = #correct                               1          1
confusion          M_ij = #{y = i, ŷ = j} (K² cells)           2          √2
log loss           Σ_i q_i, q_i = round(ℓ_i·G/L) ∈ [0, G]     G          G
calibration error  Σ_b |Σ_{i∈b} q_i|, q_i = round((o_i−c_i)G)  2G         2G
AUC (binary)       2U (Mann–Whitney, ties ½); count n₊        2(n−1); 1  2(n−1); 1
AUC (macro OvR)    (2U_k)_k; counts (n_k)_k                   6(n−1); 2  2√3(n−1); √2
=================  =========================================  =========  ==========

Proofs of the table (replace one row (x, y) by (x', y')):

* accuracy: the row's indicator of a correct prediction changes by at most 1.
* confusion: the row leaves one cell and enters one cell: ±1 in at most two cells.
* log loss: each q_i is clamped to [0, G] in integer arithmetic, so the sum changes by
  at most G whatever the float computation of ℓ_i = −ln clip(p_y, p_min, 1 − p_min)
  (L = −ln p_min). The float log only affects accuracy of the statistic, not privacy.
* calibration error (binned ECE, Naeini, Cooper & Hauskrecht 2015; Guo et al. 2017):
  q_i = round((o_i − c_i)·G) clamped to [−G, G] (o the outcome, c the confidence).
  Removing the row changes one bin's |S_b| by at most G (triangle inequality), adding one
  changes one bin's by at most G: Δ₁ = 2G.
* AUC: the AUC U/(n₊n₋) has a sensitivity that depends on the private class counts
  (1/min(n₊, n₋)), but its numerator does not: 2U (an integer) has the global bound
  2(n − 1) (:func:`auc_sensitivity`, proof there), and the counts have sensitivity 1
  (binary n₊; n₋ = n − n₊) or L1 2 (the K-class histogram). Both are released with
  noise of fixed scale; AUC = Ũ/(ñ₊ñ₋) is post-processing. K ≥ 3: the K one-vs-rest
  statistics are one vector query whose joint sensitivity is bounded (6(n − 1) in L1,
  2√3(n − 1) in L2, not K times the binary bound), noised per coordinate at that scale,
  and composed with the counts' release: ε₁ + ε₂ (Laplace, basic composition) or the sum
  of the two Gaussian mechanisms' RDP curves (Mironov 2017, Prop. 1). This replaces a
  propose-test-release mechanism (Dwork & Lei 2009) that scaled the noise to noisy
  lower bounds of the counts: (ε, δ)-DP with a failure probability and no RDP curve, so
  the ledger could not charge it (removed, issue 21; its noise is compared with this one
  in benchmarks/results/private_evaluation.md). Boyd, Lantz & Page 2015 ("Differential
  privacy for classifier evaluation", AISec, doi:10.1145/2808769.2808775) give private
  AUC mechanisms built on its sensitivity with public class counts (only their abstract
  was read here: the bound used is proven in :func:`auc_sensitivity`).

Noise calibration (:func:`laplace_scale`, :func:`gaussian_scale`): the discrete Laplace
(two-sided geometric) law with scale Δ₁/ε is ε-DP for an integer query of L1
sensitivity Δ₁ (Ghosh, Roughgarden & Sundararajan 2009; the continuous case is Dwork,
McSherry, Nissim & Smith 2006, Dwork & Roth 2014 Thm 3.6). The rounded Gaussian
⌊σZ + ½⌋ is a post-processing of the Gaussian mechanism, whose σ for (ε, δ) at L2
sensitivity 1 comes from the product's own calibration
(:func:`service.privacy.calibrate.calibrate` with q = 1, one step: a pessimistic PLD of
the Gaussian mechanism, i.e. the analytic Gaussian of Balle & Wang 2018 up to the PLD
grid), times Δ₂. The sampler's pmf gap (η per coordinate, service/privacy/sampling.py) is
subtracted from each part's ε before calibrating, so the parts still sum to the budget.

Budget split (:func:`split_budget`): equal shares of (ε, δ) per requested metric, summed
by basic composition (Dwork & Roth 2014, Thm 3.16). With Laplace noise every metric is
pure ε-DP (δ = 0); the AUC's share is split between 2U and the counts
(:data:`AUC_COUNT_SHARE`).

Confidence intervals: service/privacy/evaluation_intervals.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final, Literal

from service.privacy.calibrate import calibrate
from service.privacy.sampling import noise_slack

__all__ = [
    "AUC_COUNT_SHARE",
    "ECE_GRID",
    "LOG_LOSS_GRID",
    "EvaluationPlan",
    "Metric",
    "MetricPlan",
    "NoiseKind",
    "auc_sensitivity",
    "gaussian_scale",
    "laplace_scale",
    "noise_tail",
    "plan_evaluation",
    "split_budget",
]

Metric = Literal["accuracy", "auc", "log_loss", "calibration_error", "confusion"]
NoiseKind = Literal["laplace", "gaussian"]
METRICS: Final[tuple[Metric, ...]] = (
    "accuracy",
    "auc",
    "log_loss",
    "calibration_error",
    "confusion",
)

LOG_LOSS_GRID: Final[int] = 2**16
"""Grid units per clipped log loss range [0, L], L = −ln p_min."""
ECE_GRID: Final[int] = 2**16
"""Grid units per unit of (outcome − confidence) in the calibration error."""
MIN_GAUSSIAN_SCALE: Final[float] = 1.0
"""The worker's rounded Gaussian accepts σ ≥ 1 grid unit (worker/noise.py); more noise is
always allowed, so smaller calibrated σ are raised to it."""
MAX_SCALE: Final[float] = float(2**40)
"""The worker's samplers' largest scale (worker/noise.py)."""


def positive_number(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def _probability(name: str, value: float, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and (v >= 0.0 if allow_zero else v > 0.0) and v < 1.0):
        raise ValueError(f"{name} must lie in {'[' if allow_zero else '('}0, 1), got {value!r}")
    return v


def count_at_least(name: str, value: int, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


# ---------------------------------------------------------------------- noise


def laplace_scale(*, sensitivity: float, epsilon: float) -> float:
    """Scale b = Δ₁/ε (grid units) of the discrete Laplace law p(k) ∝ e^{−|k|/b}: ε-DP for an
    integer query of L1 sensitivity Δ₁ (Ghosh, Roughgarden & Sundararajan 2009; the ratio
    p(k)/p(k + d) ≤ e^{|d|/b} for every shift |d| ≤ Δ₁)."""
    b = positive_number("sensitivity", sensitivity) / positive_number("epsilon", epsilon)
    if b > MAX_SCALE:
        raise ValueError(f"the noise scale {b:g} exceeds the sampler's 2**40")
    return b


def gaussian_scale(*, sensitivity: float, epsilon: float, delta: float) -> float:
    """σ (grid units) of the rounded Gaussian for an (ε, δ)-DP release of L2 sensitivity Δ₂:
    Δ₂ times the noise multiplier of one Gaussian step (q = 1, T = 1) from the product's
    calibration (:func:`service.privacy.calibrate.calibrate`, PLD accountant; Balle & Wang
    2018 "Improving the Gaussian mechanism", the analytic Gaussian, is what it approximates
    from above). Raised to at least MIN_GAUSSIAN_SCALE."""
    d2 = positive_number("sensitivity", sensitivity)
    found = calibrate(
        sampling_rate=1.0,
        steps=1,
        epsilon=positive_number("epsilon", epsilon),
        delta=_probability("delta", delta, allow_zero=False),
        accountant="pld",
    )
    s = max(d2 * found.noise_multiplier, MIN_GAUSSIAN_SCALE)
    if s > MAX_SCALE:
        raise ValueError(f"the noise scale {s:g} exceeds the sampler's 2**40")
    return s


def noise_tail(*, noise: NoiseKind, scale: float, probability: float) -> int:
    """An integer t ≥ 0 with P(|N| > t) ≤ ``probability`` for one draw N of the worker's noise.

    Discrete Laplace with scale b: P(|N| > t) = 2e^{−(t+1)/b}/(1 + e^{−1/b}) (sum of the
    two geometric tails), so t = ⌈b·ln(2/(p(1 + e^{−1/b})))⌉ − 1 suffices; it is computed
    with a 1e-9 relative margin and one extra unit against the rounding of exp and log.
    Rounded Gaussian N = ⌊σZ + ½⌋: |N| > t implies |Z| ≥ (t + ½)/σ, so t = ⌈σ·z_{1−p/2} − ½⌉
    with z the standard normal quantile (statistics.NormalDist, itself accurate to ~1e-15
    relative: an assumption, covered by the extra unit).
    """
    b = positive_number("scale", scale)
    p = _probability("probability", probability, allow_zero=False)
    if noise == "laplace":
        x = b * math.log(2.0 / (p * (1.0 + math.exp(-1.0 / b)))) * (1.0 + 1e-9)
        return max(0, math.ceil(x))
    if noise == "gaussian":
        z = NormalDist().inv_cdf(1.0 - p / 2.0)
        return max(0, math.ceil(b * z * (1.0 + 1e-9) - 0.5) + 1)
    raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")


def _scale(
    noise: NoiseKind, *, l1: float, l2: float, epsilon: float, delta: float, dims: int
) -> float:
    """Noise scale for one release of ``dims`` coordinates at (ε, δ), charging the sampler's
    pmf gap (2τ per coordinate, service/privacy/sampling.py) against ε."""
    eps = epsilon - 2.0 * noise_slack(draws=dims).tau
    if noise == "laplace":
        return laplace_scale(sensitivity=l1, epsilon=eps)
    return gaussian_scale(sensitivity=l2, epsilon=eps, delta=delta)


# ---------------------------------------------------------------------- budget


@dataclass(frozen=True)
class Share:
    """One metric's part of the budget: (ε nats, δ probability)."""

    epsilon: float
    delta: float


def split_budget(
    *, metrics: Sequence[Metric], epsilon: float, delta: float, noise: NoiseKind
) -> dict[Metric, Share]:
    """Equal shares of one (ε, δ) over the requested metrics; they sum to at most (ε, δ), so
    the evaluation is (ε, δ)-DP by basic composition (Dwork & Roth 2014, Thm 3.16).

    Laplace: each metric gets ε/k and δ = 0 (every metric, AUC included, is pure ε-DP).
    Gaussian: each metric gets (ε/k, δ/k); δ > 0 is required.
    """
    ms = list(metrics)
    if not ms or len(set(ms)) != len(ms) or any(m not in METRICS for m in ms):
        raise ValueError(f"metrics must be distinct names from {METRICS}, got {metrics!r}")
    eps = positive_number("epsilon", epsilon)
    dlt = _probability("delta", delta, allow_zero=True)
    k = len(ms)
    if noise == "laplace":
        return {m: Share(epsilon=eps / k, delta=0.0) for m in ms}
    if noise == "gaussian":
        if dlt == 0.0:
            raise ValueError("Gaussian noise needs delta > 0")
        return {m: Share(epsilon=eps / k, delta=dlt / k) for m in ms}
    raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")


# ---------------------------------------------------------------------- AUC sensitivity


def auc_sensitivity(*, n: int, classes: int) -> tuple[int, float]:
    """(Δ₁, Δ₂) of the AUC's integer statistic 2U under replace-one on a holdout of public
    size n: binary 2(n − 1) for both; K ≥ 3, the vector (2U_k)_k of the one-vs-rest
    problems, Δ₁ = 6(n − 1) and Δ₂ = 2√3·(n − 1). (1 for n = 1, where 2U ≡ 0.)

    2U = Σ_{i pos} Σ_{j neg} (2·1{s_i > s_j} + 1{s_i = s_j}), so U is the Mann–Whitney
    count with ties ½ (Mann & Whitney 1947) and AUC = U/(n₊n₋) (Bamber 1975; Hanley &
    McNeil 1982). Proof: replace row r by r'. Pairs not involving the row are unchanged.
    Let the other n − 1 rows hold m₊ positives and m₋ negatives (m₊ + m₋ = n − 1). As a
    positive the row adds a term in [0, 2m₋] (its m₋ pairs, each 0, 1 or 2); as a negative,
    one in [0, 2m₊]. Same label before and after: |Δ2U| ≤ 2m₋ (or 2m₊) ≤ 2(n − 1); a label
    change: 2U moves from [0, 2m₋] to [0, 2m₊] (or back), |Δ2U| ≤ 2·max(m₊, m₋) ≤ 2(n − 1).
    Attained: one positive among n − 1 negatives, moved from above all of them to below
    (tests/unit/test_private_evaluation.py enumerates every neighbour of small holdouts).

    K ≥ 3 (problem k: class k positive, the rest negative, scores s_k): with m_k the other
    rows' count of class k (Σ m_k = n − 1), a row of class a pairs with n − 1 − m_a rows in
    problem a and with m_k rows in problem k ≠ a. Class a → b ≠ a: problem k ∉ {a, b} moves
    by ≤ 2m_k, problem a by ≤ 2·max(m_a, n − 1 − m_a), problem b by ≤ 2·max(m_b, n − 1 −
    m_b), so Σ_k |Δ_k| ≤ 2[(n − 1 − m_a − m_b) + max(·) + max(·)] ≤ 6(n − 1) (each max
    case checked: 6(n − 1) − 4(m_a + m_b), 4(n − 1) − 4m_b, 2(n − 1)); squares:
    Σ_k Δ_k² ≤ 4[max(·)² + max(·)² + (Σ_{k∉{a,b}} m_k)²] ≤ 12(n − 1)². Same class a:
    Σ_k |Δ_k| ≤ 2[(n − 1 − m_a) + Σ_{k≠a} m_k] = 4(n − 1 − m_a) and Σ Δ_k² ≤ 8(n − 1)².
    Attained (L1): the row alone in class a, every other row in one class c, the row's
    s_a, s_c moving from the top to the bottom and s_b from the bottom to the top.
    Boyd, Lantz & Page 2015 ("Differential privacy for classifier evaluation", AISec)
    study the AUC's sensitivity with the class counts public; here they are private,
    which is why 2U (not U/(n₊n₋)) is released and the counts are released separately.
    """
    rows = count_at_least("n", n, low=1)
    k = count_at_least("classes", classes, low=2)
    if rows == 1:
        return 1, 1.0
    if k == 2:
        return 2 * (rows - 1), float(2 * (rows - 1))
    return 6 * (rows - 1), 2.0 * math.sqrt(3.0) * (rows - 1)


# ---------------------------------------------------------------------- plans


@dataclass(frozen=True)
class MetricPlan:
    """Public description of one metric's release.

    ``epsilon``, ``delta``: its share of the budget. ``noise``: the law; ``scale``: the
    discrete Laplace b or the rounded Gaussian σ, in grid units of ``sensitivity_l1`` /
    ``sensitivity_l2``. AUC also releases noisy class counts (``count_scale`` at
    ``count_epsilon``, ``count_delta``, sensitivities ``count_sensitivity_l1``/``_l2``);
    its ``scale`` is 2U's, per coordinate (K ≥ 3: one 2U_k per class).
    """

    metric: Metric
    epsilon: float
    delta: float
    noise: NoiseKind
    sensitivity_l1: float
    sensitivity_l2: float
    scale: float
    count_scale: float | None = None
    count_epsilon: float | None = None
    count_delta: float | None = None
    count_sensitivity_l1: float | None = None
    count_sensitivity_l2: float | None = None


@dataclass(frozen=True)
class EvaluationPlan:
    """Everything public about one private evaluation: the holdout size ``n``, classes K,
    the confidence level, p_min, bins, and one :class:`MetricPlan` per metric. Its
    (``epsilon``, ``delta``) is the charge: the sum of the metrics' shares."""

    n: int
    classes: int
    noise: NoiseKind
    epsilon: float
    delta: float
    confidence: float
    p_min: float
    bins: int
    metrics: tuple[MetricPlan, ...]

    def metric(self, name: Metric) -> MetricPlan:
        for m in self.metrics:
            if m.metric == name:
                return m
        raise KeyError(name)


def plan_evaluation(
    *,
    metrics: Sequence[Metric],
    n: int,
    classes: int,
    epsilon: float,
    delta: float,
    noise: NoiseKind,
    confidence: float = 0.95,
    p_min: float = 1e-4,
    bins: int = 10,
) -> EvaluationPlan:
    """Check every input, split the budget and calibrate each metric's noise (module
    docstring for the table of sensitivities)."""
    rows = count_at_least("n", n, low=1)
    k = count_at_least("classes", classes, low=2)
    conf = _probability("confidence", confidence, allow_zero=False)
    pm = _probability("p_min", p_min, allow_zero=False)
    if pm >= 0.5:
        raise ValueError(f"p_min must be < 0.5, got {p_min!r}")
    nb = count_at_least("bins", bins, low=1)
    shares = split_budget(metrics=metrics, epsilon=epsilon, delta=delta, noise=noise)
    plans: list[MetricPlan] = []
    for name, share in shares.items():
        e, d = share.epsilon, share.delta
        if name == "auc":
            plans.append(_auc_plan(share, noise=noise, n=rows, classes=k))
            continue
        l1: float
        l2: float
        dims = 1
        if name == "accuracy":
            l1, l2 = 1.0, 1.0
        elif name == "confusion":
            l1, l2, dims = 2.0, math.sqrt(2.0), k * k
        elif name == "log_loss":
            l1 = l2 = float(LOG_LOSS_GRID)
        else:  # calibration_error
            l1 = l2 = 2.0 * ECE_GRID
        scale = _scale(noise, l1=l1, l2=l2, epsilon=e, delta=d, dims=dims)
        plans.append(MetricPlan(name, e, d, noise, l1, l2, scale))
    return EvaluationPlan(
        n=rows,
        classes=k,
        noise=noise,
        epsilon=sum(s.epsilon for s in shares.values()),
        delta=sum(s.delta for s in shares.values()),
        confidence=conf,
        p_min=pm,
        bins=nb,
        metrics=tuple(plans),
    )


AUC_COUNT_SHARE: Final[float] = 0.25
"""The part of the AUC's ε (and half of its δ, Gaussian) spent on the class counts; the rest
goes to 2U. The counts enter AUC = U/(n₊n₋) through n₊n₋, whose relative error is
|n₋ − n₊|/(n₊n₋) times the count's noise (zero to first order for balanced classes), while
2U's relative error is Δ/(2U·ε): 2U needs most of the budget."""


def _auc_plan(share: Share, *, noise: NoiseKind, n: int, classes: int) -> MetricPlan:
    """AUC's share: ε·(1 − AUC_COUNT_SHARE) to 2U (:func:`auc_sensitivity`), ε·AUC_COUNT_SHARE
    to the class counts (binary: n₊, sensitivity 1; K ≥ 3: the histogram (n_k)_k, L1 2,
    L2 √2: a replaced row leaves one class and joins one). Gaussian: δ/2 each. Both are
    fixed-sensitivity releases of integers with the product's integer noise, so the AUC is
    pure (ε₁ + ε₂ = ε, Laplace) or a composition of two Gaussian mechanisms (RDP curves
    added), and the AUC and its interval are post-processing of the two noisy releases."""
    e_count = share.epsilon * AUC_COUNT_SHARE
    e_auc = share.epsilon - e_count
    d_count = d_auc = share.delta / 2.0
    dims = 1 if classes == 2 else classes
    c1, c2 = (1.0, 1.0) if classes == 2 else (2.0, math.sqrt(2.0))
    count_scale = _scale(noise, l1=c1, l2=c2, epsilon=e_count, delta=d_count, dims=dims)
    l1, l2 = auc_sensitivity(n=n, classes=classes)
    scale = _scale(noise, l1=float(l1), l2=l2, epsilon=e_auc, delta=d_auc, dims=dims)
    return MetricPlan(
        "auc",
        share.epsilon,
        share.delta,
        noise,
        float(l1),
        l2,
        scale,
        count_scale=count_scale,
        count_epsilon=e_count,
        count_delta=d_count,
        count_sensitivity_l1=c1,
        count_sensitivity_l2=c2,
    )
