"""Private evaluation of a released model on a private holdout (issue 21): the integer
statistics of each metric, the worker's integer noise, and the released values with
their confidence intervals. The sensitivity arguments, budget split, noise calibration
and intervals are in service/privacy/evaluation.py; this module only computes what that
module's table names and adds the noise.

Inputs are the model's predicted probabilities on the holdout (binary: P(y = 1) per row,
shape (n,), or (n, 2); K classes: (n, K)) and the integer labels in [0, K), as numpy
arrays or CPU torch tensors. Non-finite probabilities are read as 0 and everything is
clipped to [0, 1] (a per-row rule, so the sensitivities hold whatever the model outputs).
Predictions are the arg-max (ties to the lower class; binary: p > ½ is class 1).

What leaves: :class:`EvaluationRelease`, the noisy values (for AUC, its noisy 2U and
noisy class counts, of which the AUC is a function) with their intervals, all computed
from the noisy integers and public plan values only. Noise comes from
:func:`worker.noise.secure_rng` (ChaCha20 keyed from the OS CSPRNG); no function here
takes a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from service.privacy.evaluation import (
    ECE_GRID,
    LOG_LOSS_GRID,
    EvaluationPlan,
    MetricPlan,
    NoiseKind,
)
from service.privacy.evaluation_intervals import (
    Interval,
    auc_interval,
    bounded_mean_interval,
    calibration_error_interval,
    proportion_interval,
)
from worker.noise import discrete_laplace, rounded_gaussian, secure_rng

__all__ = [
    "AucRelease",
    "ConfusionRelease",
    "EvaluationRelease",
    "ScalarRelease",
    "auc_exact",
    "auc_twice_u",
    "confusion_counts",
    "correct_count",
    "ece_units",
    "evaluate",
    "log_loss_units",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# ---------------------------------------------------------------------- inputs


def _as_numpy(x: Any) -> npt.NDArray[Any]:
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def probability_matrix(probabilities: Any, *, classes: int) -> FloatArray:
    """(n, K) float64 probabilities: a binary (n,) vector p becomes columns (1 − p, p);
    non-finite entries become 0 and all entries are clipped to [0, 1]."""
    p = np.nan_to_num(_as_numpy(probabilities).astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    p = np.clip(p, 0.0, 1.0)
    if p.ndim == 1 and classes == 2:
        p = np.stack([1.0 - p, p], axis=1)
    if p.ndim != 2 or p.shape[1] != classes:
        raise ValueError(f"probabilities must have shape (n, {classes}), got {p.shape}")
    return p


def label_vector(labels: Any, *, classes: int, rows: int) -> IntArray:
    """Integer labels in [0, K); their range is the public schema's (checked at
    registration), so an out-of-range label is a programming error."""
    y = _as_numpy(labels)
    if y.shape != (rows,):
        raise ValueError(f"labels must have shape ({rows},), got {y.shape}")
    yi = y.astype(np.int64)
    if not np.array_equal(yi, y) or (yi.size and (yi.min() < 0 or yi.max() >= classes)):
        raise ValueError(f"labels must be integers in [0, {classes})")
    return yi


def _predictions(p: FloatArray) -> IntArray:
    return np.argmax(p, axis=1).astype(np.int64)


# ---------------------------------------------------------------------- statistics


def correct_count(p: FloatArray, y: IntArray) -> int:
    """C = #{ŷ = y} (sensitivity 1 under replace-one)."""
    return int(np.count_nonzero(_predictions(p) == y))


def confusion_counts(p: FloatArray, y: IntArray) -> IntArray:
    """M_ij = #{y = i, ŷ = j}, (K, K) int64 (L1 sensitivity 2)."""
    k = p.shape[1]
    flat = y * k + _predictions(p)
    return np.bincount(flat, minlength=k * k).astype(np.int64).reshape(k, k)


