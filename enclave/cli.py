"""The `enclave` command: the admin's and operator's entry point.

`enclave` is the composition root: it may import both the service and the worker. The
service itself never imports the worker (checked by import-linter in the tests).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.auth import expiry, hash_api_key, new_api_key, revoke_key, rotate_key
from service.config import get_settings
from service.dataschema import SchemaError, TabularSchema, ValidationReport, load_schema_yaml
from service.db import engine_for, transaction
from service.ledger.admission import (
    InvalidLedgerOperation,
    dataset_filter,
    set_analyst_cap,
    set_dataset_budget,
)
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import Analyst, Dataset, LedgerEntry, Role
from service.migrate import upgrade
from service.privacy.amounts import from_micro

app = typer.Typer(
    help="Private-data enclave: train models under a differential-privacy budget.",
    no_args_is_help=True,
)
db_app = typer.Typer(help="The ledger database.", no_args_is_help=True)
datasets_app = typer.Typer(help="Datasets (inside the enclave).", no_args_is_help=True)
analysts_app = typer.Typer(help="Analysts and API keys.", no_args_is_help=True)
ledger_app = typer.Typer(help="The privacy ledger.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(datasets_app, name="datasets")
app.add_typer(analysts_app, name="analysts")
app.add_typer(ledger_app, name="ledger")

console = Console()


def _engine():  # type: ignore[no-untyped-def]
    return engine_for(get_settings().resolved_database_url)


def _home() -> None:
    get_settings().home.mkdir(parents=True, exist_ok=True)


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply the Alembic migrations (the only way the schema changes)."""
    _home()
    upgrade(get_settings().resolved_database_url, revision)
    console.print(f"ledger database at revision {revision}")


def _schema_from(path: Path) -> TabularSchema:
    """The public schema in ``path``, or one line and exit 2 (never a traceback)."""
    try:
        return load_schema_yaml(path.read_text())
    except (SchemaError, UnicodeError) as exc:
        console.print(f"[red]schema error:[/red] {escape(f'{path.name}: {exc}')}", soft_wrap=True)
        raise typer.Exit(2) from exc


def _print_report(report: ValidationReport) -> None:
    """The validation report of private rows: printed to the admin's terminal inside the
    enclave only (exact counts are not public). Registration and `check` both use it."""
    for line in report.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True)


CsvOption = Annotated[Path, typer.Option(exists=True, dir_okay=False, help="The private rows.")]
SchemaOption = Annotated[
    Path, typer.Option(exists=True, dir_okay=False, help="Public schema YAML (docs/schema.md).")
]


