"""`enclave admin jobs` (issue 26): filters, --cursor and --all on the ledger database.
Seeded as in test_job_listing.py (ties in created_at)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from enclave.cli import app
from tests.conftest import Keys
from tests.integration.test_job_listing import BASE, newest_first, seed

runner = CliRunner()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_admin_cli_filters_and_pages(client: Any, keys: Keys, settings: Any) -> None:
    jobs = seed(settings, keys, client)
    env = {"COLUMNS": "250"}

    def ids_in(output: str) -> list[str]:
        known = {j.id for j in jobs}
        return [w for w in re.findall(r"[0-9a-f-]{36}", output) if w in known]

    r = runner.invoke(
        app, ["admin", "jobs", "--status", "failed", "--all", "--limit", "2"], env=env
    )
    assert r.exit_code == 0, r.output
    assert ids_in(r.output) == newest_first([j for j in jobs if j.status == "failed"])
    assert "--cursor" not in r.output
    # A page, its cursor, the next page from it.
    args = ["admin", "jobs", "--analyst", "bob", "--limit", "4"]
    r = runner.invoke(app, args, env=env)
    assert r.exit_code == 0, r.output
    cursor = re.search(r"more jobs: --cursor (\S+)", r.output)
    assert cursor is not None
    bob = newest_first([j for j in jobs if j.analyst == "bob"])
    assert ids_in(r.output) == bob[:4]
    r = runner.invoke(app, [*args, "--cursor", cursor.group(1)], env=env)
    assert r.exit_code == 0 and ids_in(r.output) == bob[4:8], r.output
    r = runner.invoke(app, ["admin", "jobs", "--method", "expm", "--guarantee", "asymptotic",
                            "--created-after", "2026-03-01T12:00:03"], env=env)  # fmt: skip
    assert r.exit_code == 0
    assert ids_in(r.output) == newest_first(
        [j for j in jobs if j.method == "expm" and j.created_at >= BASE + timedelta(seconds=3)]
    )
    for bad, why in (
        (["--status", "done"], "--status"),
        (["--created-before", "soon"], "--created-before"),
        (["--cursor", "zzz"], "--cursor"),
    ):
        r = runner.invoke(app, ["admin", "jobs", *bad], env=env)
        assert r.exit_code == 1 and r.stderr.startswith("error: ") and why in r.stderr, r.output
