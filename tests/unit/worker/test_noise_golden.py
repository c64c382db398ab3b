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
