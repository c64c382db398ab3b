"""`enclave jobs` (the analyst's CLI) against a live API in a child process, and the
admin's job, refund, nominal and analyst commands on the same ledger."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from enclave.analyst import open_release
from enclave.cli import app
from enclave.processes import free_port
from service.db import engine_for, transaction
from service.ledger.tables import Job, JobStatus
from tests.conftest import Keys, auth
from worker.data import ROWS_FILE, dataset_dir
from worker.runner import Outcome, execute_job

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

runner = CliRunner()
REQUEST = ["--dataset", "toy", "--method", "dpsgd", "--epsilon", "1", "--delta", "1e-5"]


def jobs(live: str, key: str, *args: str) -> Any:
    """`enclave jobs …` with the URL and key from the environment, as an analyst runs it."""
    env = {"ENCLAVE_URL": live, "ENCLAVE_API_KEY": key, "COLUMNS": "200"}
    return runner.invoke(app, ["jobs", *args], env=env)


def one_error_line(result: Any) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return str(lines[0])


def test_quote_submit_watch_download_score(
    live: str, keys: Keys, settings: Any, tmp_path: Path
) -> None:
    q = jobs(live, keys.alice, "quote", *REQUEST)
    assert q.exit_code == 0, q.output + q.stderr
    assert "stated ε (nats)" in q.output and "charged_epsilon" in q.output
    assert "PROVEN" in q.output and "admitted" in q.output
    assert "worker time (at most)" in q.output and " s " in q.output
    # The same body from a file, a flag on top of it.
    body = tmp_path / "request.json"
    body.write_text(json.dumps({"dataset": "toy", "method": "dpsgd", "epsilon": 5, "delta": 1e-5,
                                "dpsgd": {"epochs": 1, "batch_size": 50}}))  # fmt: skip
    q = jobs(live, keys.alice, "quote", "--body", str(body), "--epsilon", "2")
    assert q.exit_code == 0 and "│ 2 " in q.output, q.output

    s = jobs(live, keys.alice, "submit", "--body", str(body), "--idempotency-key", "run-1")
    assert s.exit_code == 0, s.output + s.stderr
    job_id = s.output.strip().splitlines()[-1]
    again = jobs(live, keys.alice, "submit", "--body", str(body), "--idempotency-key", "run-1")
    assert again.exit_code == 0 and again.output.strip().splitlines()[-1] == job_id
    assert "the first job" in again.output
    job = httpx.get(f"{live}/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    total = job["plan"]["mechanism"]["steps"]
    assert (job["status"], job["progress_step"], job["progress_total"]) == ("queued", 0, total)
    assert f"step 0 of {total}" in s.output

    # The worker runs the job while the analyst watches.
    def run() -> None:
        time.sleep(1.0)
        assert execute_job(job_id, settings) == Outcome.released

    worker = threading.Thread(target=run)
    worker.start()
    w = jobs(live, keys.alice, "watch", job_id, "--interval", "0.2", "--timeout", "120")
    worker.join()
    assert w.exit_code == 0, w.output + w.stderr
    assert f"{total}/{total}" in w.output and "released" in w.output

    out = tmp_path / "release"
    d = jobs(live, keys.alice, "download", job_id, "--out", str(out))
    assert d.exit_code == 0, d.output + d.stderr
    assert (out / "card.json").is_file() and (out / "model.safetensors").is_file()
    assert open_release(out).card["privacy"]["guarantee"] == "proven"

    preds = tmp_path / "p.csv"
    csv = settings.home / "toy.csv"
    sc = runner.invoke(app, ["jobs", "score", str(out), str(csv), "--predictions", str(preds)])
    assert sc.exit_code == 0, sc.output + sc.stderr
    assert "AUC" in sc.output and "rows kept" in sc.output
    assert len(preds.read_text().splitlines()) == 401  # header + the 400 toy rows


def test_http_errors_are_one_line(live: str, keys: Keys, settings: Any, tmp_path: Path) -> None:
    line = one_error_line(jobs(live, keys.alice, "quote", *REQUEST[:1], "nope", *REQUEST[2:]))
    assert line == "error: Not found: no dataset named 'nope'"
    line = one_error_line(jobs(live, "enc_wrong", "quote", *REQUEST))
    assert line.startswith("error: Unauthorized: ")
    line = one_error_line(jobs(live, keys.alice, "submit", *REQUEST[:4], "--epsilon", "0"))
    assert line.startswith("error: Invalid request: ") and "epsilon" in line
    s = jobs(live, keys.alice, "submit", *REQUEST)
    job_id = s.output.strip().splitlines()[-1]
    line = one_error_line(jobs(live, keys.alice, "download", job_id, "--out", str(tmp_path)))
    assert line.startswith("error: Release not ready: ")
    line = one_error_line(jobs(live, keys.bob, "watch", job_id))  # not bob's job
    assert line.startswith("error: Not found: ")
    line = one_error_line(jobs(live, keys.alice, "quote", *REQUEST, "--epsilon", "1000000"))
    assert line.startswith("error: Invalid request: ")
    # Not the API's errors: no key, no server, no request.
    no_key = runner.invoke(app, ["jobs", "quote", *REQUEST], env={"ENCLAVE_API_KEY": ""})
    assert one_error_line(no_key).startswith("error: no API key")
    down = f"http://127.0.0.1:{free_port()}"
    assert one_error_line(jobs(down, keys.alice, "quote", *REQUEST)).startswith(
        f"error: cannot reach {down}"
    )
    assert "needs dataset" in one_error_line(jobs(live, keys.alice, "quote"))
    # A folder that holds no release: one line, not a traceback.
    csv = settings.home / "toy.csv"
    line = one_error_line(runner.invoke(app, ["jobs", "score", str(tmp_path), str(csv)]))
    assert line.startswith("error: cannot score toy.csv")


def test_quote_refused_by_the_budget_exits_1(live: str, keys: Keys) -> None:
    r = jobs(live, keys.alice, "quote", *REQUEST[:4], "--epsilon", "50", "--delta", "1e-5")
    assert "admitted" in r.output
    assert one_error_line(r).startswith("error: not admitted: ")


def test_admin_jobs_refund_nominal_and_analysts(client: Any, keys: Keys, settings: Any) -> None:
    body = {"dataset": "toy", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-5,
            "dpsgd": {"epochs": 1, "batch_size": 50}}  # fmt: skip
    job_id = client.post("/v1/jobs", json=body, headers=auth(keys.alice)).json()["id"]
    (dataset_dir(settings.resolved_data_dir, "toy") / ROWS_FILE).unlink()
    assert execute_job(job_id, settings) == Outcome.failed
    env = {"COLUMNS": "250"}
    listing = runner.invoke(app, ["admin", "jobs"], env=env)
    assert listing.exit_code == 0, listing.output
    assert job_id in listing.output and "alice" in listing.output and "failed" in listing.output
    assert "the job failed inside the enclave" in listing.output
    # It failed before reading a row: refunded automatically, so the admin's refund is
    # refused; the admin refunds a job marked failed by hand instead.
    assert "(refunded)" in listing.output
    auto = runner.invoke(app, ["admin", "refund", job_id, "--reason", "rows file was missing"])
    assert "already refunded" in one_error_line(auto)
    job_id = client.post("/v1/jobs", json=body, headers=auth(keys.alice)).json()["id"]
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.failed))
    r = runner.invoke(app, ["admin", "refund", job_id, "--reason", "rows file was missing"])
    assert r.exit_code == 0, r.output + r.stderr
    assert runner.invoke(app, ["admin", "jobs"], env=env).output.count("(refunded)") == 2
    assert one_error_line(
        runner.invoke(app, ["admin", "refund", "nope", "--reason", "why not"])
    ) == ("error: no job 'nope'")
    assert "reason" in one_error_line(
        runner.invoke(app, ["admin", "refund", job_id, "--reason", "x"])
    )
    again = runner.invoke(app, ["admin", "refund", job_id, "--reason", "once more"])
    assert one_error_line(again).startswith("error: refused: ")

    assert runner.invoke(app, ["datasets", "nominal", "toy", "--deny"]).exit_code == 0
    nf = {"dataset": "toy", "method": "expm_nf", "epsilon": 1.0, "delta": 0}
    assert client.post("/v1/quote", json=nf, headers=auth(keys.alice)).json()["admitted"] is False
    assert runner.invoke(app, ["datasets", "nominal", "toy", "--allow"]).exit_code == 0
    assert client.post("/v1/quote", json=nf, headers=auth(keys.alice)).json()["admitted"] is True
    assert one_error_line(runner.invoke(app, ["datasets", "nominal", "nope", "--allow"])) == (
        "error: no dataset named 'nope'"
    )

    analysts = runner.invoke(app, ["analysts", "list"], env=env)
    assert analysts.exit_code == 0, analysts.output
    for name in ("admin", "alice", "bob", "live", "toy"):
        assert name in analysts.output


def test_select_quotes_and_submits_a_selection(
    live: str, keys: Keys, settings: Any, tmp_path: Path
) -> None:
    body = tmp_path / "selection.json"
    body.write_text(json.dumps({
        "dataset": "toy", "kind": "architecture", "epsilon": 2, "delta": 1e-6,
        "space": {"depths": [1], "widths": [2]}, "search": {"algorithm": "rs", "trainings": 1},
        "training": {"epochs": 1, "batch_size": 50},
    }))  # fmt: skip
    q = jobs(live, keys.alice, "select", str(body), "--quote")
    assert q.exit_code == 0, q.output + q.stderr
    assert "selection" in q.output and "stage training" in q.output and "trainings: 1" in q.output
    s = jobs(live, keys.alice, "select", str(body))
    assert s.exit_code == 0, s.output + s.stderr
    job_id = s.output.strip().splitlines()[-1]
    assert execute_job(job_id, settings) == Outcome.released
    out = tmp_path / "release"
    d = jobs(live, keys.alice, "download", job_id, "--out", str(out))
    assert d.exit_code == 0, d.output + d.stderr
    assert json.loads((out / "card.json").read_text())["selection"]["selected"]["hidden"] == [2]
