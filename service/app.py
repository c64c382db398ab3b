"""The FastAPI application factory (outside the enclave: it never reads private rows)."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from service.api.docs import install_docs
from service.api.errors import install_handlers, problem_response
from service.api.metrics import Metrics, MetricsMiddleware
from service.api.metrics import router as metrics_router
from service.api.middleware import ServerErrors, reject_hostile_input
from service.api.openapi import install_openapi
from service.api.routes import admin, audits, evaluations, health, jobs, selections
from service.config import Settings, get_settings
from service.dashboard import routes as dashboard
from service.db import engine_for
from service.jobs import sweep
from service.limits import Limiter
from service.logs import RequestLog
from service.private_files import warn_private_permissions
from service.version import __version__

log = logging.getLogger("enclave.api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """Reject bodies over `limit` bytes with a 413 problem, declared or streamed."""

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_big = problem_response(
            413, "payload-too-large", f"the request body exceeds {self.limit} bytes"
        )
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await too_big(scope, receive, send)
            return
        # Read the whole body first (it is at most `limit` bytes), so a streamed body over
        # the limit is a 413 before the app sees it: raising from inside the app's read
        # would be turned into a 400 by the framework's body parsing.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await too_big(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], then=receive), send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A receive() that hands out `messages`, then defers to `then` (disconnects)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


def _sweeper(settings: Settings, stop: threading.Event) -> None:
    engine = engine_for(settings.resolved_database_url)
    while not stop.wait(settings.sweep_interval_s):
        try:
            sweep(engine, settings)
        except Exception:
            log.warning("sweep failed", exc_info=True)


def create_app(settings: Settings | None = None, *, run_sweeper: bool = True) -> FastAPI:
    settings = settings or get_settings()
    # Start-up check (issue 26): a warning per private folder or file others may read.
    warn_private_permissions(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = None
        if run_sweeper:
            thread = threading.Thread(
                target=_sweeper, args=(settings, stop), daemon=True, name="enclave-sweeper"
            )
            thread.start()
        yield
        stop.set()
        if thread:
            thread.join(timeout=5)

    app = FastAPI(
        title="Private-data enclave",
        version=__version__,
        summary="Train models on data you may never see, under a differential-privacy budget.",
        description=(
            "Analysts submit training jobs; each job's privacy plan is charged to the ledger "
            "at admission, before any private row is read. A job cancelled (or failed) before "
            "it read its first private row is refunded. A job that read rows keeps its charge, "
            "even if it failed: its failure is itself an output. Every (ε, δ) is for "
            "add/remove-one-row neighbours; the mechanisms depend only on the private rows and "
            "public values: the public schema, the budget, the plan and the public row count "
            "`n_rows`, a DP noisy count released at registration and charged to the dataset's "
            "budget. Releases state their guarantee: `proven` (DP-SGD, ExpM by Langevin), "
            "`asymptotic` (ExpM by MCMC: exact only in the limit of its steps) or `nominal` "
            "(ExpM+NF: the flow only approximates the ε-DP mechanism). "
            "Errors are RFC 9457 `application/problem+json` (schema `Problem`), with a stable "
            "`type` URI per kind of error, described at `/problems/{slug}`."
        ),
        lifespan=lifespan,
        # Every route's first dependency: NUL characters and JSON integers beyond int64
        # are a 422 before anything else runs (service.api.middleware).
        dependencies=[Depends(reject_hostile_input)],
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.limiter = Limiter.from_settings(settings)
    app.state.engine = engine_for(settings.resolved_database_url)
    install_handlers(app)
    install_openapi(app, servers=[{"url": "/", "description": "This service."}])
    install_docs(app)
    app.state.metrics = Metrics(app.state.engine)
    app.include_router(health.router)
    app.include_router(metrics_router)
    app.include_router(jobs.router)
    app.include_router(selections.router)
    app.include_router(evaluations.router)
    app.include_router(admin.router)
    app.include_router(audits.router)
    dashboard.install(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)  # type: ignore[arg-type]
    # Outside BodyLimit: it also counts the requests BodyLimit refuses.
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # type: ignore[arg-type]
    # Inside the request log: any escaped exception is a logged 500 with the request id.
    app.add_middleware(ServerErrors)  # type: ignore[arg-type]
    # Outermost: every response, refusals included, carries its request id and is logged.
    app.add_middleware(RequestLog)  # type: ignore[arg-type]
    return app
