"""Issue 24 through the API and the worker: an ``expm`` job charged by the hidden-iterate
bound (``accounting: "hidden"``) on a dataset whose schema states ``max_rows``; refused
(422, nothing charged) where the schema states none; a file above the cap refused at
registration. Runs on SQLite and PostgreSQL (the ``settings`` fixture)."""

from __future__ import annotations

from typing import Any

import pytest

from service.datasets.tabular import parse_schema
from service.db import engine_for
from tests.conftest import SMALL_SCHEMA, auth, write_toy_csv
from worker.registration import RegistrationError, register_dataset
from worker.runner import Outcome, execute_job

HIDDEN = {
    "method": "expm",
    "epsilon": 1.0,
    "delta": 1e-5,
    "expm": {"accounting": "hidden", "steps": 40},
}


def _register_capped(settings: Any, *, cap: int, rows: int = 400) -> None:
    schema = parse_schema({**SMALL_SCHEMA, "name": "capped", "max_rows": cap})
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=schema,
        csv_path=write_toy_csv(settings.home / "capped.csv", n=rows),
        epsilon_total=10.0,
        delta_total=1e-5,
    )


def _remaining(client: Any, keys: Any, name: str) -> float:
    r = client.get(f"/v1/datasets/{name}", headers=auth(keys.alice))
    return float(r.json()["budget"]["remaining_epsilon"])


def test_hidden_job_runs_on_a_capped_dataset_and_is_refused_elsewhere(
    client: Any, keys: Any, settings: Any
) -> None:
    before = _remaining(client, keys, "toy")
    r = client.post("/v1/jobs", json={"dataset": "toy", **HIDDEN}, headers=auth(keys.alice))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "max_rows" in r.json()["detail"]
    assert _remaining(client, keys, "toy") == before  # nothing charged

    _register_capped(settings, cap=440)
    body = {"dataset": "capped", **HIDDEN}
    quote = client.post("/v1/quote", json=body, headers=auth(keys.alice)).json()
    plan = quote["plan"]
    assert quote["admitted"] is True and plan["guarantee"] == "proven"
    mechanism = plan["mechanism"]
    assert mechanism["accounting"] == "hidden" and mechanism["max_rows"] == 440
    assert mechanism["noise_multiplier"] > mechanism["effective_noise_multiplier"]
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job_id = str(r.json()["id"])
    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["privacy"]["guarantee"] == "proven"
    assert card["mechanism"]["accounting"] == "hidden"
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=auth(keys.alice))
    assert weights.status_code == 200, weights.text


def test_registration_refuses_more_rows_than_the_schemas_cap(settings: Any, keys: Any) -> None:
    with pytest.raises(RegistrationError, match="max_rows 300"):
        _register_capped(settings, cap=300, rows=400)


def test_max_rows_is_validated_with_the_schema() -> None:
    for bad in (0, -5, 2**21, "many"):
        with pytest.raises(ValueError):
            parse_schema({**SMALL_SCHEMA, "max_rows": bad})
    assert parse_schema({**SMALL_SCHEMA, "max_rows": 500}).max_rows == 500


def test_a_hidden_job_at_epsilon_1e_3_is_quoted_charged_and_released(
    client: Any, keys: Any, settings: Any
) -> None:
    """ε = 1e-3 (refused before issue 24's large orders: the RDP conversion stopped at order
    1024, where a Gaussian cannot go below ε ≈ 0.011 at δ = 1e-5): admitted, the plan's
    event is (1e-3, 1e-5)-DP by its accountant, the exact Gaussian profile of its μ-GDP
    bound ('pld'; the RDP conversion of the same event says more), the ledger is charged,
    the job releases a proven model."""
    from service.privacy.calibrate import epsilon_for
    from service.privacy.events import event_from_json

    _register_capped(settings, cap=440)
    body = {"dataset": "capped", **HIDDEN, "epsilon": 1e-3}
    quote = client.post("/v1/quote", json=body, headers=auth(keys.alice)).json()
    assert quote["admitted"] is True, quote
    plan = quote["plan"]
    assert plan["guarantee"] == "proven" and plan["mechanism"]["accounting"] == "hidden"
    event = event_from_json(plan["event"])
    assert plan["accountant"] == "pld"
    assert epsilon_for(event=event, delta=1e-5, accountant="pld") <= 1e-3
    assert epsilon_for(event=event, delta=1e-5, accountant="rdp") > 1e-3
    before = _remaining(client, keys, "capped")
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job_id = str(r.json()["id"])
    assert _remaining(client, keys, "capped") < before
    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["privacy"]["guarantee"] == "proven"
    assert card["privacy"]["epsilon"] == pytest.approx(1e-3)
