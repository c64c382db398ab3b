"""The statistics of LiRA membership inference (pure math: numpy and scipy only).

Source: Carlini, Chien, Nasr, Song, Terzis & Tramèr 2022, "Membership inference attacks
from first principles" (IEEE S&P 2022, arXiv:2112.03570), §IV (LiRA) and §VI-B.

* The statistic of a model f on an example (x, y) is the logit-scaled confidence on the
  true label, φ = log(p / (1 − p)), p = f(x)_y (their eq. (4)). For a binary logistic
  model with logit z = w·x + b, p = σ(z) when y = 1 and σ(−z) when y = 0, so
  φ = (2y − 1)·z exactly (no rounding through p).
* Shadow models, each trained on a random part of a public pool, give per example the
  statistics of the models that held it (IN) and of those that did not (OUT). Each side is
  fitted by a Gaussian (their Algorithm 1): the means per example; the variance per example
  or, with fewer than 64 shadow models, one global variance per side ("fixed variance",
  their §VI-B: per-example variances are then too noisy).
* Online score: the log likelihood ratio Λ = log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²)
  (Algorithm 1, line 13, in logs). Offline score (no IN models needed): log Φ((φ − μ_out)/σ_out),
  the one-sided test that φ is larger than OUT models give (their eq. (5)).
* Evaluation: the true-positive rate at a fixed low false-positive rate (their §III-B:
  0.1 % and 1 %) and the AUC, over (target model, example) pairs.
* An ε lower bound from one threshold test: if the training is (ε, δ)-DP then, for every
  test, TPR ≤ e^ε·FPR + δ (hypothesis-testing view of DP: Wasserman & Zhou 2010; Kairouz,
  Oh & Viswanath 2015, Thm 2.1), so ε ≥ log((TPR − δ)/FPR); with a Clopper–Pearson lower
  bound on TPR and an upper bound on FPR this is the estimator of Jagielski, Ullman & Oprea
  2020 ("Auditing differentially private machine learning: how private is private SGD?").
  It is computed by :func:`service.privacy.audit.epsilon_lower_bound` (which also takes
  the mirrored inequality), with the threshold chosen on a SELECTION part of the target
  models and the rates counted on the other, held-out part, so the counts do not measure
  their own choice.

What the bound assumes. Clopper–Pearson treats the counted pairs as independent Bernoulli
trials. Pairs of different target models are independent (each model has its own random
membership and its own training randomness); pairs of ONE target model are not (they share
its training). The per-pair inequality above holds marginally for each pair, but the
interval's coverage is therefore not proven here: read the figure as the bound LiRA
papers report, not as a certificate. The proven one-run bound for the same guesses
(Steinke, Nasr & Jagielski 2023, Thm 3.1; :mod:`service.privacy.one_run_audit`) handles
that dependence, at a lower ceiling.

The ceiling. With P member pairs and N non-member pairs counted, the largest bound any
threshold can show is the one of a perfect test (TP = P, FP = 0): :func:`lira_ceiling`.

Units: ε in nats; δ a probability; scores larger for "member".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from service.privacy.audit import EpsilonLowerBound, epsilon_lower_bound

__all__ = [
    "FIXED_VARIANCE_BELOW",
    "GaussianFit",
    "auc",
    "fit_gaussians",
    "lira_ceiling",
    "logit_confidence",
    "low_fpr_bound",
    "offline_scores",
    "online_scores",
    "threshold_at_fpr",
    "tpr_at_fpr",
]

FIXED_VARIANCE_BELOW = 64
"""With fewer shadow models than this, one global variance per side (Carlini et al. §VI-B)."""
_MIN_SD = 1e-8  # a side whose statistics are all equal still gets a proper density


def logit_confidence(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """φ = log(p/(1 − p)) of the true label of a binary logistic model: (2y − 1)·z."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if z.shape != y.shape:
        raise ValueError(f"logits {z.shape} and labels {y.shape} differ in shape")
    if not np.all((y == 0.0) | (y == 1.0)):
        raise ValueError("labels must be 0 or 1")
    return np.where(y == 1.0, z, -z)


@dataclass(frozen=True)
class GaussianFit:
    """Per-example Gaussians of the IN and OUT statistics (arrays of the pool's length;
    the standard deviations are constant arrays under fixed variance)."""

    mu_in: np.ndarray
    sd_in: np.ndarray
    mu_out: np.ndarray
    sd_out: np.ndarray
    n_in: np.ndarray  # shadow models holding each example
    n_out: np.ndarray
    fixed_variance: bool


