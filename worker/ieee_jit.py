"""Compiled elementwise kernels that perform only IEEE-754 basic operations (issue 25).

:func:`ieee_njit` is ``numba.njit`` with the options the privacy proofs need, fixed in one
place. Why a kernel compiled this way computes the same bits as the numpy passes it
replaces (each numpy ufunc: one correctly rounded operation per element):

* ``fastmath=False`` (numba's default, written out): numba emits LLVM's plain ``fadd``,
  ``fsub``, ``fmul``, ``fdiv`` and ``fcmp`` with no fast-math flag, so LLVM may not reassociate,
  drop a NaN or infinity case, or contract a product and a sum into an FMA (its
  ``contract`` flag is one of the fast-math flags; LLVM IR semantics of floating-point
  instructions, https://llvm.org/docs/LangRef.html#fast-math-flags). Each source operation is
  then one IEEE-754 operation, correctly rounded in the default rounding mode, whatever
  vector width the host's code generator picks: a vector lane computes what a scalar would.
  ``np.rint`` becomes ``llvm.rint``, roundToIntegralTiesToEven in the default mode, as
  numpy's ``rint``; ``abs`` becomes ``llvm.fabs`` (clears the sign bit, as ``np.abs``).
* ``error_model="numpy"``: a division by zero gives the IEEE result (±inf or NaN), as
  numpy's ``divide``, instead of raising.
* numba never sets flush-to-zero or denormals-are-zero (those come only with fast-math), so
  subnormals behave as in numpy.
* ``cache=True``: the machine code is kept beside the module (``__pycache__``) so a new
  process does not compile again; the cache is keyed on the source and the host CPU.

tests/unit/test_exact_net.py and tests/unit/worker/test_noise_golden.py compare every kernel
with the numpy sequence it replaces bit for bit (NaN's sign included) and pin golden sha256
digests; tests/unit/worker/test_ieee_jit.py checks the compiled code of the kernels for FMA
instructions.

Every function compiled here is listed by :func:`compiled_kernels` (in the order their
modules defined them): worker/kernel_warm_up.py calls each once when a worker process
starts, so that a release does not pay numba's first call (~0.5-0.7 s: its runtime, then
the machine code loaded from the cache), and refuses to start without an example for one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import numba

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["IEEE_OPTIONS", "compiled_kernels", "ieee_njit"]

IEEE_OPTIONS: Final[dict[str, Any]] = {
    "fastmath": False,
    "error_model": "numpy",
    "boundscheck": False,
    "nogil": True,
}
"""numba.njit's options for every kernel (module docstring); ``cache=True`` is added by
:func:`ieee_njit` (the tests compile uncached copies with these options to read the code)."""


_COMPILED: list[Any] = []
"""Every numba dispatcher :func:`ieee_njit` returned in this process (its registry)."""


def ieee_njit(function: F) -> F:
    """``numba.njit`` with :data:`IEEE_OPTIONS` (module docstring), cached where numba finds
    a writable cache directory (beside the module, else the user's cache folder); without
    one it compiles once per process instead of refusing to import. The result is added to
    :func:`compiled_kernels`."""
    try:
        compiled: F = numba.njit(cache=True, **IEEE_OPTIONS)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        compiled = numba.njit(**IEEE_OPTIONS)(function)
    _COMPILED.append(compiled)
    return compiled


def compiled_kernels() -> tuple[Any, ...]:
    """The dispatchers :func:`ieee_njit` has made so far, in order (those of the modules
    imported in this process: worker/kernel_warm_up.py imports every module that has one)."""
    return tuple(_COMPILED)
