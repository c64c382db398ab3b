"""The admin dashboard: budgets, what each composition rule says, jobs and the ledger.

Sign-in exchanges an admin API key for an HttpOnly, SameSite=Strict cookie holding it.
Every figure comes from the same query functions as the API (service.ledger.accounting);
what each one means, and which are valid, is said on the page next to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Cookie, Form, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from service.api.deps import EngineDep
from service.auth import analyst_for_key
from service.db import transaction
from service.jobs import job_public
from service.ledger.accounting import accounting_summary, latest_ledger_entries
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import Analyst, Dataset, Job, Role

TEMPLATES = Path(__file__).resolve().parent / "templates"
templates = Jinja2Templates(directory=str(TEMPLATES))
router = APIRouter(prefix="/dashboard", include_in_schema=False)
COOKIE = "enclave_admin"


def _admin(engine: EngineDep, key: str | None) -> Analyst | None:
    if not key:
        return None
    with transaction(engine) as s:
        a = analyst_for_key(s, key)
        return a if a is not None and a.role == Role.admin else None


@router.get("/style.css")
def style() -> PlainTextResponse:
    return PlainTextResponse((TEMPLATES / "style.css").read_text(), media_type="text/css")


@router.get("", response_class=HTMLResponse)
def index(
    request: Request, engine: EngineDep, enclave_admin: Annotated[str | None, Cookie()] = None
) -> Response:
    admin = _admin(engine, enclave_admin)
    if admin is None:
        return templates.TemplateResponse(request, "login.html", {"error": None})
    with transaction(engine) as s:
        datasets = list(s.scalars(select(Dataset).order_by(Dataset.name)))
        accounting = [accounting_summary(s, ds) for ds in datasets]
        jobs = [
            job_public(j, n)
            for j, n in s.execute(
                select(Job, Dataset.name)
                .join(Dataset, Dataset.id == Job.dataset_id)
                .order_by(Job.created_at.desc())
                .limit(50)
            ).all()
        ]
        verified = all(r.ok for r in verify_all(s)) and not check_totals(s)
        rows = {ds.name: ds.n_rows for ds in datasets}
        nominal = {ds.name: ds.allow_nominal for ds in datasets}
        entries = latest_ledger_entries(s, limit=50)
    return templates.TemplateResponse(
        request,
        "index.html",
        {
            "admin": admin.name,
            "accounting": accounting,
            "jobs": jobs,
            "entries": entries,
            "verified": verified,
            "rows": rows,
            "nominal": nominal,
        },
    )


@router.post("/login")
def login(
    request: Request, engine: EngineDep, api_key: Annotated[str, Form(max_length=200)]
) -> Response:
    if _admin(engine, api_key) is None:
        return templates.TemplateResponse(
            request, "login.html", {"error": "not an admin key"}, status_code=401
        )
    resp = RedirectResponse("/dashboard", status_code=303)
    resp.set_cookie(
        COOKIE, api_key, httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return resp


@router.post("/logout")
def logout() -> Response:
    resp = RedirectResponse("/dashboard", status_code=303)
    resp.delete_cookie(COOKIE)
    return resp
