"""Signing in and out (an admin API key for a server-side session), and the stylesheet."""

from __future__ import annotations

from typing import Annotated

from fastapi import Cookie, Form, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from service.app_state import EngineDep, LimiterDep, SettingsDep
from service.dashboard.common import COOKIE, COOKIE_PATH, TEMPLATES, AdminForm, page_router, render
from service.dashboard.sessions import close_session, open_session
from service.db import transaction

router = page_router()


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
    limiter: LimiterDep,
    api_key: Annotated[str, Form()] = "",
) -> Response:
    # Every attempt, failed or not, spends a token of the address's sign-in bucket: a
    # burst of ENCLAVE_LOGIN_RATE_LIMIT_BURST, then a slow refill (429 problem+json).
    limiter.take_login(request)
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
