"""Issue 20 (point 3, first slice): a CNN on the bundled digits (8 × 8, 10 classes) quoted and
released through the API and the in-process worker by DP-SGD with the exact convolution
engine (worker/mechanisms/exact_conv.py), its card proven; and what the CNN family refuses
at quote time with a 4xx problem that charges nothing: batchnorm (it mixes rows),
groupnorm (not built), the ghost and JL engines, other methods, a kernel larger than the
images, a CNN on a tabular dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from enclave.analyst import score_images
from service.datasets.images import encode_pixels
from service.datasets.kinds import load_schema_yaml
from service.db import engine_for
from service.modelspec import CnnSpec
from service.releases import load_release

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits"
CONV = [{"channels": 8, "kernel": 3, "padding": 1, "pool": "avg2"}]

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "batchnorm": ({"model": {"kind": "cnn", "conv": CONV, "norm": "batchnorm"}}, "mixes rows"),
    "groupnorm": ({"model": {"kind": "cnn", "conv": CONV, "norm": "groupnorm"}}, "groupnorm"),
    # 10 classes: with_classes names what trains them (a binary target gets _check_engine's
    # "not built for convolutions", tests/unit/test_cnn_plans.py)
    "ghost": (
        {"dpsgd": {"engine": "ghost"}},
        "not by method 'dpsgd', model 'cnn', engine 'ghost'",
    ),
    "jl": ({"dpsgd": {"engine": "jl", "jl_projections": 4}}, "engine 'jl'"),
    "expm": ({"method": "expm", "dpsgd": None}, "model 'cnn'"),
    "kernel": (
        {"model": {"kind": "cnn", "conv": [{"channels": 4, "kernel": 7}] * 2}},
        "does not fit",
    ),
    "image": (
        {"model": {"kind": "cnn", "conv": CONV, "image": {"channels": 3, "height": 8, "width": 8}}},
        "differs from the dataset's",
    ),
}


def _register(settings: Any) -> None:
    from worker.registration import register_dataset

    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=load_schema_yaml((DIGITS / "schema.yaml").read_text()),
        csv_path=DIGITS / "digits.npz",
        epsilon_total=40.0,
        delta_total=1e-4,
    )


def _remaining(client: Any, headers: dict[str, str]) -> dict[str, Any]:
    listed = client.get("/v1/datasets", headers=headers).json()
    return next(d["budget"] for d in listed if d["name"] == "digits")


def _accuracy(card: dict[str, Any], weights: bytes) -> float:
    """The released CNN's accuracy on the digits (its training images)."""
    from worker.models import build_module

    schema = load_schema_yaml((DIGITS / "schema.yaml").read_text())
    with np.load(DIGITS / "digits.npz") as npz:
        images, labels = npz["images"], npz["labels"]
    x = encode_pixels(schema, images[:, None]).reshape(len(images), -1)  # type: ignore[arg-type]
    module = build_module(CnnSpec.model_validate(card["model"]), x.shape[1])
    tensors = load_release(weights, card).sample_weights(0)
    module.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in tensors.items()})
    with torch.no_grad():
        predicted = module(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predicted == labels.astype(np.int64)).mean())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_cnn_on_the_digits_is_quoted_and_released_with_a_proven_card(
    client: Any, keys: Any, settings: Any
) -> None:
    from tests.conftest import auth
    from worker.runner import Outcome, execute_job

    headers = auth(keys.alice)
    _register(settings)
    base = {
        "dataset": "digits",
        "method": "dpsgd",
        "epsilon": 8.0,
        "delta": 1e-5,
        "model": {"kind": "cnn", "conv": CONV},
        "dpsgd": {"epochs": 6, "batch_size": 256, "learning_rate": 2.0},
    }
    before = _remaining(client, headers)
    for what, (change, text) in REFUSED.items():
        body = {k: v for k, v in {**base, **change}.items() if v is not None}
        for path in ("/v1/quote", "/v1/jobs"):
            r = client.post(path, json=body, headers=headers)
            assert r.status_code == 422, (what, path, r.text)
            assert r.headers["content-type"].startswith("application/problem+json"), what
            assert text in r.text, (what, r.text)
    assert _remaining(client, headers) == before
    quote = client.post("/v1/quote", json=base, headers=headers)
    assert quote.status_code == 200, quote.text
    plan = quote.json()["plan"]
    assert plan["guarantee"] == "proven"
    image = {"channels": 1, "height": 8, "width": 8}
    assert plan["model"] == {
        "kind": "cnn",
        "conv": [{**CONV[0], "stride": 1}],
        "norm": "none",
        "classes": 10,
        "image": image,
    }
    # conv 1 → 8 (3 × 3 + 1)·8 = 80, head (8·4·4 + 1)·10 = 1,290
    assert plan["mechanism"]["parameters"] == 80 + 1290
    estimate = quote.json()["estimate"]
    assert estimate["seconds"] > 0 and estimate["memory_bytes"] > 0
    r = client.post("/v1/jobs", json=base, headers=headers)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert execute_job(job, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job}/release", headers=headers).json()
    assert card["privacy"]["guarantee"] == "proven"
    assert card["model"]["kind"] == "cnn" and card["model"]["classes"] == 10
    weights = client.get(f"/v1/jobs/{job}/release/weights", headers=headers).content
    accuracy = _accuracy(card, weights)
    scored = score_images(load_release(weights, card), DIGITS / "digits.npz")  # the analyst's
    assert len(scored.y) == 1797 and scored.probabilities.shape == (1797, 10)
    assert scored.accuracy == pytest.approx(accuracy, abs=2 / 1797)  # float64 vs the module
    print(f"digits, CNN (8 channels), DP-SGD ε = 8, 48 steps: training accuracy {accuracy:.3f}")
    assert accuracy > 0.3  # chance is 0.1
