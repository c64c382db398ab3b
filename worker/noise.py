"""Integer-valued DP noise without floating-point leaks: rounded Gaussian and discrete Laplace.

Why this exists
---------------
Floating-point noise leaks. Textbook Laplace/Gaussian samplers built from a float uniform
produce outputs whose set of reachable values (and their low-order bits) depends on the
value the noise was added to, so a single release can reveal the data exactly (Mironov 2012,
"On significance of the least significant bits for differential privacy", CCS; Jin, McMurtry,
Rubinstein & Ohrimenko 2022, "Are We There Yet? Timing and Floating-Point Attacks on
Differential Privacy Systems", IEEE S&P, who extend it to the floating-point Gaussian
samplers of DP libraries and add timing attacks). float32 `torch.normal` is additionally truncated:
Box-Muller on 24-bit uniforms never returns |x| > sqrt(-2 ln 2^-24) ≈ 5.768σ, so the
privacy loss of outputs near that edge is unbounded. Holohan & Braghin 2021 ("Secure random
sampling in differential privacy", ESORICS) propose summing several float Gaussians (Opacus'
``secure_mode`` sums four) which makes the attack harder but does not remove it.

The fix used by DP-SGD here is to work on an integer grid: the caller quantises and sums
per-sample gradients exactly as int64 and adds integer noise from this module in exact
integer arithmetic. The output support is then all of Z whatever the data (up to the
documented cap, see below), and no float ever touches the released value.

Rounded Gaussian (what `rounded_gaussian` samples)
--------------------------------------------------
N = ⌊s·Z + ½⌋ with Z ~ N(0, 1), so p(k) = Φ((k+½)/s) − Φ((k−½)/s). For an integer sum S,
S + N = ⌊S + s·Z + ½⌋ is a deterministic post-processing of the continuous Gaussian
mechanism applied to S, so every Gaussian accountant (RDP, PLD, PRV) applies unchanged with
noise standard deviation s in grid units.

Construction (rejection sampling in the style of Canonne, Kamath & Steinke 2020, "The
Discrete Gaussian for Differential Privacy", NeurIPS, arXiv:2004.00010, Algorithms 1-3):

1. Proposal Y ~ discrete Laplace of integer scale t = ⌊s⌋ + 1, q(y) ∝ exp(−|y|/t), drawn
   exactly as in CKS Algorithm 2 with a power-of-two block B = 2^j, the largest ≤ t/8 (1 if
   t < 16; CKS use the block t, any block works, and a small one keeps U ≈ 95% of the
   time instead of 63%): U uniform in {0..B−1} (j random bits) kept with
   probability exp(−U/t), V ≥ 0 geometric with P(V ≥ v) = r^v, r = e^{−B/t}, X = U + B·V,
   a fair sign, and (sign −, X = 0) rejected. P(X = x) ∝ e^{−U/t}·r^V = e^{−x/t}.
2. Accept Y = k with probability exp(−Γ(k)), where
       Γ(k) = k²/(2s²) − |k|/t − L(k) + F,   L(k) = log J(k),
       J(k) = ∫_{−½}^{½} exp(−v²/(2s²) + |k|·v/s²) dv,
   and F = max_k(−k²/(2s²) + |k|/t + L(k)) (plus a 1e-9 margin) so that Γ ≥ 0.
   Because p(k) = exp(−k²/(2s²))·J(k)/(s√(2π)) (substitute x = k + v in the integral of
   the normal density), q(k)·exp(−Γ(k)) ∝ p(k): the accepted Y has law p exactly. With
   L ≡ 0 this is CKS Algorithm 3 (discrete Gaussian); the L term is the smooth rounded-to-
   discrete-Gaussian ratio r(k) folded into the same exponent. Folding it in, instead of a
   separate acceptance step with probability r(k)/max r, matters for small s: r grows like
   cosh(k/(2s²)), so max over |k| ≤ 40s is ~1e7 at s = 1 and a separate step would accept
   almost nothing.
   F: on k ≥ 0 the exponent is strictly concave (L'' ≤ 1/(4s⁴) < 1/s²) with its real
   maximiser in [s²/t, s²/t + ½]; F is the max over the integers around it. Any constant
   added to F cancels in the accepted law, so the margin only costs a 1e-9 acceptance rate.
3. L(k) is computed by Gauss-Legendre quadrature of a positive integrand (no cancellation,
   unlike Φ((k+½)/s) − Φ((k−½)/s) for large s). The order n is the smallest whose a-priori
   remainder bound is ≤ 1e-17 relative (remainder (n!)⁴/((2n+1)((2n)!)³)·|f^{(2n)}|, derivative
   bounded by Cauchy's estimate on a circle of optimal radius; see `_quadrature_order`).

Numerical rule: no float uniform is ever compared against a probability, and the only
floating-point quantity that enters the law is Γ̂(k). Every random decision is "a uniform
W = 0.b₁b₂… on [0, 1), read from the generator's raw 64-bit words, is below an exact real",
settled by integer comparisons and certified bounds (exact given ideal random bits):

* Words and bits. Each proposal takes one raw 64-bit word (two when j > 31): its top j bits
  are U, bit 32 the sign, bits 16-31 the first 16 bits of V's uniform, bits 0-15 the first
  16 bits of the acceptance uniform (disjoint bits of a uniform word are independent
  uniforms). Later bits of a uniform, when needed, are fresh words.
* V = #{v ≥ 1 : W < r^v} (so P(V ≥ v) = P(W < r^v) = r^v), counted up to the v beyond which
  X > K anyway. With w the first 16 bits, W < r^v if w < ⌊r^v·2^16⌋ and W > r^v if
  w > ⌊r^v·2^16⌋ (a table over w); where w equals a threshold (< 0.3% of proposals) 48
  more bits are compared with ⌊r^v·2^64⌋ the same way, and a tie there (2^-64) goes to the
  exact path below. The thresholds are exact integers (integer bounds on r^v refined until
  their floors agree).
* Steps 1 and 2 accept together: keeping U (probability exp(−U/t)) and accepting k
  (exp(−Γ̂(k))) are one Bernoulli(exp(−y)), y = U/t + Γ̂(k) = U/t + ⌊Γ̂⌋ + frac/2^53, a
  rational. Floats lo ≤ 2^16·e^{−y} ≤ hi are certified from IEEE-754 basic operations alone
  (no libm function): z = fl(fl(U/t) + frac·2^-53) is within 2^-51 of y − ⌊Γ̂⌋ (two
  roundings of values < 2); i = 64·⌊Γ̂⌋ + ⌊64z⌋ and d = z − ⌊64z⌋/64 ∈ [0, 1/64) are exact;
  e^{−i/64} is bracketed by a table (integer bounds at 256 bits, rounded outward to floats;
  i ≥ 4096, i.e. y ≥ 64 − 2^-51, uses [0, 2e^{−64}]); e^{−d} by the cubic
  1 − d + d²/2 − d³/6 evaluated by Horner, within d⁴/24 + 2^-52 < 2^-28 absolute, so
  2^-27.9 relative; the products round twice more. All of this is < 2^-27 relative, and
  lo, hi widen the estimate by 2^-20. W's first 16 bits w accept if w + 1 ≤ lo and
  reject if w ≥ hi, which settles all but ≈ 2^-16 of the proposals; those go to:
* the exact path (Python integers): e^{−y} bounded at P bits with every rounding outward
  (Taylor series of e^{r} for the fractional part r, terms rounded down or up, tail bounded
  by the last term; reciprocal; (e^{−1})^⌊y⌋ by binary powering), W known to B bits; if
  neither "W < lower" nor "W ≥ upper" is settled, P doubles and W gets 64 more random bits,
  which ends with probability 1 (at once when y = 0).

The floats only decide how often the fast comparisons settle, never the outcome, so the
proposal in step 1 is exact and the accepted law is exactly P̃(k) ∝ q(k)·exp(−Γ̂(k)) below.
(`discrete_laplace` keeps the earlier construction: `Generator.integers` draws, Bernoulli(a/b)
as "an integer uniform in [0, b) is below a", Bernoulli(exp(−a/b)) by CKS Algorithm 1 and
Bernoulli(exp(−m)) as m Bernoulli(e^{-1}) trials: no floating point at all.)

Screen (issue 25, speed; scales without a table, s > 3276.8). Evaluating Γ̂ costs ~2/3 of
a proposal there, so it is evaluated only where a cheap bracket cannot show what the fast
test above decides (`_accept_screened`); every decision, and the set and order of the
entries sent to the exact path (hence every random bit read), is the one made with Γ̂
everywhere, so the output under a given generator state is unchanged (golden digests in
test_noise_golden.py). Proof, with m = `_ACCEPT_MARGIN` ≤ 2^-4, ŷ = U/t + Γ̂ (the rational the
fast test brackets) and lo_x, hi_x its floats:
  (a) Γ = G − L with G = k²/(2s²) − |k|/t + F and L = log J ∈ [−α/4, b²/8], b = |k|/s²:
      e^{−α/4} ≤ e^{−αv²} ≤ 1 on [−½, ½], and ∫_{−½}^{½} e^{bv} dv = sinh(b/2)/(b/2) ∈
      [1, cosh(b/2)] ⊂ [1, e^{b²/8}] (termwise: x^{2n}/(2n+1)! ≤ x^{2n}/(2n)! ≤ x^{2n}/(2^n n!)).
  (b) Y = fl(fl(fl(|k|·|k|)·a) + R) with a = 1/(2s²) correctly rounded (`_half_inverse_square`,
      Python's int/int division of the exact rational) and R = fl(F − fl(n/t)), n = |k| − U
      = 2^j·V (an exact integer; `_screen_rest`), so that exactly h − n/t + F = G + U/t.
      With |k| ≤ K + 1 ≤ 41s + 1, |k|/s² ≤ 41, n/t ≤ 41, |F| ≤ 842: h̃ = fl(fl(k·k)·a) is
      within (1 + u)³ − 1 ≤ 3.01u relative of h ≤ 841 (2532u), n/t rounds by ≤ 41u, R by
      ≤ 883u (|R| ≤ 883) and the sum by ≤ 1724u; with |Γ̂ − Γ| ≤ 3271u (the count below),
      |Y − ŷ| ≤ |L| + 8451u < |L| + 2^-39 (the conditioning offset of
      `_sample_rounded_gaussian`, tests only, adds < 2000u: still < 2^-38). So |Y − ŷ| ≤ D
      = K²/(8s⁴) + 1/(8s²) + 2^-38 (K ≥ |k|). The screen runs only where D ≤ 2^-15, where
      it settles nearly everything (for s > 3276.8, D < 1.9e-5 = 2^-15.7;
      `_screen_constants` returns None otherwise).
  (c) Tables: lg[w] ≤ −ln(w/2^16) ≤ lg[w] + 2^-39 for the 16-bit leads w ≥ 1, lg[0] = +inf
      (`_neg_log_table`: `ieee_math.log`, moved 2^-40 down).
      Constants (`_screen_constants`, exact rationals rounded up): with x = m + 2^-27 + u,
      c_acc ≥ D + x/(1 − x) + 2^-30 and c_rej ≥ D + (1 + m)(1 + 2^-27)(1 + u) − 1 + 2^-30;
      the shifts (`_screen_shifts`, rounded up) a ≥ c_acc + 2^-40 and r ≥ c_rej + 2^-38.
  (d) Accept: if fl(Y + a) ≤ lg[lead + 1] (≤ 11.1, so the sum rounded by ≤ 12u < 2^-40),
      then Y + c_acc ≤ −ln((lead+1)/2^16), i.e. Y + D + x/(1 − x) < −ln((lead+1)/2^16); so
      with ŷ ≤ Y + D and (1 − m)(1 − 2^-27)(1 − u) ≥ 1 − x ≥ e^{−x/(1−x)}: lead + 1 ≤
      2^16e^{−ŷ}(1 − m)(1 − 2^-27)(1 − u) ≤ lo_x, i.e. the fast test accepts (lo_x is its
      estimate of 2^16e^{−ŷ}, within 2^-27, times (1 − m) and rounded once). If the fast
      path is clamped (ŷ ≥ 64 − 2^-51, lo_x = 0), then Y ≥ ŷ − D ≥ 63.9 > 11.1: never taken.
      Reject: if fl(Y − r) ≥ lg[lead] (so lead ≥ 1; the difference rounded by ≤ 1724u <
      2^-42), then Y − c_rej ≥ −ln(lead/2^16) (2^-38 ≥ 2^-39 + 2^-42), so −Y + D + c ≤
      ln(lead/2^16) with c = (1 + m)(1 + 2^-27)(1 + u) − 1, and hi_x ≤ 2^16e^{−ŷ}(1 + c)
      ≤ 2^16·exp(−Y + D + c) ≤ lead: the fast test rejects without the exact path. If it
      is clamped, hi_x ≤ 2^16·2.2e^{−64} < 1 ≤ lead as well.
  Only the others (lead within a unit or two of 2^16e^{−Y}, ≈ 3/2^16 of them, and the
  rare lead = 0) get Γ̂ and the unchanged test. Γ̂ ≥ 0 (which `_exponent_parts` checks):
  |Γ̂ − G| ≤ |Γ̂ − Γ| + |L| ≤ D, so Γ̂ ≥ 0 wherever G ≥ D; `_low_interval` gives integers
  containing every |k| with G(k) < D (G is a parabola in k: its exact vertex, and the
  half-width from a float square root padded by 2), and Γ̂ is evaluated and checked there:
  on the whole interval once per (s, F) when it spans ≤ 2^16 integers (≤ 47 of them from
  s = 3300, none from s ≈ 4.7·10^5 on, where F's 1e-9 margin exceeds D), else on each
  draw in it.
  Like the exact path, the screen makes the time depend on the noise values, never on the
  data.
  Fast path (`_accepted_chunk`; min_abs = 0, 2^j ≤ 2^31, the interval checked once): the
  same computation on the same words in compiled loops (`_lead_v_kernel`, `_tail_kernel`
  for V's extra bits, `_screen_kernel`, and `_open_kernel` for the entries the screen
  leaves open: Γ̂ with `ieee_math.exp_one`/`log_one` and the fast test, in the operation
  order of `_exponent_block` and `_lead_bounds`; worker/ieee_jit.py: the same IEEE
  operations, no FMA, so the same bits): R looked up by V, |k|·|k| and the tests per
  entry, the sign applied as (|k| ⊕ m) − m, accepted and open values written to the output
  in stream order and the rejected open ones removed (`_drop_kernel`). Its random reads
  are those of `_propose_chunk` in the same order (the chunk's words, V's extra bits for
  the whole chunk with its ties in order, then the exact path in stream order), so it
  returns the same values and leaves the generator at the same position
  (test_noise_golden: digests, and the two chunk functions on words that take every
  branch; test_noise_fast_path: whole calls against the general path, a tie in V's bits).
  Batching the open entries of several chunks into one Γ̂ evaluation would not pay: ≈ 40%
  of chunks read exact-path words (nearly every open entry is also undecided by the fast
  test on Γ̂) and the next chunk's words start after them, so a batch would have to guess
  past those reads and redo the chunks after a wrong guess (measured at s = 1.1e6 and 1e5:
  122 of 300 chunks).

Support cap. Proposals with |k| > K = ⌈40·s⌉ are rejected, so the output law is p restricted
to |k| ≤ K and renormalised. The removed mass is P(|Z| > (K+½)/s) ≤ P(|Z| > 40) < e^{-800}
(≈ 1e-347, below the smallest positive double). Strictly, the capped mechanism's support
depends on the data, so its Rényi divergence at the support edge is infinite; what holds is
(ε, δ + T·(1+e^ε)·e^{-800})-DP for any (ε, δ) that the accountant gives for T uncapped draws
(each capped draw is within total variation e^{-800} of the uncapped one). The cap also
bounds the work per proposal and keeps every float below 2^53. `discrete_laplace` is capped
the same way at ⌈801·scale⌉ (removed mass < e^{-800}): strictly, a count released with it is
(ε, e^{-800})-DP rather than pure ε-DP, a gap far below the generator's own (see below).

Bound on the floating-point error: PMF_RELATIVE_ERROR
-----------------------------------------------------
Write u = 2^-53 (unit roundoff). The accepted law is P̃(k) ∝ q(k)·exp(−Γ̂(k)) where q is
exact and Γ̂(k) is the computed exponent after its fractional part is floored to the 2^-53
grid (`_exponent_parts`, in the operation order counted here). If |Γ̂(k) − Γ(k) − c| ≤ ε for
all |k| ≤ K and one constant c, then |log P̃(k) − log P(k)| ≤ 2ε (ε from the weight, ε from
the normaliser). The count assumes only IEEE-754 binary64 arithmetic (correct rounding of
+, −, ×, ÷, √; exact scaling by powers of two, frexp, floor, comparisons): exp and log are
`worker.ieee_math.exp`/`log`, built from those operations with bounds proven in their
docstrings (exp within 1.1u relative for normal results; log within u·|y| + 1.01u absolute),
not numpy's or the platform's libm, whose accuracy is only a measured property. Gauss-
Legendre nodes are within 4u absolute and weights within 16u relative (they are computed in
50-digit decimal arithmetic from nodes certified by sign changes of P_n and rounded once, so
within u; `_gauss_legendre`, also checked in the tests). With |k| ≤ K so z = |k|/s ≤ 41,
b = z/s ≤ 41:
  h = ½(z·z) ≤ 840.5, relative 3u ............................................. 2522u
  L = ½b + log S, S = Σ W_i exp(b·d_i − α v_i²), d_i = v_i − ½: each exponent
      ≤ 41·3u (b, product) + 41·4u (node) + 1u (α v²) + 41.2u (rounding) ≤ 371u, in
      [−42, 0]; exp 1.1u; weight 16u; product 1u; sum of ≤ 64 positive terms 63u (so S
      within 452.1u relative, log S within 452.2u absolute); log: u·|log S| + 1.01u
      ≤ 4.91u (S ≥ e^{−α/4}(1−e^{−b})/b, so |log S| ≤ 3.9); ½b 41u; final sum 20.5u ....... 519u
  |k|/t ≤ 40.5, relative u ..................................................... 41u
  g = (|k|/t + L) − F: two roundings, |values| ≤ 62 ................................ 123u
  Γ split exactly as ⌊h⌋ + (h − ⌊h⌋) (Sterbenz); f = (h − ⌊h⌋) − g, |f| ≤ 63 ........ 63u
  f − ⌊f⌋ (exact unless f < 0: ≤ u); flooring to the 2^-53 grid (≤ u) ............... 2u
  GL truncation (≤ 1e-17 relative; the order n is chosen with IEEE operations only and a
      margin, `_quadrature_order`) ................................................... 0.1u
  total ε ≤ 3271u ≈ 3.632e-13, so |log P̃/P| ≤ 2ε ≤ 7.27e-13 and
  |P̃(k)/P(k) − 1| ≤ e^{2ε} − 1 < 7.3e-13 ≤ PMF_RELATIVE_ERROR = 1e-12 for all |k| ≤ K.
(With numpy's exp and log assumed within 4 ulp, as before issue 25's IEEE-only rule, the
count was 3304u; the proven functions are tighter than that assumption, so the charged
constant is unchanged.) Measured against 60-digit mpmath (unit test), the worst
|Γ̂ − Γ − c| is ≈ 1350u (at s = 2.5; ≈ 1400u with numpy's exp and log).
Discrete Laplace draws contain no floating point at all (exact for ideal random bits).
For DP accounting this means every privacy-loss value of the rounded Gaussian is within
2·PMF_RELATIVE_ERROR (nats) of the exact mechanism's, i.e. negligible.

Library functions: which ones can change the law. Only Γ̂ enters the law, and it uses
`ieee_math.exp`/`log` (above). The other transcendental calls in this module, and why they
need no accuracy guarantee:
* `_quadrature_order` (the quadrature order n, which bounds the truncation above) uses
  exact integer factorials, `ieee_math.log` and IEEE √ with a 1e-9 log-space margin; the
  Cauchy radius ρ may be any positive number.
* `_gauss_legendre` takes numpy's `leggauss` only as Newton starting points; the nodes are
  certified (sign changes of P_n in 50-digit decimal arithmetic).
* F (`_max_log_weight`, via the same `_log_weight`): any constant cancels in P̃; only
  Γ̂ ≥ 0 matters, and that is checked on every evaluation (RuntimeError otherwise).
* `math.exp`, `math.expm1`, `math.tanh`, `math.sqrt` in `plan.acceptance`, `keep_rate`,
  the discrete-Laplace rates and `_first_accepted`: batch sizes only (how many proposals
  are drawn ahead; the output is the first accepted ones in stream order whatever the batch
  sizes), never an outcome.
* `_lead_bounds` (the fast accept/reject test) uses basic operations and a table built from
  exact integers; it only decides which decisions the exact integer path settles.
* `_accept_screened` (the screen above) uses basic operations and `ieee_math.log` (its
  table of −ln(w/2^16)); it only decides where Γ̂ is evaluated, never a decision.

What this does NOT defend against
---------------------------------
* Timing side channels inside the enclave. The number of rejection rounds (and so the
  running time) depends on the noise values, not on the data; an observer of fine-grained
  timing learns about the noise, which can weaken the guarantee (Jin et al. 2022 attack
  exactly this in discrete samplers). Outside the enclave the job's duration is not shown:
  with ENCLAVE_RELEASE_HOLD on (the default) the worker releases at a public grid time,
  started_at + D·2^j with D from the plan's time estimate (service/release_hold.py), and
  the analyst's progress is wall time against D. What still shows is which grid point the
  release took (whether the run overshot D, and by how many doublings): a coarse function
  of the run time, dominated by the machine's load, not analysed here. An observer on the
  worker's host (CPU, power, cache timing) is out of scope.
* Generator quality. `secure_rng` uses ChaCha20 (randomgen) keyed with 256 bits from the OS
  CSPRNG: the stream is computationally indistinguishable from random under the usual
  assumption on ChaCha20, which is a far larger gap than the e^{-800} cap or the 1e-12 bound.
  "Exact" above means exact for ideal random bits.
* Memory disclosure of the generator state, or a caller that reuses noise.

Why one module (over 500 lines): about 480 of its code lines and most of this docstring are
the rounded Gaussian, whose construction, fast comparisons and error bound above are one
argument over helpers it shares with the exact integer path (`_exp_neg_bounds`,
`_below_exp_neg`, `_first_accepted`, which discrete Laplace uses too), and the unit tests
patch those helpers on this module to force the exact path; splitting off discrete Laplace
(~180 lines) would still leave the Gaussian part near 700 lines with its proof split across files.
The screen (~200 lines with its constants) is a step of the same fast-test argument: its
proof is a statement about `_lead_bounds`' floats and the error count above; the fast path
(~150 lines) is the same computation as `_propose_chunk`, proven equal to it above.

No function here accepts a seed: an analyst-chosen seed would let the analyst subtract the
noise (see `worker/rng.py`).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt
from randomgen import ChaCha

from service.privacy.sampling import PMF_RELATIVE_ERROR as _CHARGED_PMF_RELATIVE_ERROR
from worker import ieee_math
from worker.ieee_jit import ieee_njit

if TYPE_CHECKING:  # torch is only needed by `to_torch`
    import torch

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

#: Bound on |P̃(k)/P(k) − 1| for every k in the support of `rounded_gaussian` (derivation in
#: the module docstring, assuming IEEE-754 arithmetic only: the count gives < 7.3e-13). The
#: ledger charges this value (service/privacy/sampling.py holds the one definition, so the
#: two cannot drift apart).
PMF_RELATIVE_ERROR: float = _CHARGED_PMF_RELATIVE_ERROR
#: `rounded_gaussian` rejects |k| > ⌈GAUSSIAN_CAP_SIGMAS · scale⌉ (removed mass < e^{-800}).
GAUSSIAN_CAP_SIGMAS: float = 40.0
#: `discrete_laplace` rejects |k| > ⌈LAPLACE_CAP_SCALES · scale⌉ (removed mass < e^{-800}).
LAPLACE_CAP_SCALES: float = 801.0
MIN_GAUSSIAN_SCALE: float = 1.0
MAX_SCALE: float = float(2**40)

_TWO53 = 2**53
# Scales with K = ⌈40 s⌉ up to this get a precomputed table of exponents (s ≲ 3276).
_TABLE_MAX_CAP = 2**17
# Added to F: a constant in the exponent cancels in the accepted law; this one only keeps the
# computed Γ ≥ 0 (float errors are ≤ 1e-12 ≪ 1e-9).
_OFFSET_MARGIN = 1e-9
_QUADRATURE_TOLERANCE = 1e-17
# Log-space slack of the order test (`_quadrature_order`): covers its rounding (< 1e-11).
_ORDER_MARGIN = 1e-9


def secure_rng() -> np.random.Generator:
    """A numpy Generator on ChaCha20 keyed with 256 bits from the OS CSPRNG (`secrets`).

    ChaCha20 (20 rounds, randomgen) is a cryptographic stream cipher used as a counter-mode
    generator: without the key its output is computationally indistinguishable from uniform.
    There is deliberately no seed parameter; every call returns an independent stream.
    """
    return np.random.Generator(ChaCha(key=secrets.randbits(256), rounds=20))


# --------------------------------------------------------------------------- exact Bernoullis


def _bernoulli_ratio(rng: np.random.Generator, num: IntArray, den: int) -> BoolArray:
    """Bernoulli(num/den) elementwise, exactly: an unbiased integer in [0, den) below num."""
    return rng.integers(0, den, size=num.shape[0], dtype=np.int64) < num


def _one_in(rng: np.random.Generator, k: int, size: int) -> BoolArray:
    """Bernoulli(1/k) elementwise, exactly: an unbiased integer in [0, k) is 0 (a byte per
    draw where k ≤ 256, a quarter of the random bits of an int64 draw)."""
    return rng.integers(0, k, size=size, dtype=np.uint8 if k <= 256 else np.int64) == 0


def _bernoulli_exp_neg_ratio(rng: np.random.Generator, num: IntArray, den: int) -> BoolArray:
    """Bernoulli(exp(−num/den)) elementwise for 0 ≤ num ≤ den < 2^63, exactly.

    CKS 2020 Algorithm 1: K ← 1; while Bernoulli(γ/K): K ← K + 1; return [K odd]. Then
    P(K ≥ k+1) = γ^k/k! and P(K odd) = Σ_j (−γ)^j/j! = e^{−γ}. Bernoulli(γ/K) is drawn as
    Bernoulli(γ)·Bernoulli(1/K) so no product of integers can overflow.
    """
    out = np.empty(num.shape[0], dtype=np.bool_)
    idx = np.arange(num.shape[0])
    k = 1
    while idx.size:
        go_on = _bernoulli_ratio(rng, num[idx], den)
        if k > 1:
            go_on &= _one_in(rng, k, idx.size)
        out[idx[~go_on]] = k % 2 == 1
        idx = idx[go_on]
        k += 1
    return out


def _bernoulli_exp_minus_one(rng: np.random.Generator, size: int) -> BoolArray:
    """`size` independent Bernoulli(e^{-1}) draws, exactly (Algorithm 1 with γ = 1)."""
    out = np.empty(size, dtype=np.bool_)
    idx = np.arange(size)
    k = 2  # Bernoulli(1/1) always continues
    while idx.size:
        go_on = _one_in(rng, k, idx.size)
        out[idx[~go_on]] = k % 2 == 1
        idx = idx[go_on]
        k += 1
    return out


def _bernoulli_exp_neg_int(rng: np.random.Generator, m: IntArray) -> BoolArray:
    """Bernoulli(exp(−m)) for integers m ≥ 0: m independent Bernoulli(e^{-1}) trials all succeed.

    Trials stop at the first failure, so the work is O(1) expected whatever m is.
    """
    out = np.ones(m.shape[0], dtype=np.bool_)
    idx = np.flatnonzero(m > 0)
    remaining = m[idx]
    while idx.size:
        ok = _bernoulli_exp_minus_one(rng, idx.size)
        out[idx[~ok]] = False
        remaining = remaining - 1
        keep = ok & (remaining > 0)
        idx, remaining = idx[keep], remaining[keep]
    return out


def _first_accepted(propose: Callable[[int], IntArray], size: int, *, rate: float) -> IntArray:
    """The first ``size`` accepted values of a stream of independent (value, accept)
    proposals, drawn in batches sized from the acceptance rate (``rate`` is a first guess,
    then the rate seen so far). ``propose(m)`` makes the next m proposals of the stream and
    returns the accepted values among them, in stream order.

    This is the law of the loop that redraws only the rejected entries: the accepted values
    of an i.i.d. proposal stream are i.i.d. with the accepted law, and the output is always
    the first ``size`` of them in stream order, whatever the batch sizes (they only decide
    how far ahead the stream is drawn, and excess proposals are discarded unseen), so the
    floating-point rate only costs time if it is off. Batches cut the rounds of numpy calls
    from ~log(size)/log(1/rejection rate) to one, rarely two.
    """
    out: IntArray | None = None
    filled = proposed = accepted = 0
    while filled < size:
        need = size - filled
        if proposed:
            rate = max(accepted / proposed, 0.05)
        # Enough for `need` acceptances unless the count falls ~4 sd short.
        batch = math.ceil((need + 4 * math.sqrt(need)) / rate) + 16
        values = propose(batch)
        kept = values[:need]
        if out is None:
            if kept.size == size:  # the usual case: one batch, no copy
                return kept
            out = np.empty(size, dtype=np.int64)
        out[filled : filled + kept.size] = kept
        filled += kept.size
        proposed += batch
        accepted += values.size
    return np.empty(0, dtype=np.int64) if out is None else out


# ------------------------------------------------------------------------ discrete Laplace


@dataclass(frozen=True)
class _LaplacePlan:
    """Exact description of DLap(scale), scale = num/den as an exact rational (den = 2^j).

    X ≥ 0 with P(X = x) ∝ exp(−x/scale) is drawn as X = U + block·V (CKS Algorithm 2 with a
    general rational scale): U uniform in {0..block−1} kept with probability
    exp(−U·den/num) (U < scale, so the exponent is < 1), V the number of successes of
    Bernoulli(exp(−block/scale)) trials, block/scale = step_whole + step_frac_num/num.
    """

    num: int
    den: int
    block: int
    step_whole: int
    step_frac_num: int
    cap: int


def _laplace_plan(scale: float, cap: int) -> _LaplacePlan:
    num, den = scale.as_integer_ratio()
    block = max(1, -(-num // den))  # ⌈scale⌉, and 1 when scale < 1
    step_whole, step_frac_num = divmod(block * den, num)
    # ⌊γ⌋ ≥ 2^62 only when scale < 2^-62: P(V ≥ 1) < e^{-2^62} then; clipping keeps int64.
    return _LaplacePlan(num, den, block, min(step_whole, 2**62), step_frac_num, cap)


def _half_laplace(rng: np.random.Generator, plan: _LaplacePlan, size: int, limit: int) -> IntArray:
    """X ≥ 0 with P(X = x) ∝ exp(−x/scale) for x ≤ limit; values > limit mean "reject"."""
    u = np.zeros(size, dtype=np.int64)
    if plan.block > 1:

        def propose_u(m: int) -> IntArray:
            cand = rng.integers(0, plan.block, size=m, dtype=np.int64)
            # cand·den < num < 2^53: cand < scale = num/den.
            return cand[_bernoulli_exp_neg_ratio(rng, cand * plan.den, plan.num)]

        # P(keep) = E exp(−U/scale) = (1 − r^block)/(block·(1 − r)), r = e^{−1/scale}.
        per = plan.den / plan.num
        rate = math.expm1(-plan.block * per) / (plan.block * math.expm1(-per))
        u = _first_accepted(propose_u, size, rate=rate)
    v = np.zeros(size, dtype=np.int64)
    v_stop = limit // plan.block + 1  # once V reaches this, X > limit: stop counting
    idx = np.arange(size)
    frac = np.full(size, plan.step_frac_num, dtype=np.int64)
    whole = np.full(size, plan.step_whole, dtype=np.int64)
    while idx.size:
        n = idx.size
        if plan.step_frac_num:
            success = _bernoulli_exp_neg_ratio(rng, frac[:n], plan.num)
        else:
            success = np.ones(n, dtype=np.bool_)
        success[success] = _bernoulli_exp_neg_int(rng, whole[: int(success.sum())])
        idx = idx[success]
        v[idx] += 1
        idx = idx[v[idx] < v_stop]
    return u + plan.block * v


def _two_sided_laplace(
    rng: np.random.Generator, plan: _LaplacePlan, size: int, min_abs: int = 0
) -> IntArray:
    """Y with P(Y = y) ∝ exp(−|y|/scale) on min_abs ≤ |y| ≤ cap (min_abs > 0: tests only).

    For min_abs > 0 this is the law conditioned on |Y| ≥ min_abs, by memorylessness
    X | X ≥ m  =  m + X.
    """
    limit = plan.cap - min_abs

    def propose(m: int) -> IntArray:
        x = _half_laplace(rng, plan, m, limit) + min_abs
        negative = _one_in(rng, 2, m)
        valid = (x <= plan.cap) & ~(negative & (x == 0))
        return np.where(negative, -x, x)[valid]

    # Only "−0" (probability ½·P(X = 0) = ½(1 − e^{−1/scale})) and the e^{-800} tail are
    # rejected.
    rate = 0.5 * (1.0 + math.exp(-plan.den / plan.num)) if min_abs == 0 else 1.0
    return _first_accepted(propose, size, rate=rate)


# ------------------------------------------------- certified Bernoulli(exp(−y)), exact path


def _exp_pos_bounds(num: int, den: int, q: int) -> tuple[int, int]:
    """Integers lo ≤ e^{num/den}·2^q ≤ hi (0 ≤ num/den ≤ 1): the Taylor series with every
    term rounded down (lo) or up (hi), and the tail after the last term n bounded by that
    term (ratio r/(n+1) ≤ ½)."""
    lo = hi = lo_term = hi_term = 1 << q
    n = 0
    while hi_term > 1 or 2 * num > (n + 1) * den:
        n += 1
        lo_term = lo_term * num // (den * n)
        hi_term = -(-hi_term * num // (den * n))
        lo += lo_term
        hi += hi_term
    return lo, hi + hi_term


@lru_cache(maxsize=32)
def _exp_neg_one_bounds(q: int) -> tuple[int, int]:
    lo, hi = _exp_pos_bounds(1, 1, q)
    return (1 << (2 * q)) // hi, -(-(1 << (2 * q)) // lo)


def _exp_neg_bounds(num: int, den: int, precision: int) -> tuple[int, int]:
    """Integers lo ≤ e^{−num/den}·2^precision ≤ hi for a rational num/den ≥ 0, exactly
    (integer arithmetic, every rounding outward): e^{−r} for the fractional part r as the
    reciprocal of the bounds on e^{r}, times (e^{−1})^⌊num/den⌋ by binary powering."""
    q = precision + 64
    whole, rem = divmod(num, den)
    e_lo, e_hi = _exp_pos_bounds(rem, den, q)
    lo, hi = (1 << (2 * q)) // e_hi, -(-(1 << (2 * q)) // e_lo)
    b_lo, b_hi = _exp_neg_one_bounds(q)
    while whole:
        if whole & 1:
            lo, hi = (lo * b_lo) >> q, -(-(hi * b_hi) >> q)
        whole >>= 1
        if whole:
            b_lo, b_hi = (b_lo * b_lo) >> q, -(-(b_hi * b_hi) >> q)
    shift = q - precision
    return lo >> shift, -(-hi >> shift)


def _below_exp_neg(rng: np.random.Generator, u: list[int], num: int, den: int) -> bool:
    """Exactly whether U < e^{−num/den}, U being the uniform binary fraction known to
    u = [bits, length] so far (refined in place with fresh 64-bit words while the bounds
    cannot tell; ends with probability 1, at once when e^{−num/den} = 1)."""
    precision = max(128, u[1] + 64)
    while True:
        lo, hi = _exp_neg_bounds(num, den, precision)
        bits, length = u
        if (bits + 1) << precision <= lo << length:  # U < (bits+1)/2^B ≤ e^{−y}
            return True
        if bits << precision >= hi << length:  # U ≥ bits/2^B ≥ e^{−y}
            return False
        precision *= 2
        u[0], u[1] = (bits << 64) | int(rng.bit_generator.random_raw(1)[0]), length + 64


def _floor_exp_neg(num: int, den: int, bits: int) -> int:
    """⌊e^{−num/den}·2^bits⌋ exactly (bounds refined until their floors agree)."""
    extra = 64
    while True:
        lo, hi = _exp_neg_bounds(num, den, bits + extra)
        if lo >> extra == hi >> extra:
            return lo >> extra
        extra *= 2  # pragma: no cover - only if e^{−y}·2^bits is within 2^-64 of an integer


#: Leading bits of U compared in the vectorised step (V and the acceptance each get 16).
_LEAD_BITS = 16
_LEAD = float(1 << _LEAD_BITS)
#: exp(−y) for y < _EXP_TABLE_STEPS/_EXP_TABLE_RES is bounded by a table of e^{−i/64} times
#: a cubic on [0, 1/64); relative error < 2^-27.9 (module docstring), far inside this margin.
_EXP_TABLE_RES = 64
_EXP_TABLE_STEPS = 64 * 64
_ACCEPT_MARGIN = 2.0**-20
_ONE_SIXTH = 1.0 / 6.0


@lru_cache(maxsize=1)
def _exp_table() -> tuple[FloatArray, FloatArray]:
    """Floats lo_i ≤ e^{−i/64} ≤ hi_i for i < 4096 (integer bounds at 256 bits, powered with
    outward rounding, divided by 2^256 with Python's correctly rounded int division, moved one
    ulp outward), and a last entry [0, 2·e^{−64}] bounding every e^{−y} with y ≥ 64 − 2^-50."""
    q = 256
    step_lo, step_hi = _exp_neg_bounds(1, _EXP_TABLE_RES, q)
    lo_i = hi_i = 1 << q
    lo = np.empty(_EXP_TABLE_STEPS + 1)
    hi = np.empty(_EXP_TABLE_STEPS + 1)
    for i in range(_EXP_TABLE_STEPS):
        lo[i] = np.nextafter(lo_i / (1 << q), 0.0)
        hi[i] = np.nextafter(hi_i / (1 << q), 2.0)
        lo_i, hi_i = (lo_i * step_lo) >> q, -(-(hi_i * step_hi) >> q)
    lo[-1], hi[-1] = 0.0, 2.0 * np.nextafter(hi_i / (1 << q), 2.0)
    lo.flags.writeable = hi.flags.writeable = False
    return lo, hi


def _lead_bounds(
    u: IntArray, t: int, whole: FloatArray, frac_num: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Floats lo ≤ 2^16·e^{−y} ≤ hi, y = u/t + whole + frac_num/2^53 (integers, u < t < 2^53;
    derivation in the module docstring: table of e^{−i/64} times a cubic on [0, 1/64))."""
    lo_table, hi_table = _exp_table()
    z = u / t  # one rounding (u, t < 2^53 are exact floats)
    z += frac_num * 2.0**-53  # the addend is exact; one rounding
    z *= float(_EXP_TABLE_RES)
    i = np.floor(z)
    z -= i  # exact, then exact scaling: d = z − i/64 ∈ [0, 1/64)
    z *= 1.0 / _EXP_TABLE_RES
    i += whole * float(_EXP_TABLE_RES)
    np.minimum(i, float(_EXP_TABLE_STEPS), out=i)
    index = i.astype(np.intp)
    poly = z * -_ONE_SIXTH  # 1 − d + d²/2 − d³/6 by Horner
    poly += 0.5
    poly *= z
    poly -= 1.0
    poly *= z
    poly += 1.0
    lo = lo_table[index] * poly
    lo *= (1.0 - _ACCEPT_MARGIN) * _LEAD
    poly *= hi_table[index]
    poly *= (1.0 + _ACCEPT_MARGIN) * _LEAD
    return lo, poly


