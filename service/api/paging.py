"""Query parameters and response headers of the paged job listings (GET /v1/jobs and
GET /v1/admin/jobs): filters, ``limit`` and ``cursor`` in; the list body unchanged, the
next page's cursor in ``X-Next-Cursor`` and a ``Link: <…>; rel="next"`` header out."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Query, Request, Response

from service.api.errors import ProblemError
from service.job_pages import MAX_CURSOR_LENGTH, MAX_LIMIT, BadCursor, JobFilters
from service.schemas.common import Guarantee, Method
from service.vocabulary import JobStatus

Limit = Annotated[
    int, Query(ge=1, le=MAX_LIMIT, description="Jobs on this page, at most (newest first).")
]
Cursor = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_CURSOR_LENGTH,
        description=(
            "Where the page starts: the previous page's `X-Next-Cursor` header (opaque). "
            "Left out: the newest jobs."
        ),
    ),
]
AnalystName = Annotated[
    str | None, Query(min_length=1, max_length=64, description="The analyst, by name.")
]


def job_filters(
    status: JobStatus | None = None,
    dataset: Annotated[str | None, Query(min_length=1, max_length=64, description="By name.")] = (
        None
    ),
    method: Method | None = None,
    guarantee: Annotated[Guarantee | None, Query(description="The plan's guarantee label.")] = None,
    created_after: Annotated[
        datetime | None, Query(description="Created at or after (ISO 8601; no offset: UTC).")
    ] = None,
    created_before: Annotated[
        datetime | None, Query(description="Created before (ISO 8601; no offset: UTC).")
    ] = None,
) -> JobFilters:
    return JobFilters(
        status=status,
        dataset=dataset,
        method=method,
        guarantee=guarantee,
        created_after=created_after,
        created_before=created_before,
    )


FiltersDep = Annotated[JobFilters, Depends(job_filters)]

NEXT_PAGE_HEADERS: dict[str, Any] = {
    "X-Next-Cursor": {
        "description": "The next page's `cursor`; absent on the last page.",
        "schema": {"type": "string"},
    },
    "Link": {
        "description": 'The next page, `<…>; rel="next"` (RFC 8288); absent on the last page.',
        "schema": {"type": "string"},
    },
}


def paged_responses(description: str) -> dict[int | str, dict[str, Any]]:
    """The 200 response of a paged listing: the list body and the next-page headers."""
    return {200: {"description": description, "headers": NEXT_PAGE_HEADERS}}


@contextmanager
def cursor_problems() -> Iterator[None]:
    """A cursor this service did not issue: 422 problem+json, never a 500."""
    try:
        yield
    except BadCursor as exc:
        raise ProblemError(
            422,
            "validation-error",
            f"invalid cursor: {exc}",
            errors=[{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}],
        ) from exc


def link_next(request: Request, response: Response, next_cursor: str | None) -> None:
    """Set ``X-Next-Cursor`` and ``Link`` for the next page (nothing on the last page).
    The link is the same request (same filters and limit) from the next cursor, as a
    path-absolute reference."""
    if next_cursor is None:
        return
    url = request.url.include_query_params(cursor=next_cursor)
    response.headers["X-Next-Cursor"] = next_cursor
    response.headers["Link"] = f'<{url.path}?{url.query}>; rel="next"'
