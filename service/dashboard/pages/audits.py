"""Privacy audits (issue 22), newest first, paged: each one's configuration, status and,
when done, the ε lower bound beside the ceiling of the same test. Audits are started with
``POST /v1/admin/audits`` or ``enclave admin audit``; this page only shows them."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from service import audits as ops
from service.app_state import EngineDep
from service.dashboard.common import AdminPage, bad_page, page_router, render
from service.dashboard.views import page_number, paging
from service.db import transaction

router = page_router()


@router.get("/audits", response_class=HTMLResponse)
def audits(
    request: Request, engine: EngineDep, admin: AdminPage, page: str | None = None
) -> Response:
    number = page_number(page)
    if number is None:
        return bad_page(request, admin, "/dashboard/audits")
    with transaction(engine) as s:
        paged = paging(number, ops.count_audits(s))
        rows = ops.audits_newest_first(s, limit=paged.size, offset=paged.offset)
    return render(
        request,
        "audits.html",
        admin,
        audits=rows,
        paging=paged,
        down=ops.round_down,
        up=ops.round_up,
    )
