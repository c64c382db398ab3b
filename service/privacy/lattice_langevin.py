"""The hidden-iterate bound of :mod:`service.privacy.hidden_langevin` for the sampler the
worker actually runs: a lattice-valued chain with integer noise and fixed-point gradients
(worker/mechanisms/langevin_hidden.py), every rounding accounted, so that the proof
assumes only IEEE-754 correct rounding. Pure math: no torch, no state (issue 24).

**The chain** (binary logistic regression; public: n̂, the schema's row cap n_max and
row-norm bound B, the grid bits a (residuals), c (features), b (θ), m (θ's range), the
learning rate lr, the regulariser l2 > 0, the noise multiplier σ, the steps K). With
float64 constants γ = fl(lr/n̂), g = γ·2^(b−a−c) (a power-of-two scaling, exact) and
ρ = fl(1 − fl(γ·l2)), and the state x ∈ ℤ^P (θ = x·2^-b), |x_j| ≤ M = 2^m:

    x ← clamp(round(fl(fl(ρ·x) − fl(g·G(x)))) + N, −M, M),   N = round(ς·Z) per coordinate,

where G(x) = Σᵢ r_int,i·x_int,i is the worker's exact integer gradient sum
(worker/mechanisms/langevin.py, item 1 of its proof: features truncated onto 2^-c, the
logit numerator exact, r_int = trunc(2^a·(σ̃(z) − y))), ς = σ·s with s below, and Z
standard Gaussian. Only x_K leaves; K is public. x₀ = 0.

**The exact map it approximates.** With x̃ᵢ = x_int,i·2^-c (the truncated features and the
bias) and ℓᵢ(θ) = log(1 + e^(θ·x̃ᵢ)) − yᵢ·θ·x̃ᵢ (convex; ∇ℓᵢ = (σ(θ·x̃ᵢ) − yᵢ)·x̃ᵢ, of norm
≤ √B since |σ − y| ≤ 1 and ‖x̃ᵢ‖² ≤ B, checked exactly by the worker; ∇²ℓᵢ ≼ (B/4)·I),
let φ_D(x) = ρ·x − g·2^(a+c)·Σ_{i∈D} ∇ℓᵢ(x·2^-b). Its Jacobian is ρ·I − γ·H with
0 ≼ H ≼ (n·B/4)·I for a dataset of n ≤ n_max rows (2^(a+c)·2^-b·g = γ), so φ_D is
c-Lipschitz with

    c = max(ρ, h − ρ),   h = γ·n_max·B/4,                                   (contraction)

when 0 < ρ < 1 and h − ρ < 1 (the same argument as condition C3 of
:mod:`~service.privacy.hidden_langevin`: φ_D(x) − φ_D(y) = (ρI − γH̄)(x − y) with H̄
symmetric, spectrum in [0, n_max·B/4]). For neighbours D, D' (one row more or less, both
with at most n_max rows), ‖φ_D(y) − φ_D'(y)‖ = g·2^(a+c)·‖∇ℓ_row‖ ≤ s = g·2^(a+c)·√B.

**The computed map's error** E ≥ ‖ψ_D(x) − φ_D(x)‖ for ψ_D(x) = round(fl(fl(ρx) − fl(gG))),
every x in the box and every D of at most n_max rows, from correct rounding alone
(u = 2^-53):

* residuals: |r_int − 2^a·(σ(z) − y)| ≤ 1 + 2^a·(e_σ + u): the truncation (< 1), the
  correctly rounded subtraction σ̃ − y (≤ u, the result in [−1, 1]) and the sigmoid's
  error e_σ = :data:`SIGMOID_ERROR_BOUND` (derived below). Row i's error vector is that
  times x_int,i, of norm ≤ 2^c·√B; over n_max rows and times g:
  E_grad = g·n_max·(1 + 2^a·(e_σ + u))·2^c·√B;
* the float64 update: fl(ρx) within u·M of ρx (|x| ≤ M), fl(g·G) within u·Q of g·G
  (G is an integer below 2^53, exact in float64; |g·G_j| ≤ Q = g·n_max·2^(a+c)), and the
  subtraction within u·(M + Q)(1 + u): per coordinate ≤ 2.0001·u·(M + Q), so
  E_float = √P·2.0001·u·(M + Q);
* the rounding to the lattice: E_round = √P/2.

E = E_grad + E_float + E_round. The clamp comes after the noise and is the same map in
both runs (projection onto a box: 1-Lipschitz, lattice points to lattice points).

**The sigmoid's error bound**, e_σ = 2^-38 ≈ 3.6e-12 (the product measured 1.4e-15; the
proof uses only this bound). σ̃ (worker/mechanisms/fixed_point.py) computes
ẽ ≈ exp(−|z|) as p̃^64, p̃ Horner's evaluation of the degree-18 Taylor polynomial T of
exp(−v) at v = min(|z|, 64)/64 ∈ [0, 1] (exact: a minimum and a power-of-two scaling),
then 1/(1 + ẽ) or ẽ/(1 + ẽ). (i) |T(−v) − e^(−v)| ≤ v^19/19! ≤ 8.3e-18 (alternating
series of decreasing terms for v ≤ 1). (ii) Horner's rounding error is at most
γ_{2·18}·Σ_j |t_j|·v^j ≤ γ_36·e (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., eq. (5.3), γ_k = ku/(1 − ku)), and the stored coefficients fl(1/j!)
add at most u·e: in all ≤ 37.01·u·e ≤ 1.12e-14, so p̃ = e^(−v)·(1 + δ) with
|δ| ≤ (1.12e-14 + 8.3e-18)·e ≤ 3.05e-14 (e^(−v) ≥ e^-1). (iii) Six correctly rounded
squarings: p̃^64 with relative error ≤ (1 + |δ|)^64·(1 + u)^63 − 1 ≤ 1.96e-12 against
e^(−64v) = e^(−|z|) for |z| ≤ 64; for |z| > 64, both ẽ and e^(−|z|) lie in
[0, 1.1·e^-64] ⊂ [0, 2e-28]. (iv) So |ẽ − e^(−|z|)| ≤ 1.96e-12, and for z ≥ 0
|1/(1 + ẽ) − 1/(1 + e^(−z))| ≤ |ẽ − e^(−z)| (the map e ↦ 1/(1 + e) is 1-Lipschitz on
e ≥ 0), likewise e/(1 + e) = 1 − 1/(1 + e); the addition and the quotient add ≤ 2u·(1 + u)
relative to values ≤ 1. In all |σ̃(z) − σ(z)| ≤ 1.96e-12 + 2.3e-16 < 2^-38.

**K ≥ 3 classes** (multinomial logistic regression, θ and x (d + 1) × K, G the exact
(d + 1) × K integer sum of r_int ⊗ x_int with r_int,k = trunc(2^a·(p̃_k − [k = y])),
worker/mechanisms/langevin.py "K classes"). What changes: ∇ℓᵢ = (p − e_y) ⊗ x̃ᵢ with
‖p − e_y‖² ≤ 2 (langevin.py's argument), so s = g·2^(a+c)·√(2B); ∇²ℓᵢ = (diag p − ppᵀ) ⊗
x̃ᵢx̃ᵢᵀ ≼ (B/2)·I (the largest eigenvalue of diag p − ppᵀ is ≤ 1/2: for a unit vector w,
wᵀ(diag p − ppᵀ)w = Var_p(w) ≤ E_p[(w_k − (w_max + w_min)/2)²] ≤ (w_max − w_min)²/4 ≤ 1/2),
so h = γ·n_max·B/2; each residual coordinate is within 1 + 2^a·(e_p + u) of the exact one,
e_p = :data:`SOFTMAX_ERROR_BOUND`, so a row's error vector has norm ≤ √K·(1 + 2^a(e_p + u))
·2^c·√B; P becomes the K·(d + 1) coordinates in E_float, E_round and r; m is set by the
d + 1 terms of one logit. The softmax's error bound, e_p = 2^-36: softmax_basic computes
u_k = fl(μ − z_k) (z exact, μ the row's largest; one correctly rounded subtraction: the
relative error ≤ u moves e^(−u_k) by a factor within e^(±64u) while u_k ≤ 64), ẽ_k =
exp_neg_basic(u_k) (relative error ≤ 1.96e-12 for u_k ≤ 64, item (iii) above; ẽ_k and
e^(−u_k) both ≤ 2e-28 beyond), s̃ = Σ ẽ_k in a fixed order (K − 1 correctly rounded additions
of non-negative terms: relative error ≤ (K − 1)u·(1 + Ku) ≤ 4.6e-13 for K ≤ 2^12), one
quotient (≤ u): p̃_k = p_k·(1 + θ_k) with |θ_k| ≤ 2·(1.96e-12 + 64u) + 4.6e-13 + 2u
≤ 4.4e-12 (the numerator's and the sum's errors, s̃ ≥ ẽ_max = 1), plus ≤ 2e-28 absolute
for the clamped terms: |p̃_k − p_k| ≤ 4.5e-12 < 2^-36.

**Theorem (lattice version).** With the contraction above, per-step shift
s_c = s + 2E + r and the lattice split r = √P/2, for every α > 1 and neighbours D, D'
(at most n_max rows each):

    D_α(x_K^D ‖ x_K^{D'}) ≤ α/(2ς²)·(s_c·√A(c, K) + r·√K)²  +  (the sampler's pmf slack),

A(c, K) of :func:`service.privacy.hidden_langevin.amplification`. With ς = σ·s this is one
Gaussian mechanism of noise multiplier σ_eff = σ/(Φ), Φ = (1 + (2E + r)/s)·√A + (r/s)·√K
(:attr:`LatticeLangevin.inflation`). The integer sampler's law is within e^{±τ} of the
exact rounded Gaussian's, τ = K·P·(−log(1 − η)) (a PmfSlackEvent, charged beside).

**Proof**, the steps of :mod:`service.privacy.hidden_langevin` with lattice couplings:
the shifted divergence D_α^{(z)}(μ ‖ ν) = inf{D_α(μ' ‖ ν): μ' on ℤ^P, W∞(μ, μ') ≤ z}.

1. Contraction reduction with error: for lattice x, y,
   ‖ψ_D(x) − ψ_D'(y)‖ ≤ ‖φ_D(x) − φ_D(y)‖ + ‖φ_D(y) − φ_D'(y)‖ + 2E ≤ c‖x − y‖ + s + 2E
   (ψ_D and ψ_D' each within E of their exact maps), so, as there,
   D_α^{(cz + s + 2E)}(ψ_D#μ ‖ ψ_D'#ν) ≤ D_α^{(z)}(μ ‖ ν).
2. Shift reduction on the lattice. For N = round(ςZ) and an integer vector u,
   N + u = round(ςZ + u) exactly (rounding commutes with integer shifts), a function of
   the Gaussian ςZ + u: by data processing D_α(N + u ‖ N) ≤ D_α(N(u, ς²I) ‖ N(0, ς²I))
   = α‖u‖²/(2ς²). Given lattice X ~ μ, X' ~ μ' with ‖X − X'‖ ≤ z + a, write w = X − X'
   and u = round(w·a/(z + a)) coordinatewise: X'' = X' + u is a lattice point with
   ‖X'' − X'‖ ≤ a + r and ‖X − X''‖ ≤ z + r (each coordinate's rounding ≤ 1/2). The
   argument of the continuous proof then gives
   D_α^{(z + r)}(μ∗N ‖ ν∗N) ≤ D_α^{(z + a)}(μ ‖ ν) + α(a + r)²/(2ς²); and spending the
   whole shift (a ≥ ‖w‖, u = w, no rounding) gives D_α^{(0)} at cost α(a)²/(2ς²).
3. The clamp maps lattice points to lattice points and is 1-Lipschitz: it keeps W∞.
4. Recursion. Let â_k be the continuous optimum of :mod:`~service.privacy.hidden_langevin`
   for per-step shift s_c (z_k = c·z_{k−1} + s_c − â_k, z₀ = 0 = z_K, Σ â_k² = s_c²·A,
   every z_k ≥ 0), and spend a_k = â_k at step k: by 1–3 the shift after step k's noise
   is z_k + r when the rounding of 2 is used, i.e. exactly the continuous recursion with
   s_c = s + 2E + r, and the cost of step k is α(â_k + r)²/(2ς²) (the last step spends
   all, needing no rounding: its cost α·â_K²/(2ς²) is below the bound used). By
   Minkowski's inequality Σ(â_k + r)² ≤ (√(Σ â_k²) + r√K)² = (s_c√A + r√K)². ∎

**Theorem (lattice version, Gaussian DP).** Under the same conditions the exact-noise chain
(N = round(ςZ) exactly) is μ-GDP with

    μ = (s_c·√A(c, K) + r·√K)/ς = Φ/σ = 1/σ_eff,

i.e. T(x_K^D, x_K^{D'}) ≥ G_μ = T(N(0, 1), N(μ, 1)) for neighbours D, D' in both orders:
the same σ_eff as above, now as a trade-off function, so its (ε, δ) is the exact Gaussian
profile δ(ε) = Φ_N(−ε/μ + μ/2) − e^ε·Φ_N(−ε/μ − μ/2) (Dong, Roth & Su 2022, "Gaussian
differential privacy", JRSS-B, Cor. 2.13) instead of an RDP conversion; the integer
sampler's slack τ is charged beside as for the RDP bound ((ε' + 2τ, e^τ·δ'), pointwise).

*Source.* The f-DP form of privacy amplification by iteration is Bok, Su & Altschuler 2024
("Shifted interpolation for differential privacy", ICML, arXiv:2403.00278): for contractive
noisy iterations θ_{k+1} = Π_C(φ_k(θ_k) + N(0, ς²I)) and θ'_{k+1} = Π_C(φ'_k(θ'_k) +
N(0, ς²I)) from one start, every φ_k, φ'_k c-Lipschitz with sup‖φ_k − φ'_k‖ ≤ s_k, C closed
convex, T(θ_K, θ'_K) ≥ G(√(Σ_k a_k²)/ς) for every γ_k ∈ [0, 1] with γ_K = 1, where
a_{k+1} = γ_{k+1}(c·b_k + s_{k+1}), b_{k+1} = (1 − γ_{k+1})(c·b_k + s_{k+1}), b_0 = 0 (their
Lemma C.3, read in the restatement of Li, Su, Long, Wang & Su 2025, "Mitigating
privacy-utility trade-off in decentralized federated learning via f-differential privacy",
Lemma B.3: the paper's own text could not be read here); with s_k = s their optimum is
μ = (s/ς)·√((1 + c)(1 − c^K)/((1 − c)(1 + c^K))) = (s/ς)·√A(c, K) (the closed form in the
authors' code, github.com/jinhobok/shifted_interpolation_dp, plot_table_ngd_fdp.py), exact
for quadratics. b_k is z_k and a_k is â_k of the proof above. That lemma assumes exact
Gaussian noise and exactly c-Lipschitz maps, which the lattice chain does not have, so it
is not applied as stated: the lattice proof above is redone with trade-off functions.

*Proof.* Every step of the RDP proof used only (a) data processing, (b) the chain rule for
a pair whose second part is drawn from a kernel of the first, (c) the Gaussian shift cost,
(d) that a mixture of shifted Gaussians is no more distinguishable than its largest shift,
(e) additivity of the costs. Their trade-off-function forms (T(P, Q) ≥ f pointwise means
"at least as hard to test as f"):

(a) T(M#P, M#Q) ≥ T(P, Q) for any kernel M that does not depend on the data (Dong, Roth &
    Su 2022, §2: post-processing; a test of M#P against M#Q is a test of P against Q).
(b) Adaptive composition (ibid., Theorem 3.2): if T(P₁, Q₁) ≥ f and T(K_P(y), K_Q(y)) ≥ g
    for every y, the pairs (Y, K_P(Y)), Y ~ P₁, and (Y', K_Q(Y')), Y' ~ Q₁, have trade-off
    ≥ f ⊗ g; with G_a ⊗ G_b = G_√(a² + b²) (ibid., Corollary 3.3).
(c) For an integer vector u, N + u = round(ςZ + u) and N = round(ςZ): by (a)
    T(N + u, N) ≥ T(N(u, ς²I), N(0, ς²I)) = G_{‖u‖/ς} (rotate u onto one axis: the other
    coordinates are the same in both laws).
(d) If T(P_j, Q) ≥ G_m for every component of a mixture P = Σ p_j P_j (Q fixed), then
    T(P, Q) ≥ G_m: a test φ has type II error β = 1 − E_Q φ ≥ G_m(E_{P_j} φ) for every j,
    so β ≥ Σ p_j G_m(E_{P_j} φ) ≥ G_m(E_P φ) by Jensen (G_m is convex).
(e) G_m is decreasing in m, so costs compose by (b) and the total is G_{√(Σ m_k²)}.

The recursion, with couplings instead of shifted divergences: let X_k, X'_k be the two
chains' states (D and D'). Induction hypothesis after step k: there is a lattice random
variable X̃_k, on one probability space with X_k, with ‖X_k − X̃_k‖ ≤ z_k + r (z_0 + r
replaced by 0 at k = 0: X̃_0 = X_0 = 0) and T(X̃_k, X'_k) ≥ G_{m_k}, m_k² = Σ_{j≤k}
((â_j + r)/ς)², m_0 = 0. Step k + 1: Y = ψ_D(X_k) and Y' = ψ_D'(X̃_k) are lattice points
with ‖Y − Y'‖ ≤ c(z_k + r) + s + 2E ≤ c·z_k + s_c =: z' (proof step 1, c ≤ 1), and
T(Y', ψ_D'(X'_k)) ≥ G_{m_k} by (a). With w = Y − Y' and a = â_{k+1}, let u = w if a ≥ z',
else u = round(w·a/z') coordinatewise: ‖u‖ ≤ a + r and ‖w − u‖ ≤ z' − a + r = z_{k+1} + r.
With one noise draw N for both, X_{k+1} = clamp(Y + N) and X̃_{k+1} = clamp(Y' + u + N):
‖X_{k+1} − X̃_{k+1}‖ ≤ ‖w − u‖ (the clamp is 1-Lipschitz). Given Y' = y, Y' + u + N is a
mixture over u (u depends on (Y, Y') only, N is independent of both) of laws y + u + N,
each at trade-off ≥ G_{(â_{k+1} + r)/ς} against y + N by (a), (c); so by (d) the kernel
meets that bound for every y, and by (b) and then (a) (keep the second part, clamp it)
T(X̃_{k+1}, X'_{k+1}) ≥ G_{m_k} ⊗ G_{(â_{k+1} + r)/ς} = G_{m_{k+1}}. At k + 1 = K, z_K = 0
gives a = â_K ≥ z', so u = w and X̃_K = X_K exactly: T(X_K, X'_K) ≥ G_{m_K}, and
m_K ≤ (s_c√A + r√K)/ς by Minkowski as above. ∎

The worker refuses (fails closed, before any step) a dataset of more rows than n_max,
whose contraction constant the plan did not cover; n_max is the schema's public
``max_rows``, which registration checks against the rows (a public statement of the
data owner, like the schema's column bounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.privacy.hidden_langevin import (
    GAUSSIAN_ORDERS,
    _amplification,
    gaussian_sigma_for_epsilon,
)
from service.privacy.rdp import epsilon_from_rdp, validate_orders

__all__ = [
    "SIGMOID_ERROR_BOUND",
    "SOFTMAX_ERROR_BOUND",
    "LatticeLangevin",
    "lattice_bits",
]

SIGMOID_ERROR_BOUND = 2.0**-38
"""e_σ ≥ |σ̃(z) − σ(z)| for fixed_point.sigmoid_basic, every float64 z (module docstring)."""

SOFTMAX_ERROR_BOUND = 2.0**-36
"""e_p ≥ |p̃_k − p_k| for fixed_point.softmax_basic, every row of ≤ 2^12 exact logits
(module docstring, "K classes")."""

_U = 2.0**-53
_ROUND_UP = 1e-9
_THETA_RANGE_BITS = 10
"""θ's box is [−2^10, 2^10] per coordinate (M·2^-b): far beyond any weight the targets here
put mass on, and the rest of the 52-bit exact range goes to the grid 2^-b."""
_EXACT_BITS = 52
_MAX_NOISE_SCALE = 2.0**40  # worker/noise.py's MAX_SCALE


def lattice_bits(*, max_rows: int, inputs: int) -> tuple[int, int, int, int]:
    """(a, c, b, m): residual, feature, θ-grid and θ-range bits for the lattice chain.

    a + c = 32 (a row's integer gradient entries ≤ 2^32: the exact float64 partial sums of
    ≤ 2^20 rows, worker/mechanisms/langevin.py), with a = ⌈log2 n_max⌉ + 8 (so that
    n_max·2^-a ≤ 2^-8: the residual grid's share of the shift) but c ≥ 8 and c ≤ 16;
    m with P·2^(c+m) ≤ 2^52 for the P = d + 1 ``inputs`` of a logit (the exact logit
    numerators); b = m − 10 (the box radius 2^10 in θ units)."""
    a = min(24, max(16, max_rows.bit_length() + 8))
    c = 32 - a
    m = _EXACT_BITS - c - (inputs - 1).bit_length()
    return a, c, m - _THETA_RANGE_BITS, m


@dataclass(frozen=True)
class LatticeLangevin:
    """The lattice chain's public constants and its bound (module docstring). Raises
    ValueError when a condition fails (l2 = 0, no contraction, a grid out of range)."""

    public_n_rows: int
    max_rows: int
    row_norm_sq_bound: int
    parameters: int
    learning_rate: float
    l2: float
    classes: int = 1
    """1 (binary, one sigmoid logit) or K ≥ 3 (softmax; ``parameters`` = K·(d + 1))."""

    def __post_init__(self) -> None:
        for name in ("public_n_rows", "max_rows", "row_norm_sq_bound", "parameters"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.classes != 1 and not (3 <= self.classes <= 1 << 12):
            raise ValueError(f"classes must be 1 or in [3, 4096], got {self.classes!r}")
        if self.parameters % self.classes:
            raise ValueError("parameters must be classes × inputs")
        if self.max_rows > 1 << 20:
            raise ValueError("max_rows above 2^20: the exact sums need more parts")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if not (math.isfinite(self.l2) and self.l2 > 0):
            raise ValueError("the hidden-iterate bound needs l2 > 0 (strong convexity)")
        if not 0.5 <= self.rho < 1.0:
            raise ValueError(f"1 − lr·l2/n̂ = {self.rho!r} is outside [0.5, 1): lower lr or l2")
        if not self.contraction < 1.0:
            raise ValueError(
                f"the step does not contract: lr·n_max·B/(4n̂) = {self.h!r} ≥ 1 + ρ; lower lr"
            )

    @property
    def inputs(self) -> int:
        """P = d + 1: a logit's features and bias."""
        return self.parameters // self.classes

    @property
    def residual_norm_sq(self) -> int:
        """‖p − e_y‖² ≤ this: 1 (|σ − y| ≤ 1) or 2 (K classes)."""
        return 1 if self.classes == 1 else 2

    @property
    def bits(self) -> tuple[int, int, int, int]:
        """(a, c, b, m) of :func:`lattice_bits`."""
        return lattice_bits(max_rows=self.max_rows, inputs=self.inputs)

    @property
    def gamma(self) -> float:
        """γ = fl(lr/n̂): the step on θ per unit of the gradient sum."""
        return self.learning_rate / self.public_n_rows

    @property
    def g(self) -> float:
        """g = γ·2^(b−a−c) (exact): the step on the lattice per unit of G."""
        a, c, b, _ = self.bits
        return math.ldexp(self.gamma, b - a - c)

    @property
    def rho(self) -> float:
        """ρ = fl(1 − fl(γ·l2)), the float the worker multiplies x by."""
        return 1.0 - self.gamma * self.l2

    @property
    def h(self) -> float:
        """h = γ·n_max·B/4, or γ·n_max·B/2 for K classes (rounded up): the largest eigenvalue
        of γ·H."""
        curvature = 0.25 if self.classes == 1 else 0.5
        return self.gamma * self.max_rows * self.row_norm_sq_bound * curvature * (1.0 + _ROUND_UP)

    @property
    def contraction(self) -> float:
        """c = max(ρ, h − ρ)."""
        return max(self.rho, self.h - self.rho)

    @property
    def contraction_gap(self) -> float:
        """1 − c, from 1 − ρ (exact by Sterbenz's lemma, ρ ∈ [0.5, 1)) and 1 + ρ − h."""
        return min(1.0 - self.rho, 1.0 + self.rho - self.h)

    @property
    def shift(self) -> float:
        """s = g·2^(a+c)·√B = γ·2^b·√B (√(2B) for K classes): one row's move of the exact
        map, lattice units."""
        _, _, b, _ = self.bits
        return math.ldexp(self.gamma, b) * math.sqrt(self.residual_norm_sq * self.row_norm_sq_bound)

    @property
    def split(self) -> float:
        """r = √P/2: one coordinatewise rounding to the lattice."""
        return math.sqrt(self.parameters) / 2.0

    @property
    def error(self) -> float:
        """E = E_grad + E_float + E_round (module docstring), rounded up."""
        a, c, _, m = self.bits
        root_b = math.sqrt(self.row_norm_sq_bound)
        if self.classes == 1:
            residual = 1.0 + math.ldexp(SIGMOID_ERROR_BOUND + _U, a)
        else:  # K coordinates, each within 1 + 2^a·(e_p + u)
            residual = math.sqrt(self.classes) * (1.0 + math.ldexp(SOFTMAX_ERROR_BOUND + _U, a))
        e_grad = self.g * self.max_rows * residual * math.ldexp(root_b, c)
        q = self.g * self.max_rows * 2.0 ** (a + c)
        e_float = math.sqrt(self.parameters) * 2.0001 * _U * (2.0**m + q)
        return (e_grad + e_float + self.split) * (1.0 + _ROUND_UP)

    def inflation(self, steps: int) -> float:
        """Φ = (1 + (2E + r)/s)·√A(c, K) + (r/s)·√K: σ_eff = σ/Φ."""
        s = self.shift
        # A(c, K) with 1 − c taken from ρ and h directly (no cancellation near c = 1).
        factor = _amplification(self.contraction, self.contraction_gap, steps)
        phi = (1.0 + (2.0 * self.error + self.split) / s) * math.sqrt(factor)
        return (phi + self.split / s * math.sqrt(steps)) * (1.0 + _ROUND_UP)

    def gdp_mu(self, *, noise_multiplier: float, steps: int) -> float:
        """μ = Φ/σ (rounded up): the exact-noise chain's last iterate is μ-GDP (module
        docstring, "Theorem (lattice version, Gaussian DP)"), the sampler's slack aside."""
        sigma = float(noise_multiplier)
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
        return self.inflation(steps) / sigma * (1.0 + _ROUND_UP)

    def noise_scale(self, noise_multiplier: float) -> float:
        """ς = σ·s, the integer noise's scale in lattice units (≤ 2^40, the sampler's range)."""
        scale = noise_multiplier * self.shift
        if not 1.0 <= scale <= _MAX_NOISE_SCALE:
            raise ValueError(f"the lattice noise scale {scale!r} is outside [1, 2^40]")
        return scale

    def rdp(self, *, noise_multiplier: float, steps: int, orders: Sequence[float]) -> np.ndarray:
        """α·Φ²/(2σ²) at each order (without the sampler's slack)."""
        alphas = np.asarray(validate_orders(orders))
        phi = self.inflation(steps)
        return alphas * (phi * phi / (2.0 * noise_multiplier**2)) * (1.0 + _ROUND_UP)

    def noise_for_epsilon(
        self,
        *,
        steps: int,
        epsilon: float,
        delta: float,
        orders: Sequence[float] = GAUSSIAN_ORDERS,
        rel_tol: float = 1e-6,
    ) -> float:
        """The smallest σ (to ``rel_tol``, rounded up) whose curve α·Φ²/(2σ²) converts to
        ε at δ (:func:`~service.privacy.rdp.epsilon_from_rdp`, minimised over ``orders``):
        σ_eff of one Gaussian mechanism
        (:func:`~service.privacy.hidden_langevin.gaussian_sigma_for_epsilon`), times Φ."""
        alphas = validate_orders(orders)
        hi = gaussian_sigma_for_epsilon(
            epsilon=epsilon, delta=delta, orders=alphas, rel_tol=rel_tol
        )
        sigma = hi * self.inflation(steps) * (1.0 + 4 * _ROUND_UP)
        curve = self.rdp(noise_multiplier=sigma, steps=steps, orders=alphas)
        if epsilon_from_rdp(rdp=curve, orders=alphas, delta=delta) > epsilon:
            raise ArithmeticError("lattice calibration missed its target")  # never returned
        return sigma