@datasets_app.command("check")
def datasets_check(csv: CsvOption, schema: SchemaOption) -> None:
    """Dry run: parse the schema, read the CSV with its csv options and report rejected and
    clipped rows per column and reason. Registers nothing and never opens the ledger."""
    from worker.data import CsvReadError, prepare_csv

    parsed = _schema_from(schema)
    try:
        report = prepare_csv(parsed, csv).report
    except CsvReadError as exc:
        console.print(f"[red]refused:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from exc
    console.print(f"schema {parsed.name!r}: {parsed.n_features} encoded features")
    _print_report(report)
    console.print("(exact counts: shown here, inside the enclave, only; nothing was registered)")
    if report.rows_kept == 0:
        raise typer.Exit(1)


@datasets_app.command("register")
def datasets_register(
    name: Annotated[str, typer.Argument(help="Must equal the schema's name.")],
    csv: CsvOption,
    schema: SchemaOption,
    epsilon: Annotated[float, typer.Option(min=0.0, help="ε_total in nats.")],
    delta: Annotated[float, typer.Option(min=0.0, max=0.999, help="δ_total (0: pure-DP only).")],
    allow_nominal: Annotated[
        bool, typer.Option(help="Allow methods whose ε is not proven (nominal or asymptotic).")
    ] = False,
    count_epsilon: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help=(
                "ε (nats) of the DP noisy row count released at registration and charged to "
                "the budget; default: 1% of ε_total, at most 0.1."
            ),
        ),
    ] = None,
) -> None:
    """Register a dataset: validate its rows against the public schema, set its budget and
    release a DP noisy row count (the only row count anyone outside the enclave sees)."""
    from worker.registration import RegistrationError, register_dataset

    parsed = _schema_from(schema)
    if parsed.name != name:
        raise typer.BadParameter(f"the schema is named {parsed.name!r}, not {name!r}")
    try:
        reg = register_dataset(
            _engine(),
            get_settings(),
            schema=parsed,
            csv_path=csv,
            epsilon_total=epsilon,
            delta_total=delta,
            allow_nominal=allow_nominal,
            count_epsilon=count_epsilon,
        )
    except RegistrationError as exc:
        if exc.report is not None:
            _print_report(exc.report)
        console.print(f"[red]refused:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from exc
    console.print(f"registered {name} (exact counts: shown here, inside the enclave, only)")
    _print_report(reg.report)
    console.print(
        f"public row count: {reg.noisy_n_rows} (DP noisy count, ε = {reg.count_epsilon:g}, "
        "charged to the dataset's budget; plans use only this)"
    )
    if reg.warning:
        console.print(f"[yellow]warning:[/yellow] {escape(reg.warning)}", soft_wrap=True)


@datasets_app.command("budget")
def datasets_budget(name: str, epsilon: float, delta: float) -> None:
    """Set or raise a dataset's budget (lowering below what is spent is refused)."""
    with transaction(_engine()) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == name)).one()
        try:
            set_dataset_budget(s, dataset=ds, epsilon_total=epsilon, delta_total=delta)
        except InvalidLedgerOperation as exc:
            console.print(f"[red]refused:[/red] {exc}")
            raise typer.Exit(2) from exc
        console.print(dataset_filter(ds).view().model_dump())


@datasets_app.command("list")
def datasets_list() -> None:
    table = Table(
        "name",
        "public rows (noisy)",
        "rule",
        "ε_total",
        "δ_total",
        "Σε charged",
        "remaining ε",
        "nominal ok",
    )
    with transaction(_engine()) as s:
        for ds in s.scalars(select(Dataset).order_by(Dataset.name)):
            v = dataset_filter(ds).view()
            table.add_row(
                ds.name,
                str(ds.n_rows),
                v.rule,
                f"{v.epsilon_total:g}",
                f"{v.delta_total:g}",
                f"{v.spent_epsilon_sum:g}",
                f"{v.remaining_epsilon:.4g}",
                str(ds.allow_nominal),
            )
    console.print(table)


ExpiresDays = Annotated[
    float | None, typer.Option(min=0.001, help="Optional lifetime of the key, in days.")
]


@analysts_app.command("create")
def analysts_create(
    name: str,
    role: Annotated[Role, typer.Option(help="analyst or admin")] = Role.analyst,
    expires_days: ExpiresDays = None,
) -> None:
    """Create an analyst and print their API key (shown once)."""
    key = analysts_create_key(name, role, expires_days=expires_days)
    console.print(f"created {Role(role).value} {name}")
    typer.echo(key)


def analysts_create_key(name: str, role: Role | str, *, expires_days: float | None = None) -> str:
    key = new_api_key()
    with transaction(_engine()) as s:
        s.add(
            Analyst(
                name=name,
                key_hash=hash_api_key(key),
                role=Role(role),
                key_expires_at=expiry(expires_days),
            )
        )
    return key


def _analyst_named(s: Session, name: str) -> Analyst:
    a = s.scalars(select(Analyst).where(Analyst.name == name)).one_or_none()
    if a is None:
        console.print(f"[red]refused:[/red] no analyst named {name!r}")
        raise typer.Exit(2)
    return a


@analysts_app.command("rotate")
def analysts_rotate(name: str, expires_days: ExpiresDays = None) -> None:
    """Give an analyst a new API key (printed once); the old key stops working at once."""
    with transaction(_engine()) as s:
        key = rotate_key(_analyst_named(s, name), expires_in_days=expires_days)
    console.print(f"rotated the key of {name}; the old key no longer works")
    typer.echo(key)


@analysts_app.command("revoke")
def analysts_revoke(name: str) -> None:
    """Revoke an analyst's API key at once (API and dashboard); `rotate` issues a new one."""
    with transaction(_engine()) as s:
        revoke_key(_analyst_named(s, name))
    console.print(f"revoked the key of {name}")


