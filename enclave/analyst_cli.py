"""The analyst's dataset and cancel commands (issue 26), over HTTP like the rest of
`enclave jobs` (:mod:`enclave.jobs_cli`: ENCLAVE_URL, ENCLAVE_API_KEY, one ``error:``
line and exit 1 for any error).

``enclave datasets`` is the admin's group (the ledger database), so the analyst's view is
``enclave jobs datasets list`` / ``enclave jobs datasets show NAME`` (GET /v1/datasets);
``enclave jobs cancel ID`` is POST /v1/jobs/{id}/cancel.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from enclave.jobs_cli import DEFAULT_URL, Api, JobId, Key, Url, console
from enclave.privacy_text import REMAINING_EXPLANATION, privacy_number

__all__ = ["add_analyst_commands", "cancel", "datasets_app"]

datasets_app = typer.Typer(
    help="Analysts: the datasets you may use, their public schema and remaining budgets.",
    no_args_is_help=True,
)


def _remaining(view: dict[str, Any] | None) -> str:
    if view is None:
        return "no cap"
    return (
        f"{privacy_number(view['remaining_epsilon'], down=True)} of ε "
        f"{privacy_number(view['epsilon_total'])}"
    )


def _columns(schema: dict[str, Any]) -> str:
    columns = schema.get("columns")
    if not isinstance(columns, list):
        return ""
    return ", ".join(str(c.get("name")) for c in columns if isinstance(c, dict))


@datasets_app.command("list")
def datasets_list(url: Url = DEFAULT_URL, key: Key = None) -> None:
    """The datasets (GET /v1/datasets): public row count, rule, remaining ε of the
    dataset's budget and of your cap (the ε of one further pure request)."""
    rows = Api(url, key).json("GET", "/v1/datasets")
    names = ("kind", "public rows (noisy)", "holdout", "rule", "ε total", "δ total")
    table = Table("dataset", *names, "remaining ε", "your cap: remaining ε", "nominal ok")
    for ds in rows:
        b = ds["budget"]
        table.add_row(
            escape(ds["name"]), escape(str(ds["public_schema"].get("kind", ""))),
            str(ds["n_rows"]), str(ds.get("holdout_rows") or "-"), b["rule"],
            privacy_number(b["epsilon_total"]),
            privacy_number(b["delta_total"]), privacy_number(b["remaining_epsilon"], down=True),
            _remaining(ds.get("analyst_budget")), "yes" if ds["allow_nominal"] else "no",
        )  # fmt: skip
    console.print(table)
    if any(ds["budget"]["rule"] == "rdp" for ds in rows):
        console.print(REMAINING_EXPLANATION, soft_wrap=True)


def _budget_rows(table: Table, label: str, view: dict[str, Any] | None) -> None:
    if view is None:
        table.add_row(label, "no cap on this dataset")
        return
    guarantee = f"({privacy_number(view['epsilon_total'])}, {privacy_number(view['delta_total'])})"
    table.add_row(label, f"{view['rule']} rule, guarantee (ε, δ) = {guarantee}")
    table.add_row("  Σε charged", privacy_number(view["spent_epsilon_sum"]))
    table.add_row("  ε spent (valid)", privacy_number(view["epsilon_spent"]))
    table.add_row("  remaining ε", privacy_number(view["remaining_epsilon"], down=True))


@datasets_app.command("show")
def datasets_show(
    name: Annotated[str, typer.Argument(help="The dataset's name.")],
    url: Url = DEFAULT_URL,
    key: Key = None,
    schema: Annotated[
        bool, typer.Option("--schema", help="Print the whole public schema as JSON too.")
    ] = False,
) -> None:
    """One dataset (GET /v1/datasets/NAME): its public facts, the dataset's budget and
    your cap, and (--schema) the public schema requests are validated against."""
    ds = Api(url, key).json("GET", f"/v1/datasets/{name}")
    public = ds["public_schema"]
    table = Table("", "", title=f"Dataset {escape(ds['name'])}", show_header=False)
    count = ds.get("count_epsilon")
    noisy = "exact (registered before noisy counts)" if count is None else (
        f"DP noisy count, ε = {privacy_number(count)} charged at registration"
    )  # fmt: skip
    table.add_row("public rows", f"{ds['n_rows']} ({noisy})")
    if ds.get("holdout_rows") is not None:
        table.add_row(
            "evaluation holdout",
            f"{ds['holdout_rows']} rows (public; read only by evaluations, not counted above)",
        )
    table.add_row("kind", escape(str(public.get("kind", ""))))
    table.add_row("columns", escape(_columns(public)))
    target = public.get("target")
    if isinstance(target, dict) and "column" in target:
        table.add_row("target", escape(str(target["column"])))
    table.add_row("nominal methods", "allowed" if ds["allow_nominal"] else "refused")
    guarantee = ds["budget"].get("guarantee")
    if guarantee:
        table.add_row("guarantee", str(guarantee).upper())
    _budget_rows(table, "dataset budget", ds["budget"])
    _budget_rows(table, "your cap", ds.get("analyst_budget"))
    console.print(table)
    views = (ds["budget"], ds.get("analyst_budget"))
    if any(v and v["rule"] == "rdp" for v in views):
        console.print(REMAINING_EXPLANATION, soft_wrap=True)
    if schema:
        typer.echo(json.dumps(public, indent=2))


def cancel(job_id: JobId, url: Url = DEFAULT_URL, key: Key = None) -> None:
    """Cancel a queued job (POST /v1/jobs/ID/cancel): it is refunded, as no private row
    was read. A job that already started cannot be cancelled (one error line, exit 1)."""
    job = Api(url, key).json("POST", f"/v1/jobs/{job_id}/cancel")
    console.print(
        f"job {job['id']} {job['status']}: ε = {privacy_number(job['epsilon'])}, "
        f"δ = {privacy_number(job['delta'])} refunded (no private row was read)",
        soft_wrap=True,
    )


def add_analyst_commands(jobs_app: typer.Typer) -> None:
    """Register `datasets` (list, show) and `cancel` under `enclave jobs`."""
    jobs_app.add_typer(datasets_app, name="datasets")
    jobs_app.command("cancel")(cancel)
