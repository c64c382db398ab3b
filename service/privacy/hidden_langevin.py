"""Rényi DP of noisy full-batch gradient descent on a strongly convex loss when only the
last iterate is released ("hidden" iterates): a bound that converges in the number of
steps K instead of growing like K as composition does. Pure math: no torch, no state.

Conventions as in :mod:`service.privacy.rdp`: RDP values and ε in nats, δ a probability,
orders α > 1, neighbours by adding or removing one row.

**Source.** The proof below is written out here, step by step, because the theorem texts
could not be read from this workplace (the search tools returned only the abstracts of
Chourasia, Ye & Shokri 2021, "Differential privacy dynamics of Langevin diffusion and
noisy gradient descent", NeurIPS, arXiv:2102.05855, and of Altschuler & Talwar 2022,
"Privacy of noisy stochastic gradient descent: more iterations without more privacy
loss", NeurIPS, arXiv:2205.13710). It is the "privacy amplification by iteration"
argument of Feldman, Mironov, Talwar & Thakurta 2018 (FOCS, arXiv:1808.06651: the
shifted Rényi divergence, its *shift-reduction* and *contraction-reduction* lemmas),
with the contraction factor c < 1 that strong convexity gives, as Altschuler & Talwar
use it; the step-by-step derivation below is self-contained and uses only the
data-processing inequality for Rényi divergence and the Rényi divergence between two
Gaussians. The result is the same function of K as the Gaussian-DP parameter that Bok,
Su & Altschuler 2024 (ICML, "Shifted interpolation for differential privacy",
arXiv:2403.00278) state to be exact in the strongly convex case (their f-DP form would
allow the tighter Gaussian (ε, δ) conversion; it is not used here because its text was
not read either). For comparison, the secondary-reading form of Chourasia et al.'s
bound, 4αL²/(λσ_C²n²)·(1 − e^(−λησ_C²K/2))-like with their Langevin noise √(2η)·σ_C,
tends to twice the limit found here: the bound below is the smaller and, for quadratic
losses, equal to the exact divergence (Tightness).

**Algorithm** (what the bound is about). Public: the divisor n ≥ 1, a start θ₀, a closed
convex set C ⊆ ℝ^P (C = ℝ^P allowed), the step η, the noise multiplier σ, the steps K.
For a dataset D of rows, F_D(θ) = (1/n)·Σ_{i∈D} ℓᵢ(θ) + r(θ), and for k = 0 … K − 1

    θ_{k+1} = Π_C(θ_k − η·(g_D(θ_k) + (L/n)·σ·ξ_k)),   ξ_k ~ N(0, I_P) i.i.d.,

where g_D is the gradient the implementation computes, with ‖g_D(θ) − ∇F_D(θ)‖ ≤ E for
every θ (E = 0 for exact arithmetic). Only θ_K is released; K is fixed before the run.
In words: Gaussian noise of std σ·L on the gradient *sum* Σ∇ℓᵢ, as the product's
Langevin sampler adds σ·Δ to its integer gradient sum.

**Conditions** (each checked by :func:`contraction_factor` and the functions below):

(C1) every ℓᵢ is L-Lipschitz: ‖∇ℓᵢ(θ)‖ ≤ L for all θ. Then, with the divisor n fixed and
     public, sup_θ ‖∇F_D(θ) − ∇F_D'(θ)‖ ≤ L/n for D' = D ± one row.
(C2) for every dataset D the algorithm may meet (both neighbours), F_D is twice
     differentiable, λ-strongly convex and β-smooth: λ·I ≼ ∇²F_D ≼ β·I, 0 < λ ≤ β.
(C3) 0 < η < 2/β. Then the gradient map φ_D(θ) = θ − η∇F_D(θ) is c-Lipschitz with
     c = max(|1 − ηλ|, |1 − ηβ|) < 1 (c = 1 − ηλ when η ≤ 2/(λ + β)): φ_D(x) − φ_D(y)
     = (I − η·H̄)(x − y) with H̄ = ∫₀¹ ∇²F_D(y + t(x − y)) dt symmetric, spectrum in
     [λ, β], so ‖I − ηH̄‖ = max over h ∈ [λ, β] of |1 − ηh|.
(C4) θ₀ and C do not depend on the data; C is closed and convex (Π_C is then a
     well-defined deterministic map; it is only post-processing below, so C = ℝ^P is
     allowed; strong convexity makes a bounded domain unnecessary).
(C5) the ξ_k are exact independent standard Gaussians; only θ_K leaves; K is public.

**Theorem.** Under (C1)–(C5), for every α > 1 and neighbours D, D' (both orders),

    D_α(θ_K^D ‖ θ_K^{D'}) ≤ α·(1 + 2nE/L)²/(2σ²) · A(c, K),
    A(c, K) = (1 + c)·(1 − c^K) / ((1 − c)·(1 + c^K)),

and A(c, K) ≤ min(K, (1 + c)/(1 − c)): never above composition (K Gaussian mechanisms,
Kα/(2σ²)), equal to it at K = 1, increasing in K and converging to (1 + c)/(1 − c)
≈ 2/(ηλ). So θ_K has the RDP curve of one Gaussian mechanism with noise multiplier
σ_eff = σ/((1 + 2nE/L)·√A(c, K)).

**Proof.** Shifted Rényi divergence (Feldman et al. 2018): for z ≥ 0,
D_α^{(z)}(μ ‖ ν) = inf { D_α(μ' ‖ ν) : W∞(μ, μ') ≤ z }, so D_α^{(0)} = D_α. Write
s = η·(L/n + 2E), ς = η·σ·L/n (the noise's std in θ-space).

1. Contraction reduction. Let ψ_D = η-step with the computed gradient,
   ψ_D(θ) = θ − η·g_D(θ). For all x, y:
   ‖ψ_D(x) − ψ_D'(y)‖ ≤ ‖φ_D(x) − φ_D(y)‖ + ‖φ_D(y) − φ_D'(y)‖ + 2ηE ≤ c‖x − y‖ + s
   by (C3), (C1) and the error bound. Given μ' with W∞(μ, μ') ≤ z, couple X ~ μ, X' ~ μ'
   with ‖X − X'‖ ≤ z a.s.: then ‖ψ_D(X) − ψ_D'(X')‖ ≤ cz + s, so
   W∞(ψ_D#μ, ψ_D'#μ') ≤ cz + s, while D_α(ψ_D'#μ' ‖ ψ_D'#ν) ≤ D_α(μ' ‖ ν) (data
   processing). Hence D_α^{(cz+s)}(ψ_D#μ ‖ ψ_D'#ν) ≤ D_α^{(z)}(μ ‖ ν).
2. Shift reduction (Feldman et al. 2018, Gaussian case). For ξ ~ N(0, ς²I) and
   0 ≤ a ≤ z + a: D_α^{(z)}(μ∗ξ ‖ ν∗ξ) ≤ D_α^{(z+a)}(μ ‖ ν) + α·a²/(2ς²). (Couple
   X ~ μ, X' ~ μ' within z + a; move X towards X' to X'' with ‖X − X''‖ ≤ z,
   ‖X'' − X'‖ ≤ a; then law(X + ξ) is within W∞ z of law(X'' + ξ), and by the chain
   rule for Rényi divergence of the pair (X', X'' + ξ) against (Y, Y + ξ), Y ~ ν,
   D_α(X'' + ξ ‖ Y + ξ) ≤ D_α(μ' ‖ ν) + sup_{‖w‖≤a} D_α(N(w, ς²I) ‖ N(0, ς²I)), the
   conditional law of X'' + ξ given X' = x being a mixture of N(x + w, ς²I), ‖w‖ ≤ a,
   whose divergence from N(x, ς²I) is at most the largest component's (quasi-convexity),
   α‖w‖²/(2ς²).)
3. Projection. Π_C is the same map in both runs: D_α^{(z)}(Π_C#μ ‖ Π_C#ν) ≤
   D_α^{(z)}(μ ‖ ν) (1-Lipschitz, step 1 with c = 1, s = 0).
4. Recursion. Both runs start at the same θ₀ (z₀ = 0, divergence 0). Step k maps
   z_{k−1} to c·z_{k−1} + s (1.), spends a_k (2.), keeps it (3.):
   z_k = c·z_{k−1} + s − a_k ≥ 0, and D_α^{(z_K)}(θ_K^D ‖ θ_K^{D'}) ≤ Σ α a_k²/(2ς²).
   Choose z_K = 0, i.e. Σ_k c^{K−k}·a_k = s·Σ_k c^{K−k} = s·(1 − c^K)/(1 − c). By
   Cauchy–Schwarz the least Σ a_k² under that constraint is
   s²·(Σ c^{K−k})²/Σ c^{2(K−k)} = s²·(1 − c^K)²(1 − c²)/((1 − c)²(1 − c^{2K}))
   = s²·A(c, K), reached at a_k ∝ c^{K−k}; these a_k increase with k, so s − a_k
   decreases and every prefix of the zero-sum Σ c^{K−k}(s − a_k) is ≥ 0: every z_k ≥ 0,
   as step 2 needs. With s²/ς² = (1 + 2nE/L)²/σ² the theorem follows. (The choice
   a_k = s for all k gives composition, K·s²: A ≤ K.) ∎

**Tightness.** For f_D(θ) = (λ/2)‖θ‖² + (1/n)Σ⟨gᵢ, θ⟩, C = ℝ^P, E = 0: θ_K is Gaussian
with covariance ς²·(1 − c^{2K})/(1 − c²)·I for both datasets and means that differ by
η·(g/n)·(1 − c^K)/(1 − c) (g the added row's vector, ‖g‖ ≤ L), so D_α equals the bound
exactly when ‖g‖ = L: no smaller σ satisfies the theorem's conclusion for all losses
meeting (C1)–(C5). tests/unit/test_hidden_langevin.py checks this closed form.

**The product's logistic regression** (worker/mechanisms/langevin.py, binary): the
sampler runs θ ← θ − (lr/n̂)·(G(θ) + N + l2·θ) with G the sum of the rows' logistic
gradients and N of std σ·Δ on the fixed-point sum. In this module's terms:

* n = n̂ (the plan's public row count, the divisor); F_D = (1/n̂)(Σℓᵢ + l2‖θ‖²/2),
  η = lr; the regulariser r(θ) = l2‖θ‖²/(2n̂) is data-independent, so it enters λ and β,
  not the sensitivity;
* L = √B: ∇ℓᵢ = (σ(θ·x̃) − y)·x̃ with x̃ = (x, 1), |σ − y| ≤ 1 and ‖x̃‖² ≤ B, the public
  schema's row-norm bound (service.methods.expm.row_norm_sq_bound; each numeric column
  in [0, 1], one 1 per categorical column, the bias), checked exactly in the worker;
* λ = l2/n̂ (ℓᵢ convex): l2 > 0 is what makes the loss strongly convex;
* β = (n_max·B/4 + l2)/n̂: ∇²ℓᵢ = σ'(·)·x̃x̃ᵀ ≼ (B/4)·I, summed over at most n_max rows,
  a *public* upper bound on the rows the worker may load (the worker does not divide by
  the loaded count, which may differ from n̂; if it can exceed n̂, β must use its bound);
* no domain is needed (strong convexity); a public box or ball C may be added (C4) and
  is useful to keep θ inside the fixed-point grid's range (below);
* E: the worker's fixed-point gradient (θ on the grid 2^-b, clamped to ±2^m; residuals
  truncated to 2^-a; σ̃ within 1.4e-15 of σ) is not ∇F_D. Per row its error is at most
  (2^-a + √(P·B)·2^-(b+1)/4 + 1.4e-15)·√B while θ stays inside the clamp, and the sum
  of n_max rows divided by n̂ gives E; outside the clamp E is unbounded, so a projection
  onto the clamp's box is needed. With n_max·2^-a comparable to 1 (Adult: 30162·2^-16
  ≈ 0.46) the term (1 + 2nE/L)² multiplies the bound by ≈ 3.7: the residual grid must
  be much finer than 1/n_max for this bound to pay off. The float64 update
  θ − (lr/n̂)·(noisy + l2·θ) rounds too: its error (a few ulps of θ per step, divided
  by η to express it in gradient units) belongs in E as well;
* (C5) holds for continuous Gaussian noise only: the worker's integer noise
  round(σΔZ) on the gradient sum is not a Gaussian in θ-space, and step 2 above needs
  the Gaussian shift cost; the composition proof covers it as post-processing of the
  Gaussian mechanism, this one does not (a lattice-valued state with rounded noise
  would need its own shift-reduction step). Wiring must settle this before a plan may
  charge this bound for the exact sampler.

For multinomial logistic regression with k classes: ∇ℓᵢ = (p − e_y) ⊗ x̃, ‖p − e_y‖ ≤ √2,
so L = √(2B); ∇²ℓᵢ = (diag p − ppᵀ) ⊗ x̃x̃ᵀ ≼ (B/2)·I (the largest eigenvalue of
diag p − ppᵀ is at most 1/2), so β = (n_max·B/2 + l2)/n̂.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.privacy.orders import CALIBRATION_ORDERS
from service.privacy.rdp import epsilon_from_rdp, validate_orders

__all__ = [
    "GAUSSIAN_ORDERS",
    "HiddenLangevinNoise",
    "HiddenLangevinProblem",
    "amplification",
    "contraction_factor",
    "effective_noise_multiplier",
    "gaussian_sigma_for_epsilon",
    "hidden_langevin_epsilon",
    "hidden_langevin_rdp",
    "logistic_regression_problem",
    "noise_for_epsilon",
    "noise_for_rdp",
]

GAUSSIAN_ORDERS: tuple[float, ...] = CALIBRATION_ORDERS + tuple(2.0**j for j in range(11, 25))
"""The default orders of the (ε, δ) functions here: CALIBRATION_ORDERS and the powers of two
from 2^11 to 2^24. The curve is linear in α, so large orders cost nothing, and at small ε
the best order of a Gaussian curve, about 1 + σ_eff·√(2·log(1/δ)), is above 1024 (at
ε = 1e-3, δ = 1e-5 it is ≈ 2.4e4)."""

# Relative margin by which every bound here is rounded up, so that float rounding in
# A(c, K) (a few ulps, also for K ≈ 1e6) can only overstate the privacy loss.
_ROUND_UP = 1e-9


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def _steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    return int(steps)


@dataclass(frozen=True)
class HiddenLangevinProblem:
    """The public constants of the theorem (module docstring), checked on construction.

    ``n``: the public divisor of the loss (rows); ``lipschitz``: L, the bound on every
    row's gradient norm; ``strong_convexity``: λ and ``smoothness``: β of F_D (the
    averaged loss plus regulariser, for every dataset the run may meet);
    ``step_size``: η; ``gradient_error``: E, a bound on ‖g_D(θ) − ∇F_D(θ)‖ for the
    gradient the implementation computes (0 for exact arithmetic), in the units of ∇F_D.
    Raises ValueError when a condition fails, e.g. η ≥ 2/β.
    """

    n: int
    lipschitz: float
    strong_convexity: float
    smoothness: float
    step_size: float
    gradient_error: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int | np.integer) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        _positive("lipschitz", self.lipschitz)
        e = self.gradient_error
        if isinstance(e, bool) or not isinstance(e, int | float) or not math.isfinite(e) or e < 0:
            raise ValueError(f"gradient_error must be finite and >= 0, got {e!r}")
        contraction_factor(
            strong_convexity=self.strong_convexity,
            smoothness=self.smoothness,
            step_size=self.step_size,
        )

    @property
    def contraction(self) -> float:
        """c = max(|1 − ηλ|, |1 − ηβ|) < 1 (condition C3)."""
        return contraction_factor(
            strong_convexity=self.strong_convexity,
            smoothness=self.smoothness,
            step_size=self.step_size,
        )

    @property
    def contraction_gap(self) -> float:
        """1 − c = min(ηλ, 2 − ηβ), from the products (no cancellation in 1 − c)."""
        eta = float(self.step_size)
        return min(eta * float(self.strong_convexity), 2.0 - eta * float(self.smoothness))

    def amplification_at(self, steps: int) -> float:
        """A(c, K) for this problem's c, with 1 − c taken from η, λ, β directly."""
        return _amplification(self.contraction, self.contraction_gap, steps)

    @property
    def shift_inflation(self) -> float:
        """(1 + 2nE/L): the per-step shift η(L/n + 2E) over the exact-gradient shift ηL/n."""
        return 1.0 + 2.0 * self.n * self.gradient_error / self.lipschitz


