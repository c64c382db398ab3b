"""The ledger, newest entry first, paged."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from service import admin as ops
from service.app_state import EngineDep
from service.dashboard.common import AdminPage, bad_page, page_router, render
from service.dashboard.views import page_number, paging
from service.db import transaction

router = page_router()


@router.get("/ledger", response_class=HTMLResponse)
def ledger(
    request: Request, engine: EngineDep, admin: AdminPage, page: str | None = None
) -> Response:
    number = page_number(page)
    if number is None:
        return bad_page(request, admin, "/dashboard/ledger")
    with transaction(engine) as s:
        paged = paging(number, ops.count_ledger_entries(s))
        entries = ops.ledger_newest_first(s, limit=paged.size, offset=paged.offset)
    return render(request, "ledger.html", admin, entries=entries, paging=paged)