def _twice_u(scores: FloatArray, positive: npt.NDArray[np.bool_]) -> int:
    """2U = Σ_{i pos, j neg} (2·1{s_i > s_j} + 1{s_i = s_j}) (Mann–Whitney, ties ½), exact:
    per positive, #{negatives below} + #{negatives not above}; 0 when a class is empty."""
    pos = scores[positive]
    neg = np.sort(scores[~positive])
    below = np.searchsorted(neg, pos, side="left").astype(np.int64)
    not_above = np.searchsorted(neg, pos, side="right").astype(np.int64)
    return int(np.sum(below + not_above, dtype=np.int64))


def _one_vs_rest(scores: FloatArray, positive: npt.NDArray[np.bool_]) -> Fraction:
    """Exact AUC = U/(n₁n₀) with ties counted ½ (Mann–Whitney), ½ when a class is empty."""
    n1 = int(np.count_nonzero(positive))
    n0 = positive.size - n1
    if n1 == 0 or n0 == 0:
        return Fraction(1, 2)
    return Fraction(_twice_u(scores, positive), 2 * n1 * n0)


def auc_twice_u(p: FloatArray, y: IntArray) -> IntArray:
    """The AUC's integer statistic: binary (2U,) of P(y = 1); K ≥ 3, (2U_k)_k with class k
    against the rest on p_k (service/privacy/evaluation.py ``auc_sensitivity``)."""
    k = p.shape[1]
    if k == 2:
        return np.array([_twice_u(p[:, 1], y == 1)], dtype=np.int64)
    return np.array([_twice_u(p[:, c], y == c) for c in range(k)], dtype=np.int64)


def auc_exact(p: FloatArray, y: IntArray) -> Fraction:
    """Binary AUC of P(y = 1), or the macro one-vs-rest AUC (mean over k of AUC of p_k for
    class k against the rest), as an exact fraction."""
    k = p.shape[1]
    if k == 2:
        return _one_vs_rest(p[:, 1], y == 1)
    return sum((_one_vs_rest(p[:, c], y == c) for c in range(k)), Fraction(0)) / k


def log_loss_units(p: FloatArray, y: IntArray, *, p_min: float) -> int:
    """Σ_i q_i, q_i = round(ℓ_i·G/L) clamped to [0, G] in integers, ℓ_i = −ln clip(p_{i,y_i},
    p_min, 1 − p_min), L = −ln p_min, G = LOG_LOSS_GRID (L1 sensitivity G)."""
    width = -math.log(p_min)
    py = np.clip(p[np.arange(p.shape[0]), y], p_min, 1.0 - p_min)
    q = np.rint(-np.log(py) * (LOG_LOSS_GRID / width)).astype(np.int64)
    return int(np.sum(np.clip(q, 0, LOG_LOSS_GRID), dtype=np.int64))


def ece_units(p: FloatArray, y: IntArray, *, bins: int) -> int:
    """T = Σ_b |Σ_{i∈b} q_i|, q_i = round((o_i − c_i)·G) clamped to [−G, G], G = ECE_GRID.
    Binary: c = P(y = 1), o = y. K ≥ 3 (top label): c = max_k p_k, o = 1{ŷ = y}.
    Bins: b = min(⌊c·B⌋, B − 1) (L1 sensitivity 2G)."""
    if p.shape[1] == 2:
        conf = p[:, 1]
        outcome = (y == 1).astype(np.float64)
    else:
        conf = np.max(p, axis=1)
        outcome = (_predictions(p) == y).astype(np.float64)
    q = np.clip(np.rint((outcome - conf) * ECE_GRID).astype(np.int64), -ECE_GRID, ECE_GRID)
    b = np.minimum((conf * bins).astype(np.int64), bins - 1)
    sums = np.zeros(bins, dtype=np.int64)
    np.add.at(sums, b, q)
    return int(np.sum(np.abs(sums), dtype=np.int64))


# ---------------------------------------------------------------------- releases


@dataclass(frozen=True)
class ScalarRelease:
    """One noisy metric: ``value`` (metric units) and its ``interval`` for the population
    value; ``noise_scale`` is the noise's b (Laplace) or σ (Gaussian) in metric units."""

    metric: str
    value: float
    interval: Interval
    epsilon: float
    delta: float
    noise: NoiseKind
    noise_scale: float