def contraction_factor(*, strong_convexity: float, smoothness: float, step_size: float) -> float:
    """c = max(|1 − ηλ|, |1 − ηβ|): the Lipschitz constant of θ ↦ θ − η∇F for every
    λ-strongly convex, β-smooth, twice differentiable F (module docstring, C3).

    Raises ValueError unless 0 < λ ≤ β and 0 < η < 2/β (then c < 1)."""
    lam = _positive("strong_convexity", strong_convexity)
    beta = _positive("smoothness", smoothness)
    eta = _positive("step_size", step_size)
    if lam > beta:
        raise ValueError(f"strong convexity λ = {lam!r} exceeds the smoothness β = {beta!r}")
    if eta * beta >= 2.0:
        raise ValueError(
            f"step size η = {eta!r} is too large: the contraction needs η < 2/β = {2.0 / beta!r}"
        )
    # With 0 < λ ≤ β and ηβ < 2 this is max(1 − ηλ, ηβ − 1) (the other two candidates are
    # never larger), so 1 − c = min(ηλ, 2 − ηβ) > 0.
    c = max(abs(1.0 - eta * lam), abs(1.0 - eta * beta))
    if not c < 1.0:  # ηλ below the float resolution of 1: no contraction is representable
        raise ValueError(f"ηλ = {eta * lam!r} is too small: the contraction factor rounds to 1")
    return c


