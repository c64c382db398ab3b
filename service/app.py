"""The FastAPI application factory (outside the enclave: it never reads private rows)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import Depends, FastAPI
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.middleware.exceptions import ExceptionMiddleware

from service.api.deps import Caller, current_caller
from service.api.docs import install_docs
from service.api.errors import install_handlers, problem_response
from service.api.metrics import Metrics, MetricsMiddleware
from service.api.metrics import router as metrics_router
from service.api.middleware import ServerErrors, reject_hostile_input
from service.api.openapi import install_openapi
from service.api.routes import admin, audits, evaluations, health, jobs, selections
from service.auth import analyst_for_key, new_api_key
from service.config import Settings, get_settings
from service.dashboard import routes as dashboard
from service.db import engine_for, transaction
from service.jobs import sweep
from service.ledger.tables import Dataset, Role
from service.limits import Limiter
from service.logs import RequestLog
from service.plans import build_plan
from service.privacy.orders import CALIBRATION_ORDERS, ORDERS
from service.privacy.rdp import warm_tables
from service.private_files import warn_private_permissions
from service.schemas import JobRequest
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


# One request of each quote family the warm-up sends (issue 26), each with its log label.
# The first selections name their per-training ε (no bisection); the last three are the
# kinds' defaults with the per-training ε calibrated, so the bisection's own first-use
# costs are paid too: the long fractional-order tables of the large σ its doubling start
# tries (public: they depend on the orders only), and, for a later request with the same
# planning inputs (a kind's defaults, the same δ, on the first dataset), the start's
# plans themselves (service.selection.kinds' memo of whole-workflow costs).
_WARM_UP_QUOTES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("dpsgd", "/v1/quote", {"method": "dpsgd", "epsilon": 1.0, "delta": 1e-6}),
    (
        "dpsgd pld",
        "/v1/quote",
        {"method": "dpsgd", "epsilon": 1.0, "delta": 1e-6, "dpsgd": {"accountant": "pld"}},
    ),
    ("expm", "/v1/quote", {"method": "expm", "epsilon": 1.0, "delta": 1e-6}),
    ("expm_nf", "/v1/quote", {"method": "expm_nf", "epsilon": 1.0, "delta": 0.0}),
    (
        "architecture rs",
        "/v1/selections/quote",
        {
            "kind": "architecture",
            "epsilon": 50.0,
            "delta": 1e-6,
            "training_epsilon": 1.0,
            "space": {"depths": [1], "widths": [8]},
            "search": {"algorithm": "rs", "trainings": 2},
        },
    ),
    (
        "hyperparameters",
        "/v1/selections/quote",
        {
            "kind": "hyperparameters",
            "epsilon": 50.0,
            "delta": 1e-6,
            "training_epsilon": 1.0,
            "epochs": [1],
            "batch_sizes": [64],
        },
    ),
    (
        "features cfs_greedy",
        "/v1/selections/quote",
        {"kind": "features", "epsilon": 1.0, "delta": 1e-6, "max_selected": 2},
    ),
    (
        "architecture, calibrated",
        "/v1/selections/quote",
        {"kind": "architecture", "epsilon": 2.0, "delta": 1e-6},
    ),
    (
        "hyperparameters, calibrated",
        "/v1/selections/quote",
        {"kind": "hyperparameters", "epsilon": 2.0, "delta": 1e-6},
    ),
    (
        "features pafs, calibrated",
        "/v1/selections/quote",
        {"kind": "features", "epsilon": 20.0, "delta": 1e-6, "method": "pafs"},
    ),
)
_NOBODY = Caller(id=0, name="warm-up", role=Role.analyst)  # no analyst has id 0: no cap


async def warm_up(app: FastAPI) -> dict[str, str]:
    """Pay a fresh process's first-use costs before it accepts requests (issue 26: its
    first quote cost 100+ ms more than a repeat): the RDP series' tables of the ledger's
    and the calibration's grids of orders, the ledger's first connection and key lookup,
    then each quote of :data:`_WARM_UP_QUOTES` sent in-process to the app below its
    middleware (routing,
    the request body's validation, planning with its caches and the accountants' tables,
    the ledger's statements, the response's serialization), as the analyst id 0.

    Read-only, like any quote: the quotes are on the first registered dataset (without
    one, they end in a 404 and the planning code is warmed on made-up public facts
    instead); they charge nothing, write nothing and read no private row. The requests
    enter below the middleware: no access-log line, no metrics. A family
    that fails is noted and skipped: the warm-up never stops the start-up. Returns what
    each request did ("ok" or the reason), also kept in ``app.state.warm_up``.
    """
    started = time.perf_counter()
    done: dict[str, str] = {}
    try:  # the RDP series' order-only tables of both grids (~20 ms; rdp.warm_tables)
        await run_in_threadpool(warm_tables, ORDERS, CALIBRATION_ORDERS)
        done["tables"] = "ok"
    except Exception as exc:
        log.warning("warm-up: the RDP tables failed", exc_info=True)
        done["tables"] = f"failed: {type(exc).__name__}"
    try:
        dataset = await run_in_threadpool(_warm_ledger, app)
        done["ledger"] = "ok"
    except Exception as exc:  # e.g. a ledger that is down: readiness reports it
        log.warning("warm-up: the ledger failed", exc_info=True)
        dataset, done["ledger"] = None, f"failed: {type(exc).__name__}"
    inner = _below_middleware(app)
    before = app.dependency_overrides.get(current_caller)  # e.g. a test's own override
    app.dependency_overrides[current_caller] = lambda: _NOBODY
    try:
        for name, path, body in _WARM_UP_QUOTES:
            try:
                if dataset is None and path == "/v1/quote":  # planning code, on made-up facts
                    request = JobRequest.model_validate({"dataset": "warm-up", **body})
                    # a tabular dataset of 8 features in [0, 1]: ‖(x, 1)‖² ≤ 9
                    made_up = partial(build_plan, n_rows=10_000, n_features=8, norm_sq_bound=9)
                    await run_in_threadpool(made_up, request)
                status = await _asgi_post(app, inner, path, {"dataset": dataset or "", **body})
                done[name] = "ok" if status == 200 else f"status {status}"
            except Exception as exc:  # a server error (ServerErrors would log and render it)
                done[name] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        if before is None:
            del app.dependency_overrides[current_caller]
        else:
            app.dependency_overrides[current_caller] = before
    log.info(
        "warm-up done in %.0f ms: %s",
        1e3 * (time.perf_counter() - started),
        "; ".join(f"{k}: {v}" for k, v in done.items()),
    )
    return done


def _below_middleware(app: FastAPI) -> Callable[..., Awaitable[None]]:
    """The app's stack from its exception handlers down (routing, dependencies, the
    handlers' problem+json), without the middleware this module adds (the request log,
    metrics, body limit) and Starlette's outermost error middleware."""
    layer: Any = app.middleware_stack
    while layer is not None and not isinstance(layer, ExceptionMiddleware):
        layer = getattr(layer, "app", None)
    return layer if layer is not None else app.router


def _warm_ledger(app: FastAPI) -> str | None:
    """The first connection, a key lookup (of a key nobody has) and the first dataset."""
    with transaction(app.state.engine) as s:
        analyst_for_key(s, new_api_key())
        return s.scalars(select(Dataset.name).order_by(Dataset.id).limit(1)).first()


async def _asgi_post(
    app: FastAPI, asgi: Callable[..., Awaitable[None]], path: str, body: object
) -> int:
    """POST ``body`` as JSON to ``asgi`` (a layer of ``app``) in-process; the status."""
    payload = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"warm-up"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "state": {},
        "app": app,  # what Starlette's outermost layer sets
    }
    status = 0

    async def receive() -> Message:
        return {"type": "http.request", "body": payload, "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await asgi(scope, receive, send)
    return status


def create_app(
    settings: Settings | None = None, *, run_sweeper: bool = True, warm: bool = True
) -> FastAPI:
    """The app; ``warm``: run :func:`warm_up` at start-up, before the first request (the
    tests' in-process clients leave it out: each would pay it)."""
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
        if warm:  # before the server accepts its first connection
            app.state.warm_up = await warm_up(app)
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
