"""Golden outputs of the noise samplers under fixed ChaCha20 keys (issue 25, speed work).

The speed-ups of worker/noise.py and worker/ieee_math.py must not change a single released
bit: under a fixed generator key, `rounded_gaussian` returns the same integers and leaves the
stream at the same position (the next raw word is hashed too, since DP-SGD draws its batches
from the same generator), Γ̂ (`_exponent`) and the IEEE-only exp/log return the same floats.
The digests below were recorded from worker/noise.py at a1d8f0c, before any of that work.
The cases cover the table path (K = ⌈40s⌉ ≤ 2^17, s ≤ 3276.8) and the per-proposal Γ̂ path,
one and several chunks of proposals, sizes that are not a multiple of any block, the
conditioned law (min_abs > 0) and scales up to 2^40. A fixed key is a test device only: the
product's generators are keyed from the OS CSPRNG (`secure_rng`), never by a caller.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt
import pytest
from randomgen import ChaCha

from worker import ieee_math, noise


def _generator(key: int) -> np.random.Generator:
    return np.random.Generator(ChaCha(key=key, rounds=20))


def _digest(*arrays: npt.NDArray[np.generic]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


# (scale, size, digest of the draws and of the next raw word), key 0x5EED0000 + index.
ROUNDED_GAUSSIAN = [
    (1.0, 5000, "c6eeb7fd8fffa48c5580197c4848c468"),
    (2.5, 5000, "787d4f6334e6628c4fefdb7afa35226b"),
    (1000.0, 40000, "1330a953506d8ecd91998eb50295b65f"),
    (3000.5, 3000, "b2ce7a41f21176879b7eb84b84e4e604"),
    (5000.0, 40000, "87eae272e9f7cce83a6d5b2036c630fc"),
    (1107296.256, 100000, "6351fee5dda4016f1492fcbc43dcb3b5"),
    (1000000.0, 70001, "2984734579a2090cb0604f74dfc0b67d"),
    (3700000000.0, 20000, "6ce1f95cbe548d0cf3854fab56f26ef4"),
    (1099511627776.0, 20000, "0ebd6136af6c2ad013d9c102a0354d05"),
]


@pytest.mark.parametrize(("index", "case"), list(enumerate(ROUNDED_GAUSSIAN)))
def test_rounded_gaussian_draws_are_unchanged(index: int, case: tuple[float, int, str]) -> None:
    scale, size, expected = case
    rng = _generator(0x5EED0000 + index)
    draws = noise.rounded_gaussian(rng, scale=scale, size=size)
    assert draws.dtype == np.int64 and draws.shape == (size,)
    assert _digest(draws, rng.bit_generator.random_raw(1)) == expected


@pytest.mark.parametrize(
    ("index", "case"),
    list(
        enumerate(
            [
                (2.5, 2000, 3, "a2897e355c0ae2f62c33052168ba6a71"),
                (5000.0, 5000, 9000, "a68c051248911181ad8f214e3d6be1d3"),
            ]
        )
    ),
)
def test_conditioned_draws_are_unchanged(index: int, case: tuple[float, int, int, str]) -> None:
    scale, size, min_abs, expected = case
    rng = _generator(0xAB0000 + index)
    plan = noise._gaussian_plan(scale)
    draws = noise._sample_rounded_gaussian(rng, plan, size, min_abs=min_abs)
    assert _digest(draws, rng.bit_generator.random_raw(1)) == expected


def test_acceptance_exponents_are_unchanged() -> None:
    expected = {
        1.0: "60b391b9559537d1963b8a5a77a121b6",
        2.5: "ef54c12f6391fd83cad4b48f05fc5069",
        5000.0: "3aa4312de6e32b04c40353bf33d588da",
        1e6: "c5822cd2ddd52b972dce17c99c5421f5",
        2.0**40: "698970e089076cdd628b7694bb309fd2",
    }
    r = np.random.default_rng(7)  # the k's only, drawn in this order
    for scale, digest in expected.items():
        plan = noise._gaussian_plan(scale)
        k = np.concatenate([r.integers(0, plan.cap + 1, 50000), np.arange(100), [plan.cap]]).astype(
            np.int64
        )
        whole, frac = noise._exponent(plan, k, plan.offset)
        whole2, frac2 = noise._exponent(plan, k, plan.offset + 0.37)
        assert _digest(whole, frac, whole2, frac2) == digest, scale


def test_ieee_exp_and_log_are_unchanged() -> None:
    r = np.random.default_rng(8)
    x = np.concatenate(
        [np.linspace(-50, 5, 100001), r.uniform(-746, 710, 20000), [0.0, -0.0, 1e-300, -1e-300]]
    )
    assert _digest(ieee_math.exp(x)) == "9adc44bb077494011c42ada90015dfe4"
    # The inputs must be the same on every machine: ieee_math.exp (basic IEEE operations,
    # pinned just above), not np.exp, whose last bits depend on the CPU's SIMD path (about
    # 0.1% of these values are not correctly rounded on an AVX2 machine, and AVX-512
    # machines take another path: the digest recorded at fb4352f did not reproduce on an
    # AMD EPYC without AVX-512 on 2026-11-25, with ieee_math unchanged since c77351e).
    y = np.concatenate(
        [
            ieee_math.exp(np.linspace(-30, 30, 100001)),
            r.uniform(0, 1e300, 10000),
            [1.0, 5e-324, 2.2e-308],
        ]
    )
    assert _digest(ieee_math.log(y)) == "cf5d556f53e26c7b3f91124e9fca2b69"


class _Scripted:
    """Raw words: ``first`` (crafted test words), then ChaCha20 under ``key``; the only
    generator method the rounded-Gaussian paths call is ``bit_generator.random_raw``."""

    def __init__(self, first: list[int], key: int) -> None:
        self.bit_generator = self
        self._first = first.copy()
        self._chacha = ChaCha(key=key, rounds=20)

    def random_raw(self, size: int) -> npt.NDArray[np.uint64]:
        head = np.array(self._first[:size], dtype=np.uint64)
        del self._first[:size]
        return np.concatenate([head, self._chacha.random_raw(size - head.size)])


def _crafted_words(scale: float, size: int, seed: int) -> list[int]:
    """``size`` proposal words at ``scale`` (j ≤ 31: U in the top j bits, bit 32 the sign,
    bits 16-31 V's lead, bits 0-15 the acceptance lead): random ones, and on purpose ±0,
    proposals beyond the cap, V leads that need more bits, and acceptance leads on and
    beside ⌊2^16·e^{−y}⌋, where the screen leaves entries open and the exact path runs."""
    plan = noise._gaussian_plan(scale)
    prop = noise._proposal_plan(plan.t, plan.cap)
    j = prop.shift
    r = np.random.default_rng(seed)
    words = r.integers(0, 2**63, size, dtype=np.uint64) * np.uint64(2) + r.integers(
        0, 2, size, dtype=np.uint64
    )
    zero_v = int(np.flatnonzero(prop.lead_v == 0)[0])
    tail_v = np.flatnonzero(prop.lead_v < 0)
    crafted = [(0, 0, zero_v, 5), (0, 1, zero_v, 5), ((1 << j) - 1, 0, 0, 3)]  # lead 0: a tail
    crafted += [(int(r.integers(1 << j)), 1, int(r.choice(tail_v)), 9) for _ in range(5)]
    u = r.integers(0, 1 << j, 300)
    lead_v = r.integers(0, 1 << 16, 300)
    lead_v = lead_v[prop.lead_v[lead_v] >= 0]
    u = u[: lead_v.size]
    k = (prop.lead_v[lead_v].astype(np.int64) << j) + u
    whole, frac = noise._exponent_parts(plan, np.minimum(k, plan.cap), plan.offset)
    lo, hi = noise._lead_bounds(u, plan.t, whole, frac)
    centre = np.floor((lo + hi) / 2).astype(np.int64)
    for i in range(lead_v.size):
        lead = int(centre[i]) + int(r.integers(-1, 2))
        if 0 <= lead < 1 << 16:
            crafted.append((int(u[i]), int(r.integers(2)), int(lead_v[i]), lead))
    places = r.choice(size, len(crafted), replace=False)
    for place, (uu, sign, lv, la) in zip(places.tolist(), crafted, strict=True):
        filler = int(words[place]) & (((1 << (64 - j)) - 1) ^ ((1 << 33) - 1))
        words[place] = (uu << (64 - j)) | filler | (sign << 32) | (lv << 16) | la
    # The extra word of each V lead that needs more bits follows the chunk's words; a zero
    # one after V's lead 0 makes V = v_stop, a proposal beyond the cap.
    tails = np.flatnonzero(prop.lead_v[(words >> np.uint64(16)) & np.uint64(0xFFFF)] < 0)
    extra = [0 if place == places[2] else int(r.integers(0, 2**63)) for place in tails]
    return [int(w) for w in words] + extra


@pytest.mark.parametrize("scale", [5000.0, 1107296.256, 3.7e9])
@pytest.mark.parametrize("size", [32768, 5000])
def test_fast_chunk_equals_the_general_chunk(
    monkeypatch: pytest.MonkeyPatch, scale: float, size: int
) -> None:
    """`_accepted_chunk` (the fast path of `rounded_gaussian`) returns exactly the accepted
    values of `_propose_chunk` and leaves the generator at the same position, on words that
    take every branch: ±0, beyond the cap, V's extra bits, screen-open entries and the exact
    path (counted: both paths run it equally often, and at least once)."""
    plan = noise._gaussian_plan(scale)
    prop = noise._proposal_plan(plan.t, plan.cap)
    fast = noise._fast_tables(scale, noise._ACCEPT_MARGIN)
    assert fast is not None
    words = _crafted_words(scale, size, seed=int(scale) % 1000 + size)
    exact_calls = [0]
    real_exact = noise._below_exp_neg

    def counted(rng: np.random.Generator, u: list[int], num: int, den: int) -> bool:
        exact_calls[0] += 1
        return real_exact(rng, u, num, den)

    monkeypatch.setattr(noise, "_below_exp_neg", counted)
    general = _Scripted(words, key=0xC0FFEE)
    values, ok = noise._propose_chunk(general, plan, prop, size, 0, None)  # type: ignore[arg-type]
    general_calls, exact_calls[0] = exact_calls[0], 0
    quick = _Scripted(words, key=0xC0FFEE)
    out = np.empty(size, dtype=np.int64)
    n = noise._accepted_chunk(quick, plan, prop, fast, noise._Workspace(size), out, size)  # type: ignore[arg-type]
    assert np.array_equal(out[:n], values[ok])
    assert general_calls == exact_calls[0] >= 1
    assert general.random_raw(1)[0] == quick.random_raw(1)[0]
    assert 0 in out[:n].tolist()  # +0 kept (−0 rejected: the general path agrees)
    assert (np.abs(values) > prop.limit).any()  # the proposal beyond the cap was made
