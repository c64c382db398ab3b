"""Shared fixtures: real databases (a fresh SQLite file or a fresh PostgreSQL database per
test), settings pointed at a temporary home, an API client, a small registered dataset."""

from __future__ import annotations

import os

# pytest-xdist runs one test process per core (scripts/test: -n 2 on 2 cores): each process,
# and every worker, API or CLI process a test starts (they inherit the environment), then
# uses one CPU thread for torch and BLAS. torch's default is one thread per core, so two
# test processes asked for four on two cores; small torch operations then wait on each
# other's threads: an ExpM+NF image job's test (its HMC reference: 5,600 small products)
# took 37-57 s at two threads and 4-6 s at one, alternated at load 8. Set before numpy or
# torch is imported (OMP_NUM_THREADS is read at their start); torch is told again in case a
# plugin imported it first. Tests that compare thread counts set their own.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_name] = "1"
    import torch

    torch.set_num_threads(1)

import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from service.config import Settings, get_settings
from service.db import engine_for
from service.migrate import upgrade

# pytest-xdist's workers start with COLUMNS=80/LINES=24 in their environment; the CLIs' rich
# consoles (created at import) would then fix their width at 80 and fold the tables that
# the CLI tests read (tests set COLUMNS per command, as a terminal would).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

PG_URL = os.environ.get("ENCLAVE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ENCLAVE_TEST_REDIS_URL", "redis://127.0.0.1:6379")
# The Redis database number tests may use; each test works under its own key prefix or
# queue name in it and removes only its own keys (never FLUSHDB).
REDIS_TEST_DB = int(os.environ.get("ENCLAVE_TEST_REDIS_DB", "15"))
REPO = Path(__file__).resolve().parents[1]
ADULT = REPO / "examples" / "adult"


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite ledger migrated once per test process (its engine is disposed by the
    migration, so the file holds everything: no -wal file is left beside it)."""
    path = tmp_path_factory.mktemp("ledger-template") / "ledger.sqlite"
    upgrade(f"sqlite:///{path}")
    assert not path.with_name(path.name + "-wal").exists()
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, _sqlite_template: Path) -> str:
    """A fresh, migrated SQLite ledger of this test's own: a copy of the process's migrated
    template (the migrations' own tests run them from nothing)."""
    path = tmp_path / "ledger.sqlite"
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def _pg_admin() -> Iterator[tuple[Engine, str, ThreadPoolExecutor]]:
    """The server's admin connection, a database migrated once per test process to copy
    each test's from (``CREATE DATABASE … TEMPLATE``: no other session may be connected to
    it, and none is: the migration disposes its engine), and one thread that drops each
    test's database after its test (a drop takes 0.2-1 s: it no longer holds up the next
    test; the session waits for every drop at its end)."""
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    template = f"enclave_template_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{template}"'))
    dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-drop")
    try:
        upgrade(make_url(PG_URL).set(database=template).render_as_string(hide_password=False))
        yield admin, template, dropper
    finally:
        dropper.shutdown(wait=True)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)'))
        admin.dispose()


def _drop_database(admin: Engine, name: str) -> None:
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def pg_url(_pg_admin: tuple[Engine, str, ThreadPoolExecutor]) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database of this test's own (a copy of the process's
    migrated template), dropped afterwards."""
    admin, template, dropper = _pg_admin
    name = f"enclave_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        engine_for.cache_clear()
        # The test's engines may still hold pooled connections (clearing the cache does not
        # close them): end them now, as the drop's FORCE did when it ran here, so that
        # drops queued behind a slow one cannot pile up connections to max_connections.
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
        dropper.submit(_drop_database, admin, name)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Run the test on both ledger databases."""
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))


