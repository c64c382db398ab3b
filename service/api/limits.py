"""Rate limits: nobody gets free CPU (issue 11: sixteen concurrent uncached quotes from one
analyst took 28–32 s each).

Two limits, both answered with 429 problem+json and ``Retry-After``:

* a token bucket per API key on every authenticated call (``rate_limit_per_s`` tokens per
  second, bursts up to ``rate_limit_burst``);
* caps on concurrent *planning* (quotes and submissions, whose noise calibration is the
  expensive part): at most ``planning_per_key`` at once per key and
  ``planning_global`` at once for the whole process.

The state is per API process (several processes each enforce their own limits); it holds
only key ids and counters, nothing about data.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from service.api.errors import ProblemError
from service.config import Settings


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class Limiter:
    rate_per_s: float
    burst: int
    planning_per_key: int
    planning_global: int
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _planning: dict[int, int] = field(default_factory=dict)
    _planning_total: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> Limiter:
        return cls(
            rate_per_s=settings.rate_limit_per_s,
            burst=settings.rate_limit_burst,
            planning_per_key=settings.planning_per_key,
            planning_global=settings.planning_global,
        )

    def take(self, key: int) -> None:
        """Spend one token of ``key``'s bucket, or raise a 429."""
        now = time.monotonic()
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                b = self._buckets[key] = _Bucket(float(self.burst), now)
            b.tokens = min(float(self.burst), b.tokens + (now - b.stamp) * self.rate_per_s)
            b.stamp = now
            if b.tokens >= 1.0:
                b.tokens -= 1.0
                return
            wait = (1.0 - b.tokens) / self.rate_per_s
        raise _limited(wait, "too many requests with this API key")

    @contextmanager
    def planning(self, key: int) -> Iterator[None]:
        """Hold one planning slot of ``key`` and of the process, or raise a 429."""
        with self._lock:
            mine = self._planning.get(key, 0)
            if mine >= self.planning_per_key:
                raise _limited(2.0, "this API key already has quotes or submissions in progress")
            if self._planning_total >= self.planning_global:
                raise _limited(2.0, "the service is busy planning other requests")
            self._planning[key] = mine + 1
            self._planning_total += 1
        try:
            yield
        finally:
            with self._lock:
                self._planning[key] -= 1
                self._planning_total -= 1


def _limited(wait_s: float, detail: str) -> ProblemError:
    retry = max(1, math.ceil(wait_s))
    return ProblemError(
        429, "rate-limited", f"{detail}; retry after {retry} s", headers={"Retry-After": str(retry)}
    )