def amplification(*, contraction: float, steps: int) -> float:
    """A(c, K) = (1 + c)(1 − c^K)/((1 − c)(1 + c^K)), rounded up by a relative 1e-9:
    the factor by which K hidden steps cost more than one Gaussian step (module
    docstring, Theorem). At most min(K, (1 + c)/(1 − c)) up to that margin. (Problems
    use :meth:`HiddenLangevinProblem.amplification_at`, which takes 1 − c from η, λ, β
    without the cancellation of 1 − c for c near 1.)"""
    c = float(contraction)
    if not (math.isfinite(c) and 0.0 <= c < 1.0):
        raise ValueError(f"contraction must be in [0, 1), got {contraction!r}")
    return _amplification(c, 1.0 - c, steps)


def _amplification(c: float, gap: float, steps: int) -> float:
    k = _steps(steps)
    if c == 0.0:
        return 1.0 + _ROUND_UP
    # c^K = exp(K·log c), log c = log1p(−(1 − c)) near c = 1; 1 − c^K = −expm1(K·log c).
    log_c = math.log1p(-gap) if gap < 0.5 else math.log(c)
    one_minus = -math.expm1(k * log_c)
    one_plus = 1.0 + math.exp(k * log_c)
    value = (1.0 + c) * one_minus / (gap * one_plus)
    return min(value, float(k)) * (1.0 + _ROUND_UP)


