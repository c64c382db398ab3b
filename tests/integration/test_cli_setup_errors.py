"""Admin setup mistakes (the ledger database missing, a wrong port, `db upgrade` skipped)
are one line `error: <cause>; <hint>` on stderr and exit status 1, never a traceback: the
real `enclave` process, as an admin would run it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import PG_URL, REPO


def enclave(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ENCLAVE_HOME": str(tmp_path / "home"),
        "ENCLAVE_DATABASE_URL": url,
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "enclave.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    return lines[0]


@pytest.mark.parametrize("args", [["datasets", "list"], ["ledger", "show"], ["ledger", "check"]])
def test_db_upgrade_skipped_on_a_new_sqlite_file(tmp_path: Path, args: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'never-upgraded.sqlite'}"
    line = one_error_line(enclave(tmp_path, url, *args))
    assert "no such table" in line and "enclave db upgrade" in line


def test_db_upgrade_skipped_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(pg_url)  # a migrated database, emptied of its tables
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    line = one_error_line(enclave(tmp_path, pg_url, "datasets", "list"))
    assert "does not exist" in line and "enclave db upgrade" in line


def test_a_postgresql_database_that_does_not_exist(tmp_path: Path) -> None:
    name = f"enclave_missing_{uuid.uuid4().hex[:12]}"
    url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    for args in (["datasets", "list"], ["db", "upgrade"]):
        line = one_error_line(enclave(tmp_path, url, *args))
        assert f'database "{name}" does not exist' in line and "ENCLAVE_DATABASE_URL" in line


def test_a_closed_port(tmp_path: Path) -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:1/test"
    for args in (["analysts", "list"], ["db", "upgrade"]):
        line = one_error_line(enclave(tmp_path, url, *args))
        assert "port 1 failed" in line and "ENCLAVE_DATABASE_URL" in line


def test_a_sqlite_folder_that_does_not_exist(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no-such-folder' / 'ledger.sqlite'}"
    line = one_error_line(enclave(tmp_path, url, "ledger", "verify"))
    assert "unable to open database file" in line and "ENCLAVE_DATABASE_URL" in line
