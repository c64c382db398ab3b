"""The end-to-end stack: an API process and Celery worker processes on a test's ledger and
broker, driven over HTTP, and the checks every end-to-end test ends with.

Fault tests must not depend on how fast the machine trains. A stack started with
``hold=True`` runs workers that stop every run at its last training step, its heartbeat
still beating, until the test opens the hold (`Stack.wait_held`, `Stack.open_hold`): the
test injects its fault at a known point of the job, however loaded the machine. The hold is
test code only (the workers start through `held_worker_main`); product code has no such
switch, and stacks started without ``hold`` run plain workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
from tests.conftest import REPO, auth, bootstrap

# The stack's own heartbeat timeout, set explicitly rather than the product's default (40 s,
# service/config.py): a test that does not exercise a takeover must never see a busy but
# alive worker taken for dead, however loaded the machine (the worker beats every 5 s
# either way, worker/runner.py). Tests of a takeover pass their own short timeout.
HEARTBEAT_TIMEOUT_S = 120.0
# How long the stack waits for a process or a state it is sure to reach: only a hang fails.
GENEROUS_S = 300.0
# The hold's folder, set for held workers only (not an ENCLAVE_* setting: the product never
# reads it).
HOLD_ENV = "E2E_HOLD_DIR"


@dataclass
class Stack:
    base: str
    port: int
    env: dict[str, str]
    keys: Any
    settings: Settings
    logs: Path
    procs: list[Any]
    hold: Path | None = None

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=auth(key), timeout=60)

    def add_worker(self, name: str) -> Any:
        log = self.logs / f"worker-{name}.log"
        if self.hold is None:
            p = start_worker(self.env, log=log, name=name)
        else:
            p = _start_held_worker(self.env, log=log, name=name)
        self.procs.append(p)
        return p

    def wait_worker_ready(self, name: str, timeout: float = GENEROUS_S) -> None:
        """Until the worker's log says it is up and consuming."""
        log = self.logs / f"worker-{name}.log"
        deadline = time.monotonic() + timeout
        while not log.exists() or " ready." not in log.read_text():
            assert time.monotonic() < deadline, f"worker {name} not ready after {timeout:.0f} s"
            time.sleep(0.2)

    def wait_held(self, job_id: str, timeout: float = GENEROUS_S) -> None:
        """Until a run of the job is held at its last training step (hold=True)."""
        assert self.hold is not None, "running_stack(..., hold=True)"
        deadline = time.monotonic() + timeout
        while not (self.hold / f"{job_id}.held").exists():
            assert time.monotonic() < deadline, f"job {job_id} not held after {timeout:.0f} s"
            time.sleep(0.05)

    def open_hold(self) -> None:
        """Let every held run go on, and every later run pass its last step unheld."""
        assert self.hold is not None, "running_stack(..., hold=True)"
        (self.hold / "open").touch()

    def kill_api(self) -> None:
        """SIGKILL the API process: requests in flight get no answer."""
        api = self.procs[0]
        os.kill(api.pid, signal.SIGKILL)
        api.wait()

    def restart_api(self) -> None:
        """A new API process on the same port (after kill_api); returns once it is ready."""
        self.procs[0] = start_api(self.env, self.port, log=self.logs / "api.log")
        wait_ready(self.base, timeout=GENEROUS_S)


def _start_held_worker(env: dict[str, str], log: Path, name: str) -> subprocess.Popen[bytes]:
    """A worker with the hold installed: the command line of enclave.processes.start_worker
    with `held_worker_main` in place of `python -m celery`."""
    boot = "from tests.e2e.stack import held_worker_main; held_worker_main()"
    cmd = [sys.executable, "-c", boot, "-A", "worker.celery_app:app", "worker", "--pool=solo"]
    cmd += ["--concurrency=1", "--loglevel=INFO", "--without-gossip", "--without-mingle"]
    cmd += ["--without-heartbeat", "-n", f"{name}@%h"]
    out = open(log, "ab")  # noqa: SIM115
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def held_worker_main() -> None:
    """Runs in a held worker's process: wraps the runner's progress callback so that a run
    reaching its last step (step == total) marks `<hold>/<job id>.held` and waits there
    until `<hold>/open` exists, then runs Celery's command line (sys.argv). While it waits,
    the run's heartbeat thread goes on beating: the job is running, at its last step, its
    training done and its final heartbeat and release not yet attempted."""
    from celery.__main__ import main

    from worker import runner

    hold = Path(os.environ[HOLD_ENV])
    progress = runner.Heartbeat.progress

    def progress_then_hold(self: runner.Heartbeat, step: int, total: int) -> None:
        progress(self, step, total)
        if step >= total:
            (hold / f"{self.job_id}.held").touch()
            while not (hold / "open").exists():
                time.sleep(0.05)

    setattr(runner.Heartbeat, "progress", progress_then_hold)  # noqa: B010
    main()


@contextmanager
def running_stack(
    settings: Settings,
    tmp_path: Path,
    broker_url: str,
    *,
    heartbeat: float = HEARTBEAT_TIMEOUT_S,
    n: int = 400,
    epsilon: float = 10.0,
    env: dict[str, str] | None = None,
    hold: bool = False,
) -> Iterator[Stack]:
    """Bootstrap the ledger, start the API (its sweeper every second) and yield; every
    process started through the stack is stopped afterwards. With ``hold``, the stack's
    workers hold each run at its last training step until `Stack.open_hold`."""
    keys = bootstrap(settings, n=n, epsilon=epsilon)
    held = None
    if hold:
        held = tmp_path / "hold"
        held.mkdir()
        env = {**(env or {}), HOLD_ENV: str(held)}
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
    stack = Stack(f"http://127.0.0.1:{port}", port, child, keys, settings, tmp_path, [api], held)
    try:
        wait_ready(stack.base, timeout=GENEROUS_S)
        yield stack
    finally:
        stop(*stack.procs)


def wait_job(
    c: httpx.Client, job_id: str, until: set[str], timeout: float = GENEROUS_S
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        if job["status"] in until:
            return job
        assert time.monotonic() < deadline, f"job {job_id} did not reach {until}: {job}"
        time.sleep(0.3)


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
