"""Issue 25, step 8: `_accepted_chunk` with the compiled open-entry test (`_open_kernel`),
V's extra bits (`_tail_kernel`) and output written in place (`_screen_kernel` into ``out``,
`_drop_kernel`) gives the same draws and generator position as the general numpy path
(`_propose_chunk`, i.e. the fast path switched off), over whole calls of several sizes (one
chunk, across chunk boundaries, many chunks) and keys, with the exact path and a tie in V's
extra bits (the rare slow paths) taken."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from randomgen import ChaCha

from tests.unit.worker.test_noise_golden import _Scripted
from worker import noise


def _chacha(key: int) -> np.random.Generator:
    return np.random.Generator(ChaCha(key=key, rounds=20))


def _count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Counts the calls of noise.<name> (a one-element list, reset by the caller)."""
    calls, real = [0], getattr(noise, name)

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(noise, name, counted)
    return calls


@pytest.mark.parametrize("scale", [5000.0, 1107296.256, 3.3e6])
@pytest.mark.parametrize(
    ("key", "size"),
    [(1, 1000), (2, 32768), (3, 32769), (4, 70001), (5, 250_000)],
)
def test_fast_path_draws_equal_the_general_path(
    monkeypatch: pytest.MonkeyPatch, scale: float, key: int, size: int
) -> None:
    """rounded_gaussian with the fast path against the same call with `_fast_tables`
    returning None (every chunk through `_propose_chunk`): the same draws, the same next
    raw word, and the exact path run equally often (at least once at the largest size)."""
    assert noise._fast_tables(scale, noise._ACCEPT_MARGIN) is not None
    exact_calls = _count_calls(monkeypatch, "_below_exp_neg")
    fast_rng = _chacha(key)
    fast = noise.rounded_gaussian(fast_rng, scale=scale, size=size)
    fast_calls, exact_calls[0] = exact_calls[0], 0
    monkeypatch.setattr(noise, "_fast_tables", lambda scale, margin: None)
    general_rng = _chacha(key)
    general = noise.rounded_gaussian(general_rng, scale=scale, size=size)
    assert np.array_equal(fast, general)
    assert fast_rng.bit_generator.random_raw(1)[0] == general_rng.bit_generator.random_raw(1)[0]
    assert fast_calls == exact_calls[0]
    if size >= 250_000:
        assert fast_calls >= 1


@pytest.mark.parametrize("scale", [5000.0, 1107296.256])
def test_a_tie_in_the_extra_bits_of_v_takes_the_exact_path(
    monkeypatch: pytest.MonkeyPatch, scale: float
) -> None:
    """A word whose V lead needs more bits, followed by an extra word that makes the 64-bit
    prefix equal to ⌊r^v·2^64⌋ (probability 2^-64 in use): both paths send it to
    `_exact_geometric` and agree on the values and the generator position."""
    plan = noise._gaussian_plan(scale)
    prop = noise._proposal_plan(plan.t, plan.cap)
    fast = noise._fast_tables(scale, noise._ACCEPT_MARGIN)
    assert fast is not None
    size = 3000
    r = np.random.default_rng(int(scale))
    words = [int(w) for w in r.integers(0, 2**63, size, dtype=np.uint64)]
    ties = _count_calls(monkeypatch, "_exact_geometric")
    # Clear every V lead that needs more bits, then plant two that do, at 10 and 2000.
    short = set(np.flatnonzero(prop.lead_v < 0).tolist())
    for i, w in enumerate(words):
        lead = (w >> 16) & 0xFFFF
        while lead in short:
            lead = (lead + 1) & 0xFFFF
        words[i] = (w & ~(0xFFFF << 16)) | (lead << 16)
    extra = []
    for place, v in ((10, 3), (2000, 7)):
        target = int(prop.floor64[v - 1])  # ⌊r^v·2^64⌋
        lead = target >> 48
        assert prop.lead_v[lead] < 0
        words[place] = (words[place] & ~(0xFFFF << 16)) | (lead << 16)
        extra.append(((target & ((1 << 48) - 1)) << 16) | 0x1234)
    general = _Scripted(words + extra, key=0xFACE)
    values, ok = noise._propose_chunk(general, plan, prop, size, 0, None)  # type: ignore[arg-type]
    general_ties, ties[0] = ties[0], 0
    quick = _Scripted(words + extra, key=0xFACE)
    out = np.empty(size, dtype=np.int64)
    n = noise._accepted_chunk(quick, plan, prop, fast, noise._Workspace(size), out, size)  # type: ignore[arg-type]
    assert np.array_equal(out[:n], values[ok])
    assert general_ties == ties[0] == 2
    assert general.random_raw(1)[0] == quick.random_raw(1)[0]


def test_drop_kernel_removes_the_rejected_places_in_order() -> None:
    for filled, place, keep in [
        (10, [2, 5, 7], [True, False, False]),
        (10, [0, 9], [False, False]),
        (10, [3, 4], [True, True]),
        (6, [0, 1, 2, 3, 4, 5], [False, True, False, True, False, False]),
    ]:
        out = np.arange(100, 100 + filled, dtype=np.int64)
        expected = np.delete(out, [p for p, k in zip(place, keep, strict=True) if not k])
        n = noise._drop_kernel(out, filled, np.array(place), np.array(keep))
        assert np.array_equal(out[:n], expected)
