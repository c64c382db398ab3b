"""Each compiled IEEE kernel called once on tiny public inputs when a worker process starts
(issues 24 and 25, speed).

numba's first call of any compiled function in a process starts its runtime and loads the
machine code from the on-disk cache (worker/ieee_jit.py), about 0.5-0.7 s, and each further
kernel's first call loads its own code: without this warm-up a worker's first release pays
that (a quarter of a hidden-iterate Langevin release). :func:`warm_up` calls every function
in :func:`worker.ieee_jit.compiled_kernels` with the argument types a release passes
(the same dtypes, dimensions, layouts and read-only plan tables, so numba selects the same
compiled specialisation), and raises :class:`KernelWarmUpError` if a kernel has no
example here, fails, or returns what it cannot (a test checks that every kernel is covered).
worker/celery_app.py runs it in every worker process before the first task, and stops the
worker if it raises.

The inputs are fixed arrays and public constants: no data set is read and no random
generator is created or advanced (the noise kernels' 64-bit words are a Weyl sequence), so
no release's randomness is consumed. The checks are sanity checks (values any correct
kernel returns: σ̃(0) = 1/2, exp(0) = 1, the counts a drop leaves); the bit-for-bit
comparisons with the numpy operations are the tests' (worker/ieee_jit.py's docstring).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from worker import ieee_math, noise
from worker.ieee_jit import compiled_kernels
from worker.mechanisms import fixed_point as fp
from worker.mechanisms import langevin

__all__ = ["KernelWarmUpError", "WarmUp", "warm_up"]

_WEYL: Final = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd: distinct words
_SCALE: Final = 1107296.256  # a Gaussian noise scale in the fast path's range (public)


class KernelWarmUpError(RuntimeError):
    """A compiled kernel failed on its warm-up example (the worker must not start)."""


@dataclass(frozen=True)
class WarmUp:
    """What :func:`warm_up` did: the kernels called (qualified names) and its seconds."""

    kernels: tuple[str, ...]
    seconds: float


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise KernelWarmUpError(f"compiled kernel warm-up: {what}")


def _words(count: int, start: int) -> np.ndarray:
    """``count`` fixed 64-bit words (a Weyl sequence: no generator)."""
    return (np.arange(start, start + count, dtype=np.uint64) * _WEYL).astype(np.uint64)


def _warm_scalars() -> None:
    _check(ieee_math.exp_one(0.0) == 1.0, "exp_one(0) != 1")
    _check(ieee_math.log_one(1.0) == 0.0, "log_one(1) != 0")
    _check(fp.sigmoid_element(0.0) == 0.5, "sigmoid_element(0) != 1/2")


def _warm_fixed_point() -> None:
    """σ̃ over a 1-D block (:func:`fixed_point._sigmoid_block`'s contiguous arrays, and in
    place as exact_net calls it); tanh̃ on the grid with a contiguous and a strided output
    (:func:`fixed_point.tanh_on_grid` with and without ``append``)."""
    z = np.array([-3.0, 0.0, 2.5])
    out = np.empty_like(z)
    nan = fp._sigmoid_kernel(z, out)
    _check(not nan and out[1] == 0.5 and bool(np.all((out >= 0.0) & (out <= 1.0))), "σ̃")
    fp._sigmoid_kernel(out, out)
    grid = np.array([[0.0, 2.0**20, -(2.0**20)], [3.0, 0.0, -5.0]])
    o = 16
    for target in (np.empty((2, 3)), np.empty((2, 4))[:, :3]):
        fp._tanh_grid_kernel(grid, fp.pow2(-35), fp.pow2(o + 1), fp.pow2(o), target)
        bounded = bool(np.all(np.abs(target) <= 2.0**o))
        _check(target[0, 0] == 0.0 and target[1, 1] == 0.0 and bounded, "tanh̃ grid")


def _warm_mlp_rows() -> None:
    """exact_net's MLP path per block of rows: the tanh backward with the outer product
    (one logit) and with a given product, the scaling of the clipped rows (the hidden layer's
    and the logit's column), and the row maxima and squares alone."""
    h = np.array([[0.0, 2.0**16, -3.0], [5.0, -(2.0**16), 1.0]])
    upper = np.array([2.0, -1.0])
    weight = np.array([1.0, -4.0, 3.0])
    t = np.empty((2, 3))
    top, t_sq, h_sq = np.empty(2), np.empty(2), np.empty(2)
    fp._tanh_backward_kernel(t, upper, weight, True, h, fp.pow2(32), fp.pow2(-33), top, t_sq, h_sq)
    _check(t[0, 1] == 0.0 and h_sq[0] == 2.0**32 + 9.0 and top[0] == 3.0, "tanh backward")
    fp._tanh_backward_kernel(
        t, np.empty(0), np.empty(0), False, h, fp.pow2(32), fp.pow2(-33), top, t_sq, h_sq
    )
    v = np.empty((2, 3))
    fp._scale_rows_kernel(h, np.array([0.5, 0.0]), fp.pow2(-20), v, top, t_sq)
    _check(bool(np.all(v[1] == 0.0)) and top[1] == 0.0 and t_sq[1] == 0.0, "row scaling")
    column = upper[:, None]
    fp._scale_rows_kernel(column, upper, fp.pow2(-20), np.empty((2, 1)), top, t_sq)
    fp._row_maxima_and_squares(h, h, top, t_sq, h_sq, True)
    _check(top[0] == 2.0**16 and t_sq[1] == h_sq[1], "row maxima and squares")


def _warm_noise() -> None:
    """The rounded Gaussian's fast chunk (noise._accepted_chunk's kernels in its order, with
    its plan tables, read-only as there): V, V's tail for four entries, the screen, the open
    entries' test, the drop."""
    plan = noise._gaussian_plan(_SCALE)
    prop = noise._proposal_plan(plan.t, plan.cap)
    fast = noise._fast_tables(_SCALE, noise._ACCEPT_MARGIN)
    _check(fast is not None, "no fast tables at the warm-up scale")
    assert fast is not None  # for mypy (checked above)
    size = 64
    words = _words(size, 1)
    work = noise._Workspace(size)
    v = work.v[:size]
    short = noise._lead_v_kernel(words, prop.lead_v, v)
    lead = (words >> np.uint64(16)) & np.uint64(0xFFFF)
    _check(short == int(np.sum(v < 0)) and bool(np.all(v == prop.lead_v[lead])), "V")
    v[:4] = -1  # four entries through the tail
    short = int(np.sum(v < 0))
    ties = np.empty(short, dtype=np.int64)
    prefixes = np.empty(short, dtype=np.uint64)
    extra = _words(short, size + 1)
    tied = noise._tail_kernel(words, v, extra, fast.ascending64, prop.v_stop, ties, prefixes)
    _check(0 <= tied <= short, "V's tail")
    np.maximum(v, 0, out=v)  # the exact path's V where tied (not drawn here)
    out = np.empty(size, dtype=np.int64)
    filled, opened = noise._screen_kernel(
        words,
        v,
        prop.shift,
        fast.half_inverse_square,
        fast.rest,
        noise._neg_log_table(),
        fast.shifts[0],
        fast.shifts[1],
        prop.limit,
        out,
        work.pending,
        work.place,
    )
    _check(0 <= opened <= filled <= size, "screen")
    n = 9  # the open test on nine entries, as if the screen had left them open
    values = np.arange(n, dtype=np.int64) * 1000 - 4000
    place = np.arange(n, dtype=np.int64)
    keep = np.empty(n, dtype=np.bool_)
    exact, whole, frac = (np.empty(n, dtype=np.int64) for _ in range(3))
    constants = noise._open_constants(plan, prop, fast)
    count = noise._open_kernel(words, values, place, place, *constants, keep, exact, whole, frac)
    _check(0 <= count <= n, "open entries' test")
    kept = noise._drop_kernel(values, n, place, keep)
    _check(kept == int(np.sum(keep)), "drop")


def _warm_langevin() -> None:
    """One part of :class:`langevin.ExactRowSums`' binary step with one-hot blocks: six
    rows, two dense columns, one group of two blocks (3 cells each), five parameters."""
    rows, parameters = 6, 5
    columns = np.array([[1.0] * rows, [0.0, 3.0, 1.0, 2.0, 0.0, 5.0]])
    theta = np.array([2.0**20, -(2.0**19)])
    extended = np.array([3.0, -1.0, 2.0, 0.0, 1.0, 0.0]) * 2.0**28  # θ_ext[P] = 0
    table_columns = np.array([[[5, 0, 1], [5, 2, 3]]], dtype=np.int64)  # P: no column
    cells = np.array([[0, 1, 2, 1, 0, 2]], dtype=np.int64)
    y = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    r = np.empty(rows)
    sums = np.zeros(parameters + 1)
    nan = langevin._binary_cells_kernel(
        columns,
        theta,
        extended,
        table_columns,
        cells,
        y,
        2.0**-28,
        2.0**16,
        r,
        np.empty((1, 3)),
        np.zeros((1, 3)),
        sums,
    )
    finite = bool(np.all(np.isfinite(r)) and np.all(np.isfinite(sums)))
    _check(not nan and finite and bool(np.all(r == np.trunc(r))), "binary cells")


def _warm_lattice_steps() -> None:
    """Two steps of the hidden-iterate chain's compiled loop on :func:`_warm_langevin`'s
    rows (four dense θ entries: two dense columns; one group of two blocks)."""
    rows, parameters = 6, 5
    columns = np.array([[1.0] * rows, [0.0, 3.0, 1.0, 2.0, 0.0, 5.0]])
    table_columns = np.array([[[5, 0, 1], [5, 2, 3]]], dtype=np.int64)
    cells = np.array([[0, 1, 2, 1, 0, 2]], dtype=np.int64)
    y = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    x = np.array([3.0, -1.0, 2.0, 0.0, 1.0])
    noise = np.array([[1, 0, -2, 5, 0], [0, 3, 1, -1, 2]], dtype=np.int64)
    done = langevin.lattice_steps_kernel(
        x,
        noise,
        0.99,
        2.0**-20,
        2.0**10,
        columns,
        np.array([4, 3], dtype=np.intp),
        table_columns,
        cells,
        y,
        2.0**-28,
        2.0**16,
        2.0**8,
        np.empty(rows),
        np.empty((1, 3)),
        np.empty((1, 3)),
        np.empty(parameters + 1),
        np.empty(2),
        np.empty(parameters + 1),
    )
    _check(done == 2 and bool(np.all(x == np.trunc(x))), "lattice steps")


_WARMERS: Final[tuple[tuple[Callable[[], None], tuple[Any, ...]], ...]] = (
    (_warm_scalars, (ieee_math.exp_one, ieee_math.log_one, fp.sigmoid_element)),
    (_warm_fixed_point, (fp._sigmoid_kernel, fp._tanh_grid_kernel)),
    (
        _warm_mlp_rows,
        (fp._tanh_backward_kernel, fp._scale_rows_kernel, fp._row_maxima_and_squares),
    ),
    (
        _warm_noise,
        (
            noise._lead_v_kernel,
            noise._tail_kernel,
            noise._screen_kernel,
            noise._open_kernel,
            noise._drop_kernel,
        ),
    ),
    (_warm_langevin, (langevin._binary_cells_kernel,)),
    (_warm_lattice_steps, (langevin.lattice_steps_kernel,)),
)
"""Each warm-up step and the kernels it calls."""


def _name(kernel: Any) -> str:
    function = kernel.py_func
    return f"{function.__module__}.{function.__qualname__}"


def warm_up() -> WarmUp:
    """Calls every compiled kernel once on its example (module docstring); raises
    :class:`KernelWarmUpError` if one has no example, fails or is left without compiled
    code."""
    start = time.perf_counter()
    covered = {id(k) for _, kernels in _WARMERS for k in kernels}
    missing = [_name(k) for k in compiled_kernels() if id(k) not in covered]
    if missing:
        raise KernelWarmUpError(f"no warm-up example for {', '.join(missing)}")
    for step, _ in _WARMERS:
        try:
            step()
        except KernelWarmUpError:
            raise
        except Exception as exc:  # a kernel that does not run is broken
            raise KernelWarmUpError(f"compiled kernel warm-up {step.__name__}: {exc!r}") from exc
    cold = [_name(k) for k in compiled_kernels() if not k.signatures]
    if cold:
        raise KernelWarmUpError(f"not compiled after the warm-up: {', '.join(cold)}")
    names = tuple(_name(k) for k in compiled_kernels())
    return WarmUp(kernels=names, seconds=time.perf_counter() - start)