@pytest.fixture
def settings(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setenv("ENCLAVE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENCLAVE_DATABASE_URL", db_url)
    monkeypatch.setenv("ENCLAVE_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}")
    monkeypatch.setenv("ENCLAVE_DEVICE", "cpu")
    # Tests race many requests on purpose; the limits have tests of their own.
    monkeypatch.setenv("ENCLAVE_RATE_LIMIT_BURST", "100000")
    monkeypatch.setenv("ENCLAVE_PLANNING_PER_KEY", "1000")
    monkeypatch.setenv("ENCLAVE_PLANNING_GLOBAL", "1000")
    # Planning is bounded in wall-clock time; tests must not depend on the machine's speed.
    monkeypatch.setenv("ENCLAVE_PLANNING_TIME_LIMIT_S", "600")
    monkeypatch.setenv("ENCLAVE_ADDRESS_RATE_LIMITS", "false")
    # The release hold (service/release_hold.py) holds each job to a public grid time: off
    # for speed (children started from here inherit it); tests/integration/test_release_hold.py
    # turns it on with a tiny quantum.
    monkeypatch.setenv("ENCLAVE_RELEASE_HOLD", "false")
    get_settings.cache_clear()
    s = get_settings()
    s.home.mkdir(parents=True, exist_ok=True)
    yield s
    get_settings.cache_clear()


SMALL_SCHEMA = {
    "name": "toy",
    "kind": "tabular",
    "csv": {"header": True},
    "target": {"column": "label", "positive": ["yes"], "negative": ["no"]},
    "columns": [
        {"name": "a", "type": "numeric", "min": 0, "max": 10, "on_invalid": "clip"},
        {"name": "b", "type": "numeric", "min": -1, "max": 1, "on_invalid": "reject"},
        {"name": "c", "type": "categorical", "levels": ["x", "y", "z"]},
    ],
}


def write_toy_csv(path: Path, n: int = 400, seed: int = 0) -> Path:
    """Synthetic rows whose label depends on the features (test data, not private)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 10, n)
    b = rng.uniform(-1, 1, n)
    c = rng.choice(["x", "y", "z"], n)
    logit = 0.6 * (a - 5) + 2 * b + (c == "z") * 1.5
    label = np.where(rng.uniform(size=n) < 1 / (1 + np.exp(-logit)), "yes", "no")
    pd.DataFrame({"a": a, "b": b, "c": c, "label": label}).to_csv(path, index=False)
    return path


@dataclass
class Keys:
    admin: str
    alice: str
    bob: str


def bootstrap(
    settings: Settings,
    *,
    epsilon: float = 10.0,
    delta: float = 1e-5,
    allow_nominal: bool = True,
    n: int = 400,
) -> Keys:
    """Register the toy dataset and create an admin and two analysts."""
    from service.auth import hash_api_key, new_api_key
    from service.datasets.tabular import parse_schema
    from service.db import transaction
    from service.ledger.tables import Analyst, Role
    from worker.registration import register_dataset

    engine = engine_for(settings.resolved_database_url)
    csv = write_toy_csv(settings.home / "toy.csv", n=n)
    register_dataset(
        engine,
        settings,
        schema=parse_schema(SMALL_SCHEMA),
        csv_path=csv,
        epsilon_total=epsilon,
        delta_total=delta,
        allow_nominal=allow_nominal,
    )
    keys = {}
    with transaction(engine) as s:
        for name, role in (("admin", Role.admin), ("alice", Role.analyst), ("bob", Role.analyst)):
            keys[name] = new_api_key()
            s.add(Analyst(name=name, key_hash=hash_api_key(keys[name]), role=role))
    return Keys(**keys)


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return bootstrap(settings)


@pytest.fixture
def client(settings: Settings, keys: Keys) -> Iterator[object]:
    from fastapi.testclient import TestClient

    from service.app import create_app

    # warm=False: each test would pay the start-up warm-up (tests/unit/test_warm_up.py has it)
    app = create_app(settings, run_sweeper=False, warm=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def flat_routes(routes: list[Any]) -> list[Any]:
    """The app's APIRoutes, through included routers (FastAPI wraps each one)."""
    from fastapi.routing import APIRoute

    flat: list[Any] = []
    for route in routes:
        if isinstance(route, APIRoute):
            flat.append(route)
        elif hasattr(route, "original_router"):
            flat.extend(flat_routes(route.original_router.routes))
    return flat


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def live(settings: Settings, keys: Keys) -> Iterator[str]:
    """The API as deployed: uvicorn in a child process on the test's ledger and broker
    (it inherits the environment ``settings`` set); yields its base URL."""
    from enclave.processes import child_env, free_port, start_api, stop, wait_ready

    base = f"http://127.0.0.1:{free_port()}"
    proc = start_api(child_env({}), int(base.rsplit(":", 1)[1]))
    try:
        wait_ready(base)
        yield base
    finally:
        stop(proc)
