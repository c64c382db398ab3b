"""Operations: one home for every process's paths, a missing release file answered as a
problem, and the Prometheus metrics."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from enclave.processes import child_env, free_port, start_api, stop, wait_ready
from service.config import Settings, get_settings
from tests.conftest import Keys, auth, bootstrap
from worker.runner import Outcome, execute_job

BODY = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 2.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def test_paths_are_absolute_and_under_one_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings(home=Path("h"), release_dir=Path("rel"))
    assert s.home == tmp_path / "h"
    assert s.resolved_release_dir == tmp_path / "h" / "rel"
    assert s.resolved_data_dir == tmp_path / "h" / "private-data"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # another folder, the same absolute home
    assert Settings(home=tmp_path / "h", release_dir=Path("rel")).resolved_release_dir == (
        s.resolved_release_dir
    )
    assert Settings(home=s.home, data_dir=Path("/abs")).resolved_data_dir == Path("/abs")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.delenv("ENCLAVE_HOME", raising=False)
    assert Settings().home == tmp_path / "user" / ".enclave"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_api_and_worker_in_different_folders_share_releases(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default home and a relative ENCLAVE_RELEASE_DIR; the API runs as a process in one
    folder, the worker in this process in another: the weights download works, and once
    the file is gone it is a 404 problem, not a 500."""
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.delenv("ENCLAVE_HOME", raising=False)
    monkeypatch.setenv("ENCLAVE_DATABASE_URL", db_url)
    monkeypatch.setenv("ENCLAVE_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.sqlite'}")
    monkeypatch.setenv("ENCLAVE_RELEASE_DIR", "releases")
    monkeypatch.setenv("ENCLAVE_DEVICE", "cpu")
    api_cwd, worker_cwd = tmp_path / "api", tmp_path / "worker"
    api_cwd.mkdir()
    worker_cwd.mkdir()
    monkeypatch.chdir(worker_cwd)
    get_settings.cache_clear()
    settings = get_settings()
    settings.home.mkdir(parents=True)
    keys = bootstrap(settings)
    port = free_port()
    log = tmp_path / "api.log"
    proc = start_api(child_env({}), port, cwd=api_cwd, log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base)
        with httpx.Client(base_url=base, headers=auth(keys.alice), timeout=30) as api:
            job_id = api.post("/v1/jobs", json=BODY).raise_for_status().json()["id"]
            assert execute_job(job_id, settings) == Outcome.released
            weights = api.get(f"/v1/jobs/{job_id}/release/weights")
            assert weights.status_code == 200 and len(weights.content) > 0
            [stored] = (settings.home / "releases" / job_id).glob("*/model.safetensors")
            assert stored.read_bytes() == weights.content
            stored.unlink()
            missing = api.get(f"/v1/jobs/{job_id}/release/weights")
            assert missing.status_code == 404, missing.text
            assert missing.headers["content-type"] == "application/problem+json"
            assert "ENCLAVE_RELEASE_DIR" in missing.json()["detail"]
            assert str(settings.home) not in missing.text  # no server path in the answer
    finally:
        stop(proc)
        get_settings.cache_clear()
    assert not any(api_cwd.iterdir()) and not any(worker_cwd.iterdir())
    # The API process logs JSON lines with request ids (service/logs.py).
    import json

    access = [
        json.loads(line)
        for line in log.read_text().splitlines()
        if line.startswith("{") and '"enclave.api.access"' in line
    ]
    weights_lines = [a for a in access if a["route"] == "/v1/jobs/{job_id}/release/weights"]
    assert [a["status"] for a in weights_lines] == [200, 404]
    assert all(len(a["request_id"]) == 32 for a in weights_lines)
    assert job_id not in json.dumps(access)  # the access log has route templates, never ids
    # The API's own warning about the missing file carries the same request's id.
    warning = next(json.loads(x) for x in log.read_text().splitlines() if "not found at" in x)
    assert warning["request_id"] == weights_lines[1]["request_id"]


def test_metrics_count_requests_by_route_template(client: Any, keys: Keys) -> None:
    job_id = client.post("/v1/jobs", json=BODY, headers=auth(keys.alice)).json()["id"]
    assert client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).status_code == 200
    assert client.get("/v1/datasets").status_code == 401
    assert client.get("/no/such/path").status_code == 404
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'enclave_http_requests_total{method="POST",route="/v1/jobs",status="202"} 1.0' in text
    assert (
        'enclave_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"} 1.0'
        in text
    )
    assert 'enclave_http_requests_total{method="GET",route="/v1/datasets",status="401"} 1.0' in text
    assert 'route="<unmatched>",status="404"' in text
    assert "enclave_http_request_duration_seconds_bucket" in text
    assert 'enclave_jobs{status="queued"} 1.0' in text
    assert 'enclave_jobs{status="released"} 0.0' in text
    assert job_id not in text  # route templates only, never an id


def test_enclave_up_writes_its_processes_logs_under_its_home(tmp_path: Path) -> None:
    """`enclave up` with a relative ENCLAVE_HOME: the API and the worker it starts log to
    HOME/logs/, and everything lands under that one home."""
    env = {k: v for k, v in child_env({}).items() if not k.startswith("ENCLAVE_")}
    env |= {"ENCLAVE_HOME": "home", "ENCLAVE_DEVICE": "cpu"}
    port = free_port()
    cmd = [sys.executable, "-m", "enclave.cli", "up", "--port", str(port)]
    proc = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    logs = tmp_path / "home" / "logs"
    try:
        wait_ready(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while "ready" not in (logs / "worker.log").read_text():
            assert time.monotonic() < deadline, (logs / "worker.log").read_text()
            time.sleep(0.5)
        assert (logs / "api.log").is_file()
        assert (tmp_path / "home" / "ledger.sqlite").is_file()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert f"logs in {logs}" in out.decode()


def test_api_logs_json_lines_with_request_ids(
    client: Any, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Every response carries a request id (the caller's, if it is a safe token) and the
    access log has one JSON line per request with the route template, never the ids."""
    import json
    import logging

    from service.logs import JsonFormatter

    with caplog.at_level(logging.INFO, logger="enclave.api.access"):
        mine = client.get(
            "/v1/jobs/00000000-0000-0000-0000-000000000000",
            headers={**auth(keys.alice), "X-Request-ID": "trace-42"},
        )
        fresh = client.get("/v1/datasets", headers={**auth(keys.alice), "X-Request-ID": "a b\n"})
    assert mine.status_code == 404 and mine.headers["X-Request-ID"] == "trace-42"
    rid = fresh.headers["X-Request-ID"]
    assert rid != "a b\n" and len(rid) == 32  # an unsafe id is replaced by a fresh one
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    by_id = {line["request_id"]: line for line in lines}
    assert by_id["trace-42"]["route"] == "/v1/jobs/{job_id}" and by_id["trace-42"]["status"] == 404
    assert by_id[rid]["route"] == "/v1/datasets" and by_id[rid]["method"] == "GET"
    text = json.dumps(lines)
    assert "00000000-0000" not in text and keys.alice not in text  # no ids, no keys
