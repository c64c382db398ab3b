"""Liveness, readiness and the problem-type documentation."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from service.api.deps import EngineDep
from service.api.errors import PROBLEMS, ProblemError, problem_response

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
def readyz(engine: EngineDep) -> dict[str, str] | JSONResponse:
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
    return {"status": "ready"}


@router.get("/problems/{slug}")
def problem_type(slug: str) -> dict[str, Any]:
    if slug not in PROBLEMS:
        raise ProblemError(404, "not-found", f"no problem type {slug!r}")
    title, description = PROBLEMS[slug]
    return {"type": f"/problems/{slug}", "title": title, "description": description}
