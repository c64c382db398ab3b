"""RFC 9457 problem details. Every error the API returns is `application/problem+json`
with a stable `type` URI (relative to the service; `GET /problems/{slug}` describes it)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"

# slug -> (title, what it means). The slugs are a compatibility contract.
PROBLEMS: dict[str, tuple[str, str]] = {
    "validation-error": (
        "Invalid request",
        "A field is missing, of the wrong type or out of range.",
    ),
    "malformed-json": ("Malformed JSON", "The body is not valid JSON."),
    "payload-too-large": ("Payload too large", "The body exceeds the service's size limit."),
    "unauthorized": ("Unauthorized", "Send a valid API key as `Authorization: Bearer <key>`."),
    "forbidden": ("Forbidden", "Your role may not do this."),
    "not-found": ("Not found", "No such resource, or it is not yours."),
    "method-not-allowed": ("Method not allowed", "This path does not accept that method."),
    "budget-exceeded": (
        "Privacy budget exceeded",
        "Admitting the request would exceed the dataset's budget or your cap. Nothing was charged.",
    ),
    "invalid-plan": (
        "Request cannot be planned",
        "The request is well formed but cannot be turned into a privacy plan. Nothing was charged.",
    ),
    "nominal-not-allowed": (
        "Unproven guarantee not allowed",
        "The dataset's admin has not allowed methods whose ε is not proven (nominal or "
        "asymptotic).",
    ),
    "idempotency-conflict": (
        "Idempotency-Key reused",
        "This Idempotency-Key was used before with a different request body.",
    ),
    "conflict": ("Conflict", "The resource is not in a state that allows this."),
    "bad-request": ("Bad request", "The request could not be read."),
    "rate-limited": (
        "Too many requests",
        "This API key (or the service as a whole) is over its rate or concurrency limit. "
        "Nothing was charged; retry after the Retry-After header's seconds.",
    ),
    "service-unavailable": (
        "Service unavailable",
        "The ledger database cannot be reached right now. Nothing was charged; retry later.",
    ),
    "release-not-ready": ("Release not ready", "The job has not released a model (yet)."),
}


class ProblemError(Exception):
    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        assert slug in PROBLEMS, slug
        self.status, self.slug, self.detail, self.extra = status, slug, detail, extra
        self.headers = headers or {}


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
        "type": f"/problems/{slug}",
        "title": PROBLEMS[slug][0],
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
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
            return _internal_response()
        # Keep the exception's headers (a 405's Allow, for one).
        return problem_response(
            exc.status_code,
            slug,
            str(exc.detail),
            request.url.path,
            headers=dict(exc.headers or {}),
        )

    @app.exception_handler(DBAPIError)
    async def _database(request: Request, exc: DBAPIError) -> JSONResponse:
        # A lost connection or an unreachable server is an outage, not a bug: 503 and
        # Retry-After. Other database errors stay 500s (they are bugs).
        if exc.connection_invalidated or isinstance(exc, OperationalError):
            return problem_response(
                503,
                "service-unavailable",
                "the ledger database is unavailable; nothing was charged",
                request.url.path,
                headers={"Retry-After": "5"},
            )
        return _internal_response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return _internal_response()


def _internal_response() -> JSONResponse:
    # A 5xx is a bug. Say nothing about it (it could carry enclave detail).
    return JSONResponse(
        {"type": "about:blank", "title": "Internal Server Error", "status": 500},
        status_code=500,
        media_type=PROBLEM_JSON,
    )
