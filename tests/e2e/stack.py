"""The end-to-end stack: an API process and Celery worker processes on a test's ledger and
broker, driven over HTTP, and the checks every end-to-end test ends with."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from enclave.processes import child_env, free_port, start_api, start_worker, stop, wait_ready
from service.config import Settings
from service.db import engine_for, transaction
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import LedgerEntry, Release
from tests.conftest import auth, bootstrap


@dataclass
class Stack:
    base: str
    port: int
    env: dict[str, str]
    keys: Any
    settings: Settings
    logs: Path
    procs: list[Any]

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=auth(key), timeout=60)

    def add_worker(self, name: str) -> Any:
        p = start_worker(self.env, log=self.logs / f"worker-{name}.log", name=name)
        self.procs.append(p)
        return p

    def kill_api(self) -> None:
        """SIGKILL the API process: requests in flight get no answer."""
        api = self.procs[0]
        os.kill(api.pid, signal.SIGKILL)
        api.wait()

    def restart_api(self) -> None:
        """A new API process on the same port (after kill_api); returns once it is ready."""
        self.procs[0] = start_api(self.env, self.port, log=self.logs / "api.log")
        wait_ready(self.base)


@contextmanager
def running_stack(
    settings: Settings,
    tmp_path: Path,
    broker_url: str,
    *,
    heartbeat: float = 120,
    n: int = 400,
    epsilon: float = 10.0,
    env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """Bootstrap the ledger, start the API (its sweeper every second) and yield; every
    process started through the stack is stopped afterwards."""
    keys = bootstrap(settings, n=n, epsilon=epsilon)
    child = child_env(
        {
            "ENCLAVE_HOME": str(settings.home),
            "ENCLAVE_DATABASE_URL": settings.resolved_database_url,
            "ENCLAVE_BROKER_URL": broker_url,
            "ENCLAVE_BROKER_KEY_PREFIX": os.environ.get("ENCLAVE_BROKER_KEY_PREFIX", ""),
            "ENCLAVE_DEVICE": "cpu",
            "ENCLAVE_HEARTBEAT_TIMEOUT_S": str(heartbeat),
            "ENCLAVE_SWEEP_INTERVAL_S": "1",
            **(env or {}),
        }
    )
    port = free_port()
    api = start_api(child, port, log=tmp_path / "api.log")
    stack = Stack(f"http://127.0.0.1:{port}", port, child, keys, settings, tmp_path, [api])
    try:
        wait_ready(stack.base)
        yield stack
    finally:
        stop(*stack.procs)


def wait_job(c: httpx.Client, job_id: str, until: set[str], timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = c.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        if job["status"] in until:
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not reach {until}: {job}")


def check_ledger(settings: Settings, releases: int) -> None:
    """Exactly `releases` release rows and release ledger entries; the running totals match
    the entries (`enclave ledger check`) and every hash chain verifies (`ledger verify`)."""
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalar(select(func.count()).select_from(Release)) == releases
        assert (
            s.scalar(
                select(func.count()).select_from(LedgerEntry).where(LedgerEntry.kind == "release")
            )
            == releases
        )
        assert check_totals(s) == []
        assert all(r.ok for r in verify_all(s))
