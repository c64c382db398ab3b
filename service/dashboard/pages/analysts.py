"""The analysts page and its forms: a new analyst, a new key, a revoked key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

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
from service.dashboard.views import safe_back
from service.db import transaction
from service.schemas import AnalystCreate, KeyRotate

router = page_router()


@router.get("/analysts", response_class=HTMLResponse)
def analysts_page(
    request: Request, engine: EngineDep, admin: AdminPage, done: str | None = None
) -> Response:
    with transaction(engine) as s:
        rows = ops.analysts_overview(s)
    return render(request, "analysts.html", admin, rows=rows, done=done_message(done))


@router.post("/analysts")
def create_analyst_form(
    request: Request,
    engine: EngineDep,
    admin: AdminForm,
    name: Annotated[str, Form()] = "",
    role: Annotated[str, Form()] = "analyst",
    expires_in_days: Annotated[str | None, Form()] = None,
    back: BackField = None,
) -> Response:
    try:
        body = AnalystCreate.model_validate(
            {"name": name, "role": role, "expires_in_days": blank_is_none(expires_in_days)}
        )
        with transaction(engine) as s:
            created = ops.create_analyst(s, body)
    except FORM_ERRORS as exc:
        return refused(request, admin, exc, safe_back(back, "/dashboard/analysts"))
    return render(request, "key.html", admin, created=created, action="created")


@router.post("/analysts/{name}/rotate")
def rotate_key_form(
    request: Request,
    name: str,
    engine: EngineDep,
    admin: AdminForm,
    expires_in_days: Annotated[str | None, Form()] = None,
    no_expiry: Annotated[str | None, Form()] = None,
    back: BackField = None,
) -> Response:
    """A new key; a blank lifetime keeps the current key's expiry (service.admin's
    rotated_key_expiry), the "no expiry" box removes it."""
    try:
        body = KeyRotate.model_validate(
            {"expires_in_days": blank_is_none(expires_in_days), "no_expiry": no_expiry == "true"}
        )
        with transaction(engine) as s:
            created = ops.rotate_analyst_key(s, name, body)
    except FORM_ERRORS as exc:
        return refused(request, admin, exc, safe_back(back, "/dashboard/analysts"))
    return render(request, "key.html", admin, created=created, action="rotated")


@router.post("/analysts/{name}/revoke")
def revoke_key_form(
    request: Request,
    name: str,
    engine: EngineDep,
    admin: AdminForm,
    confirm: Annotated[str | None, Form()] = None,
    back: BackField = None,
) -> Response:
    """Two steps: the analysts page's button asks (a page with a second form, nothing
    revoked); that form, with ``confirm=yes``, revokes. Both refuse the last live admin
    key (409)."""
    page = safe_back(back, "/dashboard/analysts")
    try:
        with transaction(engine) as s:
            if confirm != "yes":
                analyst = ops.revocable_analyst(s, name)
                role, own_key = analyst.role, analyst.name == admin.admin
            else:
                ops.revoke_analyst_key(s, name)
    except FORM_ERRORS as exc:
        return refused(request, admin, exc, page)
    if confirm != "yes":
        return render(
            request,
            "revoke.html",
            admin,
            name=name,
            role=role,
            own_key=own_key,
            back=page,
        )
    return RedirectResponse("/dashboard/analysts?done=revoked", status_code=303)
