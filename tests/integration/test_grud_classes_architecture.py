"""Issue 20: architecture search over GRU-D hidden sizes on a small synthetic three-class
time-series dataset (test data, not private) through the API and the in-process worker
(SQLite): ExpM+NF candidates, the ghost and JL engines and a classes count that is not the
outcome's are 422 problems that charge nothing; the quote's model is the space's largest
GRU-D with K logits, its charge the search's rule rebuilt from a DP-SGD job plan
(tests/unit/test_grud_classes_architecture.py); the job trains its two candidates by exact
DP-SGD and releases the chosen K-logit GRU-D, scored by the analyst's scorer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.privacy.events import event_from_json
from tests.conftest import auth
from tests.integration.test_multiclass import _remaining
from tests.integration.test_timeseries_classes import (
    register_three_class_series,
    score_released_series,
    selection_refusals_charge_nothing,
)
from tests.unit.test_cnn_architecture import _expected_event
from worker.runner import Outcome, execute_job

SPACE = {"model": "grud", "depths": [1], "widths": [2, 3]}
TRAINING = {"epochs": 2, "batch_size": 40, "learning_rate": 1.0}
BODY: dict[str, Any] = {
    "dataset": "tri-icu",
    "kind": "architecture",
    "epsilon": 8.0,
    "delta": 1e-5,
    "space": SPACE,
    "search": {"algorithm": "rs", "trainings": 2},
    "training": TRAINING,
}
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "ghost": ({"training": {**TRAINING, "engine": "ghost"}}, "engine 'ghost'"),
    "jl": ({"training": {**TRAINING, "engine": "jl", "jl_projections": 4}}, "engine 'jl'"),
    "expm_nf": (
        {
            "method": "expm_nf",
            "training": {},
            "expm_nf": {"steps": 3, "n_samples_per_step": 4, "batch_size": 8},
        },
        "method 'expm_nf'",
    ),
    "classes": ({"space": {**SPACE, "classes": 4}}, "differs from the dataset's 3"),
}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_k_class_grud_search_releases_the_chosen_grud(
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
    assert plan["model"] == {"kind": "grud", "hidden": 3, "classes": 3}
    assert quoted["estimate"]["seconds"] > 0

    r = client.post("/v1/selections", json=BODY, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    public_schema = schema.model_dump(mode="json")
    expected = _expected_event(
        {"request": job["request"], "mechanism": job["plan"]["mechanism"]}, public_schema, 200
    )
    assert event_from_json(job["plan"]["event"]) == expected
    after = _remaining(client, headers, "tri-icu")
    assert after["remaining_epsilon"] == quoted["dataset_after"]["remaining_epsilon"]

    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=headers).json()
    assert card["privacy"]["guarantee"] == "proven"
    model = card["selection"]["model"]
    assert model["kind"] == "grud" and model["classes"] == 3 and model["hidden"] in (2, 3)
    assert card["selection"]["selected"]["hidden"] == [model["hidden"]]
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=headers).content

    *_, scored = score_released_series(card, weights, tmp_path, stays=60)
    print(
        f"3-class GRU-D search (rs, 2 candidates), hidden {model['hidden']} chosen: "
        f"accuracy {scored.accuracy:.3f} (one run)"
    )
    assert _remaining(client, headers, "tri-icu") == after  # the run charged nothing more
