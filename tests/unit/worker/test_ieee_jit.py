"""The compiled kernels of worker/ieee_jit.py perform IEEE-754 basic operations only: no
fast-math flag on any floating-point instruction of their LLVM code, no FMA intrinsic, and
no fused multiply-add in the machine code built for this host. (Their bits are compared
with the numpy passes they replace in test_exact_net.py's tanh tests and
test_noise_golden.py's fast-chunk and golden tests.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import pytest
from randomgen import ChaCha

from worker import ieee_math, noise
from worker.ieee_jit import IEEE_OPTIONS
from worker.mechanisms import fixed_point as fp
from worker.mechanisms import langevin

_FAST_FLAG = re.compile(
    r"\b(fadd|fsub|fmul|fdiv|frem|fneg|fcmp)\s+(fast|contract|reassoc|nnan|ninf|nsz|arcp|afn)\b"
)
_FMA_INTRINSIC = re.compile(r"@llvm\.(fma|fmuladd)\.")
_FMA_INSTRUCTION = re.compile(r"\bv?f(n)?m(add|sub)(132|213|231)?[sp][sd]\b", re.IGNORECASE)


def _tanh_args() -> tuple[Any, ...]:
    z = np.round(np.random.default_rng(3).standard_normal((4, 33)) * 2.0**30)
    return z, fp.pow2(-35), fp.pow2(17), fp.pow2(16), np.empty_like(z)


def _tanh_backward_args() -> tuple[Any, ...]:
    rng = np.random.default_rng(5)
    h = np.round(rng.uniform(-(2.0**16), 2.0**16, (4, 33)))
    upper = np.round(rng.standard_normal(4) * 2.0**20)
    weight = np.round(rng.standard_normal(33) * 2.0**30)
    out = [np.empty(4) for _ in range(3)]
    return np.empty_like(h), upper, weight, True, h, fp.pow2(32), fp.pow2(-62), *out


def _scale_rows_args() -> tuple[Any, ...]:
    rng = np.random.default_rng(6)
    g = np.round(rng.standard_normal((4, 33)) * 2.0**25)
    return g, rng.uniform(0.0, 1.0, 4), fp.pow2(-20), np.empty_like(g), np.empty(4), np.empty(4)


def _sigmoid_args() -> tuple[Any, ...]:
    z = np.random.default_rng(4).standard_normal(67) * 30.0
    return z, np.empty_like(z)


def _binary_cells_args() -> tuple[Any, ...]:
    rng = np.random.default_rng(5)
    rows, parameters = 45, 9
    return (
        np.round(rng.random((3, rows)) * 2.0**8),  # dense columns
        np.round(rng.standard_normal(3) * 2.0**20),
        np.round(rng.standard_normal(parameters + 1) * 2.0**28),  # 2^c·θ_ext
        rng.integers(0, parameters + 1, (2, 2, 12)),  # two groups' table columns
        rng.integers(0, 12, (2, rows)),  # cells
        rng.integers(0, 2, rows).astype(np.float64),
        2.0**-28,
        2.0**16,
        np.empty(rows),
        np.empty((2, 12)),
        np.zeros((2, 12)),
        np.zeros(parameters + 1),
    )


def _lattice_steps_args() -> tuple[Any, ...]:
    rng = np.random.default_rng(6)
    cells = _binary_cells_args()
    dense = np.array([0, 4, 7], dtype=np.intp)  # the 3 dense columns' θ entries
    x = np.round(rng.standard_normal(9) * 2.0**10)
    noise = rng.integers(-50, 50, (4, 9))
    # columns, dense, table columns, cells, y, the two scalings, 2^c, then the scratch
    scratch = (np.empty(45), np.empty((2, 12)), np.empty((2, 12)), np.empty(10))
    return (
        x,
        noise,
        0.999,
        2.0**-12,
        2.0**20,
        cells[0],
        dense,
        *cells[3:8],
        2.0**8,
        *scratch,
        np.empty(3),
        np.empty(10),
    )


def _fast_plans() -> tuple[Any, Any, Any]:
    scale = 1107296.256
    plan = noise._gaussian_plan(scale)
    prop = noise._proposal_plan(plan.t, plan.cap)
    fast = noise._fast_tables(scale, noise._ACCEPT_MARGIN)
    assert fast is not None
    return plan, prop, fast


def _screen_args() -> tuple[Any, ...]:
    _, prop, fast = _fast_plans()
    words = np.random.Generator(ChaCha(key=7, rounds=20)).bit_generator.random_raw(999)
    v = np.maximum(prop.lead_v[(words >> np.uint64(16)) & np.uint64(0xFFFF)], 0)
    work = noise._Workspace(words.size)
    return (
        words,
        v,
        prop.shift,
        fast.half_inverse_square,
        fast.rest,
        noise._neg_log_table(),
        *fast.shifts,
        prop.limit,
        np.empty(words.size, dtype=np.int64),
        work.pending,
        work.place,
    )


def _open_args() -> tuple[Any, ...]:
    words = np.random.Generator(ChaCha(key=9, rounds=20)).bit_generator.random_raw(9)
    out = np.arange(9, dtype=np.int64) * 1000 - 4000
    return (
        words,
        out,
        np.arange(9),
        np.arange(9),
        *noise._open_constants(*_fast_plans()),
        np.empty(9, dtype=np.bool_),
        *(np.empty(9, dtype=np.int64) for _ in range(3)),
    )


def _tail_args() -> tuple[Any, ...]:
    prop = noise._proposal_plan(1107297, 10**9)
    words = np.random.Generator(ChaCha(key=10, rounds=20)).bit_generator.random_raw(99)
    v = np.full(words.size, -1, dtype=np.int16)
    extra = np.random.Generator(ChaCha(key=11, rounds=20)).bit_generator.random_raw(99)
    ascending = np.ascontiguousarray(prop.floor64[::-1])
    ties = np.empty(99, dtype=np.int64)
    return words, v, extra, ascending, prop.v_stop, ties, np.empty(99, dtype=np.uint64)


def _lead_args() -> tuple[Any, ...]:
    words = np.random.Generator(ChaCha(key=8, rounds=20)).bit_generator.random_raw(99)
    prop = noise._proposal_plan(1107297, 10**9)
    return words, prop.lead_v, np.empty(words.size, dtype=np.int16)


@pytest.mark.parametrize(
    ("kernel", "args"),
    [
        (fp._tanh_grid_kernel, _tanh_args),
        (fp._sigmoid_kernel, _sigmoid_args),
        (fp._tanh_backward_kernel, _tanh_backward_args),
        (fp._scale_rows_kernel, _scale_rows_args),
        (langevin._binary_cells_kernel, _binary_cells_args),
        (langevin.lattice_steps_kernel, _lattice_steps_args),
        (noise._screen_kernel, _screen_args),
        (noise._lead_v_kernel, _lead_args),
        (noise._open_kernel, _open_args),
        (noise._tail_kernel, _tail_args),
        (ieee_math.exp_one, lambda: (-3.25,)),
        (ieee_math.log_one, lambda: (0.37,)),
    ],
)
def test_kernels_compile_to_ieee_operations_only(
    kernel: Any, args: Callable[[], tuple[Any, ...]]
) -> None:
    # an uncached copy with the same options (numba does not show cached code)
    fresh = numba.njit(**IEEE_OPTIONS)(kernel.py_func)
    fresh(*args())
    llvm = "".join(fresh.inspect_llvm().values())
    asm = "".join(fresh.inspect_asm().values())
    assert len(llvm) > 1000 and len(asm) > 1000  # the code was there to read
    assert not _FAST_FLAG.search(llvm)
    assert not _FMA_INTRINSIC.search(llvm)
    assert not _FMA_INSTRUCTION.search(asm)
    # real floating-point code (the σ̃ operations, inlined)
    if kernel in (
        fp._tanh_grid_kernel,
        fp._sigmoid_kernel,
        langevin._binary_cells_kernel,
        langevin.lattice_steps_kernel,
        noise._open_kernel,
    ):
        assert re.search(r"\bfmul\b", llvm) and re.search(r"\bfdiv\b", llvm)


def test_fast_flag_pattern_would_see_contraction() -> None:
    """The patterns above match what fast-math code contains (so they can fail)."""
    assert _FAST_FLAG.search("%.5 = fmul contract double %.3, %.4")
    assert _FAST_FLAG.search("%.5 = fadd fast <4 x double> %.3, %.4")
    assert _FMA_INTRINSIC.search("call double @llvm.fmuladd.f64(double %a")
    assert _FMA_INSTRUCTION.search("\tvfmadd231pd\t%ymm1, %ymm2, %ymm0")
    assert not _FMA_INSTRUCTION.search("\tvmulpd\t%ymm1, %ymm2, %ymm0")


def test_a_fast_math_kernel_is_caught() -> None:
    """The same tanh kernel compiled with fastmath=True is flagged by the checks."""
    fast = numba.njit(fastmath=True, error_model="numpy")(fp._tanh_grid_kernel.py_func)
    fast(*_tanh_args())
    llvm = "".join(fast.inspect_llvm().values())
    assert _FAST_FLAG.search(llvm)
