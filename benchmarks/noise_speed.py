"""Draws per second of `worker.noise.rounded_gaussian` (issue 25): the current sampler
against the previous one, A/B in the same process, rounds interleaved, medians.

The previous version (worker/noise.py before this change: CKS Algorithm 2 with the block t,
CKS Algorithm 1 Bernoullis from `Generator.integers`, one numpy pass per round of every
rejection loop) is copied below, verbatim but for names, clearly marked, only so that the two
can be timed side by side on one machine; it is not used anywhere else. Both sample the
same law P̃(k) ∝ q(k)·exp(−Γ̂(k)); the run also checks that the current `_exponent` (Γ̂,
rewritten in place) returns the previous values bit for bit, and prints the sample std/s.
Run (keep it short on a shared machine):

    .venv/bin/python benchmarks/noise_speed.py [--rounds 3] [--scales 1e5 1e6 1e7]
        [--sizes 10000 100000 1000000] [--draws 1000000] [--baseline REV]
        [--out benchmarks/results/noise_speed.md]

With ``--baseline REV`` the "previous" sampler is worker/noise.py as committed at REV
(loaded from git into its own module; worker/ieee_math.py is the current one, which the
golden digests show unchanged), and the run first checks that both return the same draws
and leave the generator at the same position under fixed ChaCha20 keys (the speed-ups of
issue 25 must not change a released bit).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from randomgen import ChaCha

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker import noise  # noqa: E402

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


# ============================================================================================
# PREVIOUS VERSION of the rounded-Gaussian sampler (worker/noise.py before issue 25's
# speed-up), copied for the A/B timing only. Do not use elsewhere.
# ============================================================================================


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


def _first_accepted(
    propose: Callable[[int], tuple[IntArray, BoolArray]], size: int, *, rate: float
) -> IntArray:
    """The first ``size`` accepted values of a stream of independent (value, accept)
    proposals, drawn in batches sized from the acceptance rate (``rate`` is a first guess,
    then the rate seen so far).

    This is the law of the loop that redraws only the rejected entries: the accepted values
    of an i.i.d. proposal stream are i.i.d. with the accepted law, and the output is always
    the first ``size`` of them in stream order, whatever the batch sizes (they only decide
    how far ahead the stream is drawn, and excess proposals are discarded unseen), so the
    floating-point rate only costs time if it is off. Batches cut the rounds of numpy calls
    from ~log(size)/log(1/rejection rate) to one, rarely two.
    """
    out = np.empty(size, dtype=np.int64)
    filled = proposed = accepted = 0
    while filled < size:
        need = size - filled
        if proposed:
            rate = max(accepted / proposed, 0.05)
        # Enough for `need` acceptances unless the count falls ~4 sd short.
        batch = math.ceil((need + 4 * math.sqrt(need)) / rate) + 16
        values, ok = propose(batch)
        kept = values[ok][:need]
        out[filled : filled + kept.size] = kept
        filled += kept.size
        proposed += batch
        accepted += int(np.count_nonzero(ok))
    return out


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

        def propose_u(m: int) -> tuple[IntArray, BoolArray]:
            cand = rng.integers(0, plan.block, size=m, dtype=np.int64)
            # cand·den < num < 2^53: cand < scale = num/den.
            return cand, _bernoulli_exp_neg_ratio(rng, cand * plan.den, plan.num)

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

    def propose(m: int) -> tuple[IntArray, BoolArray]:
        x = _half_laplace(rng, plan, m, limit) + min_abs
        negative = _one_in(rng, 2, m)
        valid = (x <= plan.cap) & ~(negative & (x == 0))
        return np.where(negative, -x, x), valid

    # Only "−0" (probability ½·P(X = 0) = ½(1 − e^{−1/scale})) and the e^{-800} tail are
    # rejected.
    rate = 0.5 * (1.0 + math.exp(-plan.den / plan.num)) if min_abs == 0 else 1.0
    return _first_accepted(propose, size, rate=rate)


def _log_weight_previous(
    plan: noise._GaussianPlan, k_abs: IntArray
) -> tuple[FloatArray, FloatArray]:
    """(h, e) = (k²/(2s²), |k|/t + L(k)) in float64, in the operation order of the error count.

    log(p(k)/q(k)) = e − h + const; the acceptance exponent is Γ = h − (e − F).
    """
    kf = k_abs.astype(np.float64)
    z = kf / plan.scale
    h = 0.5 * (z * z)
    b = z / plan.scale
    total = np.zeros_like(b)
    for d, vsq, w in zip(plan.shifted_nodes, plan.nodes_sq, plan.weights, strict=True):
        total += w * np.exp(b * d - plan.alpha * vsq)
    log_j = 0.5 * b + np.log(total)
    return h, kf / plan.t + log_j


def _exponent_previous(
    plan: noise._GaussianPlan, k_abs: IntArray, offset: float
) -> tuple[IntArray, IntArray]:
    """Γ̂(k) = whole + frac/2^53 ≥ 0 (Γ = k²/(2s²) − |k|/t − L(k) + offset), split exactly."""
    h, e = _log_weight_previous(plan, k_abs)
    h_whole = np.floor(h)
    f = (h - h_whole) - (e - offset)
    f_whole = np.floor(f)
    frac = f - f_whole
    whole = h_whole.astype(np.int64) + f_whole.astype(np.int64)
    frac_num = np.floor(frac * float(2**53)).astype(np.int64)
    if whole.size and int(whole.min()) < 0:  # excluded by the margin in F; never bias silently
        raise RuntimeError("rounded Gaussian: negative acceptance exponent")
    return whole, frac_num


def _accept(
    rng: np.random.Generator, plan: noise._GaussianPlan, y: IntArray, offset: float | None
) -> BoolArray:
    k_abs = np.abs(y)
    if offset is None and plan.table_whole is not None and plan.table_frac is not None:
        whole, frac_num = plan.table_whole[k_abs], plan.table_frac[k_abs]
    else:
        whole, frac_num = _exponent_previous(plan, k_abs, plan.offset if offset is None else offset)
    ok = _bernoulli_exp_neg_ratio(rng, frac_num, 2**53)
    ok[ok] = _bernoulli_exp_neg_int(rng, whole[ok])
    return ok


def rounded_gaussian_previous_plan(
    rng: np.random.Generator, plan: noise._GaussianPlan, size: int, min_abs: int = 0
) -> IntArray:
    """Rejection loop; min_abs > 0 draws the law conditioned on |N| ≥ min_abs (tests only).

    Conditioning: the proposal conditioned on |Y| ≥ min_abs, accepted with
    exp(−Γ(k) + const), yields p restricted to |k| ≥ min_abs; the constant is re-chosen as
    the max over that range so acceptance stays efficient.
    """
    offset = None if min_abs == 0 else noise._max_log_weight(plan, min_abs) + 1e-9
    laplace = _laplace_plan(float(plan.t), plan.cap)

    def propose(m: int) -> tuple[IntArray, BoolArray]:
        y = _two_sided_laplace(rng, laplace, m, min_abs)
        return y, _accept(rng, plan, y, offset)

    return _first_accepted(propose, size, rate=plan.acceptance if min_abs == 0 else 0.5)


def rounded_gaussian_previous(rng: np.random.Generator, *, scale: float, size: int) -> IntArray:
    """PREVIOUS VERSION of `rounded_gaussian` (same plan: Γ̂, F, tables, cap)."""
    return rounded_gaussian_previous_plan(rng, noise._gaussian_plan(float(scale)), size)


# ============================================================================================
# end of the previous version
# ============================================================================================


def check_exponent_identical(scales: list[float]) -> int:
    """Γ̂ from the current `_exponent` agrees with the previous code's: the integer parts
    exactly, the fractional parts within 2^-40 (933cfbb replaced numpy's exp/log in Γ̂ by
    worker/ieee_math.py's proven ones, so the bits moved on purpose; the law's bound is
    the module docstring's)."""
    rng = np.random.default_rng(0)
    checked = 0
    for s in scales:
        plan = noise._gaussian_plan(s)
        k = np.concatenate([rng.integers(0, plan.cap + 1, 200_000), np.arange(1000), [plan.cap]])
        for offset in (plan.offset, plan.offset + 0.37):
            a, b = _exponent_previous(plan, k, offset), noise._exponent(plan, k, offset)
            whole_a = a[0].astype(np.float64) + a[1].astype(np.float64) * 2.0**-53
            whole_b = b[0].astype(np.float64) + b[1].astype(np.float64) * 2.0**-53
            if np.abs(whole_a - whole_b).max() > 2.0**-40 * max(1.0, np.abs(whole_a).max()):
                raise SystemExit(f"exponent differs at scale {s}")
            checked += k.size
    return checked


def load_baseline(rev: str) -> types.ModuleType:
    """worker/noise.py as committed at ``rev``, as a module of its own (timing only)."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:worker/noise.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("noise_baseline")
    module.__file__ = f"{rev}:worker/noise.py"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def check_same_draws(baseline: types.ModuleType, scales: list[float], size: int) -> int:
    """Both samplers, each on a ChaCha20 generator with the same fixed key: the same draws
    and the same next raw word (SystemExit otherwise). Returns the number of draws compared."""
    for i, s in enumerate(scales):
        outs = []
        for module in (baseline, noise):
            rng = np.random.Generator(ChaCha(key=0xBE7C0000 + i, rounds=20))
            outs.append(
                (module.rounded_gaussian(rng, scale=s, size=size), rng.bit_generator.random_raw(1))
            )
        if not (np.array_equal(outs[0][0], outs[1][0]) and outs[0][1] == outs[1][1]):
            raise SystemExit(f"draws differ from the baseline at scale {s}")
    return size * len(scales)


@dataclass
class Cell:
    scale: float
    size: int
    previous: list[float]
    current: list[float]
    std_ratio: float = math.nan


def time_call(fn: Callable[[], IntArray]) -> tuple[float, IntArray]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scales", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--draws", type=int, default=1_000_000, help="draws per timing")
    parser.add_argument("--baseline", default=None, help="git revision of worker/noise.py")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    load_start = os.getloadavg()
    previous_fn: Callable[..., IntArray] = rounded_gaussian_previous
    previous_name = "previous (copy in this file)"
    same_draws = 0
    if args.baseline:
        baseline = load_baseline(args.baseline)
        previous_fn = baseline.rounded_gaussian
        previous_name = f"baseline {args.baseline}"
        same_draws = check_same_draws(baseline, args.scales, 200_000)
    checked = check_exponent_identical(args.scales)
    rng = noise.secure_rng()
    cells = {(s, n): Cell(s, n, [], []) for s in args.scales for n in args.sizes}
    for s in args.scales:  # warm the plans and tables
        noise.rounded_gaussian(rng, scale=s, size=100)
        previous_fn(rng, scale=s, size=100)
    for r in range(args.rounds):
        for (s, n), cell in cells.items():
            order = [("previous", previous_fn), ("current", noise.rounded_gaussian)]
            if r % 2:
                order.reverse()
            calls = max(1, args.draws // n)  # each timing covers ≥ --draws draws
            for name, fn in order:
                total = 0.0
                for _ in range(calls):
                    dt, x = time_call(functools.partial(fn, rng, scale=s, size=n))
                    total += dt
                getattr(cell, name).append(total / (calls * n))
                if name == "current":
                    cell.std_ratio = float(np.std(x)) / s

    lines = [
        "# rounded_gaussian draw speed: current vs previous sampler (issue 25)",
        "",
        "Command: `.venv/bin/python " + " ".join(shlex.quote(a) for a in sys.argv) + "`",
        "",
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}; generator ChaCha20 "
        "(`secure_rng`). Shared 2-core machine: medians of interleaved rounds "
        f"({args.rounds}), each timing {args.draws} draws in calls of `size` draws; the"
        " speed-up is the median of the per-round ratios (paired, same round).",
        f"Γ̂ (`_exponent`) within 2^-40 of the copied old code on {checked} (k, offset) pairs.",
        f"Previous = {previous_name}."
        + (
            f" Same draws and generator position as the current code on {same_draws} draws"
            " (fixed ChaCha20 keys, 200000 per scale)."
            if same_draws
            else ""
        ),
        "Load average (1/5/15 min) at start {:.2f} / {:.2f} / {:.2f}, at end {:.2f} / {:.2f}"
        " / {:.2f}.".format(*load_start, *os.getloadavg()),
        "",
        "| scale s | size | previous ns/draw | current ns/draw | speed-up | current Mdraws/s |"
        " std/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in cells.values():
        prev = statistics.median(cell.previous) * 1e9
        cur = statistics.median(cell.current) * 1e9
        ratio = statistics.median(p / c for p, c in zip(cell.previous, cell.current, strict=True))
        lines.append(
            f"| {cell.scale:g} | {cell.size} | {prev:.0f} | {cur:.0f} | {ratio:.1f}x |"
            f" {1e3 / cur:.2f} | {cell.std_ratio:.4f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