def hidden_langevin_rdp(
    *,
    problem: HiddenLangevinProblem,
    noise_multiplier: float,
    steps: int,
    orders: Sequence[float],
) -> np.ndarray:
    """RDP curve (nats) of the last of ``steps`` hidden iterates: α·(1 + 2nE/L)²·A(c, K)/(2σ²)
    at each order α (module docstring, Theorem; conditions checked by ``problem``)."""
    sigma = _positive("noise_multiplier", noise_multiplier)
    alphas = np.asarray(validate_orders(orders))
    factor = problem.amplification_at(steps)
    scale = problem.shift_inflation**2 * factor / (2.0 * sigma * sigma)
    return alphas * scale * (1.0 + _ROUND_UP)


def effective_noise_multiplier(
    *, problem: HiddenLangevinProblem, noise_multiplier: float, steps: int
) -> float:
    """σ_eff = σ/((1 + 2nE/L)·√A(c, K)): the one Gaussian mechanism with the same RDP curve
    as the last of ``steps`` hidden iterates (rounded down, towards more privacy loss)."""
    sigma = _positive("noise_multiplier", noise_multiplier)
    factor = problem.amplification_at(steps)
    return sigma / (problem.shift_inflation * math.sqrt(factor)) * (1.0 - _ROUND_UP)


