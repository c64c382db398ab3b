"""Private evaluation of a released model on a private holdout: sensitivities, noise,
budget split and confidence intervals (pure math; the worker computes the statistics,
worker/mechanisms/evaluation.py).

Neighbouring relation
---------------------
**Replace one row** of a holdout whose size ``n`` is public. Everything else the
mechanisms use is public too: the number of classes K, the decision rule (arg-max, or
p ≥ ½ for binary), the log-loss clip p_min, the calibration bins, the grids below, and,
for AUC, the noisy class counts that the same charge releases first.

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

=================  =========================================  ======  ======
metric             integer statistic                          Δ₁      Δ₂
=================  =========================================  ======  ======
accuracy           C = #correct                               1       1
confusion          M_ij = #{y = i, ŷ = j} (K² cells)           2       √2
log loss           Σ_i q_i, q_i = round(ℓ_i·G/L) ∈ [0, G]     G       G
calibration error  Σ_b |Σ_{i∈b} q_i|, q_i = round((o_i−c_i)G)  2G      2G
AUC (binary)       counts: n₁; then round(A·m·G)              1; G+1  1; G+1
AUC (macro OvR)    counts: (n_k)_k; then round(A·G/Δ_A)       2; G+1  √2; G+1
=================  =========================================  ======  ======

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
* AUC: see :func:`binary_auc_sensitivity` and :func:`macro_auc_sensitivity`. The AUC's
  sensitivity depends on the private class counts (local sensitivity 1/min(n₁, n₀)), so
  the mechanism first releases noisy counts, turns them into public lower bounds m that
  hold except with probability δ_bad, and scales the AUC noise to 1/m: the
  propose-test-release pattern (Dwork & Lei 2009, "Differential privacy and robust
  statistics", STOC; Dwork & Roth 2014, "The Algorithmic Foundations of Differential
  Privacy", Ch. 7, stability and privacy). Rounding A/g to the grid g = Δ_A/G adds one
  unit: |round(a) − round(b)| ≤ ⌊|a − b|⌋ + 1 ≤ G + 1. Boyd, Lantz & Page 2015
  ("Differential privacy for classifier evaluation", AISec, doi:10.1145/2808769.2808775)
  give private mechanisms for AUC built on its sensitivity (only their abstract was read
  here: the bound used is proven in :func:`binary_auc_sensitivity`, not taken from them).

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
by basic composition (Dwork & Roth 2014, Thm 3.16; it holds for adaptively chosen
mechanisms, which the AUC's second stage is). With Laplace noise every metric but AUC is
pure ε-DP and δ goes to the AUC's δ_bad only (AUC needs δ > 0).

Confidence intervals: service/privacy/evaluation_intervals.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Final, Literal

from service.privacy.calibrate import calibrate
from service.privacy.sampling import noise_slack

__all__ = [
    "AUC_GRID",
    "ECE_GRID",
    "LOG_LOSS_GRID",
    "AucStage",
    "EvaluationPlan",
    "Metric",
    "MetricPlan",
    "NoiseKind",
    "auc_stage",
    "binary_auc_sensitivity",
    "gaussian_scale",
    "laplace_scale",
    "macro_auc_sensitivity",
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

AUC_GRID: Final[int] = 2**12
"""Grid units per AUC sensitivity: the AUC is released on the grid Δ_A/4096 (rounding costs
one unit of 4097 in sensitivity, 0.02%)."""
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

    Laplace: each metric gets ε/k; δ is spent by the AUC only (its count test), and a
    Laplace plan with AUC needs δ > 0 (a plan without AUC charges δ = 0). Gaussian: each
    metric gets (ε/k, δ/k); δ > 0 is required.
    """
    ms = list(metrics)
    if not ms or len(set(ms)) != len(ms) or any(m not in METRICS for m in ms):
        raise ValueError(f"metrics must be distinct names from {METRICS}, got {metrics!r}")
    eps = positive_number("epsilon", epsilon)
    dlt = _probability("delta", delta, allow_zero=True)
    k = len(ms)
    if noise == "laplace":
        if "auc" in ms and dlt == 0.0:
            raise ValueError("AUC needs delta > 0 (its class-count test fails with probability δ)")
        return {m: Share(epsilon=eps / k, delta=dlt if m == "auc" else 0.0) for m in ms}
    if noise == "gaussian":
        if dlt == 0.0:
            raise ValueError("Gaussian noise needs delta > 0")
        return {m: Share(epsilon=eps / k, delta=dlt / k) for m in ms}
    raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")


# ---------------------------------------------------------------------- AUC sensitivity


