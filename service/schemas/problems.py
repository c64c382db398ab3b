"""Error bodies (RFC 9457 problem details), the problem-type catalogue and the health
answer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.budgets import BudgetView


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description="Where: body, query, path or header, then keys.")
    msg: str
    type: str | None = None


class RemainingBudgets(BaseModel):
    dataset: BudgetView
    analyst: BudgetView | None = None


class Problem(BaseModel):
    """RFC 9457 problem details, sent as `application/problem+json` with every error.

    `type` is a stable URI reference, `/problems/{slug}` relative to the service
    (`GET /problems/{slug}` describes it); new types may be added. `errors` comes with
    validation errors, `remaining` with budget-exceeded.
    """

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": "/problems/not-found",
                    "title": "Not found",
                    "status": 404,
                    "detail": "no job 'abc'",
                    "instance": "/v1/jobs/abc",
                }
            ]
        },
    )

    type: str = Field(
        description="URI reference of the problem type, e.g. /problems/validation-error.",
        json_schema_extra={"format": "uri-reference"},
    )
    title: str
    status: int = Field(ge=400, le=599)
    detail: str | None = None
    instance: str | None = Field(default=None, description="The request path.")
    errors: list[ValidationIssue] | None = None
    remaining: RemainingBudgets | None = None


class ProblemTypeInfo(BaseModel):
    type: str
    status: int
    title: str
    description: str


class Health(BaseModel):
    status: Literal["ok", "ready"]