@dataclass(frozen=True)
class AucRelease:
    """The AUC (binary, or macro one-vs-rest), a post-processing of the two noisy integer
    releases that are part of it: ``noisy_twice_u`` (2U, or each class's 2U_k) and
    ``noisy_class_counts`` (binary: positives; K ≥ 3: each class). ``value`` is
    Ũ/(ñ₊ñ₋) with each noisy count clamped to [1, n − 1], then clipped to [0, 1].
    ``twice_u_noise_scale``: 2U's noise b or σ (2U units); ``count_noise_scale``: the
    counts'. ``noise_scale`` describes the AUC's noise in AUC units at the noisy counts
    (b/(2ñ₊ñ₋); K ≥ 3, (1/K)·√Σ_k (b/(2ñ_k(n − ñ_k)))²), as the other metrics' do; the
    count noise is not in it (the interval accounts for both)."""

    value: float
    interval: Interval
    noisy_twice_u: tuple[int, ...]
    noisy_class_counts: tuple[int, ...]
    epsilon: float
    delta: float
    noise: NoiseKind
    noise_scale: float
    twice_u_noise_scale: float
    count_noise_scale: float


@dataclass(frozen=True)
class ConfusionRelease:
    """Noisy counts M̃_ij (row: true class, column: predicted) and, per cell, an interval
    for the population probability of that cell (pointwise, not simultaneous)."""

    counts: tuple[tuple[int, ...], ...]
    intervals: tuple[tuple[Interval, ...], ...]
    epsilon: float
    delta: float
    noise: NoiseKind
    noise_scale: float


@dataclass(frozen=True)
class EvaluationRelease:
    """What an evaluation releases; a metric not requested is None."""

    n: int
    classes: int
    epsilon: float
    delta: float
    accuracy: ScalarRelease | None = None
    auc: AucRelease | None = None
    log_loss: ScalarRelease | None = None
    calibration_error: ScalarRelease | None = None
    confusion: ConfusionRelease | None = None


def _noise(rng: np.random.Generator, entry_noise: NoiseKind, scale: float, size: int) -> IntArray:
    if entry_noise == "laplace":
        return discrete_laplace(rng, scale=scale, size=size)
    return rounded_gaussian(rng, scale=scale, size=size)


def evaluate(*, plan: EvaluationPlan, probabilities: Any, labels: Any) -> EvaluationRelease:
    """Score (probabilities, labels) of the holdout under ``plan``: each requested metric's
    integer statistic plus the worker's integer noise, and its interval."""
    p = probability_matrix(probabilities, classes=plan.classes)
    if p.shape[0] != plan.n:
        raise ValueError(f"the plan is for {plan.n} rows, got {p.shape[0]}")
    y = label_vector(labels, classes=plan.classes, rows=plan.n)
    rng = secure_rng()
    out: dict[str, Any] = {}
    for entry in plan.metrics:
        if entry.metric == "accuracy":
            out["accuracy"] = _accuracy(plan, entry, rng, p, y)
        elif entry.metric == "confusion":
            out["confusion"] = _confusion(plan, entry, rng, p, y)
        elif entry.metric == "log_loss":
            out["log_loss"] = _log_loss(plan, entry, rng, p, y)
        elif entry.metric == "calibration_error":
            out["calibration_error"] = _calibration(plan, entry, rng, p, y)
        else:
            out["auc"] = _auc(plan, entry, rng, p, y)
    return EvaluationRelease(
        n=plan.n, classes=plan.classes, epsilon=plan.epsilon, delta=plan.delta, **out
    )


def _accuracy(
    plan: EvaluationPlan, e: MetricPlan, rng: np.random.Generator, p: FloatArray, y: IntArray
) -> ScalarRelease:
    noisy = correct_count(p, y) + int(_noise(rng, e.noise, e.scale, 1)[0])
    interval = proportion_interval(
        noisy_count=noisy, trials=plan.n, noise=e.noise, scale=e.scale, confidence=plan.confidence
    )
    return ScalarRelease(
        "accuracy", noisy / plan.n, interval, e.epsilon, e.delta, e.noise, e.scale / plan.n
    )


