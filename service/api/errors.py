"""RFC 9457 problem details. Every error the API returns is `application/problem+json`
with a stable `type` URI (relative to the service; `GET /problems/{slug}` describes it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, OperationalError, StatementError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.logs import request_id
from service.problems import PROBLEM_JSON as PROBLEM_JSON
from service.problems import PROBLEMS as PROBLEMS
from service.problems import ProblemError as ProblemError
from service.problems import ProblemType as ProblemType
from service.problems import problem_type_uri as problem_type_uri

log = logging.getLogger("enclave.api")

# Set per request by service.api.middleware.ServerErrors: whether this request's 5xx has
# been logged already (a handler logs it with its traceback; the middleware logs the rest).
_logged_5xx: ContextVar[list[bool] | None] = ContextVar("logged_5xx", default=None)


@contextmanager
def server_error_scope() -> Iterator[Callable[[], bool]]:
    """Track, for one request, whether its 5xx was logged; yields the question."""
    flag = [False]
    token = _logged_5xx.set(flag)
    try:
        yield lambda: flag[0]
    finally:
        _logged_5xx.reset(token)


def log_server_error(
    message: str, *, status: int = 500, exc_info: BaseException | bool = True
) -> None:
    """Log a 5xx with the request id and the exception's traceback (``True``: the one
    being handled). Call it where the error is handled; each request's 5xx is then
    logged once."""
    log.error(message, exc_info=exc_info, extra={"request_id": request_id.get(), "status": status})
    flag = _logged_5xx.get()
    if flag is not None:
        flag[0] = True


def problem_response(
    status: int,
    slug: str,
    detail: str,
    instance: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": problem_type_uri(slug),
        "title": PROBLEMS[slug].title,
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance.replace("\x00", "%00")  # a hostile path, echoed safely
    body.update(extra)
    out = dict(headers or {})
    if status == 401:
        out["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=out or None)


_STATUS_SLUG = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "payload-too-large",
    429: "rate-limited",
}


def _clean_errors(errors: list[Any]) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append(
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
        )
    return out


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(
            exc.status, exc.slug, exc.detail, request.url.path, headers=exc.headers, **exc.extra
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return problem_response(
                400, "malformed-json", "The request body is not valid JSON.", request.url.path
            )
        return problem_response(
            422,
            "validation-error",
            "The request is invalid.",
            request.url.path,
            errors=_clean_errors(errors),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = _STATUS_SLUG.get(exc.status_code, "bad-request" if exc.status_code < 500 else "")
        if not slug:
            log_server_error(
                f"HTTP {exc.status_code}: {exc.detail}", status=exc.status_code, exc_info=exc
            )
            return internal_response()
        # Keep the exception's headers (a 405's Allow, for one).
        return problem_response(
            exc.status_code,
            slug,
            str(exc.detail),
            request.url.path,
            headers=dict(exc.headers or {}),
        )

    @app.exception_handler(StatementError)
    async def _database(request: Request, exc: StatementError) -> JSONResponse:
        # A lost connection or an unreachable server is an outage, not a bug: 503 and
        # Retry-After. A value the database refuses (PostgreSQL's NUL in text, an integer
        # out of range: DataError; a value no bind parameter takes) came from the request:
        # 422, the transaction rolled back, nothing charged. Other database errors stay
        # 500s (they are bugs). Every 5xx is logged with the request id.
        if isinstance(exc, DBAPIError) and (
            exc.connection_invalidated or isinstance(exc, OperationalError)
        ):
            log_server_error("ledger database unavailable", status=503, exc_info=exc)
            return problem_response(
                503,
                "service-unavailable",
                "the ledger database is unavailable; nothing was charged",
                request.url.path,
                headers={"Retry-After": "5"},
            )
        if isinstance(exc, DataError) or (
            not isinstance(exc, DBAPIError) and isinstance(exc.orig, OverflowError | ValueError)
        ):
            log.info("database refused a request value: %s", type(exc.orig).__name__)
            return problem_response(
                422,
                "validation-error",
                "A value in the request cannot be stored (out of range, or a character the "
                "database does not accept).",
                request.url.path,
                errors=[],
            )
        log_server_error("database error", exc_info=exc)
        return internal_response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # Reached only from outside the middleware (service.api.middleware.ServerErrors
        # answers everything from inside it, with the request id).
        log_server_error("unhandled exception", exc_info=exc)
        return internal_response()


def internal_response() -> JSONResponse:
    # A 5xx is a bug. Say nothing about it (it could carry enclave detail).
    return JSONResponse(
        {"type": "about:blank", "title": "Internal Server Error", "status": 500},
        status_code=500,
        media_type=PROBLEM_JSON,
    )