def hidden_langevin_epsilon(
    *,
    problem: HiddenLangevinProblem,
    noise_multiplier: float,
    steps: int,
    delta: float,
    orders: Sequence[float] = GAUSSIAN_ORDERS,
) -> float:
    """ε (nats) at ``delta`` of the last hidden iterate: the RDP curve converted by
    :func:`~service.privacy.rdp.epsilon_from_rdp` (Canonne, Kamath & Steinke 2020,
    Prop. 12), minimised over ``orders``."""
    curve = hidden_langevin_rdp(
        problem=problem, noise_multiplier=noise_multiplier, steps=steps, orders=orders
    )
    return epsilon_from_rdp(rdp=curve, orders=orders, delta=delta)


@dataclass(frozen=True)
class HiddenLangevinNoise:
    """A calibration's answer. ``noise_multiplier``: σ for the run (noise std σ·L on the
    gradient sum); ``effective_noise_multiplier``: σ_eff of the single Gaussian mechanism
    with the same RDP curve; ``amplification``: A(c, K); ``contraction``: c;
    ``epsilon``: the ε (nats) at ``delta`` that σ attains by RDP (≤ the target), or None
    when calibrated to an RDP curve."""

    noise_multiplier: float
    effective_noise_multiplier: float
    amplification: float
    contraction: float
    epsilon: float | None = None
    delta: float | None = None


