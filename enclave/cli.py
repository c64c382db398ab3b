"""The `enclave` command: the admin's and operator's entry point.

`enclave` is the composition root: it may import both the service and the worker. The
service itself never imports the worker (checked by import-linter in the tests).

A user error (an unknown or duplicate name, a value out of range, a refused ledger
operation, a number that is not one) is one line on stderr and exit status 1, never a
traceback; values are checked by the same models as the HTTP API (service.schemas).
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy import select
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session
from typer.core import TyperGroup

from enclave.admin_jobs import admin_job, admin_jobs
from enclave.analyst_cli import add_analyst_commands
from enclave.audit_cli import admin_audit
from enclave.errors import database_setup_error, fail
from enclave.jobs_cli import jobs_app
from enclave.privacy_text import privacy_number
from service import admin as ops
from service.audit_gate import MAX_GATE_DAYS, gate_days, set_audit_gate
from service.auth import expiry, hash_api_key, new_api_key
from service.config import get_settings
from service.datasets.kinds import DATA_KINDS, DatasetSchema, load_schema_yaml
from service.datasets.tabular import SchemaError
from service.db import engine_for, transaction
from service.ledger.audit import check_totals, verify_all
from service.ledger.budgets import set_analyst_cap, set_dataset_budget
from service.ledger.errors import InvalidLedgerOperation
from service.ledger.filter_view import dataset_filter
from service.ledger.tables import Analyst, Dataset, Role
from service.migrate import upgrade
from service.private_files import make_private_dir
from service.schemas import AnalystCreate, BudgetUpdate, CapUpdate, KeyRotate, RefundRequest
from service.version import __version__


class _Commands(TyperGroup):
    """The root command: an admin setup mistake (the ledger database unreachable, missing,
    or not upgraded) raised by any subcommand is one line on stderr and exit 1, like every
    other user error, instead of a traceback of hundreds of lines."""

    def invoke(self, ctx: Any) -> Any:  # typer.Context (typer vendors its click)
        try:
            return super().invoke(ctx)
        except (OperationalError, ProgrammingError, ArgumentError) as exc:
            message = database_setup_error(exc)
            if message is None:
                raise
            fail(message)


app = typer.Typer(
    cls=_Commands,
    help="Private-data enclave: train models under a differential-privacy budget.",
    no_args_is_help=True,
    # A crash must not print local variables: they can hold API keys.
    pretty_exceptions_show_locals=False,
)
db_app = typer.Typer(help="The ledger database.", no_args_is_help=True)
datasets_app = typer.Typer(help="Datasets (inside the enclave).", no_args_is_help=True)
analysts_app = typer.Typer(help="Analysts and API keys.", no_args_is_help=True)
ledger_app = typer.Typer(help="The privacy ledger.", no_args_is_help=True)
admin_app = typer.Typer(help="Every analyst's jobs, and refunds (admin).", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(datasets_app, name="datasets")
app.add_typer(analysts_app, name="analysts")
app.add_typer(ledger_app, name="ledger")
app.add_typer(admin_app, name="admin")
app.add_typer(jobs_app, name="jobs")
add_analyst_commands(jobs_app)  # jobs datasets list/show, jobs cancel (enclave.analyst_cli)

console = Console()


def _number(text: str) -> float:
    """A command-line number; anything else (or NaN, ±inf) is a user error."""
    try:
        value = float(text)
    except ValueError:
        fail(f"not a number: {text!r}")
    if not math.isfinite(value):
        fail(f"not a finite number: {text!r}")
    return value


Model = TypeVar("Model", AnalystCreate, BudgetUpdate, CapUpdate, KeyRotate, RefundRequest)


def _checked(model: type[Model], **values: object) -> Model:
    """Validate command-line values with the API's request model (the same ranges)."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"{where}: {first['msg']} (got {first.get('input')!r})")


Number = Annotated[float, typer.Argument(parser=_number, metavar="NUMBER")]


