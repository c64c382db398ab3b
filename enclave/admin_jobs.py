"""`enclave admin jobs`: every analyst's jobs, filtered and paged by cursor, read from the
ledger database with the same query as ``GET /v1/admin/jobs`` (service/job_pages.py);
`enclave admin job`: one job (``GET /v1/admin/jobs/{job_id}``). Both show what the worker
recorded of the run (stage reached, whether the private rows were read, failure category),
which the analyst's views never show."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from enclave.errors import fail
from enclave.job_options import (
    CreatedAfterOpt,
    CreatedBeforeOpt,
    CursorOpt,
    EveryOpt,
    GuaranteeOpt,
    MethodFilterOpt,
    StatusOpt,
)
from enclave.privacy_text import privacy_number
from service import admin as ops
from service.config import get_settings
from service.db import engine_for, transaction
from service.job_pages import MAX_LIMIT, BadCursor, JobFilters
from service.schemas import AdminJob

console = Console()


def data_read_text(job: AdminJob) -> str:
    """The worker's record of whether the job read the private rows."""
    return {True: "yes", False: "no", None: "not recorded"}[job.data_read]


def admin_jobs(
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_LIMIT, help="Jobs a page (newest first).")
    ] = 50,
    cursor: CursorOpt = None,
    every: EveryOpt = False,
    status: StatusOpt = None,
    dataset: Annotated[str | None, typer.Option(help="Dataset name.")] = None,
    method: MethodFilterOpt = None,
    guarantee: GuaranteeOpt = None,
    analyst: Annotated[str | None, typer.Option(help="Analyst name.")] = None,
    created_after: CreatedAfterOpt = None,
    created_before: CreatedBeforeOpt = None,
) -> None:
    """Every analyst's jobs, newest first, with the stage each reached, whether it read the
    private rows, the failure category and reason the worker recorded (the detail stays in
    the worker's log) and whether a failed job was refunded. Filters combine; without
    --all, the next page's cursor is printed under the table."""
    values = {"status": status, "dataset": dataset, "method": method, "guarantee": guarantee}
    values |= {"analyst": analyst, "created_after": created_after}
    values |= {"created_before": created_before}
    try:
        filters = JobFilters.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"--{where.replace('_', '-')}: {first['msg']} (got {first.get('input')!r})")
    engine = engine_for(get_settings().resolved_database_url)
    rows: list[ops.JobRow] = []
    while True:
        try:
            with transaction(engine) as s:
                page = ops.jobs_page(s, filters, limit=limit, cursor=cursor)
        except BadCursor as exc:
            fail(f"--cursor: {exc}")
        rows += page.rows
        cursor = page.next_cursor
        if not every or cursor is None:
            break
    names = ["job", "analyst", "dataset", "method", "status", "stage", "read data", "steps", "ε"]
    names += ["category", "failure"]
    # Fold, never truncate: an admin copies the job id into `admin refund`.
    columns = [Column(n, overflow="fold") for n in names]
    table = Table(*columns, title="Jobs, newest first")
    for row in rows:
        j = row.job
        failure = (j.error or "") + (" (refunded)" if row.refunded else "")
        table.add_row(
            j.id, row.analyst, j.dataset, j.method, str(j.status), j.stage_reached or "",
            data_read_text(j), f"{j.progress_step}/{j.progress_total}",
            privacy_number(j.epsilon), j.failure_category or "", escape(failure),
        )  # fmt: skip
    console.print(table)
    if cursor is not None:
        console.print(f"more jobs: --cursor {cursor}", soft_wrap=True)


def admin_job(job_id: str) -> None:
    """One job of any analyst: its plan's charge, status, the stage it reached, whether it
    read the private rows (recorded by the worker just before the first read: a failed job
    that did keeps its charge, and `admin refund` then needs --override), the failure
    category (from the error's type) and reason; the detail stays in the worker's log."""
    engine = engine_for(get_settings().resolved_database_url)
    try:
        with transaction(engine) as s:
            row = ops.job_row(s, job_id)
    except ops.NotFound as exc:
        fail(str(exc))
    j = row.job
    failure = (j.error or "") + (" (refunded)" if row.refunded else "")
    table = Table("", Column("", overflow="fold"), show_header=False, title=f"Job {j.id}")
    for name, value in (
        ("analyst", row.analyst),
        ("dataset", j.dataset),
        ("method", j.method),
        ("ε, δ", f"{privacy_number(j.epsilon)}, {privacy_number(j.delta)}"),
        ("status", str(j.status)),
        ("stage reached", j.stage_reached or "not recorded"),
        ("read private rows", data_read_text(j)),
        ("failure category", j.failure_category or ""),
        ("failure", failure),
        ("steps", f"{j.progress_step}/{j.progress_total}"),
        ("created", j.created_at.isoformat()),
        ("finished", j.finished_at.isoformat() if j.finished_at else ""),
    ):
        table.add_row(name, escape(str(value)))
    console.print(table)
