"""DP-SGD's Poisson sampler draws only the included rows (geometric gaps, issue 25), and its
law is still exactly independent Bernoulli(q) inclusion per row and step.

Every statistical bound below is two-sided at ≤ 1e-7 (Bonferroni where several are taken),
so a correct sampler fails one in ~10^7 runs, while the usual off-by-ones — gaps one too
long or short (rate q/(1+q) or q/(1−q)), a block or step boundary skipped or doubled,
adjacent rows never both included — move the statistics by tens of standard deviations.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from worker.mechanisms import dpsgd
from worker.mechanisms.dpsgd import PoissonSampler
from worker.noise import secure_rng

ALPHA = 1e-7


def _steps(q: float, n: int, steps: int) -> list[np.ndarray]:
    sampler = PoissonSampler(sampling_rate=q, rng=secure_rng())
    batches: list[np.ndarray] = []
    for block in sampler.blocks(n, steps):
        assert len(block.rows) == sum(block.sizes)
        batches += np.split(block.rows, np.cumsum(block.sizes)[:-1])
    assert len(batches) == steps
    for b in batches:
        assert b.dtype == np.int64 and np.all(np.diff(b) > 0)
        assert b.size == 0 or (b[0] >= 0 and b[-1] < n)
    return batches


def _clopper_pearson(hits: int, trials: int, alpha: float) -> tuple[float, float]:
    ci = stats.binomtest(hits, trials).proportion_ci(1 - alpha, method="exact")
    return ci.low, ci.high


def _force_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the float certificate decide nothing: every gap takes the exact integer path."""

    def nothing_certain(self: PoissonSampler, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(k.size), np.ones(k.size)

    monkeypatch.setattr(PoissonSampler, "_power_bounds", nothing_certain)


@pytest.fixture(params=["certified", "exact"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "exact":
        _force_exact(monkeypatch)
    return str(request.param)


@pytest.mark.parametrize("q", [0.3, 0.05, 0.9])
def test_gaps_follow_geometric_q(q: float, path: str) -> None:
    """The gaps themselves: chi-square against P(G = k) = (1−q)^k·q (cells with ≥ 20
    expected, the tail pooled), and the cap: min(G, cap) puts mass (1−q)^cap on cap."""
    count = 20_000 if path == "exact" else 200_000
    cap = 40
    g = PoissonSampler(sampling_rate=q, rng=secure_rng()).gaps(count, cap)
    assert g.min() >= 0 and g.max() <= cap
    pmf = [(1 - q) ** k * q for k in range(cap)] + [(1 - q) ** cap]
    expected = count * np.array(pmf)
    observed = np.bincount(g, minlength=cap + 1).astype(np.float64)
    keep = int(np.argmax(expected < 20)) if np.any(expected < 20) else cap + 1
    exp_cells = np.append(expected[:keep], expected[keep:].sum())
    obs_cells = np.append(observed[:keep], observed[keep:].sum())
    if exp_cells[-1] == 0:
        exp_cells, obs_cells = exp_cells[:-1], obs_cells[:-1]
    chi2 = float(np.sum((obs_cells - exp_cells) ** 2 / exp_cells))
    assert stats.chi2.sf(chi2, len(exp_cells) - 1) > ALPHA, (chi2, len(exp_cells))


@pytest.mark.parametrize("q", [0.3, 0.0371])
def test_inclusion_per_row_and_batch_sizes(q: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per row: hits in Binomial(T, q) (Clopper–Pearson, Bonferroni over rows, rows 0 and
    n−1 included: a step boundary lost or doubled shows there); all rows together: one
    binomial test; batch sizes: chi-square against Binomial(n, q). Blocks are forced
    small so that steps straddle block ends."""
    monkeypatch.setattr(dpsgd, "_COIN_BLOCK", 7 * 300 + 5)
    n, steps = 300, 6000
    batches = _steps(q, n, steps)
    per_row = np.bincount(np.concatenate(batches), minlength=n)
    for row in range(n):
        lo, hi = _clopper_pearson(int(per_row[row]), steps, ALPHA / n)
        assert lo <= q <= hi, (row, per_row[row], steps * q)
    total = int(per_row.sum())
    assert stats.binomtest(total, n * steps, q).pvalue > ALPHA, (total, n * steps * q)
    sizes = np.array([b.size for b in batches])
    pmf = stats.binom.pmf(np.arange(n + 1), n, q)
    exp = steps * pmf
    inner = np.flatnonzero(exp >= 20)
    lo_cut, hi_cut = int(inner[0]), int(inner[-1])
    obs = np.bincount(sizes, minlength=n + 1).astype(np.float64)
    obs_cells = np.concatenate(
        [[obs[: lo_cut + 1].sum()], obs[lo_cut + 1 : hi_cut], [obs[hi_cut:].sum()]]
    )
    exp_cells = np.concatenate(
        [[exp[: lo_cut + 1].sum()], exp[lo_cut + 1 : hi_cut], [exp[hi_cut:].sum()]]
    )
    chi2 = float(np.sum((obs_cells - exp_cells) ** 2 / exp_cells))
    assert stats.chi2.sf(chi2, len(exp_cells) - 1) > ALPHA, chi2


def test_law_through_the_exact_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same inclusion rate when every gap is decided by the integer path alone."""
    _force_exact(monkeypatch)
    n, steps, q = 50, 400, 0.2
    batches = _steps(q, n, steps)
    total = sum(b.size for b in batches)
    assert stats.binomtest(total, n * steps, q).pvalue > ALPHA, (total, n * steps * q)


def test_pairwise_independence() -> None:
    """Rows 0 and 1 (adjacent: a gap ≥ 1 bug would never include both), rows 0 and n−1,
    and row n−1 of a step with row 0 of the next (across the step boundary): each pair is
    jointly included in Binomial(T, q²) of the steps, and in a 2×2 table the two rows'
    inclusions are not associated (Fisher's exact test)."""
    n, steps, q = 4, 40_000, 0.3
    inc = np.zeros((steps, n), dtype=np.bool_)
    for t, b in enumerate(_steps(q, n, steps)):
        inc[t, b] = True
    pairs = {
        "0,1": (inc[:, 0], inc[:, 1]),
        "0,n-1": (inc[:, 0], inc[:, n - 1]),
        "n-1,next 0": (inc[:-1, n - 1], inc[1:, 0]),
    }
    for name, (a, b) in pairs.items():
        both = int(np.sum(a & b))
        assert stats.binomtest(both, a.size, q * q).pvalue > ALPHA / 6, (name, both)
        table = [
            [int(np.sum(a & b)), int(np.sum(a & ~b))],
            [int(np.sum(~a & b)), int(np.sum(~a & ~b))],
        ]
        assert stats.fisher_exact(table).pvalue > ALPHA / 6, (name, table)


def test_q_one_includes_every_row() -> None:
    s = PoissonSampler(sampling_rate=1.0, rng=secure_rng())
    assert np.array_equal(s.indices(17), np.arange(17))
    blocks = list(s.blocks(5, 9))
    rows = np.concatenate([b.rows for b in blocks])
    assert [size for b in blocks for size in b.sizes] == [5] * 9
    assert np.array_equal(rows, np.tile(np.arange(5), 9))


def test_tiny_q() -> None:
    """q = 2^−20 over 2^26 (row, step) positions: Binomial(2^26, 2^−20) (mean 64) hits; the
    smallest floats include nothing in 10^12 positions (P(any) < 10^−311) and cost
    nothing like that."""
    q = 2.0**-20
    n, steps = 1 << 16, 1 << 10
    hits = sum(b.size for b in _steps(q, n, steps))
    assert stats.binomtest(hits, n * steps, q).pvalue > ALPHA, hits
    for tiny in (1e-9 / 2**20, 5e-324):
        s = PoissonSampler(sampling_rate=tiny, rng=secure_rng())
        assert s.rate == tiny
        assert sum(len(b.rows) for b in s.blocks(1_000_000, 1_000_000)) == 0


def test_no_rows_and_one_row() -> None:
    s = PoissonSampler(sampling_rate=0.5, rng=secure_rng())
    assert s.indices(0).size == 0
    blocks = list(s.blocks(0, 1000))
    assert sum(len(b.sizes) for b in blocks) == 1000
    assert all(b.rows.size == 0 and set(b.sizes) <= {0} for b in blocks)
    steps = 20_000
    one = _steps(0.5, 1, steps)
    assert all(b.size == 0 or list(b) == [0] for b in one)
    hits = sum(b.size for b in one)
    assert stats.binomtest(hits, steps, 0.5).pvalue > ALPHA, hits


@pytest.mark.parametrize("q", [3 / 8, 256 / 30162, 1 - 2**-30, 2**-40 * 3])
def test_bounds_contain_exact_powers(q: float) -> None:
    """The integer bounds at P bits and the float table bracket s^k computed exactly with
    fractions (s = 1 − q as the exact dyadic rational), and the integer bounds are tight."""
    s_exact = 1 - Fraction(q)
    sampler = PoissonSampler(sampling_rate=q, rng=secure_rng())
    for k in [0, 1, 2, 3, 7, 64, 129, 1000]:
        true = s_exact**k
        for prec in (64, 128, 256):
            lo, hi = sampler._power_ints(k, prec)
            assert Fraction(lo, 1 << prec) <= true <= Fraction(hi, 1 << prec)
            assert hi - lo <= 4 * k + 4  # directed roundings grow ~linearly in k
    for i in range(11):
        true = s_exact ** (1 << i)
        assert Fraction(sampler._pow_lo[i]) <= true <= Fraction(sampler._pow_hi[i])


def test_exact_comparison_matches_fractions() -> None:
    """_below_power decides U ≤ s^k exactly for U known to 53 bits and extended with
    fresh words: against fractions, for U just below, at and above s^k's neighbourhood."""
    q = 256 / 30162
    s_exact = 1 - Fraction(q)
    sampler = PoissonSampler(sampling_rate=q, rng=secure_rng())
    for k in [0, 1, 5, 117, 4000]:
        target = s_exact**k
        centre = math.floor(target * 2**53)
        for top in range(max(centre - 2, 0), min(centre + 3, 2**53)):
            u = [top, 53]
            got = sampler._below_power(u, k)
            bits, length = u
            lo, hi = Fraction(bits, 1 << length), Fraction(bits + 1, 1 << length)
            assert (hi <= target) if got else (lo >= target), (k, top, got)


@pytest.mark.parametrize("q", [0.3, 256 / 482592, 1e-9])
def test_low_bit_table_gives_the_per_bit_products_bit_for_bit(q: float) -> None:
    """Issue 25 (speed): the bound products over a guess's low bits come from one table
    look-up; they must be the very floats of the per-bit loop (the same products in the
    same order), so which gaps take the exact path, and every drawn gap, are unchanged."""
    s = PoissonSampler(sampling_rate=q, rng=secure_rng())
    rng = np.random.default_rng(5)
    k = np.concatenate(
        [
            np.arange(0, 1 << 13),
            rng.integers(0, 1 << 40, 5000),
            [(1 << 12) - 1, 1 << 12, (1 << 12) + 1, (1 << 52) + 12345],
        ]
    ).astype(np.int64)
    lo, hi = np.ones(k.size), np.ones(k.size)
    for i in range(int(k.max()).bit_length()):  # the plain loop over every bit
        bit = ((k >> i) & 1).astype(np.bool_)
        lo *= np.where(bit, s._pow_lo[i], 1.0)
        hi *= np.where(bit, s._pow_hi[i], 1.0)
    got_lo, got_hi = s._power_bounds(k)
    assert np.array_equal(got_lo.view(np.int64), lo.view(np.int64))
    assert np.array_equal(got_hi.view(np.int64), hi.view(np.int64))
    small = np.arange(0, 100, dtype=np.int64)  # a call whose guesses are all below 2^12
    assert np.array_equal(s._power_bounds(small)[0], lo[:100])
