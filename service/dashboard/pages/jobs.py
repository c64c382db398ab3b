"""Every analyst's jobs (filtered, paged by cursor) and the refund form."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import select

from service import admin as ops
from service.app_state import EngineDep
from service.dashboard.common import (
    FORM_ERRORS,
    AdminForm,
    AdminPage,
    BackField,
    blank_is_none,
    done_message,
    page_router,
    refused,
    render,
)
from service.dashboard.sessions import AdminSession
from service.dashboard.views import PAGE_SIZE, safe_back
from service.db import transaction
from service.job_pages import BadCursor, JobFilters, count_matching
from service.ledger.tables import Analyst, Dataset, JobStatus
from service.schemas import RefundRequest
from service.schemas.common import GUARANTEE_ORDER, method_names

router = page_router()


@router.get("/jobs", response_class=HTMLResponse)
def jobs(
    request: Request,
    engine: EngineDep,
    admin: AdminPage,
    status: str | None = None,
    dataset: str | None = None,
    method: str | None = None,
    guarantee: str | None = None,
    analyst: str | None = None,
    cursor: str | None = None,
    done: str | None = None,
) -> Response:
    """Every analyst's jobs, newest first, filtered by the form's fields (a blank field
    matches every job) and paged by cursor (service/job_pages.py)."""
    raw = {"status": status, "dataset": dataset, "method": method}
    raw |= {"guarantee": guarantee, "analyst": analyst}
    try:
        filters = JobFilters.model_validate({k: blank_is_none(v) for k, v in raw.items()})
    except ValidationError as exc:
        return bad_filter(request, admin, exc)
    cursor = blank_is_none(cursor)
    with transaction(engine) as s:
        try:
            page = ops.jobs_page(s, filters, limit=PAGE_SIZE, cursor=cursor)
        except BadCursor:
            return render(
                request,
                "error.html",
                admin,
                status_code=400,
                title="No such page",
                message="The page link is not one this dashboard made: start from the first page.",
                back="/dashboard/jobs",
            )
        total = count_matching(s, filters)
        datasets = list(s.scalars(select(Dataset.name).order_by(Dataset.name)))
        analysts = list(s.scalars(select(Analyst.name).order_by(Analyst.name)))
    query = filters.query_params()
    return render(
        request,
        "jobs.html",
        admin,
        rows=page.rows,
        filters=filters,
        total=total,
        size=PAGE_SIZE,
        first=cursor is None,
        first_url="/dashboard/jobs" + (f"?{urlencode(query)}" if query else ""),
        next_url=None
        if page.next_cursor is None
        else "/dashboard/jobs?" + urlencode({**query, "cursor": page.next_cursor}),
        choices={
            "status": [s.value for s in JobStatus],
            "method": method_names(),
            "guarantee": list(GUARANTEE_ORDER),
            "dataset": datasets,
            "analyst": analysts,
        },
        done=done_message(done),
    )


def bad_filter(request: Request, admin: AdminSession, exc: ValidationError) -> Response:
    """A filter value the jobs page does not know: a 422 page saying which."""
    detail = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
    return render(
        request,
        "error.html",
        admin,
        status_code=422,
        title="Invalid filter",
        message=f"No jobs were looked up: {detail}",
        back="/dashboard/jobs",
    )


@router.post("/jobs/{job_id}/refund")
def refund_form(
    request: Request,
    job_id: str,
    engine: EngineDep,
    admin: AdminForm,
    reason: Annotated[str, Form()] = "",
    override: Annotated[str | None, Form()] = None,
    back: BackField = None,
) -> Response:
    try:
        body = RefundRequest.model_validate({"reason": reason, "override": override == "true"})
        with transaction(engine) as s:
            job = ops.refund_failed_job(s, job_id, body)
            information_only = ops.refund_is_information_only_for(s, job.id)
    except FORM_ERRORS as exc:
        return refused(request, admin, exc, safe_back(back, "/dashboard/jobs"))
    done = "refund_information_only" if information_only else "refund"
    return RedirectResponse(f"/dashboard/jobs?done={done}", status_code=303)
