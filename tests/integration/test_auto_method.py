"""``method: "auto"`` end to end (issue 21, point 3): quoted, submitted, run by the worker
(whose plan check re-derives the choice from the stored ``auto`` request) and released; the
quote, the job and the card record the request's ``auto`` and the chosen method. Method
options with ``auto`` are a 422 that charges nothing. Runs on SQLite and PostgreSQL (the
``settings`` fixture's parametrisation)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from enclave.jobs_cli import quote_table
from service.config import Settings
from tests.conftest import Keys, auth, bootstrap
from worker.runner import Outcome, execute_job


@pytest.fixture
def keys(settings: Settings) -> Keys:
    # 2,000 toy rows, B = 4 (two numeric columns, one categorical, the bias): the rule's
    # scale n̂·ε/√B is ≈ 500 at ε = 0.5 (DP-SGD) and ≈ 2,000 at ε = 2 (the Langevin ExpM).
    return bootstrap(settings, n=2_000)


@pytest.mark.parametrize(("epsilon", "method"), [(0.5, "dpsgd"), (2.0, "expm")])
def test_an_auto_job_runs_and_its_card_records_the_choice(
    client: Any, keys: Keys, settings: Settings, epsilon: float, method: str
) -> None:
    alice = auth(keys.alice)
    body = {"dataset": "toy", "method": "auto", "epsilon": epsilon, "delta": 1e-5}
    quote = client.post("/v1/quote", json=body, headers=alice)
    assert quote.status_code == 200, quote.text
    assert quote.json()["admitted"] is True, quote.json()
    plan = quote.json()["plan"]
    assert plan["method"] == method
    assert plan["guarantee"] == "proven"
    choice = plan["method_choice"]
    assert (choice["requested"], choice["method"]) == ("auto", method)
    assert "n̂·ε/√B" in choice["reason"]
    shown = Console(record=True, width=400)  # the CLI's quote (enclave jobs quote)
    shown.print(quote_table(quote.json()))
    assert f"{method} (auto: {choice['reason']})" in shown.export_text()

    r = client.post("/v1/jobs", json=body, headers=alice)
    assert r.status_code == 202, r.text
    job_id = str(r.json()["id"])
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert job["request"]["method"] == "auto"  # stored as sent: the worker re-plans from it
    assert job["method"] == method
    assert job["plan"] == plan

    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert job["status"] == "released", job
    card = client.get(f"/v1/jobs/{job_id}/release", headers=alice).json()
    assert card["method_choice"] == choice
    assert card["mechanism"]["method"] == method
    assert card["privacy"]["guarantee"] == "proven"
    if method == "expm":
        assert card["mechanism"]["sampler"] == "langevin"


def test_a_named_methods_card_has_no_choice(client: Any, keys: Keys, settings: Settings) -> None:
    alice = auth(keys.alice)
    body = {"dataset": "toy", "method": "expm", "epsilon": 1.0, "delta": 1e-5}
    quote = client.post("/v1/quote", json=body, headers=alice)
    assert quote.status_code == 200, quote.text
    assert "method_choice" not in quote.json()["plan"]
    r = client.post("/v1/jobs", json=body, headers=alice)
    assert r.status_code == 202, r.text
    job_id = str(r.json()["id"])
    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=alice).json()
    assert "method_choice" not in card


@pytest.mark.parametrize(
    "options",
    [{"dpsgd": {"epochs": 1}}, {"expm": {"steps": 10}}, {"expm_nf": {"layers": 1}}],
)
def test_auto_with_method_options_is_refused_and_charges_nothing(
    client: Any, keys: Keys, options: dict[str, Any]
) -> None:
    alice = auth(keys.alice)
    before = client.get("/v1/datasets/toy", headers=alice).json()
    body = {"dataset": "toy", "method": "auto", "epsilon": 1.0, "delta": 1e-5, **options}
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=body, headers=alice)
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["type"].endswith("invalid-plan"), problem
        assert "name the method to set its options" in problem["detail"]
    assert client.get("/v1/datasets/toy", headers=alice).json() == before
    assert client.get("/v1/jobs", headers=alice).json() == []
