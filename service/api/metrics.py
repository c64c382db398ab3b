"""Prometheus metrics at ``GET /metrics`` (prometheus-client's text format).

What is counted is operational only, never derived from private rows: HTTP requests by
method, route *template* (``/v1/jobs/{job_id}``, never the job id) and status, their
latency, and the number of jobs in each status (read from the ledger at scrape time).
No loss, row count, norm or ε of any job appears here.

Public unless ``ENCLAVE_METRICS_TOKEN`` is set: then a scrape must send
``Authorization: Bearer <token>`` (compared in constant time), else 401. Either way each
scrape spends a token of its client address's rate-limit bucket (service/limits.py).

Each app has its own registry (tests build many apps in one process). With several
uvicorn worker processes, set ``PROMETHEUS_MULTIPROC_DIR`` to an empty folder shared by
them (prometheus-client's multiprocess mode) so that a scrape sums every process.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select

from service.api.errors import ProblemError
from service.app_state import LimiterDep, SettingsDep
from service.db import transaction
from service.ledger.tables import Job, JobStatus

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Requests that matched no route (404s, bodies refused before routing) share one label,
# so arbitrary paths cannot grow the number of series.
UNMATCHED = "<unmatched>"


class JobsByStatus(Collector):
    """``enclave_jobs{status}``: how many jobs are in each status, counted at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("enclave_jobs", "Jobs in each status.", labels=["status"])
        with transaction(self.engine) as s:
            counts = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        for status in JobStatus:
            family.add_metric([status.value], float(counts.get(status, 0)))
        yield family


class Metrics:
    """The app's request metrics and its registry."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "enclave_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "enclave_http_request_duration_seconds",
            "HTTP request latency by method and route template, in seconds.",
            ["method", "route"],
            registry=self.registry,
        )
        self.jobs = JobsByStatus(engine)
        self.registry.register(self.jobs)

    def exposition(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            merged = CollectorRegistry()
            MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            merged.register(self.jobs)
            return generate_latest(merged)
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Count and time every HTTP request by its route template once the app answered."""

    def __init__(self, app: Callable[..., Awaitable[None]], metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception with no response sent is answered 500 by the server
        start = time.perf_counter()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            method = str(scope.get("method", ""))
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - start)


router = APIRouter()


def _bearer_token(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, settings: SettingsDep, limiter: LimiterDep) -> Response:
    # Every scrape spends a token of its address's bucket (issue 19); with
    # ENCLAVE_METRICS_TOKEN set, only `Authorization: Bearer <token>` is served.
    limiter.take_unauthenticated(request, "metrics")
    expected = settings.metrics_token.get_secret_value() if settings.metrics_token else ""
    if expected and not hmac.compare_digest(_bearer_token(request).encode(), expected.encode()):
        raise ProblemError(401, "unauthorized", "/metrics requires its bearer token")
    body = request.app.state.metrics.exposition()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