def _accept_exp_neg(
    rng: np.random.Generator,
    lead: FloatArray,
    u: IntArray,
    t: int,
    whole: FloatArray,
    frac_num: FloatArray,
    needed: BoolArray,
) -> BoolArray:
    """Bernoulli(exp(−y)), y = u/t + whole + frac_num/2^53, exactly: "W < e^{−y}" for a
    uniform W = 0.b₁b₂… whose first 16 bits are ``lead``.

    W's interval [lead, lead + 1)/2^16 below lo/2^16 accepts, at or above hi/2^16 rejects
    (`_lead_bounds`); the rest (≈ 2^-16 of them) go to the exact integer path with fresh
    bits. Entries with ``needed`` False are left undecided (False): they are rejected for
    another reason.
    """
    lo, hi = _lead_bounds(u, t, whole, frac_num)
    accept = lead + 1.0 <= lo
    open_ = np.flatnonzero(needed & ~accept & (lead < hi))
    den = t << 53
    for j in open_.tolist():
        num = (int(u[j]) << 53) + int(frac_num[j]) * t + int(whole[j]) * den
        accept[j] = _below_exp_neg(rng, [int(lead[j]), _LEAD_BITS], num, den)
    return accept


# --------------------------------------------- screening Γ̂ with a certified cheap bracket