def noise_for_rdp(
    *,
    problem: HiddenLangevinProblem,
    steps: int,
    target_rdp: Sequence[float] | np.ndarray,
    orders: Sequence[float],
) -> HiddenLangevinNoise:
    """The smallest σ whose curve α·(1 + 2nE/L)²·A/(2σ²) is ≤ ``target_rdp`` at every
    order: σ² = max_α α·(1 + 2nE/L)²·A/(2·target(α)), rounded up."""
    alphas = np.asarray(validate_orders(orders))
    target = np.asarray([float(t) for t in target_rdp], dtype=np.float64)
    if target.shape != alphas.shape:
        raise ValueError(f"target_rdp has {target.size} entries but orders has {alphas.size}")
    if not bool(np.all(np.isfinite(target) & (target > 0.0))):
        raise ValueError("target RDP values must be finite and > 0")
    factor = problem.amplification_at(steps)
    # α/(2σ_eff²) ≤ target(α) at every order ⇔ σ_eff² ≥ max_α α/(2·target(α)).
    sigma_eff = math.sqrt(float(np.max(alphas / (2.0 * target))))
    sigma = sigma_eff * problem.shift_inflation * math.sqrt(factor) * (1.0 + 4 * _ROUND_UP)
    return HiddenLangevinNoise(
        noise_multiplier=sigma,
        effective_noise_multiplier=sigma_eff,
        amplification=factor,
        contraction=problem.contraction,
    )


def _gaussian_epsilon(sigma_eff: float, delta: float, orders: Sequence[float]) -> float:
    alphas = np.asarray(orders, dtype=np.float64)
    return epsilon_from_rdp(rdp=alphas / (2.0 * sigma_eff * sigma_eff), orders=orders, delta=delta)


