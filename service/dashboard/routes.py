"""The admin dashboard: budgets, what each composition rule says, jobs and the ledger.

Server-rendered pages without JavaScript. Sign-in exchanges an admin API key for a
server-side session (:mod:`service.dashboard.sessions`); the cookie holds only the session
token. Every POST form carries the session's CSRF token. Every figure comes from the same
query functions as the API (service.ledger.accounting); what each one means, and which are
valid, is said on the page next to it.

The pages are in :mod:`service.dashboard.pages` (one module per concept), what they share in
:mod:`service.dashboard.common`; this module gathers them into the one router the app
includes (each page's router has the ``/dashboard`` prefix).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from service.dashboard.common import CsrfRefused, SignInRequired, render
from service.dashboard.pages import analysts, audits, datasets, jobs, ledger, overview, session
from service.dashboard.security import DashboardHeaders

router = APIRouter(include_in_schema=False)
for page in (session, overview, jobs, ledger, audits, datasets, analysts):
    router.include_router(page.router)


def install(app: FastAPI) -> None:
    """Wire the dashboard into the API app: routes, sign-in redirects, CSRF refusals and
    the security headers."""
    app.include_router(router)

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        return RedirectResponse("/dashboard/login", status_code=303)

    @app.exception_handler(CsrfRefused)
    async def _csrf(request: Request, exc: CsrfRefused) -> Response:
        return render(
            request,
            "error.html",
            None,
            status_code=403,
            title="Form refused",
            message="The form's security token is missing or out of date. Nothing was "
            "changed; reload the page and try again.",
        )

    app.add_middleware(DashboardHeaders)  # type: ignore[arg-type]
