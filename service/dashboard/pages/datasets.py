"""A dataset's page (its accounting, spending chart and caps) and its forms: the budget,
the nominal policy and the analysts' caps."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service import admin as ops
from service.app_state import EngineDep
from service.audit_gate import gate_days, set_audit_gate
from service.dashboard.chart import build_chart
from service.dashboard.common import (
    FORM_ERRORS,
    AdminForm,
    AdminPage,
    BackField,
    done_message,
    page_router,
    refused,
    render,
)
from service.dashboard.views import safe_back
from service.db import transaction
from service.ledger.accounting import accounting_summary, spending_over_time
from service.schemas import BudgetUpdate, CapUpdate, NominalUpdate
from service.schemas.admin import AuditGateUpdate

router = page_router()


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
        holdout_rows = ds.holdout_rows
        audit_gate_days = gate_days(s, ds.id)
    return render(
        request,
        "dataset.html",
        admin,
        a=summary,
        n_rows=n_rows,
        holdout_rows=holdout_rows,
        allow_nominal=allow_nominal,
        audit_gate_days=audit_gate_days,
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


@router.post("/datasets/{name}/audit-gate")
def audit_gate_form(
    request: Request,
    name: str,
    engine: EngineDep,
    admin: AdminForm,
    max_age_days: Annotated[str, Form()] = "",
    back: BackField = None,
) -> Response:
    """The release gate (service/audit_gate.py): a maximum audit age in days, empty: off."""
    page = f"/dashboard/datasets/{quote(name)}"
    try:
        body = AuditGateUpdate.model_validate({"max_age_days": max_age_days.strip() or None})
        with transaction(engine) as s:
            ds = ops.dataset_named(s, name)
            set_audit_gate(s, dataset=ds, max_age_days=body.max_age_days)
    except FORM_ERRORS as exc:
        return refused(request, admin, exc, safe_back(back, page))
    return RedirectResponse(f"{page}?done=audit-gate", status_code=303)


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
