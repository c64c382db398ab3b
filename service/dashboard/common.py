"""What every dashboard page shares: the templates, the signed-in admin (a page's and a
POST form's dependency), rendering, and the refusal pages.

The pages themselves are in :mod:`service.dashboard.pages`; :mod:`service.dashboard.routes`
gathers them into the one router the app includes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, Form, Request
from fastapi.responses import Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from service import admin as ops
from service.app_state import EngineDep
from service.dashboard.sessions import AdminSession, csrf_ok, session_for_token
from service.dashboard.views import estimate_text, guarantee_label, here, timestamp
from service.db import transaction
from service.ledger.errors import InvalidLedgerOperation

TEMPLATES = Path(__file__).resolve().parent / "templates"
templates = Jinja2Templates(directory=str(TEMPLATES))
templates.env.globals.update(
    estimate_text=estimate_text,
    guarantee_label=guarantee_label,
    here=here,
    timestamp=timestamp,
)
PREFIX = "/dashboard"
COOKIE = "enclave_session"
COOKIE_PATH = "/dashboard"


def page_router() -> APIRouter:
    """A page module's router: every dashboard path is under :data:`PREFIX`, none is in the
    OpenAPI schema. (The prefix is here, not on the router that includes the pages: the home
    page's path is the bare prefix, and FastAPI refuses an empty path on a prefixless
    router.)"""
    return APIRouter(prefix=PREFIX, include_in_schema=False)


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


# ------------------------------------------------------------------ pages with forms

DONE = {
    "budget": "Budget saved.",
    "nominal": "Nominal policy saved.",
    "audit-gate": "Release gate saved.",
    "cap": "Cap saved.",
    "revoked": "Key revoked: it authenticates nobody from now on.",
    "refund": "Refund recorded in the ledger.",
    "refund_information_only": "Information-only refund recorded in the ledger: the job had "
    "read private rows, so its charge stays and no budget came back.",
}


def done_message(done: str | None) -> str | None:
    return DONE.get(done or "")


def refused(request: Request, admin: AdminSession, exc: Exception, back: str) -> Response:
    """A refused form: what was wrong, nothing changed, a 4xx page."""
    if isinstance(exc, ValidationError):
        detail = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'form'}: {e['msg']}" for e in exc.errors()
        )
        status, title = 422, "Invalid form"
    elif isinstance(exc, ops.NotFound):
        detail, status, title = str(exc), 404, "Not found"
    else:
        detail, status, title = str(exc), 409, "Refused"
    return render(
        request,
        "error.html",
        admin,
        status_code=status,
        title=title,
        message=f"Nothing was changed: {detail}",
        back=back,
    )


FORM_ERRORS = (ValidationError, ops.NotFound, InvalidLedgerOperation)
#: Every form's hidden field naming the page it was on (path and query; templates fill it
#: with ``here(...)``), for the Back link of a refusal: :func:`safe_back` checks it.
BackField = Annotated[str | None, Form()]


def blank_is_none(value: str | None) -> str | None:
    return None if value is None or not value.strip() else value.strip()