def binary_auc_sensitivity(*, positives: int, negatives: int) -> Fraction:
    """Largest change of the binary AUC when one row is replaced, for a holdout with
    ``positives`` = n₁ ≥ 1 and ``negatives`` = n₀ ≥ 1: 1/min(n₁, n₀) (local sensitivity).

    AUC = U/(n₁n₀), U = Σ_{i pos} Σ_{j neg} h(s_i, s_j), h = 1, ½, 0 for >, =, < (Mann-
    Whitney; Hanley & McNeil 1982); a class left empty has AUC ½ by convention.
    Proof (AUC's sensitivity is the subject of Boyd, Lantz & Page 2015; this is our own):
    * same class, positive: the row's n₀ pairs change, each by ≤ 1: |ΔAUC| ≤ n₀/(n₁n₀)
      = 1/n₁; a negative likewise 1/n₀. Attained: move the lowest-scored positive above
      every negative when it was below them all.
    * positive → negative: let A₀ be the AUC of the other rows (n₁ − 1 positives, n₀
      negatives). AUC(D) = A₀ + (r/n₀ − A₀)/n₁ (r ∈ [0, n₀] the row's pairs, a weighted
      mean of the pairs) and AUC(D') = A₀ + (r'/(n₁ − 1) − A₀)/(n₀ + 1) (r' ∈ [0, n₁ − 1]),
      so |ΔAUC| ≤ max_{A₀∈[0,1]} max((1 − A₀)/n₁ +
      A₀/(n₀ + 1), A₀/n₁ + (1 − A₀)/(n₀ + 1)) = max(1/n₁, 1/(n₀ + 1)) ≤ 1/min(n₁, n₀).
      (n₁ = 1: the bound is 1, which any change satisfies.) Negative → positive is
      symmetric: max(1/n₀, 1/(n₁ + 1)).
    So on any neighbour D' of D, |AUC(D) − AUC(D')| ≤ 1/min(n₁(D), n₀(D)); the test in
    tests/unit/test_private_evaluation.py enumerates neighbours and finds it attained.
    """
    p = count_at_least("positives", positives, low=1)
    q = count_at_least("negatives", negatives, low=1)
    return Fraction(1, min(p, q))


def macro_auc_sensitivity(*, class_lower: Sequence[int], rest_lower: Sequence[int]) -> Fraction:
    """Largest change of the macro one-vs-rest AUC (mean over k of AUC_k, class k against
    the rest) when one row is replaced, given lower bounds m_k ≤ n_k and m̄_k ≤ n − n_k
    (all ≥ 1) of D's class counts:  Δ_A = (1/K)·(Σ_k 1/m̄_k + 2/min_k m_k).

    Proof: replace a row of class a by one of class b. Problem k ∉ {a, b} sees a negative
    replaced by a negative: ≤ 1/(n − n_k) (:func:`binary_auc_sensitivity`, same class).
    Problem a (and b, if b ≠ a) sees the row change class or stay positive: at most
    max(1/n_a, 1/(n − n_a)) ≤ 1/n_a + 1/(n − n_a) (resp. for b). Summing,
    Σ_k |ΔAUC_k| ≤ Σ_k 1/(n − n_k) + 1/n_a + 1/n_b ≤ Σ_k 1/m̄_k + 2/min_k m_k.
    """
    lo = [count_at_least("class_lower", int(m), low=1) for m in class_lower]
    rest = [count_at_least("rest_lower", int(m), low=1) for m in rest_lower]
    if len(lo) != len(rest) or len(lo) < 3:
        raise ValueError("macro AUC needs K >= 3 lower bounds of each kind")
    total = sum((Fraction(1, m) for m in rest), Fraction(0)) + Fraction(2, min(lo))
    return total / len(lo)


# ---------------------------------------------------------------------- plans