def _round_up(q: Fraction) -> float:
    value = float(q)
    return math.nextafter(value, math.inf) if Fraction(value) < q else value


@lru_cache(maxsize=32)
def _screen_constants(scale: float, cap: int, margin: float) -> tuple[float, float, float] | None:
    """(width, c_acc, c_rej) of the screen (module docstring, "Screen"), or None where its
    conditions fail (D > 2^-15 or m > 2^-4: evaluate Γ̂ everywhere).

    D = K²/(8s⁴) + 1/(8s²) + 2^-38 (exact rational; width = D rounded up), with
    x = m + 2^-27 + 2^-53: c_acc = D + x/(1 − x) + 2^-30 and c_rej = D + (1 + m)(1 + 2^-27)
    (1 + 2^-53) − 1 + 2^-30, both rounded up; m is the fast path's margin `_ACCEPT_MARGIN`."""
    s = Fraction(scale)
    d = Fraction(cap) ** 2 / (8 * s**4) + 1 / (8 * s**2) + Fraction(1, 2**38)
    m = Fraction(margin)
    if d > Fraction(1, 2**15) or m > Fraction(1, 16):
        return None
    x = m + Fraction(1, 2**27) + Fraction(1, 2**53)
    up = (1 + m) * (1 + Fraction(1, 2**27)) * (1 + Fraction(1, 2**53)) - 1
    slack = Fraction(1, 2**30)
    return _round_up(d), _round_up(d + x / (1 - x) + slack), _round_up(d + up + slack)