def _confusion(
    plan: EvaluationPlan, e: MetricPlan, rng: np.random.Generator, p: FloatArray, y: IntArray
) -> ConfusionRelease:
    k = plan.classes
    noisy = confusion_counts(p, y) + _noise(rng, e.noise, e.scale, k * k).reshape(k, k)
    counts = tuple(tuple(int(v) for v in row) for row in noisy)
    intervals = tuple(
        tuple(
            proportion_interval(
                noisy_count=c,
                trials=plan.n,
                noise=e.noise,
                scale=e.scale,
                confidence=plan.confidence,
            )
            for c in row
        )
        for row in counts
    )
    return ConfusionRelease(counts, intervals, e.epsilon, e.delta, e.noise, e.scale)


def _log_loss(
    plan: EvaluationPlan, e: MetricPlan, rng: np.random.Generator, p: FloatArray, y: IntArray
) -> ScalarRelease:
    noisy = log_loss_units(p, y, p_min=plan.p_min) + int(_noise(rng, e.noise, e.scale, 1)[0])
    width = -math.log(plan.p_min)
    unit = width / LOG_LOSS_GRID
    interval = bounded_mean_interval(
        noisy_sum=noisy,
        trials=plan.n,
        unit=unit,
        width=width,
        noise=e.noise,
        scale=e.scale,
        confidence=plan.confidence,
    )
    value = noisy * unit / plan.n
    return ScalarRelease(
        "log_loss", value, interval, e.epsilon, e.delta, e.noise, e.scale * unit / plan.n
    )


def _calibration(
    plan: EvaluationPlan, e: MetricPlan, rng: np.random.Generator, p: FloatArray, y: IntArray
) -> ScalarRelease:
    noisy = ece_units(p, y, bins=plan.bins) + int(_noise(rng, e.noise, e.scale, 1)[0])
    interval = calibration_error_interval(
        noisy_total=noisy,
        trials=plan.n,
        bins=plan.bins,
        noise=e.noise,
        scale=e.scale,
        confidence=plan.confidence,
    )
    value = noisy / (ECE_GRID * plan.n)
    return ScalarRelease(
        "calibration_error",
        value,
        interval,
        e.epsilon,
        e.delta,
        e.noise,
        e.scale / (ECE_GRID * plan.n),
    )


def _auc(
    plan: EvaluationPlan, e: MetricPlan, rng: np.random.Generator, p: FloatArray, y: IntArray
) -> AucRelease:
    assert e.count_scale is not None
    k, n = plan.classes, plan.n
    true_counts = np.bincount(y, minlength=k).astype(np.int64)
    counted = true_counts[1:2] if k == 2 else true_counts
    noisy_counts = tuple(
        int(v) for v in counted + _noise(rng, e.noise, e.count_scale, counted.size)
    )
    stat = auc_twice_u(p, y)
    noisy_u = tuple(int(v) for v in stat + _noise(rng, e.noise, e.scale, stat.size))
    # Post-processing of the two releases only: AUC_k = Ũ_k/(ñ_k(n − ñ_k)), counts
    # clamped to [1, n − 1] (n = 1: no pair, ½ by convention), the mean clipped to [0, 1]
    # (a noisy count near 1 can blow the ratio up).
    pairs = [
        2.0 * min(max(c, 1), n - 1) * (n - min(max(c, 1), n - 1)) if n >= 2 else 0.0
        for c in noisy_counts
    ]
    values = [u / d if d > 0 else 0.5 for u, d in zip(noisy_u, pairs, strict=True)]
    per_class = [e.scale / d if d > 0 else 0.0 for d in pairs]
    interval = auc_interval(plan=plan, noisy_twice_u=noisy_u, noisy_counts=noisy_counts)
    return AucRelease(
        min(max(sum(values) / len(values), 0.0), 1.0),
        interval,
        noisy_u,
        noisy_counts,
        e.epsilon,
        e.delta,
        e.noise,
        math.sqrt(sum(v * v for v in per_class)) / len(per_class),
        e.scale,
        e.count_scale,
    )
