"""A plan must not depend on the CPU that planned it: the pinned plan digests
(tests/unit/test_plan_digests.py) hold with every one of numpy's CPU-specific kernels
switched off (NPY_DISABLE_CPU_FEATURES: numpy then runs its baseline loops, which call the
C library, as on a CPU without AVX2/AVX-512). Three selection plans failed this on an
AVX-512 Xeon after passing on an AMD EPYC without AVX-512: numpy's SIMD log1p (Intel's
SVML) differs from the C library's in the last bits, and the integer-order RDP series'
logsumexp took it (service/privacy/rdp.py: _logsumexp now uses math.log1p)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

_SCRIPT = """
import json
from tests.plan_cases import REQUESTS, plan_digest
print(json.dumps({name: plan_digest(*REQUESTS[name]) for name in REQUESTS}))
"""


def _dispatched_features() -> list[str]:
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]


def test_plans_are_the_same_without_numpys_cpu_specific_kernels() -> None:
    from tests.unit.test_plan_digests import GOLDEN

    features = _dispatched_features()
    if not features:
        pytest.skip("this CPU runs only numpy's baseline kernels: nothing to switch off")
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": " ".join(features)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    digests = json.loads(out.stdout.strip().splitlines()[-1])
    assert {name: d for name, d in digests.items() if d != GOLDEN[name]} == {}