@lru_cache(maxsize=1)
def _neg_log_table() -> FloatArray:
    """Floats lg[w] ≤ −ln(w/2^16) ≤ lg[w] + 2^-39 for the leads 1 ≤ w ≤ 2^16, lg[0] = +inf
    (one 512 KiB table for both tests of the screen): `ieee_math.log` of the exact w·2^-16
    is within u·11.1 + 1.01u < 2^-49 of ln, and the entries are moved 2^-40 down (one more
    rounding, < 2^-49)."""
    table = np.empty((1 << _LEAD_BITS) + 1)
    table[0] = np.inf
    table[1:] = -ieee_math.log(np.arange(1, (1 << _LEAD_BITS) + 1) * 2.0**-_LEAD_BITS)
    table[1:] -= 2.0**-40
    table.flags.writeable = False
    return table


@lru_cache(maxsize=32)
def _screen_shifts(c_acc: float, c_rej: float) -> tuple[float, float]:
    """(a, r) = (c_acc + 2^-40, c_rej + 2^-38) rounded up: the screen accepts where
    fl(Y + a) ≤ lg[lead + 1] and rejects where fl(Y − r) ≥ lg[lead] (module docstring, Screen
    (d): the extra 2^-40 and 2^-38 cover those two roundings and lg's 2^-39)."""
    return (
        _round_up(Fraction(c_acc) + Fraction(1, 2**40)),
        _round_up(Fraction(c_rej) + Fraction(1, 2**38)),
    )


def _screen_decide(
    y: FloatArray,
    lead: IntArray,
    shifts: tuple[float, float],
    accept: BoolArray,
    open_: BoolArray,
    scratch: FloatArray,
    bound: FloatArray,
) -> None:
    """accept ← fl(y + a) ≤ lg[lead + 1]; open_ ← neither that nor fl(y − r) ≥ lg[lead] (the
    entries whose Γ̂ is needed); every array is written in place (no temporaries)."""
    table = _neg_log_table()
    np.add(y, shifts[0], out=scratch)
    np.take(table[1:], lead, out=bound, mode="clip")  # lead < 2^16: clip never clips
    np.less_equal(scratch, bound, out=accept)
    np.subtract(y, shifts[1], out=scratch)
    np.take(table, lead, out=bound, mode="clip")
    np.less(scratch, bound, out=open_)
    open_ ^= accept  # accepted entries have y − r < y + a ≤ lg[lead + 1] < lg[lead]


