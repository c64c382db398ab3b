"""Issue 20: an architecture search over CNNs on the bundled digits (8 × 8, 10 classes)
through the API and the in-process worker: the quote shows the CNN space's plan and a time,
an MLP space on the images is a 422 problem that charges nothing, the job trains the two
candidates by exact DP-SGD and releases the chosen CNN, its card naming it and its
weights scored by the analyst's scorer; /openapi.json documents the CNN space's fields."""

from __future__ import annotations

from typing import Any

import pytest

from enclave.analyst import score_images
from service.releases import load_release
from tests.conftest import auth
from tests.integration.test_cnn_digits import DIGITS, _register, _remaining
from worker.runner import Outcome, execute_job

BODY = {
    "dataset": "digits",
    "kind": "architecture",
    "epsilon": 8.0,
    "delta": 1e-5,
    # the CNN space by default on images; two channel counts, one kernel and pooling
    "space": {"depths": [1], "widths": [4, 8], "kernels": [3], "pools": ["avg2"]},
    "search": {"algorithm": "rs", "trainings": 2},
    "training": {"epochs": 2, "batch_size": 256, "learning_rate": 2.0},
}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_cnn_search_on_the_digits_releases_the_chosen_cnn(
    client: Any, keys: Any, settings: Any
) -> None:
    headers = auth(keys.alice)
    _register(settings)
    before = _remaining(client, headers)
    mlp = {**BODY, "space": {"model": "mlp", "depths": [1], "widths": [4]}}
    for path in ("/v1/selections/quote", "/v1/selections"):
        r = client.post(path, json=mlp, headers=headers)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "searches CNNs" in r.text, r.text
    assert _remaining(client, headers) == before

    quote = client.post("/v1/selections/quote", json=BODY, headers=headers)
    assert quote.status_code == 200, quote.text
    plan = quote.json()["plan"]
    assert plan["guarantee"] == "proven" and plan["epsilon"] <= 8.0
    assert plan["model"]["kind"] == "cnn" and plan["model"]["classes"] == 10
    # the largest candidate: conv 1 → 8 (3·3 + 1)·8 = 80, head (8·4·4 + 1)·10 = 1,290
    assert plan["mechanism"]["candidates"][0]["parameters"] == 80 + 1290
    assert [m["conv"][0]["channels"] for m in plan["mechanism"]["cost_models"]] == [8]
    assert quote.json()["estimate"]["seconds"] > 0

    r = client.post("/v1/selections", json=BODY, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    assert job["status"] == "released" and job["progress_step"] == job["progress_total"] == 2
    stored = job["request"]["selection"]["request"]["space"]
    assert stored["model"] == "cnn" and stored["classes"] == 10
    card = client.get(f"/v1/jobs/{job_id}/release", headers=headers).json()
    assert card["privacy"]["guarantee"] == "proven"
    assert card["mechanism"]["method"] == "selection"
    selected = card["selection"]["selected"]
    assert selected["hidden"] in ([4], [8]) and selected["kernel"] == 3
    assert selected["pool"] == "avg2" and selected["activation"] == "relu"
    channels = selected["hidden"][0]
    conv = [{"channels": channels, "kernel": 3, "stride": 1, "padding": 1, "pool": "avg2"}]
    model = {"kind": "cnn", "conv": conv, "norm": "none", "classes": 10}
    assert card["model"] == {**model, "image": {"channels": 1, "height": 8, "width": 8}}
    assert card["selection"]["model"] == card["model"]
    assert isinstance(card["selection"]["noisy_validation_accuracy"], float)
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=headers).content
    scored = score_images(load_release(weights, card), DIGITS / "digits.npz")
    assert scored.probabilities.shape == (1797, 10)
    print(f"digits, CNN search of 2, {channels} channels chosen: accuracy {scored.accuracy:.3f}")
    assert _remaining(client, headers)["remaining_epsilon"] < before["remaining_epsilon"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_openapi_documents_the_cnn_space(client: Any) -> None:
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    space = schemas["ArchitectureSpace"]["properties"]
    assert {"kernels", "pools", "image", "classes"} <= set(space)
    model = space["model"]
    assert "'cnn'" in str(model) and "image dataset" in model["description"]
    assert "cnn only" in space["kernels"]["description"]
    mechanism = schemas["SelectionMechanism"]["properties"]
    assert "cost_models" in mechanism and "CNNs" in mechanism["cost_models"]["description"]
