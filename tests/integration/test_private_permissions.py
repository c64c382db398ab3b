"""Private files are owner-only whatever the umask (issue 26): registration's rows, a
release, the SQLite ledger and the embedded mode's logs are 0600 in 0700 folders, and the
start-up check of the API and the worker warns once per path others may read."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from service.config import Settings, get_settings
from service.datasets.kinds import load_schema_yaml
from service.datasets.tabular import parse_schema
from service.db import engine_for
from service.migrate import upgrade
from service.private_files import (
    check_private_permissions,
    make_private_dir,
    warn_private_permissions,
)
from tests.conftest import SMALL_SCHEMA, write_toy_csv
from tests.integration.test_timeseries import write_tiny_series

UMASKS = [0o022, 0o000]


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """A permissive umask for the test, restored afterwards."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.fixture
def home_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Settings on an embedded-mode home under tmp_path (SQLite ledger made by the test)."""
    monkeypatch.setenv("ENCLAVE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ENCLAVE_DATABASE_URL", raising=False)
    monkeypatch.delenv("ENCLAVE_DATA_DIR", raising=False)
    monkeypatch.delenv("ENCLAVE_RELEASE_DIR", raising=False)
    monkeypatch.setenv("ENCLAVE_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}")
    monkeypatch.setenv("ENCLAVE_DEVICE", "cpu")
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()
    engine_for.cache_clear()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _tree_modes(root: Path) -> dict[str, int]:
    modes = {".": _mode(root)}
    for path in root.rglob("*"):
        modes[str(path.relative_to(root))] = _mode(path)
    return modes


def _assert_private_tree(root: Path) -> None:
    for name, mode in _tree_modes(root).items():
        path = root / name
        want = 0o700 if path.is_dir() else 0o600
        assert mode == want, f"{name}: {mode:04o}, want {want:04o}"


def _ledger(settings: Settings) -> Any:
    make_private_dir(settings.home)
    upgrade(settings.resolved_database_url)
    return engine_for(settings.resolved_database_url)


def test_registration_writes_0600_files_in_0700_folders(
    umask: int, home_settings: Settings, tmp_path: Path
) -> None:
    from worker.registration import register_dataset

    engine = _ledger(home_settings)
    public = tmp_path / "public"  # the admin's input files: not the enclave's
    public.mkdir()
    register_dataset(
        engine,
        home_settings,
        schema=parse_schema(SMALL_SCHEMA),
        csv_path=write_toy_csv(public / "toy.csv", n=60),
        epsilon_total=10.0,
        delta_total=1e-5,
    )
    obs, outcomes, schema_path = write_tiny_series(public, stays=20)
    register_dataset(
        engine,
        home_settings,
        schema=load_schema_yaml(schema_path.read_text()),
        csv_path=obs,
        outcomes_path=outcomes,
        epsilon_total=10.0,
        delta_total=1e-5,
        allow_nominal=True,
    )
    data = home_settings.resolved_data_dir
    series = load_schema_yaml(schema_path.read_text()).name
    assert sorted(_tree_modes(data)) == sorted(
        [
            ".",
            series,
            f"{series}/.encoded.lock",
            f"{series}/encoded.npz",
            f"{series}/observations.csv.gz",
            f"{series}/outcomes.csv.gz",
            "toy",
            "toy/.encoded.lock",
            "toy/encoded.npz",
            "toy/rows.csv.gz",
        ]
    )
    _assert_private_tree(data)
    # The SQLite ledger (and its WAL side files) too.
    ledger = home_settings.home / "ledger.sqlite"
    for path in [ledger, *ledger.parent.glob("ledger.sqlite-*")]:
        assert _mode(path) == 0o600, path.name
    assert _mode(home_settings.home) == 0o700
    assert _check(home_settings.home) == []


def test_a_release_writes_0600_files_in_0700_folders(umask: int, tmp_path: Path) -> None:
    from worker.release import check_release_space, write_release

    releases = tmp_path / "home" / "releases"
    check_release_space(releases, 1)
    paths = write_release(releases, "job-1", "token-1", b"weights", {"card_version": 1})
    assert paths.weights.read_bytes() == b"weights"
    assert sorted(_tree_modes(releases)) == [
        ".",
        "job-1",
        "job-1/token-1",
        "job-1/token-1/card.json",
        "job-1/token-1/model.safetensors",
    ]
    _assert_private_tree(releases)
    assert _mode(tmp_path / "home") == 0o700  # a missing parent is made private too


def test_an_existing_stale_temporary_file_is_made_private(umask: int, tmp_path: Path) -> None:
    import pandas as pd

    from worker.data import _write_gzip_csv

    folder = make_private_dir(tmp_path / "data" / "toy")
    stale = folder / "rows.csv.gz.tmp"
    stale.write_bytes(b"old")
    stale.chmod(0o644)
    _write_gzip_csv(folder / "rows.csv.gz", pd.DataFrame({"a": [1, 2]}))
    assert not stale.exists()
    assert _mode(folder / "rows.csv.gz") == 0o600
    assert pd.read_csv(folder / "rows.csv.gz").a.tolist() == [1, 2]


def test_embedded_logs_are_private(umask: int, tmp_path: Path) -> None:
    from enclave.processes import _open_log

    logs = make_private_dir(tmp_path / "home" / "logs")
    with _open_log(logs / "worker.log") as fh:
        fh.write(b"one\n")
    old = logs / "api.log"
    old.write_bytes(b"before\n")
    old.chmod(0o644)
    with _open_log(old) as fh:  # appends, and narrows an old log
        fh.write(b"after\n")
    assert old.read_bytes() == b"before\nafter\n"
    _assert_private_tree(logs)


def test_the_cli_makes_a_new_home_private(umask: int, home_settings: Settings) -> None:
    from typer.testing import CliRunner

    from enclave.cli import app

    result = CliRunner().invoke(app, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert _mode(home_settings.home) == 0o700
    assert _mode(home_settings.home / "ledger.sqlite") == 0o600


def _check(home: Path) -> list[str]:
    """The whole embedded home as the API and the worker together check it."""
    folders = [home / "private-data", home / "releases", home / "logs"]
    return check_private_permissions(folders, ledger_file=home / "ledger.sqlite")


def _clean_tree(home: Path) -> None:
    for folder in ("private-data/toy", "releases/job/token", "logs"):
        make_private_dir(home / folder)
    for name in ("private-data/toy/rows.csv.gz", "releases/job/token/card.json", "logs/api.log"):
        (home / name).write_bytes(b"secret row 42")
        (home / name).chmod(0o600)
    (home / "ledger.sqlite").write_bytes(b"")
    (home / "ledger.sqlite").chmod(0o600)


def test_the_check_reports_wide_paths_and_nothing_for_a_clean_tree(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert _check(home) == []  # nothing there yet: nothing to report
    _clean_tree(home)
    assert _check(home) == []
    (home / "private-data" / "toy" / "rows.csv.gz").chmod(0o644)
    (home / "releases" / "job").chmod(0o755)
    (home / "ledger.sqlite").chmod(0o640)
    (home / "logs" / "api.log").chmod(0o400)  # narrower is fine
    (home / "logs" / "link").symlink_to(home / "logs" / "api.log")  # links: not checked
    problems = _check(home)
    assert problems == [
        f"private file {home}/private-data/toy/rows.csv.gz has mode 0644, wider than 0600: "
        f"others may read it (fix: chmod 600 {home}/private-data/toy/rows.csv.gz)",
        f"private folder {home}/releases/job has mode 0755, wider than 0700: "
        f"others may read it (fix: chmod 700 {home}/releases/job)",
        f"private file {home}/ledger.sqlite has mode 0640, wider than 0600: "
        f"others may read it (fix: chmod 600 {home}/ledger.sqlite)",
    ]
    assert not any("secret" in p for p in problems)


def test_the_check_walks_folders_outside_the_home(tmp_path: Path) -> None:
    data, releases = tmp_path / "volume" / "data", tmp_path / "volume" / "releases"
    make_private_dir(data)
    make_private_dir(releases)
    data.chmod(0o755)
    (releases / "x").write_bytes(b"")
    (releases / "x").chmod(0o666)
    problems = check_private_permissions([data, releases])
    assert [p.split(" has ")[0] for p in problems] == [
        f"private folder {data}",
        f"private file {releases}/x",
    ]


def test_the_api_warns_at_start_up(
    home_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from service.app import create_app

    home = home_settings.home
    _clean_tree(home)
    with caplog.at_level(logging.WARNING, logger="enclave.permissions"):
        create_app(home_settings, run_sweeper=False)
    assert [r for r in caplog.records if r.name == "enclave.permissions"] == []

    (home / "private-data" / "toy" / "rows.csv.gz").chmod(0o644)
    (home / "releases").chmod(0o755)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="enclave.permissions"):
        create_app(home_settings, run_sweeper=False)  # warns, does not fail
    warnings = [r.getMessage() for r in caplog.records if r.name == "enclave.permissions"]
    # The API checks what it owns; the data folder is the worker's (it never names it).
    assert len(warnings) == 1
    assert warnings[0].startswith(f"private folder {home}/releases has mode 0755")
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert "secret" not in caplog.text


def test_the_worker_warns_at_start_up(
    home_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from worker.celery_app import app, check_permissions_at_start

    home = home_settings.home
    _clean_tree(home)
    (home / "logs" / "api.log").chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="enclave.permissions"):
        check_permissions_at_start(sender=SimpleNamespace(app=SimpleNamespace()))  # not ours
        assert caplog.records == []
        (home / "private-data" / "toy" / "rows.csv.gz").chmod(0o644)  # the worker's folder
        check_permissions_at_start(sender=SimpleNamespace(app=app))
    assert [r.getMessage().split(" has ")[0] for r in caplog.records] == [
        f"private file {home}/logs/api.log",
        f"private file {home}/private-data/toy/rows.csv.gz",
    ]


def test_many_problems_are_capped_and_a_failing_check_does_not_raise(
    home_settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.private_files as private_files

    releases = make_private_dir(home_settings.resolved_release_dir)
    for i in range(5):
        (releases / f"f{i}").write_bytes(b"")
        (releases / f"f{i}").chmod(0o644)
    monkeypatch.setattr(private_files, "MAX_WARNINGS", 3)
    with caplog.at_level(logging.WARNING, logger="enclave.permissions"):
        assert len(warn_private_permissions(home_settings)) == 5
    assert len(caplog.records) == 4 and caplog.records[-1].getMessage().startswith("2 more")

    def broken(_settings: Any, **_: Any) -> list[str]:
        raise PermissionError("no")

    monkeypatch.setattr(private_files, "settings_permission_problems", broken)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="enclave.permissions"):
        assert warn_private_permissions(home_settings) == []
    assert "could not check" in caplog.text