def _half_inverse_square(scale: float) -> float:
    """a = 1/(2s²) correctly rounded (Python's int/int division of the exact rational)."""
    q = Fraction(1, 2) / Fraction(scale) ** 2
    return q.numerator / q.denominator


def _screen_rest(plan: _GaussianPlan, n: IntArray, offset: float) -> FloatArray:
    """R = fl(F − fl(n/t)) for n = |k| − U (= 2^j·V + min_abs), the part of Y after h."""
    rest = n.astype(np.float64)
    rest /= plan.t
    np.subtract(offset, rest, out=rest)
    return rest


@lru_cache(maxsize=32)
def _low_interval(scale: float, offset: float, min_abs: int, margin: float) -> tuple[int, int]:
    """Integers [lo, hi] (lo > hi if none) containing every min_abs ≤ |k| ≤ K with G(k) < width
    (|k| < min_abs is never proposed, and F = ``offset`` is a max over |k| ≥ min_abs only), G the
    exact real k²/(2s²) − k/t + F (F = ``offset``): outside it Γ̂ ≥ G − D ≥ 0 (module docstring,
    Screen). G = (k − k*)²/(2s²) + G(k*), k* = s²/t, so the set is k* ± r with r² = 2s²(width −
    G(k*)); r is computed in float (error ≪ 1 for r < 2^50) and padded by 2 on each side."""
    plan = _gaussian_plan(scale)
    screen = _screen_constants(scale, plan.cap, margin)
    assert screen is not None  # only called where the screen runs
    s, f = Fraction(scale), Fraction(offset)
    centre = s * s / plan.t
    r2 = 2 * s * s * (Fraction(screen[0]) - (f - s * s / (2 * plan.t * plan.t)))
    if r2 <= 0:
        return 1, 0
    r = math.sqrt(float(r2))
    return max(min_abs, math.floor(centre - r) - 2), min(plan.cap, math.ceil(centre + r) + 2)


#: Spans of `_low_interval` up to this are checked once (`_checked_low_interval`).
_LOW_CHECK_MAX = 1 << 16


@lru_cache(maxsize=32)
def _checked_low_interval(scale: float, offset: float, min_abs: int, margin: float) -> bool:
    """Evaluates Γ̂ on all of `_low_interval` when it spans ≤ `_LOW_CHECK_MAX` integers
    (`_exponent_parts` raises if any Γ̂ < 0) and says whether it did: then no draw needs the
    check again."""
    lo, hi = _low_interval(scale, offset, min_abs, margin)
    if hi - lo + 1 > _LOW_CHECK_MAX:
        return False
    if hi >= lo:
        _exponent_parts(_gaussian_plan(scale), np.arange(lo, hi + 1, dtype=np.int64), offset)
    return True


def _accept_screened(
    rng: np.random.Generator,
    plan: _GaussianPlan,
    lead: IntArray,
    u: IntArray,
    k_abs: IntArray,
    offset: float,
    needed: BoolArray,
    min_abs: int = 0,
) -> BoolArray:
    """`_accept_exp_neg` with Γ̂(k) (`_exponent_parts`) evaluated only where a cheap bracket
    of y cannot show what its fast test decides: the same decisions, the same entries sent
    to the exact path in the same order, so the same random bits are read (proof in the
    module docstring, "Screen"). Also raises, like `_exponent_parts`, if any Γ̂(k) < 0
    (every |k| in ``k_abs`` is ≥ ``min_abs``)."""
    screen = _screen_constants(plan.scale, plan.cap, _ACCEPT_MARGIN)
    if screen is None:
        return _accept_full(rng, plan, lead, u, k_abs, offset, needed)
    if not _checked_low_interval(plan.scale, offset, min_abs, _ACCEPT_MARGIN):
        lo, hi = _low_interval(plan.scale, offset, min_abs, _ACCEPT_MARGIN)
        low = np.flatnonzero((k_abs >= lo) & (k_abs <= hi))
        if low.size:
            _exponent_parts(plan, k_abs[low], offset)  # raises if any Γ̂ < 0
    y = k_abs.astype(np.float64)
    y *= y
    y *= _half_inverse_square(plan.scale)
    y += _screen_rest(plan, k_abs - u, offset)
    accept = np.empty(y.size, dtype=np.bool_)
    open_ = np.empty(y.size, dtype=np.bool_)
    shifts = _screen_shifts(screen[1], screen[2])
    _screen_decide(y, lead, shifts, accept, open_, np.empty_like(y), np.empty_like(y))
    cand = np.flatnonzero(open_)
    if cand.size:
        accept[cand] = _accept_full(
            rng, plan, lead[cand], u[cand], k_abs[cand], offset, needed[cand]
        )
    return accept


def _accept_full(
    rng: np.random.Generator,
    plan: _GaussianPlan,
    lead: IntArray,
    u: IntArray,
    k_abs: IntArray,
    offset: float,
    needed: BoolArray,
) -> BoolArray:
    """The fast test on Γ̂ (and the exact path where it cannot tell), for the few entries the
    screen leaves open."""
    whole, frac_num = _exponent_parts(plan, k_abs, offset)
    return _accept_exp_neg(rng, lead.astype(np.float64), u, plan.t, whole, frac_num, needed)


# ------------------------------------------------------------------------ rounded Gaussian


def _log_factorial(n: int) -> float:
    """ln(n!) from the exact integer: n! = 2^e·m, m = n!/2^e ∈ [½, 1] by Python's correctly
    rounded int/int division, ln(n!) = e·ln 2 + ln m with `ieee_math.log` (error ≪ 1e-12)."""
    exact = math.factorial(n)
    e = exact.bit_length()
    m = exact / (1 << e)
    return e * ieee_math.LN2_HI + (e * ieee_math.LN2_LO + _scalar_log(m))


def _scalar_log(x: float) -> float:
    return float(ieee_math.log(np.array([x]))[0])


def _quadrature_order(alpha: float, beta: float) -> int:
    """Smallest Gauss-Legendre order n with relative error ≤ 1e-17 for J (see module doc).

    Integrand f(v) = exp(−αv² + β(v − ½)) on [−½, ½], β ≥ 0. Remainder ≤
    (n!)⁴/((2n+1)((2n)!)³)·max|f^{(2n)}|, and by Cauchy on a circle of radius ρ,
    |f^{(2n)}| ≤ (2n)!·exp(αρ² + βρ)/ρ^{2n} (Re(−αz²) ≤ αρ², Re β(z − ½) ≤ βρ) for any
    ρ > 0 (so ρ, chosen near the minimiser 2αρ² + βρ = 2n, needs no accuracy). The integral
    is ≥ e^{−α/4}(1 − e^{−β})/β ≥ e^{−α/4}·max(e^{−β/2}, [β ≥ 1]·0.632/β)
    ((1 − e^{−β})/β = e^{−β/2}·sinh(β/2)/(β/2), and 1 − e^{−1} > 0.632).

    The test is made in log space with IEEE operations only: factorials are exact integers
    (`_log_factorial`), logs are `ieee_math.log` (error ≤ u·|y| + 1.01u), √ is IEEE. For
    n ≤ 128 and s ∈ [1, 2^40], ρ ∈ [0.03, s·√(2n)] so |log ρ| ≤ 31, and the |terms| sum to
    < 1.3·10^4 (4 ln n! ≤ 1976, 2 ln (2n)! ≤ 2336, αρ² + βρ ≤ 2n, 2n|ln ρ| ≤ 7936); each
    term is within 6u of itself plus 1.01u per log and the sum rounds 5 times, so each side
    is within 2e-11 of the exact value, and the comparison keeps a margin of 1e-9: a
    returned n provably meets the tolerance (libm's lgamma/exp/log are not used).
    """
    log_lower = -alpha / 4 - beta / 2
    if beta >= 1:
        log_lower = max(log_lower, -alpha / 4 + _scalar_log(0.632) - _scalar_log(beta))
    target = _scalar_log(_QUADRATURE_TOLERANCE) + log_lower - _ORDER_MARGIN
    for n in range(1, 129):
        rho = 4 * n / (beta + math.sqrt(beta * beta + 16 * alpha * n))
        log_bound = (
            4 * _log_factorial(n)
            - _scalar_log(2 * n + 1)
            - 2 * _log_factorial(2 * n)
            + alpha * rho * rho
            + beta * rho
            - 2 * n * _scalar_log(rho)
        )
        if log_bound <= target:
            return n
    raise RuntimeError("no Gauss-Legendre order reaches the tolerance")  # unreachable, s ≥ 1


@lru_cache(maxsize=64)
def _gauss_legendre(order: int) -> tuple[FloatArray, FloatArray]:
    """Gauss-Legendre nodes and weights on [−1, 1], correctly rounded to float64.

    numpy's `leggauss` nodes are accurate, but its weights are off by up to ~3000u at order
    30; so each node is refined by Newton's method and its weight 2/((1−x²)P'_n(x)²) is
    evaluated in 50-digit decimal arithmetic, then rounded once.

    `leggauss` only supplies starting points: each refined node x is certified by a sign
    change of P_n on [x − 1e-40, x + 1e-40] (P_n evaluated in 50 digits, error < 1e-46,
    while |P_n(x ± 1e-40)| ≈ 1e-40·|P'_n| ≥ 1e-40 at the roots), and the n intervals are
    disjoint; P_n has exactly n simple roots in (−1, 1), so every root is found and each
    float node is within u/2 + 1e-40 of its root (a RuntimeError otherwise). The weight
    formula at x then differs from the exact weight by far less than u.
    """

    def legendre(x: Decimal) -> tuple[Decimal, Decimal]:
        previous, current = Decimal(1), x
        for j in range(2, order + 1):
            previous, current = current, ((2 * j - 1) * x * current - (j - 1) * previous) / j
        return current, order * (x * current - previous) / (x * x - 1)

    guesses, _ = np.polynomial.legendre.leggauss(order)  # sorted ascending
    nodes, weights = [], []
    certified: list[Decimal] = []  # right ends of the certified intervals
    with localcontext() as ctx:
        ctx.prec = 50
        radius = Decimal("1e-40")
        for guess in guesses:
            x = Decimal(float(guess))
            for _ in range(4):  # quadratic convergence from ~1e-16
                value, slope = legendre(x)
                x -= value / slope
            _, slope = legendre(x)
            below, _ = legendre(x - radius)
            above, _ = legendre(x + radius)
            if not below * above < 0 or (certified and x - radius <= certified[-1]):
                raise RuntimeError(f"Gauss-Legendre node {len(certified)} of {order}: no root")
            certified.append(x + radius)
            nodes.append(float(x))
            weights.append(float(2 / ((1 - x * x) * slope * slope)))
    return np.array(nodes), np.array(weights)


