"""DP-SGD (Abadi et al. 2016): Poisson sampling, per-example clipping, Gaussian noise, run
as the named stages of one step, each depending only on the plan's public values.

What the ledger charged (service/methods/dpsgd.py) is the Poisson-subsampled Gaussian mechanism
with the plan's q, σ, C and T, under add/remove-one neighbours. The run below is exactly
that mechanism, post-processed:

1. **Sample** (:class:`PoissonSampler`): every loaded row is included independently with
   probability exactly q (the float q is a dyadic rational m/2^j), for exactly T steps.
   Only the included rows are drawn: the gaps between them over the (step, row) positions
   are Geometric(q), drawn by inversion from the generator's raw integer words and decided
   by integer comparisons and certified bounds, never by an unchecked float (the class's
   docstring has the argument), so a step costs O(q·n), not O(n). Empty batches take their
   noise step. Nothing here looks at the rows; the work depends only on n and on the
   sampled batch sizes (timing: below).
2. **Clip and sum** (the plan's engine, worker/mechanisms/grad_engines.py): adding or
   removing one example moves the int64 vector S by ≤ κ·2^k in ℓ2. For logistic
   regression and MLPs (every engine),
   :class:`~worker.mechanisms.exact_net.ExactNetClipper`: each row's clipped contribution
   (and jl's norm estimate) in fixed-point arithmetic, the same bits whatever else is in
   the batch, and an exact int64 sum, a proof from IEEE-754 alone (issue 25). For GRU-D
   (``exact`` only), float64 per-example gradients weighted a little under 2^k and
   rounded once after a bounded-error sum, a proof that also rests on a measured
   assumption (A1 in grad_engines), so its plans say nominal.
3. **Noise** (:func:`worker.noise.rounded_gaussian`): integer noise N = round(s·Z),
   s = σ·2^k, added in exact integer arithmetic. S + round(s·Z) = round(S + s·Z) for an
   integer S, so the output is a deterministic post-processing of the Gaussian mechanism
   on S with sensitivity 2^k and noise s = σ·2^k: every accountant's curve for the
   subsampled Gaussian applies unchanged. The support of the output is all integers
   whatever the data, which closes the floating-point attacks on Gaussian sampling
   (Mironov 2012; Jin et al. 2022); the sampler's own floating-point gap (relative pmf
   error η) is charged in the plan as a PmfSlackEvent.
4. **Scale and step**: θ ← θ − lr · (S + N)·C·2^−k / (q·n̂), where q·n̂ is the *expected*
   batch size from the public row count n̂. It was q·n with the loaded n before, which
   made the released weights' scale depend on the private row count (an audit measured
   ε ≥ 3.56 at claimed ε = 1 from that alone). θ is one flat buffer that the module's
   parameters view, so the step is one in-place update.

Timing side channels: a step's duration grows with the sampled batch, so a run's duration
grows with the private row count (q·n rows a step on average). It is not shown outside the
enclave: with ENCLAVE_RELEASE_HOLD on (the default), the worker holds the finished job to a
public release time fixed from the plan's time estimate (service/release_hold.py) and
analysts see wall-time progress, never this module's step counter; what still shows is
which grid point the release took (overshoot of the estimate by whole doublings). Timing
observed on the worker's host itself is out of scope.

Why one module (over 500 lines): the four stages above are the one mechanism the ledger
charged, and most of the length is the Poisson sampler's exactness argument next to its
code (:class:`PoissonSampler`); the clip-and-sum engines are already their own modules.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from service.modelspec import ModelSpec
from worker.mechanisms.base import MechanismOutput, PlanMismatch, ProgressFn, TabularTrainingSet
from worker.mechanisms.grad_engines import (
    IntegerSum,
    exact_clipper,
    ghost_clipper,
    jl_integer_sum,
)
from worker.mechanisms.guards import GuardFailed, positive_finite
from worker.models import build_module
from worker.noise import rounded_gaussian, secure_rng

# Noise coordinates drawn per call of the sampler (amortises its per-call overhead).
_NOISE_BLOCK_ELEMENTS = 1 << 20
# (step, row) positions one call of the sampler covers at most (many steps at once) ...
_COIN_BLOCK = 1 << 40
# ... and the included rows it expects to find at most: the gap draws of one call.
_HIT_BLOCK = 1 << 16
# Low bits of a gap guess whose bound products come from one table look-up (4096 entries).
_LOW_BITS = 12


@dataclass(frozen=True)
class DpsgdParams:
    """The plan's public values that the run may depend on (and nothing else)."""

    noise_multiplier: float
    sampling_rate: float
    steps: int
    expected_batch_size: float
    max_grad_norm: float
    learning_rate: float
    grid_bits: int
    parameters: int
    steps_per_epoch: int
    # σ for each epoch (a decaying schedule); empty: noise_multiplier throughout.
    noise_multipliers: tuple[float, ...] = ()
    # Per-example gradient engine (worker/mechanisms/grad_engines.py); JL's r and κ.
    engine: str = "exact"
    jl_projections: int = 0
    jl_kappa: float = 1.0

    def __post_init__(self) -> None:
        # Fail closed on values no proof covers (worker/mechanisms/guards.py); the engines
        # also check every row's contribution on the real batch.
        positive_finite(
            "dpsgd",
            max_grad_norm=self.max_grad_norm,
            learning_rate=self.learning_rate,
            noise_multiplier=self.noise_multiplier,
            sampling_rate=self.sampling_rate,
            expected_batch_size=self.expected_batch_size,
            steps=self.steps,
            steps_per_epoch=self.steps_per_epoch,
            parameters=self.parameters,
            jl_kappa=self.jl_kappa,
        )
        if self.sampling_rate > 1:
            raise GuardFailed(f"dpsgd: sampling_rate must be ≤ 1, got {self.sampling_rate!r}")
        positive_finite("dpsgd", **{f"sigma_{e}": s for e, s in enumerate(self.noise_multipliers)})

    def sigma_at(self, step: int) -> float:
        """σ of step ``step`` (1-based), as the plan's event accounts it."""
        if not self.noise_multipliers:
            return self.noise_multiplier
        return self.noise_multipliers[self._epoch(step)]

    def _epoch(self, step: int) -> int:
        return min((step - 1) // self.steps_per_epoch, len(self.noise_multipliers) - 1)

    def steps_with_same_sigma(self, step: int) -> int:
        """How many steps from ``step`` on (itself included) use σ_at(step)."""
        if not self.noise_multipliers or self._epoch(step) == len(self.noise_multipliers) - 1:
            return self.steps - step + 1
        return (self._epoch(step) + 1) * self.steps_per_epoch - step + 1

    @classmethod
    def from_plan(cls, mechanism: dict[str, Any]) -> DpsgdParams:
        return cls(
            steps_per_epoch=int(mechanism["steps_per_epoch"]),
            noise_multipliers=tuple(float(v) for v in mechanism.get("noise_multipliers", ())),
            noise_multiplier=float(mechanism["noise_multiplier"]),
            sampling_rate=float(mechanism["sampling_rate"]),
            steps=int(mechanism["steps"]),
            expected_batch_size=float(mechanism["expected_batch_size"]),
            max_grad_norm=float(mechanism["max_grad_norm"]),
            learning_rate=float(mechanism["learning_rate"]),
            grid_bits=int(mechanism["grid_bits"]),
            parameters=int(mechanism["parameters"]),
            engine=str(mechanism.get("engine", "exact")),
            jl_projections=int(mechanism.get("jl_projections") or 0),
            jl_kappa=float(mechanism.get("jl_kappa", 1.0)),
        )


class NoiseStream:
    """Integer noise for one step at a time, drawn in blocks of many steps (the noise does not
    depend on the data, so drawing it early changes nothing but the per-call overhead), and
    moved to ``device`` once per block."""

    def __init__(
        self,
        *,
        rng: np.random.Generator,
        size: int,
        steps: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.rng, self.size, self.left, self.device = rng, size, steps, device
        self.block = max(1, _NOISE_BLOCK_ELEMENTS // max(size, 1))
        self._scale: float | None = None
        self._buffer = torch.empty((0, size), dtype=torch.int64, device=device)
        self._next = 0

    def draw(self, *, scale: float, same_scale_ahead: int) -> torch.Tensor:
        """Noise for one step, an int64 tensor of ``size``; ``same_scale_ahead`` (≥ 1) steps,
        this one included, share ``scale``, so a refill never draws noise no step will use."""
        if scale != self._scale or self._next >= len(self._buffer):
            rows = max(1, min(self.block, same_scale_ahead, self.left))
            flat = rounded_gaussian(self.rng, scale=scale, size=rows * self.size)
            self._buffer = torch.from_numpy(flat.reshape(rows, self.size)).to(self.device)
            self._scale, self._next = scale, 0
        out = self._buffer[self._next]
        self._next += 1
        self.left -= 1
        return out

    def draw_steps(self, *, scale: float, same_scale_ahead: int, most: int) -> torch.Tensor:
        """Noise for the next 1 to ``most`` steps at once, (steps, size) int64: the rows that
        as many calls of :meth:`draw` would return, from the same refills of the same sizes
        (so the same draws in the same order); fewer than ``most`` where the buffer ends
        first. ``same_scale_ahead`` as for :meth:`draw`, counted from the first of them."""
        first = self.draw(scale=scale, same_scale_ahead=same_scale_ahead)
        count = max(0, min(most - 1, len(self._buffer) - self._next))
        if not count:
            return first.unsqueeze(0)
        self._next += count
        self.left -= count
        return self._buffer[self._next - count - 1 : self._next]


@dataclass(frozen=True)
class SampledBlock:
    """The batches of consecutive steps: ``rows`` holds each step's row indices (ascending)
    one step after another, ``sizes`` how many belong to each step."""

    rows: npt.NDArray[np.int64]
    sizes: list[int]


class PoissonSampler:
    """Independent inclusion of each row with probability exactly q per step.

    A float q is a dyadic rational m/2^j (j ≤ 1074); write s = 1 − q = (2^j − m)/2^j.

    **Steps** (:meth:`blocks`, :meth:`indices`) draw only the included rows: the (step, row)
    positions of ``steps`` steps over ``n`` rows, laid end to end, are a sequence of
    independent Bernoulli(q) trials, and the numbers of failures before each success (the
    gaps) are independent Geometric(q): P(G ≥ k) = s^k. Each gap is drawn by inversion
    (Devroye 1986, *Non-Uniform Random Variate Generation*, ch. X §2: G = ⌊ln U / ln s⌋),
    written as G = max{k : U ≤ s^k} so that P(G ≥ k) = P(U ≤ s^k) = s^k holds exactly for a
    uniform U on [0, 1]. U is the binary fraction 0.b₁b₂… whose first 53 bits V are the top
    of one raw 64-bit word of the generator and whose later bits are fresh words, drawn only
    if needed; no float ever decides G:

    * a float log gives a guess k̂ (capped at the positions left, where any larger gap ends
      the block alike), and k̂ is *certified* against rigorous bounds: lower and upper
      bounds of s^(2^i) computed in integer arithmetic with directed rounding and rounded
      outward to floats, multiplied over k̂'s bits (each IEEE product is correctly rounded,
      so ≤ 65 of them err by < 2^−46 relative plus < 2^−1000 absolute, which the bounds
      absorb). k̂ is accepted iff (V+1)·2^−53 ≤ lower(s^k̂) and V·2^−53 > upper(s^(k̂+1)),
      i.e. iff the whole interval U can lie in lies inside (s^(k̂+1), s^k̂]: then G = k̂
      whatever U's later bits are (up to the null event that they are all 0). The log's
      accuracy only decides how often this succeeds, never what is released;
    * otherwise (about once in 2^40 gaps, and whenever V = 0) the exact path decides
      "U ≤ s^k" with Python integers: s^k bounded at P bits with directed rounding, U known
      to B bits; if neither settles it, P doubles and U gets 64 more random bits, which
      ends with probability 1. G is then found by bisection (the guess probed first).

    So G has exactly the Geometric(q) law given uniform raw words, the same kind of
    statement as for the coins below: nothing but integer comparisons and certified bounds
    decide the sample. Positions past the block's end are dropped and the next block starts
    from fresh words (its trials are independent of the first block's), so each block's
    positions are exactly those of n·steps independent Bernoulli(q) trials, in
    O(q·n·steps + steps) work instead of O(n·steps). q = 1 includes every row.

    **Coins** (:meth:`coins`, one per row, O(size)): "a uniform j-bit integer U is below m",
    which has probability exactly q. U is compared with m one byte at a time, most
    significant first: the first byte decides unless it equals m's (probability 1/256), and
    only the rows still tied draw another byte, so a coin costs 1 + 1/255 random bytes on
    average whatever j is. The bytes are the generator's raw 64-bit outputs split into 8
    (each byte of a uniform word is uniform and independent of the others)."""

    def __init__(self, *, sampling_rate: float, rng: np.random.Generator) -> None:
        if not 0.0 < sampling_rate <= 1.0:
            raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
        num, den = float(sampling_rate).as_integer_ratio()  # den = 2^j
        bits = den.bit_length() - 1
        width = -(-bits // 8)
        threshold = num << (8 * width - bits)  # m·2^(8·width − j): the same q, whole bytes
        # q = 1 has no digits: every row is included.
        self._digits = list(threshold.to_bytes(width, "big")) if num < den else []
        self._num, self._den, self._bits = num, den, bits
        self.rng = rng
        # ln s for the guess only; outward float bounds of s^(2^i) for the certificate.
        self._log_s = math.log1p(-self.rate) if num < den else -math.inf
        self._pow_lo, self._pow_hi = self._power_table()
        self._low_lo, self._low_hi = self._low_table()

    @property
    def rate(self) -> float:
        """The inclusion probability actually used (the plan's q, exactly)."""
        return self._num / self._den

    def _bytes(self, size: int) -> npt.NDArray[np.uint8]:
        return self.rng.bit_generator.random_raw(-(-size // 8)).view(np.uint8)[:size]

    def coins(self, size: int) -> npt.NDArray[np.bool_]:
        """``size`` independent Bernoulli(q) draws."""
        if not self._digits:  # q = 1
            return np.ones(size, dtype=np.bool_)
        first = self._bytes(size)
        below = first < self._digits[0]
        tied = np.flatnonzero(first == self._digits[0])
        for digit in self._digits[1:]:
            if not tied.size:
                break
            later = self._bytes(tied.size)
            below[tied[later < digit]] = True
            tied = tied[later == digit]
        return below  # rows still tied have U = m: not below

    # ----------------------------------------------------------------- geometric gaps

    def _base(self, precision: int) -> tuple[int, int]:
        """⌊s·2^P⌋ and ⌈s·2^P⌉ (s = (2^j − m)/2^j, exact integers)."""
        a, j = self._den - self._num, self._bits
        if precision >= j:
            return a << (precision - j), a << (precision - j)
        return a >> (j - precision), -((-a) >> (j - precision))

    def _power_ints(self, k: int, precision: int) -> tuple[int, int]:
        """Integers lo, hi with lo ≤ s^k·2^P ≤ hi: binary powering, rounding lo's products
        down and hi's up."""
        b_lo, b_hi = self._base(precision)
        r_lo = r_hi = 1 << precision
        while k:
            if k & 1:
                r_lo = (r_lo * b_lo) >> precision
                r_hi = -((-(r_hi * b_hi)) >> precision)
            k >>= 1
            if k:
                b_lo = (b_lo * b_lo) >> precision
                b_hi = -((-(b_hi * b_hi)) >> precision)
        return r_lo, r_hi

    def _power_table(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Floats lo_i ≤ s^(2^i) ≤ hi_i, i < 63: integer bounds at 192 bits, each divided
        by 2^192 (Python's int division rounds correctly) and moved one ulp outward."""
        prec = 192
        b_lo, b_hi = self._base(prec)
        lo, hi = np.empty(63), np.empty(63)
        for i in range(63):
            lo[i] = max(np.nextafter(b_lo / (1 << prec), 0.0), 0.0)
            hi[i] = min(np.nextafter(b_hi / (1 << prec), 2.0), 1.0)
            b_lo = (b_lo * b_lo) >> prec
            b_hi = -((-(b_hi * b_hi)) >> prec)
        return lo, hi

    def _below_power(self, u: list[int], k: int) -> bool:
        """Exactly whether U ≤ s^k, U being known to u = [bits, length] so far (refined in
        place with fresh 64-bit words while the bounds cannot tell)."""
        precision = 128
        while True:
            lo, hi = self._power_ints(k, precision)
            bits, length = u
            if (bits + 1) << precision <= lo << length:  # U ≤ (bits+1)/2^B ≤ s^k
                return True
            if bits << precision > hi << length:  # U ≥ bits/2^B > s^k
                return False
            precision *= 2
            word = int(self.rng.bit_generator.random_raw(1)[0])
            u[0], u[1] = (bits << 64) | word, length + 64

    def _exact_gap(self, top: int, guess: int, cap: int) -> int:
        """min(G, cap) exactly for U = 0.⟨top's 53 bits⟩⟨fresh bits⟩: the largest k ≤ cap
        with U ≤ s^k, by bisection probing the guess and its successor first."""
        u = [top, 53]
        lo, hi = 0, cap  # U ≤ s^lo holds (s^0 = 1); the answer lies in [lo, hi]
        probes = [guess, guess + 1]
        while lo < hi:
            mid = probes.pop(0) if probes else (lo + hi + 1) // 2
            if not lo < mid <= hi:
                continue
            if self._below_power(u, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _power_bounds(
        self, k: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Float products of the table's bounds over k's bits (≈ lower and upper bounds of
        s^k, up to the products' own rounding, which the caller's slack absorbs)."""
        # The products over k's low _LOW_BITS bits, from the table of exactly those products
        # (the same multiplications in the same order: the same bits), then the rest.
        low = k & ((1 << _LOW_BITS) - 1)
        lo, hi = self._low_lo[low], self._low_hi[low]
        for i in range(_LOW_BITS, int(k.max(initial=0)).bit_length()):
            bit = ((k >> i) & 1).astype(np.bool_)
            lo *= np.where(bit, self._pow_lo[i], 1.0)
            hi *= np.where(bit, self._pow_hi[i], 1.0)
        return lo, hi

    def _low_table(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """For every k < 2^_LOW_BITS, the float products of the table's bounds over k's bits,
        multiplied in increasing bit order from 1.0 (as :meth:`_power_bounds` does)."""
        k = np.arange(1 << _LOW_BITS, dtype=np.int64)
        lo, hi = np.ones(k.size), np.ones(k.size)
        for i in range(_LOW_BITS):
            bit = ((k >> i) & 1).astype(np.bool_)
            lo *= np.where(bit, self._pow_lo[i], 1.0)
            hi *= np.where(bit, self._pow_hi[i], 1.0)
        return lo, hi

    def gaps(self, count: int, cap: int) -> npt.NDArray[np.int64]:
        """``count`` independent draws of min(G, cap), G ~ Geometric(q) failures before a
        success (0 < q < 1, 0 ≤ cap < 2^53)."""
        top = self.rng.bit_generator.random_raw(count) >> np.uint64(11)  # V, 53 bits
        v = top.astype(np.float64)  # exact: V < 2^53
        u_lo, u_hi = v * 2.0**-53, (v + 1.0) * 2.0**-53
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            guess_f = np.floor(np.log((v + 0.5) * 2.0**-53) / self._log_s)
        guess = np.minimum(np.nan_to_num(guess_f, nan=0.0, posinf=cap), cap).astype(np.int64)
        guess = np.maximum(guess, 0)
        capped = guess == cap  # s^cap once, not over cap's bits for every gap
        lo, hi = self._power_bounds(np.where(capped, 0, guess))
        cap_lo, cap_hi = self._power_bounds(np.array([cap], dtype=np.int64))
        lo[capped], hi[capped] = cap_lo[0], cap_hi[0]
        slack, tiny = 2.0**-46, 2.0**-1000
        at_least = lo * (1.0 - slack) - tiny >= u_hi  # U ≤ s^k̂: G ≥ k̂
        below_next = hi * self._pow_hi[0] * (1.0 + slack) + tiny < u_lo  # U > s^(k̂+1)
        certain = at_least & ((guess == cap) | below_next)
        for i in np.flatnonzero(~certain):
            guess[i] = self._exact_gap(int(top[i]), int(guess[i]), cap)
        return guess

    def _positions(self, length: int) -> npt.NDArray[np.int64]:
        """The successes among ``length`` independent Bernoulli(q) trials (ascending)."""
        if not self._digits:  # q = 1
            return np.arange(length, dtype=np.int64)
        q, at = self.rate, 0
        found: list[npt.NDArray[np.int64]] = []
        while at < length:
            mean = q * (length - at)
            # enough gaps to reach the end unless the count falls ~6 sd short
            want = int(mean + 6.0 * math.sqrt(mean) + 16)
            pos = at + np.cumsum(self.gaps(want, length - at) + 1) - 1
            found.append(pos[pos < length])
            at = int(pos[-1]) + 1
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)

    def indices(self, n: int) -> npt.NDArray[np.int64]:
        """One step's batch: the rows among ``n`` whose coin came up."""
        return self._positions(n)

    def blocks(self, n: int, steps: int) -> Iterator[SampledBlock]:
        """The batches of ``steps`` consecutive steps over ``n`` rows: the included (step,
        row) positions of many steps at once, drawn as geometric gaps, O(q·n) a step."""
        expected = max(self.rate * n, 1.0)
        per_block = max(1, min(_COIN_BLOCK // max(n, 1), int(_HIT_BLOCK / expected)))
        for start in range(0, steps, per_block):
            k = min(per_block, steps - start)
            hits = self._positions(n * k)  # (step, row) in step-major order
            ends = np.searchsorted(hits, np.arange(1, k + 1) * n)
            sizes = np.diff(ends, prepend=0)
            rows = hits - np.repeat(np.arange(k) * n, sizes)
            yield SampledBlock(rows=rows, sizes=sizes.tolist())


def _flat_parameters(module: torch.nn.Module) -> torch.Tensor:
    """One buffer holding every parameter in parameters() order, the parameters becoming
    views of it, so that a step is one in-place update of the buffer."""
    params = list(module.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    offset = 0
    for p in params:
        p.data = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def _train_one(
    *,
    spec: ModelSpec,
    params: DpsgdParams,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
    done: int,
    total: int,
    canaries: GradientCanaries | None = None,
) -> dict[str, torch.Tensor]:
    # The model's width is d (tabular) or V (GRU-D's (n, 3, T, V) inputs), never the size
    # of x's second axis; GRU-D's imputation means are the schema's public ones.
    module = build_module(spec, data.n_features, public_means=data.public_means).to(device)
    theta = _flat_parameters(module)
    if theta.numel() != params.parameters:
        raise PlanMismatch("the model's parameter count differs from the plan's")
    rng = secure_rng()
    sampler = PoissonSampler(sampling_rate=params.sampling_rate, rng=rng)
    noise = NoiseStream(rng=rng, size=params.parameters, steps=params.steps, device=device)
    # Integer units → parameter units: lr·C·2^−k over the *expected* batch size.
    unit = (
        params.learning_rate
        * params.max_grad_norm
        * 2.0**-params.grid_bits
        / params.expected_batch_size
    )
    integer_sum = integer_sum_for(params, module=module, rng=rng)
    if canaries is not None and canaries.parameters != params.parameters:
        raise PlanMismatch("the canaries' parameter count differs from the plan's")
    n = data.n
    # An admin audit's included gradient canaries are rows n, n+1, … of the same sampler.
    sampled_over = n if canaries is None else n + canaries.rows
    step = 0
    for block in sampler.blocks(sampled_over, params.steps):
        rows = torch.from_numpy(block.rows).to(device)
        for idx in rows.split(block.sizes):
            step += 1
            real = idx if canaries is None else idx[idx < n]
            summed = integer_sum(data.x.index_select(0, real), data.y.index_select(0, real))
            if canaries is not None:
                summed += canaries.contribution(idx[idx >= n] - n)  # exact, in int64
            scale = params.sigma_at(step) * 2.0**params.grid_bits
            ahead = params.steps_with_same_sigma(step)
            summed += noise.draw(scale=scale, same_scale_ahead=ahead)  # exact, in int64
            if canaries is not None:
                canaries.observe(summed, theta)
            theta.sub_(summed.double() * unit)
            progress(done + step, total)
    # Parameters and buffers (GRU-D's public means), so the release loads on its own.
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def run_dpsgd(
    *,
    spec: ModelSpec,
    mechanism: dict[str, Any],
    samples: int,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    """Train `samples` independent DP-SGD models (each charged by the plan)."""
    params = DpsgdParams.from_plan(mechanism)
    per = params.steps
    total = per * samples
    releases = [
        _train_one(
            spec=spec,
            params=params,
            data=data,
            device=device,
            progress=progress,
            done=i * per,
            total=total,
        )
        for i in range(samples)
    ]
    return MechanismOutput(releases=releases)


def run_dpsgd_with_canaries(
    *,
    spec: ModelSpec,
    mechanism: dict[str, Any],
    data: TabularTrainingSet,
    device: torch.device,
    canaries: GradientCanaries,
) -> dict[str, torch.Tensor]:
    """ONE DP-SGD run of the plan with an admin audit's gradient canaries in it (the
    registry's :func:`run_dpsgd`, which jobs run, has no canary parameter): the same
    sampler, engine, noise and step as a job, plus :class:`GradientCanaries`. Only
    worker/gradient_canaries.py calls it (tests/unit/test_gradient_canaries.py)."""
    return _train_one(
        spec=spec,
        params=DpsgdParams.from_plan(mechanism),
        data=data,
        device=device,
        progress=lambda step, total: None,
        done=0,
        total=0,
        canaries=canaries,
    )


class GradientCanaries:
    """White-box gradient canaries of an admin audit (worker/gradient_canaries.py has the
    design and the scoring): never a job's, only :func:`run_dpsgd_with_canaries` takes them.

    Each of the ``rows`` included canaries is one more "row" of the run's Poisson sampler
    (positions n, n+1, … after the n data rows), so it enters a step's sum with probability
    exactly q, independently across steps, as a data row does; when it does, its
    contribution is a fixed int64 vector on the engine's integer grid of ℓ2 norm ≤ 2^k,
    the per-row bound every engine's sum is accounted with (κ·2^k, κ ≥ 1), checked here in
    exact integer arithmetic (fail closed). So the run is the planned mechanism on a
    dataset of n + rows rows, and the guarantee covers adding or removing any one canary.
    What the white-box auditor sees, inside the worker: ``observed`` accumulates, in int64,
    the noisy sums S_t + N_t (Σ_t (S_t + N_t) = (θ_0 − θ_T)·q·n̂/(lr·C·2^−k)), and
    ``iterates`` holds θ_{t−1}, the parameters each step's sum was computed at (T × P
    float64: small models only)."""

    def __init__(self, contributions: torch.Tensor, *, grid_bits: int) -> None:
        if contributions.dtype != torch.int64 or contributions.dim() != 2:
            raise GuardFailed("gradient canaries: an int64 (canaries, parameters) tensor")
        limit = 4**grid_bits  # (2^k)², compared in Python integers: no overflow
        for row in contributions.tolist():
            if sum(v * v for v in row) > limit:
                raise GuardFailed("gradient canaries: a canary's norm exceeds 2^k")
        self.contributions = contributions
        self.rows, self.parameters = contributions.shape
        self.observed = torch.zeros(self.parameters, dtype=torch.int64)
        self.iterates: list[torch.Tensor] = []

    def contribution(self, sampled: torch.Tensor) -> torch.Tensor:
        """Σ of the sampled canaries' vectors (indices into ``contributions``)."""
        return self.contributions.index_select(0, sampled.cpu()).sum(0).to(sampled.device)

    def observe(self, noisy_sum: torch.Tensor, theta: torch.Tensor) -> None:
        """One step: its noisy sum, and θ before the step."""
        self.observed += noisy_sum.cpu()
        self.iterates.append(theta.detach().to("cpu", torch.float64, copy=True))


def integer_sum_for(
    params: DpsgdParams, *, module: torch.nn.Module, rng: np.random.Generator
) -> IntegerSum:
    """The plan's engine for one run's ``module`` as (x, y) → int64 sum of sensitivity
    ≤ κ·2^k."""
    k, c, size = params.grid_bits, params.max_grad_norm, params.parameters
    if params.engine == "exact":
        return exact_clipper(module, grid_bits=k, max_grad_norm=c, parameters=size)
    if params.engine == "ghost":
        return ghost_clipper(module, grid_bits=k, max_grad_norm=c, parameters=size)
    if params.engine == "jl":
        r, kappa = params.jl_projections, params.jl_kappa
        return lambda x, y: jl_integer_sum(
            module,
            x,
            y,
            grid_bits=k,
            max_grad_norm=c,
            parameters=size,
            projections=r,
            kappa=kappa,
            rng=rng,
        )
    raise PlanMismatch(f"unknown gradient engine {params.engine!r}")
