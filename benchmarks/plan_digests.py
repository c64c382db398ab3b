"""Digest and planning time of each request of tests/plan_cases.py, in one process in
order (the first request pays the imports): the check that a speed-up of planning left
every plan as it was, and where the planning time goes.

    .venv/bin/python benchmarks/plan_digests.py   # digest, wall and CPU ms, name
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.plan_cases import REQUESTS, plan_digest  # noqa: E402


def main() -> None:
    for name, (endpoint, body) in REQUESTS.items():
        t, c = time.perf_counter(), time.process_time()
        digest = plan_digest(endpoint, body)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        print(f"{digest}  {1e3 * wall:7.1f} ms ({1e3 * cpu:7.1f} ms cpu)  {name}", flush=True)


if __name__ == "__main__":
    main()
