"""The API's keep-alive timeout (enclave/processes.py, API_KEEP_ALIVE_S) outlasts its
clients' own idle limits, in every way the product starts uvicorn: `enclave api` (the
Docker image's command) and start_api (`enclave up`, the demo, the tests). At uvicorn's
default (5 s, httpx's own idle limit too) the server could close a connection just as a
client sent its next request on it: "Server disconnected without sending a response"."""

from __future__ import annotations

import sys
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from enclave import processes
from enclave.cli import app
from enclave.processes import API_KEEP_ALIVE_S


def test_longer_than_the_clients_idle_limits() -> None:
    assert httpx.Limits().keepalive_expiry < API_KEEP_ALIVE_S  # type: ignore[operator]
    assert API_KEEP_ALIVE_S > 60  # a reverse proxy's usual idle timeout (AWS ALB, nginx)


def test_enclave_api_passes_it_to_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda target, **kw: seen.update(kw, target=target))
    r = CliRunner().invoke(app, ["api", "--port", "8123", "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert seen["target"] == "service.asgi:app"
    assert seen["timeout_keep_alive"] == API_KEEP_ALIVE_S
    assert (seen["port"], seen["workers"]) == (8123, 2)


def test_start_api_passes_it_to_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the command line start_api builds is looked at: no child is started.
    seen: list[list[str]] = []
    monkeypatch.setattr(processes.subprocess, "Popen", lambda cmd, **kw: seen.append(cmd))
    processes.start_api({}, 8123)
    (args,) = seen
    assert args[:4] == [sys.executable, "-m", "uvicorn", "service.asgi:app"]
    i = args.index("--timeout-keep-alive")
    assert args[i + 1] == str(API_KEEP_ALIVE_S)