def gaussian_sigma_for_epsilon(
    *, epsilon: float, delta: float, orders: Sequence[float], rel_tol: float = 1e-6
) -> float:
    """The smallest σ_eff (to ``rel_tol``; the upper end of the bracket, so it always meets
    the target) of ONE Gaussian mechanism whose RDP curve α/(2σ_eff²) converts to ε at δ by
    :func:`~service.privacy.rdp.epsilon_from_rdp` over ``orders``: bisection on log σ_eff
    (ε is decreasing in σ_eff)."""
    eps = _positive("epsilon", epsilon)
    if isinstance(delta, bool) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    lo, hi = 1e-3, 1.0
    while _gaussian_epsilon(hi, delta, orders) > eps:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            raise ValueError(f"ε = {eps!r} at δ = {delta!r} needs σ_eff > 1e12")
    if _gaussian_epsilon(lo, delta, orders) <= eps:
        raise ValueError(f"ε = {eps!r} is reached without noise (σ_eff < 1e-3)")
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        if _gaussian_epsilon(mid, delta, orders) <= eps:
            hi = mid
        else:
            lo = mid
    return hi


def noise_for_epsilon(
    *,
    problem: HiddenLangevinProblem,
    steps: int,
    epsilon: float,
    delta: float,
    orders: Sequence[float] = GAUSSIAN_ORDERS,
    rel_tol: float = 1e-6,
) -> HiddenLangevinNoise:
    """The smallest σ (to ``rel_tol``) for which the last hidden iterate is (ε, δ)-DP by
    the RDP curve and :func:`~service.privacy.rdp.epsilon_from_rdp`: first σ_eff of one
    Gaussian mechanism, by bisection on log σ_eff (ε is decreasing in σ_eff), then
    σ = σ_eff·(1 + 2nE/L)·√A(c, K). The returned σ always meets the target (the upper
    end of the bracket is kept); the answer's ``epsilon`` is recomputed from it."""
    alphas = validate_orders(orders)
    factor = problem.amplification_at(steps)
    hi = gaussian_sigma_for_epsilon(epsilon=epsilon, delta=delta, orders=alphas, rel_tol=rel_tol)
    sigma = hi * problem.shift_inflation * math.sqrt(factor) * (1.0 + 4 * _ROUND_UP)
    achieved = hidden_langevin_epsilon(
        problem=problem, noise_multiplier=sigma, steps=steps, delta=delta, orders=alphas
    )
    if achieved > epsilon:  # cannot happen with the rounding above; never return a σ that fails
        raise ArithmeticError(f"calibration missed: ε = {achieved!r} > {epsilon!r}")
    return HiddenLangevinNoise(
        noise_multiplier=sigma,
        effective_noise_multiplier=hi,
        amplification=factor,
        contraction=problem.contraction,
        epsilon=achieved,
        delta=float(delta),
    )


def logistic_regression_problem(
    *,
    public_n_rows: int,
    row_norm_sq_bound: float,
    l2: float,
    learning_rate: float,
    max_rows: int | None = None,
    gradient_error: float = 0.0,
) -> HiddenLangevinProblem:
    """The theorem's constants for the product's binary logistic regression sampler,
    θ ← θ − (lr/n̂)·(Σᵢ∇ℓᵢ(θ) + N + l2·θ) (module docstring): n = n̂, L = √B,
    λ = l2/n̂, β = (n_max·B/4 + l2)/n̂, η = lr; ``max_rows`` (n_max) defaults to n̂, i.e.
    assumes the worker never loads more rows than the plan's public count.
    Raises ValueError when l2 ≤ 0 (no strong convexity) or lr ≥ 2/β."""
    n = public_n_rows
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"public_n_rows must be an integer >= 1, got {n!r}")
    n_max = n if max_rows is None else max_rows
    if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < 1:
        raise ValueError(f"max_rows must be an integer >= 1, got {max_rows!r}")
    b = _positive("row_norm_sq_bound", row_norm_sq_bound)
    reg = _positive("l2", l2)
    return HiddenLangevinProblem(
        n=n,
        lipschitz=math.sqrt(b),
        strong_convexity=reg / n,
        smoothness=(n_max * b / 4.0 + reg) / n,
        step_size=learning_rate,
        gradient_error=gradient_error,
    )