@dataclass(frozen=True)
class _GaussianPlan:
    scale: float
    t: int  # proposal scale ⌊s⌋ + 1
    cap: int  # K = ⌈40 s⌉
    alpha: float  # 1/(2s²)
    shifted_nodes: FloatArray  # v_i − ½ for the Gauss-Legendre nodes v_i on [−½, ½]
    nodes_sq: FloatArray  # v_i²
    weights: FloatArray  # Gauss-Legendre weights on [−½, ½]
    offset: float  # F
    table_whole: IntArray | None  # ⌊Γ̂(k)⌋ for k = 0..K (small scales)
    table_frac: IntArray | None  # 2^53·frac(Γ̂(k))
    # P(accept) = Σ_k q(k)·exp(−Γ(k)) = s·√(2π)·e^{−F}·tanh(1/(2t)) (Σ_k exp(−k²/(2s²))·J(k)
    # = s√(2π) over the proposal's normaliser coth(1/(2t))): sizes batches, nothing else.
    acceptance: float


def _log_weight(plan: _GaussianPlan, k_abs: IntArray) -> tuple[FloatArray, FloatArray]:
    """(h, e) = (k²/(2s²), |k|/t + L(k)) in float64, in the operation order of the error count.

    log(p(k)/q(k)) = e − h + const; the acceptance exponent is Γ = h − (e − F). (The sum of
    the quadrature terms starts from the first term: 0 + x = x, the same value as before.)
    The terms of all nodes are one array (row i: node i, the same operations elementwise),
    so `ieee_math.exp` is called once, not once per node (its per-call cost dominates the
    few entries the screen leaves open); the rows are summed in node order as before.
    """
    kf = k_abs.astype(np.float64)
    z = kf / plan.scale
    b = z / plan.scale
    z *= z
    z *= 0.5  # h
    terms = b[None, :] * plan.shifted_nodes[:, None]
    terms -= (plan.alpha * plan.nodes_sq)[:, None]  # each α·v_i² one rounding, as before
    terms = ieee_math.exp(terms)  # proven 1.1u (not numpy's exp: module docstring)
    terms *= plan.weights[:, None]
    total = terms[0].copy()  # the order is ≥ 1
    for row in terms[1:]:
        total += row
    total = ieee_math.log(total)  # proven u·|log S| + 1.01u
    b *= 0.5
    b += total  # L
    kf /= plan.t
    kf += b
    return z, kf


def _exponent_parts(
    plan: _GaussianPlan, k_abs: IntArray, offset: float
) -> tuple[FloatArray, FloatArray]:
    """Γ̂(k) = whole + frac/2^53 ≥ 0 as two float arrays of exact integers (see `_exponent`),
    in blocks of 4096 (elementwise, so the values do not depend on the blocking; the
    temporaries of `ieee_math`'s exp and log then stay in cache, ~3x faster than 32768)."""
    if k_abs.size <= _EXPONENT_BLOCK:
        return _exponent_block(plan, k_abs, offset)
    whole = np.empty(k_abs.size)
    frac = np.empty(k_abs.size)
    for start in range(0, k_abs.size, _EXPONENT_BLOCK):
        stop = start + _EXPONENT_BLOCK
        whole[start:stop], frac[start:stop] = _exponent_block(plan, k_abs[start:stop], offset)
    return whole, frac


_EXPONENT_BLOCK = 4096


def _exponent_block(
    plan: _GaussianPlan, k_abs: IntArray, offset: float
) -> tuple[FloatArray, FloatArray]:
    h, e = _log_weight(plan, k_abs)
    h_whole = np.floor(h)
    h -= h_whole
    e -= offset
    h -= e  # f = (h − ⌊h⌋) − (e − offset)
    f_whole = np.floor(h)
    h -= f_whole  # frac(f)
    h *= float(_TWO53)
    np.floor(h, out=h)
    h_whole += f_whole
    if h_whole.size and float(h_whole.min()) < 0:  # excluded by the margin in F; never bias
        raise RuntimeError("rounded Gaussian: negative acceptance exponent")
    return h_whole, h


def _exponent(plan: _GaussianPlan, k_abs: IntArray, offset: float) -> tuple[IntArray, IntArray]:
    """Γ̂(k) = whole + frac/2^53 ≥ 0 (Γ = k²/(2s²) − |k|/t − L(k) + offset), split exactly."""
    whole, frac_num = _exponent_parts(plan, k_abs, offset)
    return whole.astype(np.int64), frac_num.astype(np.int64)


def _max_log_weight(plan: _GaussianPlan, min_abs: int) -> float:
    """max over integers |k| ≥ min_abs of −k²/(2s²) + |k|/t + L(k) (concave in k ≥ 0)."""
    centre = plan.scale * plan.scale / plan.t
    lo = max(0, math.floor(centre) - 1)
    candidates = np.maximum(np.arange(lo, math.ceil(centre) + 3, dtype=np.int64), min_abs)
    h, e = _log_weight(plan, candidates)
    return float(np.max(e - h))


@lru_cache(maxsize=16)
def _gaussian_plan(scale: float) -> _GaussianPlan:
    t = math.floor(scale) + 1
    cap = math.ceil(GAUSSIAN_CAP_SIGMAS * scale)
    alpha = 0.5 / (scale * scale)
    order = _quadrature_order(alpha, cap / (scale * scale))
    x, w = _gauss_legendre(order)
    nodes = 0.5 * x
    plan = _GaussianPlan(
        scale=scale,
        t=t,
        cap=cap,
        alpha=alpha,
        shifted_nodes=nodes - 0.5,
        nodes_sq=nodes * nodes,
        weights=0.5 * w,
        offset=0.0,
        table_whole=None,
        table_frac=None,
        acceptance=0.5,
    )
    offset = _max_log_weight(plan, 0) + _OFFSET_MARGIN
    table_whole = table_frac = None
    if cap <= _TABLE_MAX_CAP:
        table_whole, table_frac = _exponent(plan, np.arange(cap + 1, dtype=np.int64), offset)
        table_whole.flags.writeable = table_frac.flags.writeable = False
    for array in (plan.shifted_nodes, plan.nodes_sq, plan.weights):
        array.flags.writeable = False  # shared through the cache
    acceptance = scale * math.sqrt(2 * math.pi) * math.exp(-offset) * math.tanh(0.5 / t)
    return replace(
        plan,
        offset=offset,
        table_whole=table_whole,
        table_frac=table_frac,
        acceptance=min(max(acceptance, 0.05), 1.0),
    )


@dataclass(frozen=True)
class _ProposalPlan:
    """The discrete-Laplace proposal of scale t as X = U + 2^j·V (module docstring, step 1).

    U is j uniform bits (2^j ≤ t/8, or j = 0); V ~ Geometric, P(V ≥ v) = r^v with
    r = e^{−2^j/t}, counted only up to ``v_stop`` (beyond it X > ``limit`` anyway):
    V = #{1 ≤ v ≤ v_stop : W < r^v} for a uniform W. ``lead_v`` gives V from W's first 16
    bits w, or −1 where w = ⌊r^v·2^16⌋ for some v (those draw 48 more bits and use
    ``floor64``; ties there, probability 2^-64 each, go to the exact integer path).
    """

    t: int
    shift: int  # j
    limit: int
    v_stop: int
    lead_v: npt.NDArray[np.int16]
    floor64: npt.NDArray[np.uint64]  # ⌊r^v·2^64⌋ for v = 1..v_stop
    keep_rate: float  # P(keep U) = E e^{−U/t}: sizes batches, nothing else


#: B = 2^j is the largest power of two ≤ t/2^_BLOCK_BELOW (1 if there is none): U is kept
#: with probability 0.94-0.97 on average (0.63-0.79 with B ≤ t), for a longer V table.
_BLOCK_BELOW = 3


@lru_cache(maxsize=16)
def _proposal_plan(t: int, limit: int) -> _ProposalPlan:
    shift = max(t.bit_length() - 1 - _BLOCK_BELOW, 0)
    block = 1 << shift
    v_stop = limit // block + 1
    floor16 = np.array(
        [_floor_exp_neg(v * block, t, _LEAD_BITS) for v in range(1, v_stop + 1)], dtype=np.int64
    )
    floor64 = np.array(
        [_floor_exp_neg(v * block, t, 64) for v in range(1, v_stop + 1)], dtype=np.uint64
    )
    w = np.arange(1 << _LEAD_BITS, dtype=np.int64)
    # ⌊·⌋ is non-increasing in v: #{v : w < floor16_v} by binary search on the reversed list.
    count = v_stop - np.searchsorted(floor16[::-1], w, side="right")
    lead_v = np.where(np.isin(w, floor16), -1, count).astype(np.int16)
    lead_v.flags.writeable = floor64.flags.writeable = False
    keep_rate = math.expm1(-block / t) / (block * math.expm1(-1.0 / t))
    return _ProposalPlan(t, shift, limit, v_stop, lead_v, floor64, keep_rate)


def _geometric_tail(rng: np.random.Generator, prop: _ProposalPlan, lead: IntArray) -> IntArray:
    """V for the entries whose first 16 bits did not settle it: 48 fresh bits each, compared
    with ⌊r^v·2^64⌋ (W < r^v if W's 64-bit prefix w < ⌊r^v·2^64⌋, W > r^v if w > it); a tie
    goes to the exact path."""
    prefix = (lead.astype(np.uint64) << np.uint64(64 - _LEAD_BITS)) | (
        rng.bit_generator.random_raw(lead.size) >> np.uint64(_LEAD_BITS)
    )
    # ⌊r^v·2^64⌋ is non-increasing in v: #{v : prefix < it} by binary search on the reversed
    # list (a prefix equal to one of them has a different left and right insertion point).
    ascending = prop.floor64[::-1]
    right = np.searchsorted(ascending, prefix, side="right")
    v = prop.v_stop - right
    for j in np.flatnonzero(np.searchsorted(ascending, prefix, side="left") != right).tolist():
        v[j] = _exact_geometric(rng, prop, [int(prefix[j]), 64])
    return v


def _exact_geometric(rng: np.random.Generator, prop: _ProposalPlan, u: list[int]) -> int:
    """#{1 ≤ v ≤ v_stop : W < r^v} exactly, W known to u = [bits, length] (refined in place)."""
    count = 0
    while count < prop.v_stop and _below_exp_neg(rng, u, (count + 1) << prop.shift, prop.t):
        count += 1
    return count


_CHUNK = 1 << 15  # proposals per vectorised pass: the working arrays stay in cache


