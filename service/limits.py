"""Rate limits: nobody gets free CPU (issue 11: sixteen concurrent uncached quotes from one
analyst took 28–32 s each), and nobody guesses keys for free (issue 19).

All are answered with 429 problem+json and ``Retry-After``:

* a token bucket per API key on every authenticated call (``rate_limit_per_s`` tokens per
  second, bursts up to ``rate_limit_burst``);
* caps on concurrent *planning* (quotes and submissions, whose noise calibration is the
  expensive part): at most ``planning_per_key`` at once per key and
  ``planning_global`` at once for the whole process, the last free slot kept for a key
  that holds none, each held at most ``planning_time_limit_s`` (plus one ε evaluation);
* token buckets per *client address* for traffic that has no identity to charge: calls
  with a missing or invalid API key, and ``/metrics`` (``unauth_rate_limit_per_s`` /
  ``unauth_rate_limit_burst``, one bucket each), and dashboard sign-in attempts, failed or
  not (``login_rate_limit_per_s`` / ``login_rate_limit_burst``: a small burst, then a slow
  refill). These buckets are separate from every key's: a valid key is never slowed by
  bad guesses made from its address. The address is the TCP peer's; the last
  ``X-Forwarded-For`` entry (the one the nearest proxy appended) is used instead only when
  ``trust_forwarded_for`` is set.

The state is per API process (several processes each enforce their own limits); it holds
only key ids, client addresses and counters, nothing about data.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from service.config import Settings
from service.problems import ProblemError

# Address buckets kept at most (per kind); beyond it, full (idle) buckets are dropped, then
# the least recently used ones, so a flood of addresses cannot grow memory without bound.
MAX_ADDRESSES = 65536


@dataclass
class _Bucket:
    tokens: float
    stamp: float


def _spend(buckets: dict[Any, _Bucket], key: object, rate_per_s: float, burst: int) -> float:
    """Spend one token of ``key``'s bucket: 0 if there was one, else the seconds until there
    will be. The caller holds the lock."""
    now = time.monotonic()
    b = buckets.get(key)
    if b is None:
        b = buckets[key] = _Bucket(float(burst), now)
    b.tokens = min(float(burst), b.tokens + (now - b.stamp) * rate_per_s)
    b.stamp = now
    if b.tokens >= 1.0:
        b.tokens -= 1.0
        return 0.0
    return (1.0 - b.tokens) / rate_per_s


def _prune(buckets: dict[Any, _Bucket], rate_per_s: float, burst: int) -> None:
    """Drop buckets that have refilled (a new one starts full: nothing is forgotten), then,
    if still too many, the least recently used half."""
    now = time.monotonic()
    for key in [k for k, b in buckets.items() if b.tokens + (now - b.stamp) * rate_per_s >= burst]:
        del buckets[key]
    if len(buckets) > MAX_ADDRESSES:
        for key in sorted(buckets, key=lambda k: buckets[k].stamp)[: len(buckets) // 2]:
            del buckets[key]


@dataclass
class Limiter:
    rate_per_s: float
    burst: int
    planning_per_key: int
    planning_global: int
    # Per client address, for traffic without a valid key (see the module's docstring).
    unauth_rate_per_s: float = 1.0
    unauth_burst: int = 30
    login_rate_per_s: float = 1 / 60
    login_burst: int = 10
    address_limits: bool = True
    trust_forwarded_for: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _addresses: dict[tuple[str, str], _Bucket] = field(default_factory=dict)
    _logins: dict[str, _Bucket] = field(default_factory=dict)
    _planning: dict[int, int] = field(default_factory=dict)
    _planning_total: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> Limiter:
        return cls(
            rate_per_s=settings.rate_limit_per_s,
            burst=settings.rate_limit_burst,
            planning_per_key=settings.planning_per_key,
            planning_global=settings.planning_global,
            unauth_rate_per_s=settings.unauth_rate_limit_per_s,
            unauth_burst=settings.unauth_rate_limit_burst,
            login_rate_per_s=settings.login_rate_limit_per_s,
            login_burst=settings.login_rate_limit_burst,
            address_limits=settings.address_rate_limits,
            trust_forwarded_for=settings.trust_forwarded_for,
        )

    def take(self, key: int) -> None:
        """Spend one token of ``key``'s bucket, or raise a 429."""
        with self._lock:
            wait = _spend(self._buckets, key, self.rate_per_s, self.burst)
        if wait:
            raise _limited(wait, "too many requests with this API key")

    def client_address(self, request: Request) -> str:
        """The client's address: the TCP peer, or the nearest proxy's ``X-Forwarded-For``
        entry where ``trust_forwarded_for`` says a proxy sets it."""
        if self.trust_forwarded_for:
            forwarded = request.headers.get("x-forwarded-for", "").split(",")[-1].strip()
            if forwarded:
                return forwarded
        return request.client.host if request.client is not None else "unknown"

    def take_unauthenticated(self, request: Request, kind: str = "unauthenticated") -> None:
        """Spend one token of the client address's bucket for ``kind`` (``unauthenticated``:
        a missing or invalid key; ``metrics``), or raise a 429."""
        what = "requests to /metrics" if kind == "metrics" else "requests without a valid key"
        self._take_address(
            request,
            self._addresses,
            kind,
            rate_per_s=self.unauth_rate_per_s,
            burst=self.unauth_burst,
            detail=f"too many {what} from this address",
        )

    def take_login(self, request: Request) -> None:
        """Spend one token of the client address's sign-in bucket, or raise a 429."""
        self._take_address(
            request,
            self._logins,
            None,
            rate_per_s=self.login_rate_per_s,
            burst=self.login_burst,
            detail="too many dashboard sign-in attempts from this address",
        )

    def _take_address(
        self,
        request: Request,
        buckets: dict[Any, _Bucket],
        kind: str | None,
        *,
        rate_per_s: float,
        burst: int,
        detail: str,
    ) -> None:
        """Spend one token of the client address's bucket in ``buckets`` (keyed by
        (kind, address), or by the address alone when ``kind`` is None), or raise a 429."""
        if not self.address_limits:
            return
        address = self.client_address(request)
        key = address if kind is None else (kind, address)
        with self._lock:
            if len(buckets) > MAX_ADDRESSES:
                _prune(buckets, rate_per_s, burst)
            wait = _spend(buckets, key, rate_per_s, burst)
        if wait:
            raise _limited(wait, detail)

    @contextmanager
    def planning(self, key: int) -> Iterator[None]:
        """Hold one planning slot of ``key`` and of the process, or raise a 429.

        Fair share (issue 19): a key that already holds a slot may not take the process's
        last free one, which stays for a key that holds none; and every slot is held at
        most ``planning_time_limit_s`` plus one ε evaluation (service/privacy/deadline.py),
        so no set of analysts can keep the others out for longer than that."""
        with self._lock:
            mine = self._planning.get(key, 0)
            if mine >= self.planning_per_key:
                raise _limited(2.0, "this API key already has quotes or submissions in progress")
            free = self.planning_global - self._planning_total
            if free <= 0 or (mine > 0 and free <= 1):
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
