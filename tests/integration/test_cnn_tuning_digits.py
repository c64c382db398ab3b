"""Issue 20: hyperparameter tuning of a CNN on the bundled digits (8 × 8, 10 classes) through
the API and the in-process worker: what cannot run is a 422 problem that charges nothing
(a CNN on a tabular dataset, an engine option, batchnorm, another image shape); the
quote is admitted and its charge is the tuning rule's (tests/unit/test_cnn_tuning.py);
the job trains its runs by exact DP-SGD and releases the chosen settings' CNN, its card
naming the fitted model and its weights scored by the analyst's scorer."""

from __future__ import annotations

from typing import Any

import pytest

from enclave.analyst import score_images
from service.privacy.events import event_from_json
from service.releases import load_release
from service.schemas import JobRequest, PrivacyPlan
from tests.conftest import auth
from tests.integration.test_cnn_digits import DIGITS, _register, _remaining
from tests.unit.test_cnn_tuning import DIGITS as DIGITS_SCHEMA
from tests.unit.test_cnn_tuning import _expected_event
from worker.runner import Outcome, execute_job

CONV = [{"channels": 8, "kernel": 3, "padding": 1, "pool": "avg2"}]
BODY: dict[str, Any] = {
    "dataset": "digits",
    "kind": "hyperparameters",
    "epsilon": 8.0,
    "delta": 1e-5,
    "model": {"kind": "cnn", "conv": CONV},
    "learning_rates": [1.0, 2.0],
    "batch_sizes": [256],
    "epochs": [2],
    # at most two runs: the worker always trains two (decoys after the K-th)
    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.5, "max_runs": 2},
}
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "tabular": ({"dataset": "toy"}, "needs an image dataset; this dataset is tabular"),
    # the kind has no engine option: its trainings use the exact engine (a ghost or JL
    # engine for convolutions is not built, service/plans.py MULTICLASS_MODELS)
    "engine": ({"dpsgd": {"engine": "ghost"}}, "extra_forbidden"),
    "batchnorm": ({"model": {"kind": "cnn", "conv": CONV, "norm": "batchnorm"}}, "mixes rows"),
    "image": (
        {"model": {"kind": "cnn", "conv": CONV, "image": {"channels": 3, "height": 8, "width": 8}}},
        "differs from the dataset's",
    ),
    "kernel": (
        {"model": {"kind": "cnn", "conv": [{"channels": 4, "kernel": 7}] * 2}},
        "does not fit",
    ),
}


def _budgets(client: Any, headers: dict[str, str]) -> dict[str, Any]:
    return {d["name"]: d["budget"] for d in client.get("/v1/datasets", headers=headers).json()}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cnn_tuning_on_the_digits_releases_the_chosen_settings_cnn(
    client: Any, keys: Any, settings: Any
) -> None:
    headers = auth(keys.alice)
    _register(settings)
    before = _budgets(client, headers)
    for what, (change, text) in REFUSED.items():
        for path in ("/v1/selections/quote", "/v1/selections"):
            r = client.post(path, json={**BODY, **change}, headers=headers)
            assert r.status_code == 422, (what, path, r.text)
            assert r.headers["content-type"].startswith("application/problem+json"), what
            assert text in r.text, (what, r.text)
    assert _budgets(client, headers) == before  # nothing charged, on either dataset

    quote = client.post("/v1/selections/quote", json=BODY, headers=headers)
    assert quote.status_code == 200, quote.text
    quoted = quote.json()
    plan = quoted["plan"]
    assert quoted["admitted"] and plan["guarantee"] == "proven" and plan["epsilon"] <= 8.0
    assert quoted["charged_epsilon"] == plan["epsilon"]
    image = {"channels": 1, "height": 8, "width": 8}
    conv = [{**CONV[0], "stride": 1}]
    assert plan["model"] == {
        "kind": "cnn",
        "conv": conv,
        "norm": "none",
        "classes": 10,
        "image": image,
    }
    # conv 1 → 8 (3·3 + 1)·8 = 80, head (8·4·4 + 1)·10 = 1,290
    (candidate,) = plan["mechanism"]["candidates"]
    assert candidate["parameters"] == 80 + 1290 and candidate["batch_size"] == 256
    assert quoted["estimate"]["seconds"] > 0

    r = client.post("/v1/selections", json=BODY, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    stored = JobRequest.model_validate(job["request"])
    charged = PrivacyPlan.model_validate(job["plan"])
    # the charge is the rule's: random stopping over (the CNN's DP-SGD job event on the
    # training split + one noisy count), rebuilt from a DP-SGD job's plan
    expected = _expected_event({"request": stored, "plan": charged}, DIGITS_SCHEMA)
    assert event_from_json(charged.event) == expected
    after = _remaining(client, headers)
    assert after["remaining_epsilon"] == quoted["dataset_after"]["remaining_epsilon"]

    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    assert job["status"] == "released" and job["progress_step"] == job["progress_total"] == 1
    card = client.get(f"/v1/jobs/{job_id}/release", headers=headers).json()
    assert card["privacy"]["guarantee"] == "proven"
    assert card["mechanism"]["method"] == "selection"
    model = {**plan["model"]}
    assert card["model"] == model and card["selection"]["model"] == model
    selected = card["selection"]["selected"]
    assert selected["learning_rate"] in (1.0, 2.0) and selected["batch_size"] == 256
    assert selected["epochs"] == 2
    assert isinstance(card["selection"]["noisy_validation_accuracy"], float)
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=headers).content
    scored = score_images(load_release(weights, card), DIGITS / "digits.npz")
    assert scored.probabilities.shape == (1797, 10)
    print(
        f"digits, CNN tuning (2 runs, 8 channels), learning rate {selected['learning_rate']} "
        f"chosen: accuracy {scored.accuracy:.3f} (one run)"
    )
    assert _remaining(client, headers) == after  # the run charged nothing more