def _propose_rounded(
    rng: np.random.Generator,
    plan: _GaussianPlan,
    prop: _ProposalPlan,
    size: int,
    min_abs: int,
    offset: float | None,
) -> IntArray:
    """The accepted values among ``size`` proposals (module docstring, steps 1-2), in stream
    order, in chunks of `_CHUNK` (the chunks are consecutive stretches of one i.i.d. stream)."""
    fast = _fast_tables(plan.scale, _ACCEPT_MARGIN) if min_abs == 0 and offset is None else None
    if fast is not None:
        out = np.empty(size, dtype=np.int64)
        work, filled = _Workspace(min(size, _CHUNK)), 0
        for start in range(0, size, _CHUNK):
            stop = min(start + _CHUNK, size)
            filled += _accepted_chunk(rng, plan, prop, fast, work, out[filled:], stop - start)
        return out[:filled]
    pieces = []
    for start in range(0, size, _CHUNK):
        stop = min(start + _CHUNK, size)
        values, ok = _propose_chunk(rng, plan, prop, stop - start, min_abs, offset)
        pieces.append(values[ok])
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def _propose_chunk(
    rng: np.random.Generator,
    plan: _GaussianPlan,
    prop: _ProposalPlan,
    size: int,
    min_abs: int,
    offset: float | None,
) -> tuple[IntArray, BoolArray]:
    """One raw 64-bit word per proposal: its top j bits are U (a second word when j > 31),
    bit 32 the sign, bits 16-31 the lead of V's uniform and bits 0-15 the lead of the
    acceptance uniform (disjoint bits of a uniform word are independent uniforms)."""
    words = rng.bit_generator.random_raw(size)
    j = prop.shift
    source = words if j <= 31 else rng.bit_generator.random_raw(size)
    # Fields below 2^63 have the same value as uint64 and int64: views, not conversions.
    top = (source >> np.uint64(64 - j)).view(np.int64) if j else None  # >> 64: undefined
    u = np.zeros(size, dtype=np.int64) if top is None else top
    negative = (words & np.uint64(1 << 32)) != 0
    lead_v = ((words >> np.uint64(16)) & np.uint64(0xFFFF)).view(np.int64)
    lead_accept = (words & np.uint64(0xFFFF)).view(np.int64)
    v = prop.lead_v[lead_v].astype(np.int64)
    open_ = np.flatnonzero(v < 0)
    if open_.size:
        v[open_] = _geometric_tail(rng, prop, lead_v[open_])
    x = v << j
    x += u
    valid = x <= prop.limit
    x += min_abs
    if min_abs == 0:
        valid &= ~(negative & (x == 0))
    k = np.minimum(x, plan.cap)  # rejected entries stay in range, their exponent unused
    if offset is None and plan.table_whole is not None and plan.table_frac is not None:
        whole = plan.table_whole[k].astype(np.float64)
        frac_num = plan.table_frac[k].astype(np.float64)
        lead_f = lead_accept.astype(np.float64)
        accept = _accept_exp_neg(rng, lead_f, u, prop.t, whole, frac_num, valid)
    else:
        exponent_offset = plan.offset if offset is None else offset
        accept = _accept_screened(
            rng, plan, lead_accept, u, k, exponent_offset, valid, min_abs=min_abs
        )
    valid &= accept
    # x·(1 − 2·[negative]) in exact int64 arithmetic (|x| ≤ K < 2^53): branch-free, ~10x
    # faster than a masked negation on random signs.
    sign = negative.view(np.int8) * np.int8(-2)
    sign += np.int8(1)
    x *= sign
    return x, valid


@dataclass(frozen=True)
class _FastTables:
    """What `_accepted_chunk` needs beyond the proposal plan (one scale, min_abs = 0):
    ``rest[V]`` = R = fl(F − fl(2^j·V/t)) for V = 0..v_stop (`_screen_rest`: the same float
    operations as the generic screen, so the same bits), a = 1/(2s²) and the screen's shifts."""

    rest: FloatArray
    half_inverse_square: float
    shifts: tuple[float, float]
    alpha_nodes_sq: FloatArray  # α·v_i², as `_log_weight` rounds it
    ascending64: npt.NDArray[np.uint64]  # the proposal plan's floor64 reversed, contiguous
    lead_factors: tuple[float, float]  # `_lead_bounds`' (1 ∓ margin)·2^16


@lru_cache(maxsize=16)
def _fast_tables(scale: float, margin: float) -> _FastTables | None:
    """Tables of the fast path, or None where it does not apply: the scale has an exponent
    table (s ≤ 3276.8), the screen does not run, U needs a second word (j > 31), or the
    region where Γ̂ ≥ 0 needs checking per draw is too wide to check once. The margin is an
    argument (`_ACCEPT_MARGIN` at every call) so that the cache is keyed on it: a test that widens
    the margin must not get tables built for another one."""
    plan = _gaussian_plan(scale)
    screen = _screen_constants(scale, plan.cap, margin)
    prop = _proposal_plan(plan.t, plan.cap)
    if plan.table_whole is not None or screen is None or prop.shift > 31:
        return None
    if not _checked_low_interval(scale, plan.offset, 0, margin):
        return None
    v = np.arange(prop.v_stop + 1, dtype=np.int64)
    rest = _screen_rest(plan, v << prop.shift, plan.offset)
    rest.flags.writeable = False
    shifts = _screen_shifts(screen[1], screen[2])
    alpha_nodes_sq = plan.alpha * plan.nodes_sq
    alpha_nodes_sq.flags.writeable = False
    ascending64 = np.ascontiguousarray(prop.floor64[::-1])
    ascending64.flags.writeable = False
    factors = ((1.0 - margin) * _LEAD, (1.0 + margin) * _LEAD)
    return _FastTables(
        rest, _half_inverse_square(scale), shifts, alpha_nodes_sq, ascending64, factors
    )


class _Workspace:
    """Preallocated arrays of `_accepted_chunk`, reused for every chunk of a call (fresh
    256 KiB numpy temporaries can cost hundreds of page faults per chunk when glibc returns
    them to the system)."""

    def __init__(self, size: int) -> None:
        self.v = np.empty(size, dtype=np.int16)
        self.pending = np.empty(size, dtype=np.int64)  # open entries: index in the chunk
        self.place = np.empty(size, dtype=np.int64)  # and place in ``out``


_U16: Final = np.uint64(0xFFFF)
_SIXTEEN: Final = np.uint64(16)
_THIRTY_TWO: Final = np.uint64(32)
_ONE: Final = np.uint64(1)
_FORTY_EIGHT: Final = np.uint64(48)


@ieee_njit
def _lead_v_kernel(
    words: npt.NDArray[np.uint64], lead_v: npt.NDArray[np.int16], v: npt.NDArray[np.int16]
) -> int:  # pragma: no cover - compiled (numba runs this source as machine code)
    """v[i] = lead_v[(words[i] >> 16) & 0xFFFF] (−1: V needs more bits); how many are −1.
    Integer operations only."""
    short = 0
    for i in range(words.shape[0]):
        value = lead_v[(words[i] >> _SIXTEEN) & _U16]
        v[i] = value
        short += value < 0
    return short


@ieee_njit
def _tail_kernel(
    words: npt.NDArray[np.uint64],
    v: npt.NDArray[np.int16],
    extra: npt.NDArray[np.uint64],
    ascending: npt.NDArray[np.uint64],
    v_stop: int,
    ties: IntArray,
    prefixes: npt.NDArray[np.uint64],
) -> int:  # pragma: no cover - compiled (numba runs this source as machine code)
    """`_geometric_tail` for the entries with v[i] < 0, the n-th of them with the extra word
    extra[n] (integers only): the 64-bit prefix (lead << 48) | (extra >> 16), V = v_stop −
    #{ascending ≤ prefix}; where the prefix equals an entry of ``ascending`` (its left and
    right insertion points differ) i and the prefix go to ``ties`` (the exact path, in this
    order). Returns how many did."""
    n = 0
    tied = 0
    for i in range(words.shape[0]):
        if v[i] >= 0:
            continue
        prefix = (((words[i] >> _SIXTEEN) & _U16) << _FORTY_EIGHT) | (extra[n] >> _SIXTEEN)
        n += 1
        right = np.searchsorted(ascending, prefix, side="right")
        v[i] = v_stop - right
        if np.searchsorted(ascending, prefix, side="left") != right:
            ties[tied] = i
            prefixes[tied] = prefix
            tied += 1
    return tied


@ieee_njit
def _screen_kernel(
    words: npt.NDArray[np.uint64],
    v: npt.NDArray[np.int16],
    shift: int,
    half_inverse_square: float,
    rest: npt.NDArray[np.float64],
    table: npt.NDArray[np.float64],
    accept_shift: float,
    reject_shift: float,
    limit: int,
    out: npt.NDArray[np.int64],
    pending: npt.NDArray[np.int64],
    place: npt.NDArray[np.int64],
) -> tuple[int, int]:  # pragma: no cover - compiled (numba runs this source as machine code)
    """`_accepted_chunk`'s screen for every entry, in one compiled loop (worker/ieee_jit.py:
    the same IEEE operations as the numpy passes it replaced, so the same bits): |k| =
    2^j·V + U (U the word's top j bits, 0 for j = 0), Y = fl(fl(fl(k)·fl(k))·a) + R[V] (R
    looked up with V clipped to the table, as ``np.take(mode="clip")``), accept ←
    fl(Y + a') ≤ lg[lead + 1], open ← (fl(Y − r') < lg[lead]) ⊕ accept (`_screen_decide`),
    then accept ← accept ∧ ¬(|k| > limit ∨ (negative ∧ |k| = 0)), and the signed value
    |k|·(1 − 2·[bit 32]) as (|k| ⊕ m) − m with m = −[bit 32]. The accepted and the open
    entries' signed values go to ``out`` in stream order (``values[ok]`` once the open ones
    are settled: `_decide_open`, `_drop_kernel`); the n-th open entry's index goes to
    pending[n] and its place in ``out`` to place[n]. Returns (how many written, how many
    open)."""
    top = rest.shape[0] - 1
    opened = 0
    filled = 0
    up = np.uint64(64 - shift) if shift > 0 else np.uint64(0)
    for i in range(words.shape[0]):
        word = words[i]
        index = np.int64(v[i])
        magnitude = index << shift
        if shift > 0:
            magnitude += np.int64(word >> up)
        index = np.int64(min(max(int(index), 0), top))
        y = float(magnitude)
        y = y * y
        y = y * half_inverse_square
        y = y + rest[index]
        lead = np.int64(word & _U16)
        ok = y + accept_shift <= table[lead + 1]
        still = (y - reject_shift < table[lead]) != ok
        negative = np.int64((word >> _THIRTY_TWO) & _ONE)
        if magnitude > limit or (negative == 1 and magnitude == 0):
            ok = False
        mask = -negative
        out[filled] = (magnitude ^ mask) - mask  # kept only if counted below
        if still:
            pending[opened] = i
            place[opened] = filled
            opened += 1
            filled += 1
        elif ok:
            filled += 1
    return filled, opened


def _accepted_chunk(
    rng: np.random.Generator,
    plan: _GaussianPlan,
    prop: _ProposalPlan,
    fast: _FastTables,
    work: _Workspace,
    out: IntArray,
    size: int,
) -> int:
    """`_propose_chunk` then ``values[ok]`` (written to the start of ``out``; returns how many)
    for min_abs = 0 at scales with `_fast_tables`: the same words, values and decisions, and
    the same random reads in the same order (V's extra bits for the whole chunk first, then
    the exact path in stream order), so the same output and generator position (tests:
    test_noise_golden, and the comparison with `_propose_chunk`). Faster: V, its extra bits,
    the screen and the open entries' test in compiled loops (`_lead_v_kernel`,
    `_tail_kernel`, `_screen_kernel`, `_open_kernel`; issue 25: they replace numpy passes
    with the same operations, the same bits), the values written once into ``out`` (which
    must hold ``size`` values)."""
    words = rng.bit_generator.random_raw(size)
    j = prop.shift
    if out.shape[0] < size:  # the kernels write without bounds checks
        raise ValueError("out is shorter than the chunk")
    v = work.v[:size]
    short = _lead_v_kernel(words, prop.lead_v, v)
    if short:  # V's extra words, drawn for the whole chunk, before the exact path
        ties = np.empty(short, dtype=np.int64)
        prefixes = np.empty(short, dtype=np.uint64)
        extra = rng.bit_generator.random_raw(short)
        tied = _tail_kernel(words, v, extra, fast.ascending64, prop.v_stop, ties, prefixes)
        for i, prefix in zip(ties[:tied].tolist(), prefixes[:tied].tolist(), strict=True):
            v[i] = _exact_geometric(rng, prop, [prefix, 64])  # in `_geometric_tail`'s order
    filled, opened = _screen_kernel(
        words,
        v,
        j,
        fast.half_inverse_square,
        fast.rest,
        _neg_log_table(),
        fast.shifts[0],
        fast.shifts[1],
        prop.limit,
        out,
        work.pending,
        work.place,
    )
    if opened:
        keep = _decide_open(rng, plan, prop, fast, words, out, work.pending, work.place, opened)
        filled = _drop_kernel(out, filled, work.place[:opened], keep)
    return int(filled)


