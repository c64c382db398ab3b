"""Refunds on real databases (SQLite and PostgreSQL): one sign convention for a refund's ε
and δ in every view of the ledger (GET /v1/admin/ledger, `enclave ledger show`, the
dashboard), and the automatic refund of a job that failed before it read a private row
(exactly once; never for a job that read rows)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select, update
from typer.testing import CliRunner

from enclave.cli import app
from service.admin import signed_delta
from service.db import engine_for, transaction
from service.ledger.audit import check_totals, verify_all
from service.ledger.refunds import AUTOMATIC_REFUND_REASON
from service.ledger.tables import EntryKind, Job, JobStatus, LedgerEntry
from tests.conftest import auth
from worker.data import ROWS_FILE, dataset_dir
from worker.runner import Outcome, execute_job

DPSGD = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def _budget(client: Any, keys: Any) -> Any:
    return client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]


def _entries(client: Any, keys: Any, job_id: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in client.get("/v1/admin/ledger", headers=auth(keys.admin)).json():
        if e["job_id"] == job_id:
            out.setdefault(e["kind"], []).append(e)
    return out


def _ledger_sound(settings: Any) -> None:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert check_totals(s) == []
        assert all(v.ok for v in verify_all(s))


def test_signed_delta_follows_the_sign_of_epsilon() -> None:
    assert signed_delta(EntryKind.refund, -1_000_000, "1e-05") == "-1e-05"
    assert signed_delta(EntryKind.refund, 0, "0") == "0"  # information only: nothing back
    assert signed_delta(EntryKind.refund, -1_000_000, "0") == "0"  # a pure job's refund
    assert signed_delta(EntryKind.charge, 1_000_000, "1e-05") == "1e-05"


def test_a_refund_shows_negative_epsilon_and_delta_in_every_view(
    client: Any, keys: Any, settings: Any
) -> None:
    job = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    assert client.post(f"/v1/jobs/{job}/cancel", headers=auth(keys.alice)).is_success
    rows = _entries(client, keys, job)
    (charge,), (refund,) = rows["charge"], rows["refund"]
    assert refund["epsilon"] == -charge["epsilon"] < 0
    assert charge["delta"] == 1e-5  # a number, like ε: the plan's δ exactly
    assert refund["delta"] == -charge["delta"]  # the API: δ signed like ε

    shown = CliRunner().invoke(app, ["ledger", "show"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    (line,) = [ln for ln in shown.output.splitlines() if " refund " in ln and job[:8] in ln]
    cells = [c.strip() for c in line.split("│")]
    assert f"{refund['epsilon']:g}" in cells and f"{refund['delta']:g}" in cells, line

    # The dashboard shows the same figures (it no longer signs them itself).
    login = client.post("/dashboard/login", data={"api_key": keys.admin}, follow_redirects=False)
    assert login.status_code == 303
    page = client.get("/dashboard/ledger").text
    assert f"<td>{refund['delta']:g}</td>" in page  # -1e-05
    # The stored row is unchanged: the chain still verifies.
    assert client.get("/v1/admin/ledger/verify", headers=auth(keys.admin)).json()["ok"] is True


def test_a_job_failing_before_its_first_read_is_refunded_automatically_once(
    client: Any, keys: Any, settings: Any
) -> None:
    before = _budget(client, keys)
    job_id = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    assert _budget(client, keys) != before  # charged at admission
    (dataset_dir(settings.resolved_data_dir, "toy") / ROWS_FILE).unlink()
    assert execute_job(job_id, settings) == Outcome.failed
    assert _budget(client, keys) == before  # the charge went back to the filter
    (refund,) = _entries(client, keys, job_id)["refund"]
    assert refund["reason"] == AUTOMATIC_REFUND_REASON
    assert refund["event"]["data_touched"] is False and refund["epsilon"] < 0
    # Exactly once: neither the admin nor a second delivery of the job refunds it again.
    r = client.post(
        f"/v1/admin/jobs/{job_id}/refund",
        json={"reason": "the data volume was not mounted"},
        headers=auth(keys.admin),
    )
    assert r.status_code == 409 and "already refunded" in r.text
    assert execute_job(job_id, settings) == Outcome.skipped
    assert len(_entries(client, keys, job_id)["refund"]) == 1
    assert _budget(client, keys) == before
    _ledger_sound(settings)


def test_a_job_given_up_before_any_read_is_refunded(client: Any, keys: Any, settings: Any) -> None:
    """The worker's other failure path: too many attempts (each lost before reading)."""
    before = _budget(client, keys)
    job_id = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(update(Job).where(Job.id == job_id).values(attempts=settings.max_attempts))
    assert execute_job(job_id, settings) == Outcome.skipped
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.get_one(Job, job_id).status == JobStatus.failed
    assert [e["reason"] for e in _entries(client, keys, job_id)["refund"]] == [
        AUTOMATIC_REFUND_REASON
    ]
    assert _budget(client, keys) == before
    _ledger_sound(settings)


def test_a_job_that_read_rows_and_failed_keeps_its_charge(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import worker.runner as runner

    def broken(**_: Any) -> Any:
        raise RuntimeError("the mechanism failed after reading rows")

    monkeypatch.setattr(runner, "run_mechanism", broken)
    job_id = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    charged = _budget(client, keys)
    assert execute_job(job_id, settings) == Outcome.failed
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, job_id)
        assert job.status == JobStatus.failed and job.data_touched is True
        refunds = s.scalar(
            select(func.count())
            .select_from(LedgerEntry)
            .where(LedgerEntry.job_id == job_id, LedgerEntry.kind == EntryKind.refund)
        )
        assert refunds == 0
    assert _budget(client, keys) == charged
    _ledger_sound(settings)
