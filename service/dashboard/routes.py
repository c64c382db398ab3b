"""The admin dashboard: budgets, what each composition rule says, jobs and the ledger.

Server-rendered pages without JavaScript. Sign-in exchanges an admin API key for a
server-side session (:mod:`service.dashboard.sessions`); the cookie holds only the session
token. Every POST form carries the session's CSRF token. Every figure comes from the same
query functions as the API (service.ledger.accounting); what each one means, and which are
valid, is said on the page next to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from service import admin as ops
from service.api.deps import EngineDep, SettingsDep
from service.dashboard.security import DashboardHeaders
from service.dashboard.sessions import (
    AdminSession,
    close_session,
    csrf_ok,
    open_session,
    session_for_token,
)
from service.dashboard.views import (
    guarantee_label,
    page_number,
    paging,
    signed_delta,
    timestamp,
)
from service.db import transaction
from service.ledger.accounting import accounting_summary
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import Dataset

TEMPLATES = Path(__file__).resolve().parent / "templates"
templates = Jinja2Templates(directory=str(TEMPLATES))
templates.env.globals.update(
    guarantee_label=guarantee_label,
    signed_delta=signed_delta,
    timestamp=timestamp,
)
router = APIRouter(prefix="/dashboard", include_in_schema=False)
COOKIE = "enclave_session"
COOKIE_PATH = "/dashboard"


class SignInRequired(Exception):
    """No live session: the page answers with a redirect to the sign-in form."""


class CsrfRefused(Exception):
    """A POST without the session's CSRF token: 403, nothing done."""


def current_admin(
    engine: EngineDep, enclave_session: Annotated[str | None, Cookie()] = None
) -> AdminSession:
    with transaction(engine) as s:
        admin = session_for_token(s, enclave_session)
    if admin is None:
        raise SignInRequired
    return admin


AdminPage = Annotated[AdminSession, Depends(current_admin)]


def checked_form(admin: AdminPage, csrf: Annotated[str | None, Form()] = None) -> AdminSession:
    """The session of a POST form whose CSRF token matches it (else 403)."""
    if not csrf_ok(admin, csrf):
        raise CsrfRefused
    return admin


AdminForm = Annotated[AdminSession, Depends(checked_form)]


def render(
    request: Request,
    template: str,
    admin: AdminSession | None,
    status_code: int = 200,
    **context: Any,
) -> Response:
    return templates.TemplateResponse(
        request,
        template,
        {"admin": admin, **context},
        status_code=status_code,
    )


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


@router.get("/style.css")
def style() -> PlainTextResponse:
    return PlainTextResponse((TEMPLATES / "style.css").read_text(), media_type="text/css")


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> Response:
    return render(request, "login.html", None, error=None)


@router.post("/login")
def login(
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    api_key: Annotated[str, Form()] = "",
) -> Response:
    with transaction(engine) as s:
        token = open_session(s, api_key, ttl_s=settings.dashboard_session_ttl_s)
    if token is None:
        return render(request, "login.html", None, status_code=401, error="not an admin key")
    resp = RedirectResponse("/dashboard", status_code=303)
    resp.set_cookie(
        COOKIE,
        token,
        max_age=int(settings.dashboard_session_ttl_s),
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return resp


@router.post("/logout")
def logout(
    engine: EngineDep,
    _: AdminForm,
    enclave_session: Annotated[str | None, Cookie()] = None,
) -> Response:
    with transaction(engine) as s:
        close_session(s, enclave_session)
    resp = RedirectResponse("/dashboard/login", status_code=303)
    resp.delete_cookie(COOKIE, path=COOKIE_PATH)
    return resp


def bad_page(request: Request, admin: AdminSession, back: str) -> Response:
    return render(
        request,
        "error.html",
        admin,
        status_code=400,
        title="No such page",
        message="The page number must be a whole number from 1 up.",
        back=back,
    )


@router.get("", response_class=HTMLResponse)
def index(request: Request, engine: EngineDep, admin: AdminPage) -> Response:
    with transaction(engine) as s:
        datasets = list(s.scalars(select(Dataset).order_by(Dataset.name)))
        accounting = [accounting_summary(s, ds) for ds in datasets]
        verified = all(r.ok for r in verify_all(s)) and not check_totals(s)
        rows = {ds.name: ds.n_rows for ds in datasets}
        nominal = {ds.name: ds.allow_nominal for ds in datasets}
    return render(
        request,
        "index.html",
        admin,
        accounting=accounting,
        verified=verified,
        rows=rows,
        nominal=nominal,
    )


@router.get("/jobs", response_class=HTMLResponse)
def jobs(
    request: Request, engine: EngineDep, admin: AdminPage, page: str | None = None
) -> Response:
    number = page_number(page)
    if number is None:
        return bad_page(request, admin, "/dashboard/jobs")
    with transaction(engine) as s:
        paged = paging(number, ops.count_jobs(s))
        rows = ops.jobs_newest_first(s, limit=paged.size, offset=paged.offset)
    return render(request, "jobs.html", admin, rows=rows, paging=paged)


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
