"""Issue 20: hyperparameter tuning of a K-class GRU-D on a small synthetic three-class
time-series dataset (test data, not private) through the API and the in-process worker
(SQLite): what cannot run is a 422 problem that charges nothing (an engine option, a
classes count that is not the outcome's, GRU-D on a tabular dataset); the quote is
admitted and its charge is the tuning rule's (tests/unit/test_grud_classes_tuning.py:
random stopping over the DP-SGD job plans of the candidates + one noisy count); the job
trains its runs by exact DP-SGD and releases the chosen settings' K-logit GRU-D, its card
naming the fitted model and its weights scored by the analyst's scorer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.privacy.events import event_from_json
from service.schemas import JobRequest, PrivacyPlan
from tests.conftest import auth
from tests.integration.test_multiclass import _remaining
from tests.integration.test_timeseries_classes import (
    register_three_class_series,
    score_released_series,
    selection_refusals_charge_nothing,
)
from tests.unit.test_cnn_tuning import _expected_event
from worker.runner import Outcome, execute_job

MODEL = {"kind": "grud", "hidden": 3}
BODY: dict[str, Any] = {
    "dataset": "tri-icu",
    "kind": "hyperparameters",
    "epsilon": 8.0,
    "delta": 1e-5,
    "model": MODEL,
    "learning_rates": [0.5, 1.0],
    "batch_sizes": [40],
    "epochs": [2],
    # at most two runs: the worker always trains two (decoys after the K-th)
    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.5, "max_runs": 2},
}
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    # the kind has no engine option: its trainings use the exact engine (GRU-D's ghost and
    # JL engines do not take K classes, service/plans.py MULTICLASS_MODELS)
    "engine": ({"dpsgd": {"engine": "ghost"}}, "extra_forbidden"),
    "classes": ({"model": {**MODEL, "classes": 4}}, "differs from the dataset's 3 classes"),
    "tabular": ({"dataset": "toy"}, "GRU-D"),
}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_k_class_grud_tuning_releases_the_chosen_settings_grud(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    headers = auth(keys.alice)
    schema = register_three_class_series(settings, tmp_path, stays=200)
    selection_refusals_charge_nothing(client, headers, BODY, REFUSED)

    quote = client.post("/v1/selections/quote", json=BODY, headers=headers)
    assert quote.status_code == 200, quote.text
    quoted = quote.json()
    plan = quoted["plan"]
    assert quoted["admitted"] and plan["guarantee"] == "proven" and plan["epsilon"] <= 8.0
    assert quoted["charged_epsilon"] == plan["epsilon"]
    assert plan["model"] == {**MODEL, "classes": 3}
    assert quoted["estimate"]["seconds"] > 0

    r = client.post("/v1/selections", json=BODY, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    stored = JobRequest.model_validate(job["request"])
    charged = PrivacyPlan.model_validate(job["plan"])
    public_schema = schema.model_dump(mode="json")
    expected = _expected_event({"request": stored, "plan": charged}, public_schema)
    assert event_from_json(charged.event) == expected
    after = _remaining(client, headers, "tri-icu")
    assert after["remaining_epsilon"] == quoted["dataset_after"]["remaining_epsilon"]

    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    assert job["status"] == "released" and job["progress_step"] == job["progress_total"] == 1
    card = client.get(f"/v1/jobs/{job_id}/release", headers=headers).json()
    assert card["privacy"]["guarantee"] == "proven"
    assert card["mechanism"]["method"] == "selection"
    assert card["model"] == {**MODEL, "classes": 3} == card["selection"]["model"]
    selected = card["selection"]["selected"]
    assert selected["learning_rate"] in (0.5, 1.0) and selected["batch_size"] == 40
    assert isinstance(card["selection"]["noisy_validation_accuracy"], float)
    assert set(card["selection"]) == {"selected", "model", "noisy_validation_accuracy"}
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=headers).content

    *_, scored = score_released_series(card, weights, tmp_path, stays=60)
    print(
        f"3-class GRU-D tuning (2 runs, H = 3), learning rate {selected['learning_rate']} "
        f"chosen: accuracy {scored.accuracy:.3f} (one run)"
    )
    assert _remaining(client, headers, "tri-icu") == after  # the run charged nothing more