@analysts_app.command("cap")
def analysts_cap(name: str, dataset: str, epsilon: float, delta: float) -> None:
    """Set an analyst's cap on a dataset (lowering below what they spent is refused)."""
    with transaction(_engine()) as s:
        a = s.scalars(select(Analyst).where(Analyst.name == name)).one()
        ds = s.scalars(select(Dataset).where(Dataset.name == dataset)).one()
        try:
            set_analyst_cap(s, analyst=a, dataset=ds, epsilon=epsilon, delta=delta)
        except InvalidLedgerOperation as exc:
            console.print(f"[red]refused:[/red] {exc}")
            raise typer.Exit(2) from exc
    console.print(f"cap set: {name} on {dataset}: ε={epsilon}, δ={delta}")


def ledger_table(rows: list[dict]) -> Table:
    table = Table(
        "id", "dataset", "kind", "job", "ε", "δ", "reason", "hash", title="Privacy ledger"
    )
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["dataset"],
            r["kind"],
            (r["job_id"] or "")[:8],
            f"{r['epsilon']:g}",
            r["delta"],
            (r["reason"] or "")[:40],
            r["hash"][:12],
        )
    return table


@ledger_app.command("show")
def ledger_show(limit: int = 50) -> None:
    with transaction(_engine()) as s:
        rows = s.execute(
            select(LedgerEntry, Dataset.name)
            .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
            .order_by(LedgerEntry.id.desc())
            .limit(limit)
        ).all()
        data = [
            {
                "id": e.id,
                "dataset": n,
                "kind": str(e.kind),
                "job_id": e.job_id,
                "epsilon": from_micro(e.epsilon_micro),
                "delta": e.delta,
                "reason": e.reason,
                "hash": e.hash,
            }
            for e, n in reversed(rows)
        ]
    console.print(ledger_table(data))


@ledger_app.command("verify")
def ledger_verify() -> None:
    """Walk every dataset's hash chain."""
    with transaction(_engine()) as s:
        reports = verify_all(s)
    for r in reports:
        console.print(json.dumps(r.__dict__))
    if not all(r.ok for r in reports):
        raise typer.Exit(1)


@ledger_app.command("check")
def ledger_check() -> None:
    """Recompute every running total from the entries and report mismatches."""
    with transaction(_engine()) as s:
        mismatches = check_totals(s)
    for m in mismatches:
        console.print(f"[red]mismatch[/red] {m}")
    if mismatches:
        raise typer.Exit(1)
    console.print("all running totals match the entries")


@app.command()
def api(host: str = "127.0.0.1", port: int = 8000, workers: int = 1) -> None:
    """Run the HTTP API (outside the enclave)."""
    import uvicorn

    uvicorn.run("service.api.asgi:app", host=host, port=port, workers=workers)


@app.command("worker")
def worker_cmd(loglevel: str = "INFO") -> None:
    """Run a Celery worker (inside the enclave)."""
    from worker.celery_app import app as celery_app

    celery_app.worker_main(
        [
            "worker",
            "--pool=solo",
            "--concurrency=1",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
        ]
    )


@app.command()
def up(port: int = 8000) -> None:
    """Embedded mode: migrate, then run the API and one worker until Ctrl-C."""
    from enclave.processes import child_env, start_api, start_worker, stop, wait_ready

    db_upgrade()
    env = child_env({})
    api_proc = start_api(env, port)
    worker_proc = start_worker(env)
    try:
        wait_ready(f"http://127.0.0.1:{port}")
        console.print(f"enclave up: API on http://127.0.0.1:{port} (docs at /docs); Ctrl-C stops")
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while api_proc.poll() is None and worker_proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop(api_proc, worker_proc)


@app.command()
def demo(
    epsilon: float = 1.0,
    epochs: int = 3,
    keep: Annotated[bool, typer.Option(help="Keep the demo's files (.enclave-demo/).")] = False,
) -> None:
    """The main job, end to end on the embedded default (see README)."""
    from enclave.demo import run_demo

    run_demo(epsilon=epsilon, epochs=epochs, keep=keep, console=console)


if __name__ == "__main__":
    app()