def _version(show: bool) -> None:
    if show:
        typer.echo(f"enclave {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    pass


def _engine():  # type: ignore[no-untyped-def]
    return engine_for(get_settings().resolved_database_url)


def _home() -> None:
    make_private_dir(get_settings().home)  # a new home is 0700 (issue 26)


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply the Alembic migrations (the only way the schema changes)."""
    from alembic.util import CommandError

    _home()
    try:
        upgrade(get_settings().resolved_database_url, revision)
    except CommandError as exc:
        fail(f"cannot upgrade to {revision!r}: {exc}")
    console.print(f"ledger database at revision {revision}")


def _schema_from(path: Path) -> DatasetSchema:
    """The public schema in ``path``, or one line and exit 1 (never a traceback)."""
    try:
        return load_schema_yaml(path.read_text())
    except (SchemaError, UnicodeError) as exc:
        fail(f"invalid schema: {path.name}: {exc}")


class _Report(Protocol):
    def lines(self) -> list[str]: ...


def _print_report(report: _Report) -> None:
    """The validation report of private rows: printed to the admin's terminal inside the
    enclave only (exact counts are not public). Registration and `check` both use it."""
    for line in report.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True)


CsvOption = Annotated[
    Path,
    typer.Option(
        exists=True,
        help=(
            "The private rows (a folder of per-stay files for layout: wide; for images, "
            "the folder or file that the schema's source.format reads)."
        ),
    ),
]
OutcomesOption = Annotated[
    Path | None,
    typer.Option(
        exists=True,
        dir_okay=False,
        help="Time-series datasets: the per-stay outcomes file (docs/schema.md).",
    ),
]
SchemaOption = Annotated[
    Path, typer.Option(exists=True, dir_okay=False, help="Public schema YAML (docs/schema.md).")
]


@datasets_app.command("check")
def datasets_check(csv: CsvOption, schema: SchemaOption, outcomes: OutcomesOption = None) -> None:
    """Dry run: parse the schema, read the CSV with its csv options and report rejected and
    clipped rows per column and reason. Registers nothing and never opens the ledger."""
    from worker.data import CsvReadError, prepare_dataset

    parsed = _schema_from(schema)
    try:
        report = prepare_dataset(parsed, csv, outcomes).report
    except CsvReadError as exc:
        fail(f"refused: {exc}")
    console.print(DATA_KINDS[parsed.kind].describe(parsed))
    _print_report(report)
    console.print("(exact counts: shown here, inside the enclave, only; nothing was registered)")
    if report.rows_kept == 0:
        raise typer.Exit(1)


@datasets_app.command("register")
def datasets_register(
    name: Annotated[str, typer.Argument(help="Must equal the schema's name.")],
    csv: CsvOption,
    schema: SchemaOption,
    epsilon: Annotated[float, typer.Option(parser=_number, help="ε_total in nats.")],
    delta: Annotated[float, typer.Option(parser=_number, help="δ_total (0: pure-DP only).")],
    allow_nominal: Annotated[
        bool, typer.Option(help="Allow methods whose ε is not proven (nominal or asymptotic).")
    ] = False,
    count_epsilon: Annotated[
        float | None,
        typer.Option(
            parser=_number,
            help=(
                "ε (nats) of the DP noisy row count released at registration and charged to "
                "the budget; default: 1% of ε_total, at most 0.1."
            ),
        ),
    ] = None,
    outcomes: OutcomesOption = None,
    holdout_fraction: Annotated[
        float | None,
        typer.Option(
            parser=_number,
            help=(
                "Keep floor(F × the noisy row count) rows (images; stays of a time series), "
                "drawn at random by the enclave, as a private evaluation holdout that no "
                "training job reads (POST /v1/evaluations scores releases on it); 0 < F <= 0.5."
            ),
        ),
    ] = None,
) -> None:
    """Register a dataset: validate its rows against the public schema, set its budget and
    release a DP noisy row count (the only row count anyone outside the enclave sees)."""
    from worker.registration import RegistrationError, register_dataset

    parsed = _schema_from(schema)
    if parsed.name != name:
        fail(f"the schema is named {parsed.name!r}, not {name!r}")
    try:
        reg = register_dataset(
            _engine(),
            get_settings(),
            schema=parsed,
            csv_path=csv,
            outcomes_path=outcomes,
            epsilon_total=epsilon,
            delta_total=delta,
            allow_nominal=allow_nominal,
            count_epsilon=count_epsilon,
            holdout_fraction=holdout_fraction,
        )
    except RegistrationError as exc:
        if exc.report is not None:
            _print_report(exc.report)
        fail(f"refused: {exc}")
    console.print(f"registered {name} (exact counts: shown here, inside the enclave, only)")
    _print_report(reg.report)
    console.print(
        f"public row count: {reg.noisy_n_rows} (DP noisy count, "
        f"ε = {privacy_number(reg.count_epsilon)}, "
        "charged to the dataset's budget; plans use only this)"
    )
    if reg.holdout_rows is not None:
        console.print(
            f"evaluation holdout: {reg.holdout_rows} rows (public; the public row count above "
            "counts the training rows only)"
        )
    if reg.warning:
        console.print(f"[yellow]warning:[/yellow] {escape(reg.warning)}", soft_wrap=True)


@datasets_app.command("budget")
def datasets_budget(name: str, epsilon: Number, delta: Number) -> None:
    """Set or raise a dataset's budget (lowering below what is spent is refused)."""
    budget = _checked(BudgetUpdate, epsilon_total=epsilon, delta_total=delta)
    with transaction(_engine()) as s:
        ds = _dataset_named(s, name)
        try:
            set_dataset_budget(
                s, dataset=ds, epsilon_total=budget.epsilon_total, delta_total=budget.delta_total
            )
        except InvalidLedgerOperation as exc:
            fail(f"refused: {exc}")
        v = dataset_filter(ds).view()
    console.print(
        f"budget of {name}: {v.rule} rule, (ε, δ) = ({privacy_number(v.epsilon_total)}, "
        f"{privacy_number(v.delta_total)}); Σε charged {privacy_number(v.spent_epsilon_sum)}, "
        f"ε spent {privacy_number(v.epsilon_spent)}, "
        f"remaining ε {privacy_number(v.remaining_epsilon, down=True)}",
        soft_wrap=True,
    )


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
                privacy_number(v.epsilon_total),
                privacy_number(v.delta_total),
                privacy_number(v.spent_epsilon_sum),
                privacy_number(v.remaining_epsilon, down=True),
                str(ds.allow_nominal),
            )
    console.print(table)


