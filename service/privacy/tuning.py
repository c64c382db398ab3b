"""Private selection: the RDP of "run a private mechanism a random number of times and
release only the best run" (hyperparameter tuning, architecture search by random search).

Setting (Papernot & Steinke 2022, "Hyperparameter Tuning with Renyi Differential
Privacy", ICLR 2022, arXiv:2110.03620, Sec. 3): Q is one run (train one candidate with
DP-SGD, score it); A draws K from a *public* distribution, independently of the data,
runs Q K times with fresh randomness and returns the run with the best score (nothing,
if K = 0). A's privacy loss is not K times Q's: the bounds below grow only with
log E[K], which is the whole point (plain composition would charge E[K] or the cap).

Units: ε and RDP values in nats; δ a probability; an order λ is a float > 1.

Formulas (each is an upper bound on the RDP of A at order λ; we take the smallest over
the free parameter where there is one):

* truncated negative binomial D_{η,γ} (PS22 Definition 1, Theorem 2): for η ∈ (−1, ∞),
  γ ∈ (0, 1), if Q is (λ, ε)-RDP and (λ̂, ε̂)-RDP (λ̂ ∈ [1, ∞)), then A is (λ, ε')-RDP with

      ε' = ε + (1 + η)(1 − 1/λ̂) ε̂ + (1 + η) log(1/γ) / λ̂ + log(E[K]) / (λ − 1),

  E[K] = η(1 − γ) / (γ (1 − γ^η)) for η ≠ 0 and (1/γ − 1)/log(1/γ) for η = 0
  (the logarithmic distribution). η = 1 is the geometric distribution
  P[K = k] = γ(1 − γ)^{k−1}. λ̂ is free: we minimise over λ̂ ∈ {1} ∪ ORDERS (at λ̂ = 1
  the ε̂ term vanishes, whatever ε̂ is).
  Pure DP: letting λ, λ̂ → ∞ in the same bound, an ε-DP Q gives a ((2 + η)ε)-DP A; for
  η = 1 this is Liu & Talwar 2019 ("Private Selection from Private Candidates", STOC
  2019, Theorem 3.4): 3ε.
* Poisson(μ), μ ≥ 1 (PS22 Theorem 6; μ < 1 refused, see :class:`PoissonRuns`): if Q is
  (λ, ε)-RDP and (ε̂, δ̂)-DP with e^{ε̂} ≤ 1 + 1/(λ − 1), then A is (λ, ε')-RDP with

      ε' = ε + μ δ̂ + log(μ) / (λ − 1).

  We take ε̂ = log(λ/(λ − 1)) (the largest allowed) and δ̂ from Q's RDP curve by the
  conversion of Canonne, Kamath & Steinke 2020 (Prop. 12; see
  :func:`delta_from_rdp`), or δ̂ = 0 if Q is ε₀-DP with ε₀ ≤ ε̂.

* a law capped at ``max_runs`` (K drawn from the law *conditioned* on K ≤ max_runs, so
  the work is bounded): the theorems above are for the uncapped laws and do not apply as
  stated. We use PS22's generic bound instead (Lemma 7: for any K on {0, 1, 2, ...} with
  probability generating function f, there are q, q' ∈ [0, 1] with
  e^{(λ−1)D_λ(A(x)‖A(x'))} ≤ e^{(λ−1)D_λ(Q(x)‖Q(x'))} · f'(q)^λ · f'(q')^{1−λ}).
  f' is increasing on [0, 1], so f'(q) ≤ f'(1) = E[K] and f'(q') ≥ f'(0) = P[K = 1].
  That factor bounds the outputs of a run (by the mean value theorem on
  P[best ≤ y] = f(F(y)), F the run's cdf); the output ⊥ of K = 0 has the same mass
  P[K = 0] on both datasets and adds to the sum, so

      ε' = log(P[K = 0] + E[K]^λ · P[K = 1]^{1−λ} · e^{(λ−1)ε}) / (λ − 1),

  which for laws on {1, 2, ...} is ε + log(E[K] / P[K = 1]) + log(E[K]) / (λ − 1); E[K],
  P[K = 0] and P[K = 1] are those of the capped law. (Leaving the ⊥ term out would
  undercut the true RDP when P[K = 0] is large: K ∈ {0, 1} with P[K = 1] = p gives
  log((1 − p) + p·e^{(λ−1)ε})/(λ − 1), which is above ε + log(p)/(λ − 1).) A capped
  Poisson law may therefore have μ < 1. For the capped geometric this is at
  most Theorem 2's value at λ̂ = 1 (E[K]/P[K = 1] ≤ 1/γ², against 2·log(1/γ)); the
  λ̂ > 1 terms are lost. A capped law is never claimed pure. The exact best-of-K check in
  tests/unit/privacy/test_tuning.py would catch this bound (or our reading of the
  lemma) undercutting the true RDP.

Without a cap the number of runs is unbounded (its law is public; a large K is only
slow, never a privacy failure); the plan publishes quantiles of K (:func:`runs_quantile`)
and the service estimates the work at a high quantile (service/resources.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import special

from service.privacy.rdp import validate_orders

__all__ = [
    "MAX_RUNS_CAP",
    "PoissonRuns",
    "RunsDistribution",
    "TruncatedNegativeBinomialRuns",
    "delta_from_rdp",
    "padded_runs",
    "random_stopping_rdp",
    "runs_distribution_from_json",
    "runs_quantile",
]


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    out = float(value) + 0.0
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


MAX_RUNS_CAP = 10_000
"""The largest ``max_runs`` accepted (the capped law's moments are summed term by term)."""


class _RunsLaw:
    """What both laws share: the cap (``max_runs``; None: uncapped) applied to the
    uncapped pmf ``_log_pmf0``, and the moments the bounds need."""

    max_runs: int | None
    _start: int  # the smallest K with positive probability

    def _log_pmf0(self, k: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _expected_runs0(self) -> float:
        raise NotImplementedError

    def _check_cap(self) -> None:
        cap = self.max_runs
        if cap is None:
            return
        if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_RUNS_CAP:
            raise ValueError(f"max_runs must be an integer in [1, {MAX_RUNS_CAP}], got {cap!r}")

    def _support(self) -> np.ndarray:
        assert self.max_runs is not None
        return np.arange(self._start, self.max_runs + 1, dtype=np.float64)

    def _log_mass(self) -> float:
        """log P[K ≤ max_runs] under the uncapped law."""
        return float(special.logsumexp(self._log_pmf0(self._support())))

    def log_pmf(self, k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        out = self._log_pmf0(k)
        if self.max_runs is None:
            return out
        return np.where(k <= self.max_runs, out - self._log_mass(), -np.inf)

    def expected_runs(self) -> float:
        """E[K] (of the capped law where there is a cap)."""
        if self.max_runs is None:
            return self._expected_runs0()
        ks = self._support()
        return float(np.sum(ks * np.exp(self.log_pmf(ks))))

    def prob_one(self) -> float:
        """P[K = 1] (= f'(0), PS22 Lemma 7's smallest pgf slope)."""
        return float(np.exp(self.log_pmf(np.array([1.0])))[0])

    def prob_zero(self) -> float:
        """P[K = 0]: the probability of releasing nothing (⊥), the same on both datasets."""
        return float(np.exp(self.log_pmf(np.array([0.0])))[0]) if self._start == 0 else 0.0

    def _cap_json(self) -> dict[str, Any]:
        return {} if self.max_runs is None else {"max_runs": self.max_runs}


@dataclass(frozen=True)
class TruncatedNegativeBinomialRuns(_RunsLaw):
    """K ~ D_{η,γ} on {1, 2, ...} (PS22 Definition 1):

    P[K = k] = (1 − γ)^k / (γ^{−η} − 1) · Γ(k + η) / (Γ(η) k!)  (η ≠ 0),
    P[K = k] = (1 − γ)^k / (k log(1/γ))                          (η = 0).
    """

    eta: float
    gamma: float
    kind: Literal["truncated_negative_binomial"] = "truncated_negative_binomial"
    max_runs: int | None = None
    _start = 1

    def __post_init__(self) -> None:
        eta = _finite("eta", self.eta)
        gamma = _finite("gamma", self.gamma)
        if eta <= -1.0:
            raise ValueError(f"eta must be > -1, got {self.eta!r}")
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {self.gamma!r}")
        object.__setattr__(self, "eta", eta)
        object.__setattr__(self, "gamma", gamma)
        self._check_cap()

    def _expected_runs0(self) -> float:
        """E[K] (PS22, after Definition 1)."""
        eta, gamma = self.eta, self.gamma
        if eta == 0.0:
            return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
        return eta * (1.0 - gamma) / (gamma * -math.expm1(eta * math.log(gamma)))

    def _log_pmf0(self, k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        eta, gamma = self.eta, self.gamma
        base = k * math.log1p(-gamma)
        if eta == 0.0:
            return base - np.log(k) - math.log(math.log(1.0 / gamma))
        # log((γ^{−η} − 1)) with the sign of η folded into the binomial's Γ(η).
        norm = math.log(abs(math.expm1(-eta * math.log(gamma))))
        coef = special.gammaln(k + eta) - special.gammaln(eta) - special.gammaln(k + 1.0)
        # For −1 < η < 0, Γ(η) < 0 and γ^{−η} − 1 < 0: the two signs cancel.
        return base + coef - norm

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "eta": self.eta, "gamma": self.gamma, **self._cap_json()}


@dataclass(frozen=True)
class PoissonRuns(_RunsLaw):
    """K ~ Poisson(μ) on {0, 1, ...}, μ ≥ 1 (or any μ > 0 with a cap); K = 0 releases
    nothing (PS22 Sec. 3.3)."""

    mu: float
    kind: Literal["poisson"] = "poisson"
    max_runs: int | None = None
    _start = 0

    def __post_init__(self) -> None:
        mu = _finite("mu", self.mu)
        if mu <= 0.0:
            raise ValueError(f"mu must be > 0, got {self.mu!r}")
        if mu < 1.0 and self.max_runs is None:
            # Below 1 Theorem 6's log μ term is negative; our exact best-of-K check
            # (tests/unit/privacy/test_tuning.py) found it below the true RDP at μ = 0.5
            # (the mass of K = 0 must add to the sum; see the module docstring), so we do
            # not claim it there. With a cap the generic bound, ⊥ term included, applies.
            raise ValueError(f"mu must be >= 1 without max_runs, got {self.mu!r}")
        object.__setattr__(self, "mu", mu)
        self._check_cap()

    def _expected_runs0(self) -> float:
        return self.mu

    def _log_pmf0(self, k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        return k * math.log(self.mu) - self.mu - special.gammaln(k + 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "mu": self.mu, **self._cap_json()}


RunsDistribution = TruncatedNegativeBinomialRuns | PoissonRuns


def runs_distribution_from_json(d: object) -> RunsDistribution:
    """Decode ``to_json`` output; ValueError on anything else."""
    if not isinstance(d, dict):
        raise ValueError(f"a runs distribution must be an object, got {type(d).__name__}")
    kind, cap = d.get("kind"), d.get("max_runs")
    keys = set(d) - {"max_runs"}
    if kind == "truncated_negative_binomial" and keys == {"kind", "eta", "gamma"}:
        return TruncatedNegativeBinomialRuns(eta=d["eta"], gamma=d["gamma"], max_runs=cap)
    if kind == "poisson" and keys == {"kind", "mu"}:
        return PoissonRuns(mu=d["mu"], max_runs=cap)
    raise ValueError(f"unknown or malformed runs distribution {d!r}")


RUNS_WORK_QUANTILE = 0.999
"""Random stopping without a cap: the work is estimated, and the runs padded, at this
quantile of K."""


def padded_runs(dist: RunsDistribution) -> int:
    """How many trainings a random-stopping job performs whatever K is: the cap, or K's
    :data:`RUNS_WORK_QUANTILE` quantile where the law is uncapped. The worker runs
    max(K, this) trainings and discards those after the K-th, so the job's duration, the
    only observable of its progress, does not depend on K (Papernot & Steinke's bound
    assumes K hidden; issue 19). With a cap the duration never depends on K; without one,
    K above the quantile (probability ≤ 1 − 0.999) still lengthens the job, which is why
    the README recommends ``max_runs``."""
    if dist.max_runs is not None:
        return dist.max_runs
    return runs_quantile(dist, RUNS_WORK_QUANTILE)


def runs_quantile(dist: RunsDistribution, p: float) -> int:
    """Smallest k with P[K ≤ k] ≥ p (public: shows the analyst how long a job may run)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    start = 0 if isinstance(dist, PoissonRuns) else 1
    total, k = 0.0, start
    while True:
        ks = np.arange(k, k + 1024, dtype=np.float64)
        cdf = total + np.cumsum(np.exp(dist.log_pmf(ks)))
        hit = np.nonzero(cdf >= p)[0]
        if hit.size:
            return int(ks[hit[0]])
        total, k = float(cdf[-1]), k + 1024
        if k > 10**8:
            raise ValueError("quantile beyond 1e8 runs")


def delta_from_rdp(
    *, rdp: Sequence[float] | np.ndarray, orders: Sequence[float], epsilon: float
) -> float:
    """Smallest δ over the orders such that the RDP curve implies (ε, δ)-DP: the conversion
    of :func:`~service.privacy.rdp.epsilon_from_rdp` (Canonne, Kamath & Steinke 2020,
    Prop. 12) solved for δ:

        log δ = (α − 1)(ρ_α − ε + log(1 − 1/α)) − log α.
    """
    alphas = validate_orders(orders)
    best = 1.0
    for a, r in zip(alphas, rdp, strict=True):
        r = float(r)
        if not math.isfinite(r):
            continue
        log_d = (a - 1.0) * (r - epsilon + math.log1p(-1.0 / a)) - math.log(a)
        best = min(best, math.exp(min(log_d, 0.0)))
    return best


def random_stopping_rdp(
    *,
    dist: RunsDistribution,
    base_rdp: Sequence[float] | np.ndarray,
    orders: Sequence[float],
    hat_rdp: Sequence[float] | np.ndarray,
    hat_orders: Sequence[float],
    base_pure_epsilon: float | None = None,
) -> np.ndarray:
    """PS22 bound on the RDP of best-of-K at each order λ in ``orders``.

    ``base_rdp`` is one run's curve on ``orders``; ``hat_rdp`` the same run's curve on
    ``hat_orders`` (the free λ̂ of Theorem 2, or the grid for δ̂ in Theorem 6);
    ``base_pure_epsilon``: one run's ε if it is ε-DP (δ̂ = 0 where allowed).
    Formulas and citations in the module docstring. Rounded up slightly (2⁻⁴⁰ relative).
    """
    lams = np.asarray(validate_orders(orders))
    base = np.asarray(base_rdp, dtype=np.float64)
    hats = np.asarray(validate_orders(hat_orders))
    hat = np.asarray(hat_rdp, dtype=np.float64)
    if base.shape != lams.shape or hat.shape != hats.shape:
        raise ValueError("curve and order lengths differ")
    if np.any(~(base >= 0.0)) or np.any(~(hat >= 0.0)):
        raise ValueError("RDP values must be >= 0")
    log_ek = math.log(dist.expected_runs())
    if dist.max_runs is not None:
        # PS22 Lemma 7 with f'(q) ≤ E[K], f'(q') ≥ P[K = 1], plus the ⊥ output's mass
        # P[K = 0] on both sides (module docstring).
        scaled = (lams - 1.0) * (base + log_ek - math.log(dist.prob_one())) + log_ek
        p0 = dist.prob_zero()
        if p0 > 0.0:
            scaled = np.logaddexp(math.log(p0), scaled)
        out = scaled / (lams - 1.0)
    elif isinstance(dist, TruncatedNegativeBinomialRuns):
        c = 1.0 + dist.eta
        log_inv_gamma = -math.log(dist.gamma)
        # λ̂ = 1: only the log(1/γ) term; λ̂ ∈ grid: all three.
        candidates = np.concatenate(
            ([c * log_inv_gamma], c * (1.0 - 1.0 / hats) * hat + c * log_inv_gamma / hats)
        )
        extra = float(np.min(candidates[np.isfinite(candidates)]))
        out = base + extra + log_ek / (lams - 1.0)
    else:
        out = np.empty_like(base)
        for n, lam in enumerate(lams):
            eps_hat = math.log(lam / (lam - 1.0))
            if base_pure_epsilon is not None and base_pure_epsilon <= eps_hat:
                d_hat = 0.0
            else:
                d_hat = delta_from_rdp(rdp=hat, orders=tuple(hats.tolist()), epsilon=eps_hat)
            out[n] = base[n] + dist.mu * d_hat + log_ek / (lam - 1.0)
    out = out + np.abs(out) * 2.0**-40
    return np.maximum(out, 0.0)
