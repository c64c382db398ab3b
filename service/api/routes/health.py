"""Liveness, readiness and the problem-type documentation."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from service.api.deps import EngineDep
from service.api.errors import PROBLEMS, ProblemError, problem_response, problem_type_uri
from service.api.openapi import problem_responses
from service.schemas import Health, ProblemTypeInfo

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, operation_id="healthz")
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    operation_id="readyz",
    responses=problem_responses(503),
)
def readyz(engine: EngineDep) -> Health | JSONResponse:
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1 FROM datasets LIMIT 1"))
    except Exception:
        return problem_response(
            503,
            "service-unavailable",
            "the ledger database is not reachable or not migrated",
            headers={"Retry-After": "5"},
        )
    return Health(status="ready")


@router.get(
    "/problems/{slug}",
    response_model=ProblemTypeInfo,
    operation_id="getProblemType",
    responses=problem_responses(404, 422),
)
def problem_type(slug: str) -> ProblemTypeInfo:
    if slug not in PROBLEMS:
        raise ProblemError(404, "not-found", f"no problem type {slug!r}")
    t = PROBLEMS[slug]
    return ProblemTypeInfo(
        type=problem_type_uri(slug), status=t.status, title=t.title, description=t.description
    )
