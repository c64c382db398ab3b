"""`enclave admin jobs`: every analyst's jobs, filtered and paged by cursor, read from the
ledger database with the same query as ``GET /v1/admin/jobs`` (service/job_pages.py)."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from enclave.errors import fail
from enclave.privacy_text import privacy_number
from service import admin as ops
from service.config import get_settings
from service.db import engine_for, transaction
from service.job_pages import MAX_LIMIT, BadCursor, JobFilters

console = Console()


def admin_jobs(
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_LIMIT, help="Jobs a page (newest first).")
    ] = 50,
    cursor: Annotated[
        str | None,
        typer.Option(help="Start after this cursor (printed under the previous page)."),
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every matching job: all pages, one table.")
    ] = False,
    status: Annotated[
        str | None, typer.Option(help="queued, running, released, failed or cancelled.")
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="Dataset name.")] = None,
    method: Annotated[str | None, typer.Option(help="dpsgd, expm, expm_nf or selection.")] = None,
    guarantee: Annotated[
        str | None, typer.Option(help="The plan's: proven, asymptotic or nominal.")
    ] = None,
    analyst: Annotated[str | None, typer.Option(help="Analyst name.")] = None,
    created_after: Annotated[
        str | None, typer.Option(help="ISO 8601, inclusive (no offset: UTC).")
    ] = None,
    created_before: Annotated[
        str | None, typer.Option(help="ISO 8601, exclusive (no offset: UTC).")
    ] = None,
) -> None:
    """Every analyst's jobs, newest first, with the failure reason the worker recorded
    (the detail stays in the worker's log) and whether a failed job was refunded. Filters
    combine; without --all, the next page's cursor is printed under the table."""
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
    names = ("job", "analyst", "dataset", "method", "status", "steps", "ε", "failure")
    # Fold, never truncate: an admin copies the job id into `admin refund`.
    columns = [Column(n, overflow="fold") for n in names]
    table = Table(*columns, title="Jobs, newest first")
    for row in rows:
        j = row.job
        failure = (j.error or "") + (" (refunded)" if row.refunded else "")
        table.add_row(
            j.id, row.analyst, j.dataset, j.method, str(j.status),
            f"{j.progress_step}/{j.progress_total}", privacy_number(j.epsilon), escape(failure),
        )  # fmt: skip
    console.print(table)
    if cursor is not None:
        console.print(f"more jobs: --cursor {cursor}", soft_wrap=True)