@dataclass(frozen=True)
class MetricPlan:
    """Public description of one metric's release.

    ``epsilon``, ``delta``: its share of the budget. ``noise``: the law; ``scale``: the
    discrete Laplace b or the rounded Gaussian σ, in grid units of ``sensitivity_l1`` /
    ``sensitivity_l2``. AUC has a first stage (noisy class counts: ``count_scale``,
    ``count_epsilon``, ``count_delta``) and a test failing with probability
    ``delta_bad``; its grid unit is only known after the counts (:func:`auc_stage`).
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
    delta_bad: float | None = None


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
            plans.append(_auc_plan(share, noise=noise, classes=k))
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


def _auc_plan(share: Share, *, noise: NoiseKind, classes: int) -> MetricPlan:
    """AUC's share: half of ε to the class counts, half to the AUC. Laplace: all of δ to the
    count test (δ_bad). Gaussian: δ/3 each to the counts, the AUC and δ_bad. The total is
    (ε, δ) by the argument of :func:`auc_stage`."""
    e_count = e_auc = share.epsilon / 2.0
    if noise == "laplace":
        d_count, d_auc, d_bad = 0.0, 0.0, share.delta
    else:
        d_count = d_auc = d_bad = share.delta / 3.0
    dims = 1 if classes == 2 else classes
    c1, c2 = (1.0, 1.0) if classes == 2 else (2.0, math.sqrt(2.0))
    count_scale = _scale(noise, l1=c1, l2=c2, epsilon=e_count, delta=d_count, dims=dims)
    g = float(AUC_GRID + 1)
    scale = _scale(noise, l1=g, l2=g, epsilon=e_auc, delta=d_auc, dims=1)
    return MetricPlan(
        "auc",
        share.epsilon,
        share.delta,
        noise,
        g,
        g,
        scale,
        count_scale=count_scale,
        count_epsilon=e_count,
        count_delta=d_count,
        delta_bad=d_bad,
    )


@dataclass(frozen=True)
class AucStage:
    """The AUC's second stage, a function of the released noisy counts only.

    ``released`` is False when a lower bound is < 1 (too few rows of a class to bound the
    sensitivity): the AUC is then not released (its share is spent anyway).
    ``unit``: one grid unit in AUC units, Δ_A/AUC_GRID (an exact fraction).
    ``class_lower`` / ``rest_lower``: the public lower bounds m_k ≤ n_k, m̄_k ≤ n − n_k.
    """

    released: bool
    unit: Fraction
    sensitivity: Fraction
    class_lower: tuple[int, ...]
    rest_lower: tuple[int, ...]


def auc_stage(plan: EvaluationPlan, noisy_counts: Sequence[int]) -> AucStage:
    """Public lower bounds on the class counts from the noisy counts, and the AUC grid.

    Binary: ``noisy_counts`` = (ñ₁,) the noisy positive count; K ≥ 3: (ñ_k)_k. With
    τ = :func:`noise_tail` at probability δ_bad (binary) or δ_bad/K (union bound over the
    K counts), m_k = ñ_k − τ and m̄_k = n − ñ_k − τ. Binary uses m = min(m₁, m̄₁).

    Privacy (the propose-test-release pattern, Dwork & Lei 2009): fix neighbours D, D' and
    let G be the set of noisy counts whose bounds hold for D (every m_k ≤ n_k(D),
    m̄_k ≤ n − n_k(D)). On G the sensitivity bound (:func:`binary_auc_sensitivity`,
    :func:`macro_auc_sensitivity`, both from D's counts) is ≤ Δ_A, so the second stage is
    (ε_a, δ_a)-indistinguishable on (D, D'); off G has probability ≤ δ_bad under D.
    Let M* be the mechanism that, off G, runs the second stage on D' whichever input it
    has: M*(D') = M(D') exactly, M*(D) differs from M(D) only off G (total variation
    ≤ δ_bad), and on the pair (D, D') M* is an adaptive composition of an (ε_c, δ_c) and an
    (ε_a, δ_a) mechanism (off G its second stage ignores the input). So for any output set
    S, P_D[S] ≤ P_{M*(D)}[S] + δ_bad ≤ e^{ε_c + ε_a}P_{D'}[S] + δ_c + δ_a + δ_bad (adaptive
    composition, Dwork & Roth 2014 Thm 3.16), and the same with D and D' swapped (G then
    taken for D').
    For binary counts, min(ñ₁, n − ñ₁) − τ ≤ min(n₁, n₀) whenever |N| ≤ τ.
    """
    entry = plan.metric("auc")
    assert entry.count_scale is not None and entry.delta_bad is not None
    counts = [int(c) for c in noisy_counts]
    k = plan.classes
    if len(counts) != (1 if k == 2 else k):
        raise ValueError(f"expected {1 if k == 2 else k} noisy counts, got {len(counts)}")
    per = entry.delta_bad if k == 2 else entry.delta_bad / k
    tau = noise_tail(noise=plan.noise, scale=entry.count_scale, probability=per)
    lower = tuple(c - tau for c in counts)
    rest = tuple(plan.n - c - tau for c in counts)
    if min(lower + rest) < 1:
        return AucStage(False, Fraction(0), Fraction(0), lower, rest)
    if k == 2:
        sens = Fraction(1, min(lower[0], rest[0]))
    else:
        sens = macro_auc_sensitivity(class_lower=lower, rest_lower=rest)
    return AucStage(True, sens / AUC_GRID, sens, lower, rest)