def _side(phi: np.ndarray, mask: np.ndarray, fixed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-example mean (NaN where no model is on this side) and standard deviation."""
    count = mask.sum(axis=0)
    total = np.where(mask, phi, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    resid = np.where(mask, phi - mu, 0.0)
    if fixed:
        dof = int(count.sum() - (count > 0).sum())  # one mean fitted per example
        sd = math.sqrt(float((resid**2).sum()) / dof) if dof > 0 else math.nan
        sds = np.full(phi.shape[1], sd)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            sds = np.sqrt((resid**2).sum(axis=0) / np.maximum(count - 1, 1))
        sds = np.where(count > 1, sds, np.nan)
        fallback = np.nanmedian(sds) if np.isfinite(sds).any() else math.nan
        sds = np.where(np.isfinite(sds), sds, fallback)
    return mu, np.maximum(sds, _MIN_SD)


def fit_gaussians(
    phi: np.ndarray, member: np.ndarray, *, fixed_variance: bool | None = None
) -> GaussianFit:
    """Fit IN/OUT Gaussians per example from shadow statistics ``phi`` (models × examples)
    and memberships ``member`` (same shape, bool). ``fixed_variance`` defaults to "fewer
    than 64 shadow models". An example that no shadow held (or that all held) gets the
    other side's mean shifted by the mean IN − OUT gap of the examples that have both, and
    an example without a per-example variance the median of the others'."""
    phi = np.asarray(phi, dtype=np.float64)
    member = np.asarray(member, dtype=bool)
    if phi.ndim != 2 or phi.shape != member.shape:
        raise ValueError("phi and member must be 2-d arrays of one shape (models × examples)")
    if not np.isfinite(phi).all():
        raise ValueError("phi must be finite")
    fixed = phi.shape[0] < FIXED_VARIANCE_BELOW if fixed_variance is None else fixed_variance
    mu_in, sd_in = _side(phi, member, fixed)
    mu_out, sd_out = _side(phi, ~member, fixed)
    both = np.isfinite(mu_in) & np.isfinite(mu_out)
    if not both.any() or not np.isfinite(sd_in).all() or not np.isfinite(sd_out).all():
        raise ValueError("too few shadow models: no example was seen both IN and OUT twice")
    gap = float(np.mean(mu_in[both] - mu_out[both]))
    mu_in = np.where(np.isfinite(mu_in), mu_in, mu_out + gap)
    mu_out = np.where(np.isfinite(mu_out), mu_out, mu_in - gap)
    return GaussianFit(
        mu_in=mu_in,
        sd_in=sd_in,
        mu_out=mu_out,
        sd_out=sd_out,
        n_in=member.sum(axis=0),
        n_out=(~member).sum(axis=0),
        fixed_variance=fixed,
    )


def online_scores(fit: GaussianFit, phi: np.ndarray) -> np.ndarray:
    """Λ = log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²), per example (the last axis)."""
    phi = np.asarray(phi, dtype=np.float64)
    return stats.norm.logpdf(phi, fit.mu_in, fit.sd_in) - stats.norm.logpdf(
        phi, fit.mu_out, fit.sd_out
    )


def offline_scores(fit: GaussianFit, phi: np.ndarray) -> np.ndarray:
    """log Φ((φ − μ_out)/σ_out): how far above the OUT models' statistics φ lies."""
    phi = np.asarray(phi, dtype=np.float64)
    return stats.norm.logcdf(phi, fit.mu_out, fit.sd_out)


def _check_scores(scores: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    m = np.asarray(members, dtype=bool).reshape(-1)
    if s.shape != m.shape:
        raise ValueError("scores and members differ in size")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite")
    if m.all() or not m.any():
        raise ValueError("need both members and non-members")
    return s, m


def threshold_at_fpr(scores: np.ndarray, members: np.ndarray, fpr: float) -> float:
    """The smallest threshold t such that the test "member iff score > t" flags at most
    ⌊fpr·N⌋ of the N non-members (−inf when fpr·N ≥ N)."""
    s, m = _check_scores(scores, members)
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr}")
    neg = np.sort(s[~m])[::-1]  # descending
    k = math.floor(fpr * len(neg))
    return -math.inf if k >= len(neg) else float(neg[k])


def tpr_at_fpr(scores: np.ndarray, members: np.ndarray, fpr: float) -> tuple[float, float]:
    """(TPR, FPR achieved) of the test at :func:`threshold_at_fpr` on the same scores (the
    paper's empirical ROC point: optimistic for the attacker by its choice of t)."""
    s, m = _check_scores(scores, members)
    t = threshold_at_fpr(s, m, fpr)
    return float(np.mean(s[m] > t)), float(np.mean(s[~m] > t))


def auc(scores: np.ndarray, members: np.ndarray) -> float:
    """Area under the ROC curve: P(score of a member > that of a non-member), ties ½
    (Mann–Whitney U / (P·N), from mid-ranks)."""
    s, m = _check_scores(scores, members)
    ranks = stats.rankdata(s)  # mid-ranks for ties
    p, n = int(m.sum()), int((~m).sum())
    return float((ranks[m].sum() - p * (p + 1) / 2) / (p * n))


def low_fpr_bound(
    *,
    select_scores: np.ndarray,
    select_members: np.ndarray,
    scores: np.ndarray,
    members: np.ndarray,
    fpr: float,
    delta: float,
    confidence: float = 0.95,
    comparisons: int = 1,
) -> EpsilonLowerBound:
    """ε_lb of the test "member iff score > t", t chosen on the selection pairs at the
    target ``fpr`` and counted on the held-out pairs (module text; ``comparisons`` is the
    number of such tests the caller reports together, a Bonferroni factor)."""
    t = threshold_at_fpr(select_scores, select_members, fpr)
    s, m = _check_scores(scores, members)
    return epsilon_lower_bound(
        hits_world0=int((s[~m] > t).sum()),
        runs_world0=int((~m).sum()),
        hits_world1=int((s[m] > t).sum()),
        runs_world1=int(m.sum()),
        delta=delta,
        confidence=confidence,
        comparisons=comparisons,
        threshold=t,
        orientation="above",
        rule="split",
    )


def lira_ceiling(
    *, members: int, non_members: int, delta: float, confidence: float = 0.95, comparisons: int = 1
) -> float:
    """The largest ε_lb a threshold test on these counts can show: every member flagged,
    no non-member flagged (at the same confidence and Bonferroni factor)."""
    return epsilon_lower_bound(
        hits_world0=0,
        runs_world0=non_members,
        hits_world1=members,
        runs_world1=members,
        delta=delta,
        confidence=confidence,
        comparisons=comparisons,
    ).epsilon
