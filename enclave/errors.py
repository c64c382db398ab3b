"""How every `enclave` command reports a user error: one line on stderr, exit status 1."""

from __future__ import annotations

from typing import NoReturn

import typer
from sqlalchemy.exc import ArgumentError, OperationalError, ProgrammingError

UPGRADE_HINT = "run `enclave db upgrade` (it creates and migrates the ledger's tables)"
URL_HINT = "check ENCLAVE_DATABASE_URL"
SERVER_HINT = "check ENCLAVE_DATABASE_URL and that the database server is running"
SQLITE_HINT = "check ENCLAVE_DATABASE_URL (or ENCLAVE_HOME): the SQLite file's folder must exist"
# PostgreSQL's SQLSTATEs for a table or column the migrations have not created yet.
UNDEFINED_TABLE_OR_COLUMN = ("42P01", "42703")


def fail(message: str) -> NoReturn:
    """Report a user error as one line on stderr and exit with status 1."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc)
    return next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)


def database_setup_error(exc: Exception) -> str | None:
    """The one-line message (cause; hint) for an admin setup mistake: the ledger database
    unreachable or missing, its URL malformed, or its tables not created (`db upgrade`
    skipped). None for any other database error (a bug: its traceback is kept)."""
    cause = _first_line(exc)
    if isinstance(exc, ArgumentError):
        return f"the ledger database URL is not usable: {cause}; {URL_HINT}"
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    missing_schema = sqlstate in UNDEFINED_TABLE_OR_COLUMN or (
        cause.startswith(("no such table", "no such column"))
    )
    if isinstance(exc, OperationalError | ProgrammingError) and missing_schema:
        return f"the ledger database has no tables yet ({cause}); {UPGRADE_HINT}"
    if isinstance(exc, OperationalError):
        if "does not exist" in cause:
            hint = "create the database (e.g. createdb) or correct ENCLAVE_DATABASE_URL"
            return f"cannot open the ledger database: {cause}; {hint}"
        sqlite = type(getattr(exc, "orig", None)).__module__.startswith("sqlite3")
        return f"cannot open the ledger database: {cause}; {SQLITE_HINT if sqlite else SERVER_HINT}"
    return None
