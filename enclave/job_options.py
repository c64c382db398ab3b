"""The job-listing filters' command-line options, shared by `enclave admin jobs`
(enclave/admin_jobs.py) and the analyst's `enclave jobs list` (enclave/jobs_cli.py): the
same filters as ``GET /v1/jobs`` and ``GET /v1/admin/jobs`` (service/job_pages.py)."""

from __future__ import annotations

from typing import Annotated

import typer

CursorOpt = Annotated[
    str | None,
    typer.Option(help="Start after this cursor (printed under the previous page)."),
]
EveryOpt = Annotated[bool, typer.Option("--all", help="Every matching job: all pages, one table.")]
StatusOpt = Annotated[
    str | None, typer.Option(help="queued, running, released, failed or cancelled.")
]
MethodFilterOpt = Annotated[str | None, typer.Option(help="dpsgd, expm, expm_nf or selection.")]
GuaranteeOpt = Annotated[
    str | None, typer.Option(help="The plan's: proven, asymptotic or nominal.")
]
CreatedAfterOpt = Annotated[str | None, typer.Option(help="ISO 8601, inclusive (no offset: UTC).")]
CreatedBeforeOpt = Annotated[str | None, typer.Option(help="ISO 8601, exclusive (no offset: UTC).")]
