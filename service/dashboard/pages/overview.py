"""The home page (every dataset's budget, incrementally verified) and the full chain walk."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import select

from service.app_state import EngineDep
from service.dashboard.common import AdminPage, page_router, render
from service.db import transaction
from service.ledger.accounting import accounting_summary
from service.ledger.audit import check_totals, verify_all
from service.ledger.checkpoints import verify_incrementally
from service.ledger.tables import Dataset

router = page_router()


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