ExpiresDays = Annotated[
    float | None, typer.Option(parser=_number, help="Optional lifetime of the key, in days.")
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
    body = _checked(AnalystCreate, name=name, role=Role(role).value, expires_in_days=expires_days)
    key = new_api_key()
    try:
        with transaction(_engine()) as s:
            if s.scalars(select(Analyst).where(Analyst.name == body.name)).first():
                fail(f"an analyst named {body.name!r} exists")
            s.add(
                Analyst(
                    name=body.name,
                    key_hash=hash_api_key(key),
                    role=Role(body.role),
                    key_expires_at=expiry(body.expires_in_days),
                )
            )
    except IntegrityError:  # created concurrently, between the check and the insert
        fail(f"an analyst named {body.name!r} exists")
    return key


@contextmanager
def _refusals() -> Iterator[None]:
    """The shared admin operations' (service/admin.py) refusals as one line, exit 1."""
    try:
        yield
    except ops.NotFound as exc:
        fail(str(exc))
    except InvalidLedgerOperation as exc:
        fail(f"refused: {exc}")


def _analyst_named(s: Session, name: str) -> Analyst:
    with _refusals():
        return ops.analyst_named(s, name)


def _dataset_named(s: Session, name: str) -> Dataset:
    with _refusals():
        return ops.dataset_named(s, name)


@analysts_app.command("rotate")
def analysts_rotate(
    name: str,
    expires_days: Annotated[
        float | None,
        typer.Option(
            parser=_number,
            help="Lifetime of the new key, in days (without it: the current key's expiry).",
        ),
    ] = None,
    no_expiry: Annotated[bool, typer.Option(help="The new key never expires.")] = False,
) -> None:
    """Give an analyst a new API key (printed once); the old key stops working at once. It
    keeps the current key's expiry unless --expires-days or --no-expiry says otherwise (as
    POST /v1/admin/analysts/{name}/key)."""
    body = _checked(KeyRotate, expires_in_days=expires_days, no_expiry=no_expiry)
    with _refusals(), transaction(_engine()) as s:
        key = ops.rotate_analyst_key(s, name, body).api_key
    console.print(f"rotated the key of {name}; the old key no longer works")
    typer.echo(key)


@analysts_app.command("revoke")
def analysts_revoke(name: str) -> None:
    """Revoke an analyst's API key at once (API and dashboard); `rotate` issues a new one.
    The last live admin key is never revoked (refused, exit 1)."""
    with _refusals(), transaction(_engine()) as s:
        ops.revoke_analyst_key(s, name)
    console.print(f"revoked the key of {name}")


@analysts_app.command("cap")
def analysts_cap(name: str, dataset: str, epsilon: Number, delta: Number) -> None:
    """Set an analyst's cap on a dataset (lowering below what they spent is refused)."""
    cap = _checked(CapUpdate, epsilon=epsilon, delta=delta)
    with transaction(_engine()) as s:
        a = _analyst_named(s, name)
        ds = _dataset_named(s, dataset)
        try:
            set_analyst_cap(s, analyst=a, dataset=ds, epsilon=cap.epsilon, delta=cap.delta)
        except InvalidLedgerOperation as exc:
            fail(f"refused: {exc}")
    console.print(
        f"cap set: {name} on {dataset}: "
        f"ε={privacy_number(cap.epsilon)}, δ={privacy_number(cap.delta)}"
    )


@analysts_app.command("list")
def analysts_list() -> None:
    """Every analyst: role, key state, and Σε spent and cap per dataset."""
    table = Table("name", "role", "key", "key expires", "dataset", "Σε spent", "cap (remaining ε)")
    with transaction(_engine()) as s:
        rows = ops.analysts_overview(s)
    for a in rows:
        expires = a.key_expires_at.isoformat(timespec="minutes") if a.key_expires_at else ""
        for i, sp in enumerate(a.spending or [None]):
            head = (a.name, a.role, a.key_state, expires) if i == 0 else ("", "", "", "")
            if sp is None:
                table.add_row(*head, "", "", "")
                continue
            cap = (
                f"ε {privacy_number(sp.cap.epsilon_total)} "
                f"({privacy_number(sp.cap.remaining_epsilon, down=True)})"
                if sp.cap
                else "none"
            )
            table.add_row(*head, sp.dataset, privacy_number(sp.epsilon_sum), cap)
    console.print(table)


@datasets_app.command("nominal")
def datasets_nominal(
    name: str,
    allow: Annotated[
        bool,
        typer.Option(
            "--allow/--deny", help="Allow or forbid methods whose ε is nominal (expm_nf)."
        ),
    ],
) -> None:
    """Set a dataset's nominal policy (as PUT /v1/admin/datasets/{name}/nominal)."""
    with _refusals(), transaction(_engine()) as s:
        ds = ops.set_nominal(s, name, allow_nominal=allow)
        console.print(f"{ds.name}: nominal methods {'allowed' if ds.allow_nominal else 'refused'}")


@datasets_app.command("audit-gate")
def datasets_audit_gate(
    name: str,
    days: Annotated[
        float | None,
        typer.Option(
            "--days",
            min=0.001,
            max=MAX_GATE_DAYS,
            help="On: training jobs need an audit of their configuration that passed "
            "within this many days (service/audit_gate.py).",
        ),
    ] = None,
    off: Annotated[bool, typer.Option("--off", help="Turn the gate off.")] = False,
) -> None:
    """Set a dataset's release gate (as PUT /v1/admin/datasets/{name}/audit-gate); with
    neither --days nor --off, show it. Passing an audit is not a proof."""
    if days is not None and off:
        fail("give --days or --off, not both")
    with _refusals(), transaction(_engine()) as s:
        ds = ops.dataset_named(s, name)
        if days is not None or off:
            set_audit_gate(s, dataset=ds, max_age_days=None if off else days)
        now = gate_days(s, ds.id)
        console.print(
            f"{ds.name}: audit gate "
            + ("off" if now is None else f"on: audits that passed within {now:g} days")
        )


# Filters, --cursor and --all (issue 26): enclave/admin_jobs.py.
admin_app.command("jobs")(admin_jobs)
admin_app.command("job")(admin_job)
admin_app.command("audit")(admin_audit)  # one-run privacy audit (issue 22)


@admin_app.command("refund")
def admin_refund(
    job_id: str,
    reason: Annotated[str, typer.Option(help="Why (3 to 2000 characters; in the ledger).")],
    override: Annotated[
        bool,
        typer.Option(
            help="The job read private rows: record the refund as information only (no ε back)."
        ),
    ] = False,
) -> None:
    """Refund a failed job's charge with a reason (as POST /v1/admin/jobs/{id}/refund)."""
    body = _checked(RefundRequest, reason=reason, override=override)
    with _refusals(), transaction(_engine()) as s:
        job = ops.refund_failed_job(s, job_id, body)
        information_only = ops.refund_is_information_only_for(s, job.id)
    if information_only:
        console.print(
            f"recorded an information-only refund of job {job.id} on {job.dataset} (its charge "
            f"stays: it had read private rows): {escape(body.reason)}"
        )
    else:
        console.print(f"refunded job {job.id} on {job.dataset}: {escape(body.reason)}")


def ledger_table(rows: list[dict]) -> Table:
    table = Table(
        "id", "dataset", "kind", "job", "ε", "δ", "reason", "hash", title="Privacy ledger"
    )
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["dataset"],
            r.get("label") or r["kind"],
            (r["job_id"] or "")[:8],
            privacy_number(r["epsilon"]),
            privacy_number(r["delta"]),
            (r["reason"] or "")[:40],
            r["hash"][:12],
        )
    return table


