"""A privacy audit through the deployed processes (issue 22): the API stores and sends it,
a real Celery worker takes the ``enclave.run_audit`` message and runs a small audit on
public Adult (once over HTTP, once through ``enclave admin audit --via-api``), and the
ledger is untouched: nothing is charged to any budget."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from enclave.cli import app
from service.config import Settings
from service.db import engine_for, transaction
from service.ledger.tables import Dataset, LedgerEntry
from tests.e2e.stack import GENEROUS_S, check_ledger, running_stack


def _ledger(settings: Settings) -> tuple[int, list[tuple[str, int]]]:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        entries = int(s.scalar(select(func.count()).select_from(LedgerEntry)) or 0)
        spent = [(d.name, d.spent_epsilon_micro) for d in s.scalars(select(Dataset))]
    return entries, spent


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_audit_runs_on_a_celery_worker_and_charges_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    body = {
        "method": "dpsgd",
        "epsilon": 1.0,
        "delta": 1e-5,
        "canaries": 20,
        "dpsgd": {"epochs": 1},
    }
    with running_stack(settings, tmp_path, settings.resolved_broker_url) as stack:
        before = _ledger(settings)
        stack.add_worker("w1")
        with stack.client(stack.keys.admin) as c:
            audit = c.post("/v1/admin/audits", json=body).raise_for_status().json()
            deadline = time.monotonic() + GENEROUS_S
            while audit["status"] in ("queued", "running"):
                assert time.monotonic() < deadline, audit
                time.sleep(0.3)
                audit = c.get(f"/v1/admin/audits/{audit['id']}").raise_for_status().json()
        assert audit["status"] == "done", audit
        result = audit["result"]
        assert 0.0 <= result["epsilon_lower_bound"] <= result["ceiling"] == audit["ceiling"]
        assert result["canaries"] == 20 and audit["seconds"] > 0
        # The same through `enclave admin audit --via-api`, on the same worker.
        argv = ["admin", "audit", "--method", "dpsgd", "--epsilon", "1", "--delta", "1e-5"]
        argv += ["--canaries", "10", "--via-api", "--url", stack.base, "--key", stack.keys.admin]
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0, r.output
        first, second, third = r.output.strip().splitlines()
        assert first.startswith("ε ≥ ") and first.endswith(
            "with 10 canaries): a lower bound, not a proof"
        )
        assert "of 2 guesses right on 10 canaries" in second and "nothing charged" in second
        with stack.client(stack.keys.admin) as c:
            listed = c.get("/v1/admin/audits").raise_for_status().json()
        assert [a["status"] for a in listed] == ["done", "done"] and listed[0]["id"] in third
        assert _ledger(settings) == before  # no entry, no ε spent on any dataset
        check_ledger(settings, releases=0)
