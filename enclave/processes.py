"""Start the API and worker as child processes (embedded mode, demo and tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

import httpx

from service.private_files import open_private_file

# How long the API keeps an idle keep-alive connection open (uvicorn's default: 5 s).
# Longer than any client or proxy in front of it keeps one idle: a keep-alive connection
# has a race at the server's timeout (the server closes it just as the client, seeing it
# idle but open, sends its next request on it; the client gets "Server disconnected
# without sending a response"). httpx keeps idle connections 5 s, the same as uvicorn's
# default, so the race was open to every httpx client; reverse proxies commonly keep 60 s
# (AWS ALB's default idle timeout; nginx's upstream keepalive_timeout: 60 s). At 65 s the
# client's side always gives a connection up first. An idle connection costs the server
# one socket and no thread.
API_KEEP_ALIVE_S = 65


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _open_log(log: Path) -> BinaryIO:
    """Append to ``log``, a file only its owner may read (0600 whatever the umask, issue
    26): a child's output may name private details."""
    return os.fdopen(open_private_file(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")


def start_api(
    env: dict[str, str],
    port: int,
    log: Path | None = None,
    workers: int = 1,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "service.asgi:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--workers",
        str(workers),
        "--timeout-keep-alive",
        str(API_KEEP_ALIVE_S),
    ]
    out = _open_log(log) if log else subprocess.DEVNULL
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)


def start_worker(
    env: dict[str, str], log: Path | None = None, name: str = "w1"
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.celery_app:app",
        "worker",
        "--pool=solo",
        "--concurrency=1",
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"{name}@%h",
    ]
    out = _open_log(log) if log else subprocess.DEVNULL
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(base_url: str, timeout: float = 300.0) -> None:
    """Until the API answers /readyz (it returns as soon as it does). Start-up sends warm-up
    quotes (service/app.py) and can take over a minute on a busy machine: a generous limit,
    so `enclave up` and the tests do not depend on how fast the machine is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the API at {base_url} did not become ready in {timeout:.0f} s")


def stop(*procs: subprocess.Popen[bytes] | None) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            p.terminate()
    for p in procs:
        if p is not None:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
