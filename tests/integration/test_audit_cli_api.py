"""`enclave admin audit --via-api` with issue 22's model and options flags against the API
as deployed (uvicorn, SQLite): --model, --dpsgd and --expm reach POST /v1/admin/audits as
the request's fields, the worker's task runs the audit here, and the command prints the
report (the MLP, ExpM's sampler); a refusal is the API's 422 problem on one line, with
nothing stored."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from enclave.cli import app
from service.audits import Audit
from service.db import engine_for, transaction
from worker.audit_job import AuditOutcome, execute_audit

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
CLAIM = ["admin", "audit", "--epsilon", "1", "--delta", "1e-5", "--canaries", "30"]


def _requests(settings: Any) -> list[tuple[str, dict[str, Any]]]:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        return [(a.id, a.request) for a in s.scalars(select(Audit)).all()]


@SQLITE
def test_the_cli_submits_an_mlp_audit_with_its_options(live: str, keys: Any, settings: Any) -> None:
    argv = [*CLAIM, "--method", "dpsgd", "--model", '{"kind": "mlp", "hidden": [8]}']
    argv += ["--dpsgd", '{"engine": "ghost", "epochs": 1}']
    argv += ["--via-api", "--url", live, "--key", keys.admin, "--timeout", "300"]
    out: dict[str, Any] = {}
    cli = threading.Thread(target=lambda: out.update(r=CliRunner().invoke(app, argv)))
    cli.start()
    deadline = time.monotonic() + 120
    while not (stored := _requests(settings)):
        assert time.monotonic() < deadline and cli.is_alive(), out
        time.sleep(0.2)
    ((audit_id, request),) = stored
    assert request["model"] == {"kind": "mlp", "hidden": [8], "activation": "tanh"}
    assert request["dpsgd"]["engine"] == "ghost" and request["dpsgd"]["epochs"] == 1
    assert request["expm"] is None
    assert execute_audit(audit_id, settings) == AuditOutcome.done
    cli.join(timeout=120)
    r = out["r"]
    assert r.exit_code == 0, r.output
    first, second, third = r.output.strip().splitlines()
    assert first.endswith("with 30 canaries): a lower bound, not a proof")
    assert "of 6 guesses right on 30 canaries; dpsgd MLP on adult (30,162 rows)" in second
    assert third.startswith(f"audit {audit_id} ")


@SQLITE
def test_a_refused_expm_option_is_the_apis_422_on_one_line(
    live: str, keys: Any, settings: Any
) -> None:
    argv = [*CLAIM, "--method", "dpsgd", "--expm", '{"sampler": "mcmc"}']
    r = CliRunner().invoke(app, [*argv, "--via-api", "--url", live, "--key", keys.admin])
    assert r.exit_code == 1
    (line,) = r.output.strip().splitlines()
    assert line.startswith("error: ") and "expm options are for method 'expm' only" in line
    assert _requests(settings) == []
