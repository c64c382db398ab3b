"""The problems the service can answer with (RFC 9457): each slug's status, title and
meaning, and the exception that carries one. Shared by the HTTP API (which renders them as
`application/problem+json`, see service.api.errors) and the dashboard, and by the layers
below both (the rate limiter raises them), so neither front end imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROBLEM_JSON = "application/problem+json"


@dataclass(frozen=True)
class ProblemType:
    """One problem type: the HTTP status it is always sent with, a title, what it means."""

    status: int
    title: str
    description: str


# slug -> problem type. The slugs and their statuses are a compatibility contract (the
# OpenAPI document lists, for each documented status, the types it may carry).
PROBLEMS: dict[str, ProblemType] = {
    "validation-error": ProblemType(
        422, "Invalid request", "A field is missing, of the wrong type or out of range."
    ),
    "malformed-json": ProblemType(400, "Malformed JSON", "The body is not valid JSON."),
    "payload-too-large": ProblemType(
        413, "Payload too large", "The body exceeds the service's size limit."
    ),
    "unauthorized": ProblemType(
        401, "Unauthorized", "Send a valid API key as `Authorization: Bearer <key>`."
    ),
    "forbidden": ProblemType(403, "Forbidden", "Your role may not do this."),
    "not-found": ProblemType(404, "Not found", "No such resource, or it is not yours."),
    "method-not-allowed": ProblemType(
        405, "Method not allowed", "This path does not accept that method."
    ),
    "budget-exceeded": ProblemType(
        409,
        "Privacy budget exceeded",
        "Admitting the request would exceed the dataset's budget or your cap. Nothing was charged.",
    ),
    "invalid-plan": ProblemType(
        422,
        "Request cannot be planned",
        "The request is well formed but cannot be turned into a privacy plan. Nothing was charged.",
    ),
    "nominal-not-allowed": ProblemType(
        403,
        "Unproven guarantee not allowed",
        "The dataset's admin has not allowed methods whose ε is not proven (nominal or "
        "asymptotic).",
    ),
    "audit-gate": ProblemType(
        422,
        "No passing audit of this configuration",
        "The dataset's release gate is on and no audit of this configuration (method, model "
        "family, engine, sampler, σ at most the job's) passed within the age the admin "
        "set (service/audit_gate.py). Nothing was charged.",
    ),
    "idempotency-conflict": ProblemType(
        422,
        "Idempotency-Key reused",
        "This Idempotency-Key was used before with a different request body.",
    ),
    "conflict": ProblemType(409, "Conflict", "The resource is not in a state that allows this."),
    "bad-request": ProblemType(400, "Bad request", "The request could not be read."),
    "rate-limited": ProblemType(
        429,
        "Too many requests",
        "This API key (or the service as a whole) is over its rate or concurrency limit. "
        "Nothing was charged; retry after the Retry-After header's seconds.",
    ),
    "service-unavailable": ProblemType(
        503,
        "Service unavailable",
        "The ledger database cannot be reached right now. Nothing was charged; retry later.",
    ),
    "release-not-ready": ProblemType(
        409, "Release not ready", "The job has not released a model (yet)."
    ),
    "unreadable-record": ProblemType(
        409,
        "Stored record unreadable",
        "The service's stored record of this resource does not match its documented type "
        "(tampered with, or written by a newer service), so it cannot be served. It is "
        "logged, and the admin sees it flagged.",
    ),
}


def problem_type_uri(slug: str) -> str:
    return f"/problems/{slug}"


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
        assert slug in PROBLEMS and PROBLEMS[slug].status == status, (slug, status)
        self.status, self.slug, self.detail, self.extra = status, slug, detail, extra
        self.headers = headers or {}