def _decide_open(
    rng: np.random.Generator,
    plan: _GaussianPlan,
    prop: _ProposalPlan,
    fast: _FastTables,
    words: npt.NDArray[np.uint64],
    out: IntArray,
    pending: IntArray,
    place: IntArray,
    opened: int,
) -> BoolArray:
    """Whether each of the ``opened`` entries the screen left open is accepted:
    `_accept_full` & needed (needed: |k| ≤ limit and not −0), as `_accepted_chunk` computed
    it before issue 25's step 8, with Γ̂ and the fast test in one compiled loop
    (`_open_kernel`: microseconds instead of ~60 numpy passes, ~250 µs, for the one or two
    open entries of a chunk) and the exact path in stream order, where it was (the same
    `_below_exp_neg` calls, the same random reads)."""
    keep = np.empty(opened, dtype=np.bool_)
    exact = np.empty(opened, dtype=np.int64)
    whole = np.empty(opened, dtype=np.int64)
    frac = np.empty(opened, dtype=np.int64)
    constants = _open_constants(plan, prop, fast)
    count = _open_kernel(
        words, out, pending[:opened], place[:opened], *constants, keep, exact, whole, frac
    )
    if count < 0:  # as `_exponent_parts`: excluded by the margin in F
        raise RuntimeError("rounded Gaussian: negative acceptance exponent")
    den = plan.t << 53
    exact_list, whole_list, frac_list = (a[:count].tolist() for a in (exact, whole, frac))
    for n, w, f in zip(exact_list, whole_list, frac_list, strict=True):
        word = int(words[pending[n]])
        num = ((word >> (64 - prop.shift)) << 53) + f * plan.t + w * den
        keep[n] = _below_exp_neg(rng, [word & 0xFFFF, _LEAD_BITS], num, den)
    return keep


_OpenConstants = tuple[
    int, int, int, float, float, FloatArray, FloatArray, FloatArray, float, FloatArray,
    FloatArray, float, float,
]  # fmt: skip


def _open_constants(plan: _GaussianPlan, prop: _ProposalPlan, fast: _FastTables) -> _OpenConstants:
    """`_open_kernel`'s arguments from ``shift`` to ``hi_factor``."""
    lo_table, hi_table = _exp_table()
    return (
        prop.shift,
        prop.limit,
        plan.cap,
        plan.scale,
        float(plan.t),
        plan.shifted_nodes,
        fast.alpha_nodes_sq,
        plan.weights,
        plan.offset,
        lo_table,
        hi_table,
        fast.lead_factors[0],
        fast.lead_factors[1],
    )


@ieee_njit
def _open_kernel(
    words: npt.NDArray[np.uint64],
    out: IntArray,
    pending: IntArray,
    place: IntArray,
    shift: int,
    limit: int,
    cap: int,
    scale: float,
    t: float,
    shifted_nodes: FloatArray,
    alpha_nodes_sq: FloatArray,
    weights: FloatArray,
    offset: float,
    lo_table: FloatArray,
    hi_table: FloatArray,
    lo_factor: float,
    hi_factor: float,
    keep: BoolArray,
    exact: IntArray,
    whole_out: IntArray,
    frac_out: IntArray,
) -> int:  # pragma: no cover - compiled (numba runs this source as machine code)
    """For the n-th open entry (i = pending[n], its signed value at out[place[n]]), in
    order: needed = |k| ≤ limit ∧ ¬(−0), u, lead and k = min(|k|, K) from the word and the
    value as `_accepted_chunk` read them; Γ̂(k) = whole + frac/2^53
    with `_log_weight`'s and `_exponent_block`'s operations in their order (exp and log by
    `ieee_math.exp_one`/`log_one`, the same bits); lo, hi with `_lead_bounds`' operations;
    then `_accept_exp_neg`'s decision: keep[n] = needed ∧ lead + 1 ≤ lo, and where needed ∧
    ¬keep[n] ∧ lead < hi, n goes to ``exact`` (with its whole and frac; keep[n] False until
    the exact path decides). Returns how many went there, or −1 if any Γ̂ < 0
    (before any is decided, as `_exponent_parts` raised before the exact path ran).
    Worker/ieee_jit.py: the same IEEE operations, no FMA, so the same bits."""
    count = 0
    nodes = shifted_nodes.shape[0]
    up = np.uint64(64 - shift) if shift > 0 else np.uint64(0)
    for n in range(pending.shape[0]):
        word = words[pending[n]]
        k = abs(out[place[n]])  # |k| < 2^62
        negative = (word >> _THIRTY_TWO) & _ONE
        needed = k <= limit and not (negative == 1 and k == 0)
        u = np.int64(word >> up) if shift > 0 else np.int64(0)
        lead = float(np.int64(word & _U16))
        k = min(k, cap)
        # `_log_weight`
        kf = float(k)
        z = kf / scale
        b = z / scale
        z = z * z
        z = z * 0.5  # h
        total = 0.0
        for node in range(nodes):
            term = b * shifted_nodes[node]
            term = term - alpha_nodes_sq[node]
            term = ieee_math.exp_one(term)
            term = term * weights[node]
            total = term if node == 0 else total + term
        total = ieee_math.log_one(total)
        b = b * 0.5
        b = b + total  # L
        kf = kf / t
        kf = kf + b
        # `_exponent_block`
        h_whole = np.floor(z)
        z = z - h_whole
        kf = kf - offset
        z = z - kf
        f_whole = np.floor(z)
        z = z - f_whole
        z = z * 9007199254740992.0  # 2^53
        frac = np.floor(z)
        h_whole = h_whole + f_whole
        if h_whole < 0:
            return -1
        # `_lead_bounds`
        y = float(u) / t
        y = y + frac * 2.0**-53
        y = y * 64.0
        step = np.floor(y)
        y = y - step
        y = y * (1.0 / 64.0)
        step = step + h_whole * 64.0
        step = min(step, 4096.0)
        poly = y * -_ONE_SIXTH
        poly = poly + 0.5
        poly = poly * y
        poly = poly - 1.0
        poly = poly * y
        poly = poly + 1.0
        index = int(step)
        lo = lo_table[index] * poly
        lo = lo * lo_factor
        hi = poly * hi_table[index]
        hi = hi * hi_factor
        ok = lead + 1.0 <= lo
        keep[n] = needed and ok
        if needed and not ok and lead < hi:
            exact[count] = n
            whole_out[count] = np.int64(h_whole)
            frac_out[count] = np.int64(frac)
            count += 1
    return count


@ieee_njit
def _drop_kernel(
    out: IntArray, filled: int, place: IntArray, keep: BoolArray
) -> int:  # pragma: no cover - compiled (numba runs this source as machine code)
    """Removes out[place[n]] where not keep[n] from out[:filled] (places ascending), keeping
    the order; returns the new length. Integers only."""
    write = filled
    for n in range(place.shape[0]):
        if not keep[n]:
            write = place[n]
            break
    read = write
    for n in range(place.shape[0]):
        if place[n] < write or keep[n]:
            continue
        out[write : write + place[n] - read] = out[read : place[n]]
        write += place[n] - read
        read = place[n] + 1
    if read <= filled:
        out[write : write + filled - read] = out[read:filled]
        write += filled - read
    return write


def _sample_rounded_gaussian(
    rng: np.random.Generator, plan: _GaussianPlan, size: int, min_abs: int = 0
) -> IntArray:
    """Rejection loop; min_abs > 0 draws the law conditioned on |N| ≥ min_abs (tests only).

    Conditioning: the proposal conditioned on |Y| ≥ min_abs (|Y| = min_abs + X with X the
    unconditioned half-line proposal capped at K − min_abs, by memorylessness), accepted with
    exp(−Γ(k) + const), yields p restricted to |k| ≥ min_abs; the constant is re-chosen as
    the max over that range so acceptance stays efficient.
    """
    offset = None if min_abs == 0 else _max_log_weight(plan, min_abs) + _OFFSET_MARGIN
    prop = _proposal_plan(plan.t, plan.cap - min_abs)
    rate = prop.keep_rate * (plan.acceptance if min_abs == 0 else 0.5)

    def propose(m: int) -> IntArray:
        return _propose_rounded(rng, plan, prop, m, min_abs, offset)

    return _first_accepted(propose, size, rate=rate)


# ------------------------------------------------------------------------------ public API


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
        raise ValueError(f"size must be a non-negative integer, got {size!r}")
    return int(size)


def _check_scale(scale: float, *, low: float, low_inclusive: bool) -> float:
    if isinstance(scale, bool) or not isinstance(scale, int | float | np.integer | np.floating):
        raise ValueError(f"scale must be a real number, got {scale!r}")
    value = float(scale)
    above = value >= low if low_inclusive else value > low
    if not (math.isfinite(value) and above and value <= MAX_SCALE):
        bracket = "[" if low_inclusive else "("
        raise ValueError(f"scale must lie in {bracket}{low:g}, 2**40], got {scale!r}")
    return value


def rounded_gaussian(rng: np.random.Generator, *, scale: float, size: int) -> IntArray:
    """`size` draws of N = ⌊scale·Z + ½⌋, Z ~ N(0, 1), as int64 (noise std `scale` in grid units).

    pmf p(k) = Φ((k+½)/s) − Φ((k−½)/s) restricted to |k| ≤ ⌈40·s⌉ (removed mass < e^{-800}),
    with every pmf value within relative error PMF_RELATIVE_ERROR. scale ∈ [1, 2**40].
    `rng` should come from `secure_rng()`.
    """
    s = _check_scale(scale, low=MIN_GAUSSIAN_SCALE, low_inclusive=True)
    return _sample_rounded_gaussian(rng, _gaussian_plan(s), _check_size(size))


def discrete_laplace(rng: np.random.Generator, *, scale: float, size: int) -> IntArray:
    """`size` draws of the two-sided geometric law p(k) ∝ exp(−|k|/scale), as int64.

    With scale = Δ/ε, c + N is ε-DP for an integer query c of sensitivity Δ (Ghosh,
    Roughgarden & Sundararajan 2009). Drawn exactly (no floating point, CKS Algorithms 1-2
    with the rational value of `scale`) on |k| ≤ ⌈801·scale⌉ (removed mass
    2e^{−(K+1)/scale}/(1+e^{−1/scale}) < 2e^{−801} < e^{-800}; see the module docstring for
    what the cap means for a pure-DP claim). scale ∈ (0, 2**40].
    """
    b = _check_scale(scale, low=0.0, low_inclusive=False)
    n = _check_size(size)
    plan = _laplace_plan(b, math.ceil(LAPLACE_CAP_SCALES * b))
    return _two_sided_laplace(rng, plan, n)


def to_torch(array: npt.NDArray[np.int64], device: torch.device | str = "cpu") -> torch.Tensor:
    """Integer noise as an int64 tensor on `device` (values unchanged; no float conversion)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)
