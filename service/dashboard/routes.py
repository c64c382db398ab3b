"""The admin dashboard: budgets, what each composition rule says, jobs and the ledger.

Server-rendered pages without JavaScript. Sign-in exchanges an admin API key for a
server-side session (:mod:`service.dashboard.sessions`); the cookie holds only the session
token. Every POST form carries the session's CSRF token. Every figure comes from the same
query functions as the API (service.ledger.accounting); what each one means, and which are
valid, is said on the page next to it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, get_args
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Cookie, Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from sqlalchemy import select

from service import admin as ops
from service.app_state import EngineDep, LimiterDep, SettingsDep
from service.dashboard.chart import build_chart
from service.dashboard.security import DashboardHeaders
from service.dashboard.sessions import (
    AdminSession,
    close_session,
    csrf_ok,
    open_session,
    session_for_token,
)
from service.dashboard.views import (
    PAGE_SIZE,
    guarantee_label,
    here,
    page_number,
    paging,
    safe_back,
    timestamp,
)
from service.db import transaction
from service.job_pages import BadCursor, JobFilters, count_matching
from service.ledger.accounting import accounting_summary, spending_over_time
from service.ledger.audit import check_totals, verify_all
from service.ledger.checkpoints import verify_incrementally
from service.ledger.errors import InvalidLedgerOperation
from service.ledger.tables import Analyst, Dataset, JobStatus
from service.schemas import (
    AnalystCreate,
    BudgetUpdate,
    CapUpdate,
    KeyRotate,
    NominalUpdate,
    RefundRequest,
)
from service.schemas.common import GUARANTEE_ORDER, Method

TEMPLATES = Path(__file__).resolve().parent / "templates"
templates = Jinja2Templates(directory=str(TEMPLATES))
templates.env.globals.update(
    guarantee_label=guarantee_label,
    here=here,
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
    # Incremental: only the entries after each dataset's latest checkpoint are walked
    # (issue 26; what this can and cannot detect: service/ledger/checkpoints.py). The full
    # walk is /dashboard/verify. The PLD figure is left to each dataset's page: composing
    # every charge takes time proportional to the ledger.
    reports = verify_incrementally(engine)
    with transaction(engine) as s:
        datasets = list(s.scalars(select(Dataset).order_by(Dataset.name)))
        accounting = [accounting_summary(s, ds, compose_pld=False) for ds in datasets]
        rows = {ds.name: ds.n_rows for ds in datasets}
        nominal = {ds.name: ds.allow_nominal for ds in datasets}
    mismatches = [m for r in reports for m in r.mismatches]
    return render(
        request,
        "index.html",
        admin,
        accounting=accounting,
        verified=all(r.ok for r in reports),
        reports=reports,
        mismatches=mismatches,
        rows=rows,
        nominal=nominal,
    )


@router.get("/verify", response_class=HTMLResponse)
def verify_whole_chain(request: Request, engine: EngineDep, admin: AdminPage) -> Response:
    """The full walk ("verify the whole chain"): every entry of every dataset, no
    checkpoint read or written, as GET /v1/admin/ledger/verify and `enclave ledger verify`."""
    started = time.perf_counter()
    with transaction(engine) as s:
        chains = verify_all(s)
        mismatches = check_totals(s)
    return render(
        request,
        "verify.html",
        admin,
        verified=all(c.ok for c in chains) and not mismatches,
        chains=chains,
        mismatches=mismatches,
        seconds=time.perf_counter() - started,
    )


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
            "method": list(get_args(Method)),
            "guarantee": list(GUARANTEE_ORDER),
            "dataset": datasets,
            "analyst": analysts,
        },
        done=done_message(done),
    )


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


# ------------------------------------------------------------------ pages with forms

DONE = {
    "budget": "Budget saved.",
    "nominal": "Nominal policy saved.",
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


@router.get("/datasets/{name}", response_class=HTMLResponse)
def dataset_page(
    request: Request,
    name: str,
    engine: EngineDep,
    admin: AdminPage,
    done: str | None = None,
    scale: str | None = None,
) -> Response:
    if scale not in (None, "", "budget", "spent"):
        return render(
            request,
            "error.html",
            admin,
            status_code=400,
            title="No such scale",
            message="The chart's scale is 'budget' (the whole budget) or 'spent' (zoomed to "
            "what is spent).",
            back=f"/dashboard/datasets/{quote(name)}",
        )
    with transaction(engine) as s:
        try:
            ds = ops.dataset_named(s, name)
        except ops.NotFound as exc:
            return refused(request, admin, exc, "/dashboard")
        summary = accounting_summary(s, ds)
        points = spending_over_time(s, ds)
        overview = ops.analysts_overview(s)
        caps = [(row.name, sp) for row in overview for sp in row.spending if sp.dataset == name]
        n_rows, allow_nominal = ds.n_rows, ds.allow_nominal
    return render(
        request,
        "dataset.html",
        admin,
        a=summary,
        n_rows=n_rows,
        allow_nominal=allow_nominal,
        chart=build_chart(
            points, epsilon_total=summary.epsilon_total, zoom_to_spent=scale == "spent"
        ),
        zoomed=scale == "spent",
        points=points,
        analysts=[row.name for row in overview],
        caps=caps,
        done=done_message(done),
    )


@router.post("/datasets/{name}/budget")
def budget_form(
    request: Request,
    name: str,
    engine: EngineDep,
    admin: AdminForm,
    epsilon_total: Annotated[str, Form()] = "",
    delta_total: Annotated[str, Form()] = "",
    back: BackField = None,
) -> Response:
    page = f"/dashboard/datasets/{quote(name)}"
    try:
        body = BudgetUpdate.model_validate(
            {"epsilon_total": epsilon_total, "delta_total": delta_total}
        )
        with transaction(engine) as s:
            ops.update_budget(s, name, body)
    except FORM_ERRORS as exc:
        return refused(request, admin, exc, safe_back(back, page))
    return RedirectResponse(f"{page}?done=budget", status_code=303)


@router.post("/datasets/{name}/nominal")
def nominal_form(
    request: Request,
    name: str,
    engine: EngineDep,
    admin: AdminForm,
    allow_nominal: Annotated[str, Form()] = "",
    back: BackField = None,
) -> Response:
    page = f"/dashboard/datasets/{quote(name)}"
    try:
        body = NominalUpdate.model_validate({"allow_nominal": allow_nominal})
        with transaction(engine) as s:
            ops.set_nominal(s, name, allow_nominal=body.allow_nominal)
    except FORM_ERRORS as exc:
        return refused(request, admin, exc, safe_back(back, page))
    return RedirectResponse(f"{page}?done=nominal", status_code=303)


@router.post("/datasets/{name}/caps")
def cap_form(
    request: Request,
    name: str,
    engine: EngineDep,
    admin: AdminForm,
    analyst: Annotated[str, Form()] = "",
    epsilon: Annotated[str, Form()] = "",
    delta: Annotated[str, Form()] = "",
    back: BackField = None,
) -> Response:
    page = f"/dashboard/datasets/{quote(name)}"
    try:
        body = CapUpdate.model_validate({"epsilon": epsilon, "delta": delta})
        with transaction(engine) as s:
            ops.update_cap(s, name, analyst, body)
    except FORM_ERRORS as exc:
        return refused(request, admin, exc, safe_back(back, page))
    return RedirectResponse(f"{page}?done=cap", status_code=303)


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
