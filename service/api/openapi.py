"""The OpenAPI document as a contract generated clients can trust.

Every error the service sends is `application/problem+json` (:mod:`service.api.errors`),
so every documented 4xx/5xx response refers to the one `Problem` schema, and lists the
problem types (`/problems/{slug}`) its status may carry. FastAPI's default 422
`HTTPValidationError` never appears: it describes a body the service does not send, and a
generated client that trusted it would crash on every 422. Routes declare their possible
statuses with :func:`problem_responses`; :func:`install_openapi` adds the `Problem`
schema to the document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.api.errors import PROBLEM_JSON, PROBLEMS, problem_type_uri
from service.schemas import Problem

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

# What a status means in general; the problem types sent with it follow in the document.
_MEANING = {
    400: "The request could not be read (malformed JSON).",
    401: "Missing, invalid, revoked or expired API key.",
    403: "Not allowed for this caller.",
    404: "No such resource, or it is not yours.",
    409: "Conflicts with the ledger's or the resource's state. Nothing was charged.",
    413: "The request body is too large.",
    422: "The request is invalid or cannot be planned. Nothing was charged.",
    429: "Over a rate or concurrency limit; retry after the Retry-After header's seconds.",
    503: "The ledger database is unavailable; nothing was charged. Retry later.",
}


def _description(status: int) -> str:
    types = ", ".join(
        f"`{problem_type_uri(slug)}`" for slug, t in PROBLEMS.items() if t.status == status
    )
    return f"{_MEANING[status]} Problem types: {types}."


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route (or router) that may answer with these error statuses."""
    return {
        status: {
            "description": _description(status),
            "content": {PROBLEM_JSON: {"schema": PROBLEM_REF}},
        }
        for status in statuses
    }


# Every authenticated route: bad key, rate limit, ledger down.
AUTHENTICATED = problem_responses(401, 429, 503)
# Every route with a JSON body: unreadable body, body too large, invalid fields.
JSON_BODY = problem_responses(400, 413, 422)


def install_openapi(app: FastAPI, *, servers: list[dict[str, str]]) -> None:
    """Build the document once, with the `Problem` schema (and its parts) as components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
                tags=app.openapi_tags,
                servers=servers,
            )
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, schema in problem.pop("$defs", {}).items():
                schemas.setdefault(name, schema)
            schemas["Problem"] = problem
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