@ledger_app.command("show")
def ledger_show(limit: int = 50) -> None:
    """The newest entries, oldest first (amounts signed as in GET /v1/admin/ledger)."""
    with transaction(_engine()) as s:
        entries = ops.ledger_newest_first(s, limit=limit)
    console.print(ledger_table([e.model_dump(mode="json") for e in reversed(entries)]))


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

    from enclave.processes import API_KEEP_ALIVE_S

    # The app's own access log (service/logs.py: JSON lines with request ids) replaces
    # uvicorn's; uvicorn keeps its startup and error lines. Keep-alive: longer than the
    # clients' and proxies' own idle limits (see API_KEEP_ALIVE_S).
    uvicorn.run(
        "service.asgi:app",
        host=host,
        port=port,
        workers=workers,
        access_log=False,
        timeout_keep_alive=API_KEEP_ALIVE_S,
    )


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
    """Embedded mode: migrate, then run the API and one worker until Ctrl-C.

    Their logs are appended to HOME/logs/api.log and HOME/logs/worker.log."""
    from enclave.processes import child_env, start_api, start_worker, stop, wait_ready

    db_upgrade()
    home = get_settings().home
    logs = home / "logs"
    make_private_dir(logs)  # 0700; the logs are 0600 (enclave.processes)
    # The children get the absolute home, so they agree with this process on every path.
    env = child_env({"ENCLAVE_HOME": str(home)})
    api_proc = start_api(env, port, log=logs / "api.log")
    worker_proc = start_worker(env, log=logs / "worker.log")
    try:
        wait_ready(f"http://127.0.0.1:{port}")
        console.print(f"enclave up: API on http://127.0.0.1:{port} (docs at /docs); Ctrl-C stops")
        console.print(
            f"home {home}; logs in {logs}/api.log and worker.log",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
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
    from enclave.demo import AdminSteps, run_demo

    steps = AdminSteps(db_upgrade, datasets_register, analysts_create_key, ledger_table)
    run_demo(epsilon=epsilon, epochs=epochs, keep=keep, console=console, admin_steps=steps)


if __name__ == "__main__":
    app()
