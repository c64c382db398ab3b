"""Issue 20, multi-class targets end to end: a 3-class tabular dataset (generated here) and
the bundled digits (10 classes) register, a DP-SGD job and a proven ExpM (Langevin) job on
multinomial logistic regression are released through the API and the in-process worker with
proven cards, their accuracy on the training rows is well above chance (1/K), and every
method, engine, sampler and model that does not take K classes yet is refused at quote time
with a 4xx that charges nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from enclave.analyst import CARD_FILE, WEIGHTS_FILE, score_csv, score_images
from enclave.cli import app
from service.datasets.images import encode_pixels
from service.datasets.kinds import load_schema_yaml
from service.db import engine_for
from service.releases import load_release, predict_class_proba

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits"
CLASSES = ["north", "east", "west"]
runner = CliRunner()

REFUSED = {
    "ghost": {"method": "dpsgd", "dpsgd": {"engine": "ghost"}, "delta": 1e-5},
    "jl_mlp": {
        "method": "dpsgd",
        "dpsgd": {"engine": "jl", "jl_projections": 4},
        "delta": 1e-5,
        "model": {"kind": "mlp", "hidden": [8]},
    },
    "jl": {"method": "dpsgd", "dpsgd": {"engine": "jl", "jl_projections": 4}, "delta": 1e-5},
    "expm_mlp": {
        "method": "expm",
        "expm": {"steps": 10},
        "delta": 1e-5,
        "model": {"kind": "mlp", "hidden": [8]},
    },
    "mcmc": {"method": "expm", "expm": {"sampler": "mcmc", "chains": 2, "steps": 10}},
    "expm_nf": {"method": "expm_nf", "delta": 0},
}


HYPER = {  # K-class hyperparameter tuning of multinomial logistic regression (DP-SGD)
    "kind": "hyperparameters",
    "epsilon": 3.0,
    "delta": 1e-6,
    "model": {"kind": "logistic"},
    "learning_rates": [0.5, 2.0],
    "batch_sizes": [100],
    "epochs": [2],
    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.9},
}


def _three_classes(folder: Path, n: int = 1500) -> tuple[Path, Path]:
    """Three Gaussian clusters in [0, 10]² with a noise feature (public, generated)."""
    rng = np.random.default_rng(20)
    centres = np.array([[2.0, 2.0], [8.0, 3.0], [5.0, 8.5]])
    label = rng.integers(0, 3, n)
    xy = centres[label] + rng.normal(0.0, 1.3, (n, 2))
    frame = pd.DataFrame(
        {
            "u": np.clip(xy[:, 0], 0, 10).round(3),
            "v": np.clip(xy[:, 1], 0, 10).round(3),
            "noise": rng.uniform(0, 10, n).round(3),
            "zone": np.array(CLASSES)[label],
        }
    )
    frame.to_csv(folder / "tri.csv", index=False)
    schema = {
        "name": "tri",
        "target": {"column": "zone", "classes": CLASSES},
        "columns": [
            {"name": c, "type": "numeric", "min": 0, "max": 10} for c in ["u", "v", "noise"]
        ],
    }
    (folder / "tri.yaml").write_text(yaml.safe_dump(schema))
    return folder / "tri.csv", folder / "tri.yaml"


def _register(settings: Any, csv: Path, schema_path: Path) -> Any:
    from worker.registration import register_dataset

    schema = load_schema_yaml(schema_path.read_text())
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=schema,
        csv_path=csv,
        epsilon_total=40.0,
        delta_total=1e-4,
    )
    return schema


def _remaining(client: Any, headers: dict[str, str], name: str) -> dict[str, Any]:
    listed = client.get("/v1/datasets", headers=headers).json()
    return next(d["budget"] for d in listed if d["name"] == name)


def _refusals_charge_nothing(client: Any, headers: dict[str, str], name: str, k: int) -> None:
    before = _remaining(client, headers, name)
    for what, extra in REFUSED.items():
        body = {"dataset": name, "epsilon": 1.0, "model": {"kind": "logistic"}, **extra}
        for path in ("/v1/quote", "/v1/jobs"):
            r = client.post(path, json=body, headers=headers)
            assert r.status_code == 422, (what, path, r.text)
            assert f"{k} classes" in r.text and "engine 'exact'" in r.text, (what, r.text)
    selection = {
        "dataset": name,
        "kind": "architecture",
        "epsilon": 3.0,
        "delta": 1e-6,
        "space": {"depths": [1], "widths": [2, 4]},
        "search": {"algorithm": "rs", "trainings": 2},
        "training": {"epochs": 1, "batch_size": 50},
    }
    if name == "digits":  # images: architecture search is over CNNs, which take K classes
        r = client.post("/v1/selections/quote", json=selection, headers=headers)
        assert r.status_code == 200 and r.json()["plan"]["model"]["kind"] == "cnn", r.text
        assert r.json()["plan"]["model"]["classes"] == k
    else:
        for path in ("/v1/selections/quote", "/v1/selections"):
            r = client.post(path, json=selection, headers=headers)
            assert r.status_code == 422 and "only 'hyperparameters' takes" in r.text, r.text
    assert _remaining(client, headers, name) == before


def _release(client: Any, headers: dict[str, str], settings: Any, body: dict[str, Any]) -> Any:
    from worker.runner import Outcome, execute_job

    r = client.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert execute_job(job, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job}/release", headers=headers).json()
    weights = client.get(f"/v1/jobs/{job}/release/weights", headers=headers).content
    return card, weights


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_three_class_tabular_target_trains_by_dpsgd_and_refuses_the_rest(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    from tests.conftest import auth

    headers = auth(keys.alice)
    csv, schema_path = _three_classes(tmp_path)
    _register(settings, csv, schema_path)
    _refusals_charge_nothing(client, headers, "tri", 3)
    body = {"dataset": "tri", "method": "dpsgd", "epsilon": 2.0, "delta": 1e-5}
    card, weights = _release(client, headers, settings, body)
    assert card["privacy"]["guarantee"] == "proven"
    assert card["model"] == {"kind": "logistic", "classes": 3}
    assert card["mechanism"]["parameters"] == 3 * (3 + 1)
    assert "softmax" in card["output"] and "north, east, west" in card["output"]
    assert "index in the declared classes" in card["preprocessing"]["description"]
    folder = tmp_path / "release"
    folder.mkdir()
    (folder / CARD_FILE).write_text(__import__("json").dumps(card))
    (folder / WEIGHTS_FILE).write_bytes(weights)
    scored = score_csv(folder, csv)
    assert scored.probabilities.shape == (1500, 3)
    assert scored.accuracy is not None and scored.auc is not None
    print(f"3-class tabular, DP-SGD ε = 2: accuracy {scored.accuracy:.3f}, AUC {scored.auc:.3f}")
    assert scored.accuracy > 2 / 3 and scored.auc > 0.8
    r = runner.invoke(app, ["jobs", "score", str(folder), str(csv)])
    assert r.exit_code == 0, r.output
    assert f"{scored.accuracy:.4f}" in r.output and f"{scored.auc:.4f}" in r.output
    # Hyperparameter tuning (Papernot–Steinke random search) of the same K-class model,
    # each candidate scored by its noisy validation accuracy (argmax of the K scores).
    r = client.post("/v1/selections", json={**HYPER, "dataset": "tri"}, headers=headers)
    assert r.status_code == 202, r.text
    from worker.runner import Outcome, execute_job

    assert execute_job(r.json()["id"], settings) == Outcome.released
    tuned = client.get(f"/v1/jobs/{r.json()['id']}/release", headers=headers).json()
    assert tuned["privacy"]["guarantee"] == "proven"
    assert tuned["model"] == {"kind": "logistic", "classes": 3}
    assert tuned["selection"]["selected"]["learning_rate"] in (0.5, 2.0)
    assert isinstance(tuned["selection"]["noisy_validation_accuracy"], float)
    weights = client.get(f"/v1/jobs/{r.json()['id']}/release/weights", headers=headers).content
    (folder / CARD_FILE).write_text(__import__("json").dumps(tuned))
    (folder / WEIGHTS_FILE).write_bytes(weights)
    scored = score_csv(folder, csv)
    print(f"3-class tabular, tuned DP-SGD ε = 3 (workflow): accuracy {scored.accuracy:.3f}")
    assert scored.accuracy is not None and scored.accuracy > 2 / 3
    # The proven ExpM (Langevin) on the same target: K·(d + 1) parameters, sensitivity √(2B).
    body = {"dataset": "tri", "method": "expm", "epsilon": 2.0, "delta": 1e-5}
    card, weights = _release(client, headers, settings, body)
    assert card["privacy"]["guarantee"] == "proven"
    assert card["model"] == {"kind": "logistic", "classes": 3}
    assert card["mechanism"]["parameters"] == 3 * (3 + 1)
    assert card["mechanism"]["classes"] == 3 and card["mechanism"]["residual_norm_sq_bound"] == 2
    (folder / CARD_FILE).write_text(__import__("json").dumps(card))
    (folder / WEIGHTS_FILE).write_bytes(weights)
    scored = score_csv(folder, csv)
    assert scored.accuracy is not None and scored.auc is not None
    print(f"3-class tabular, ExpM Langevin ε = 2: accuracy {scored.accuracy:.3f}")
    assert scored.accuracy > 2 / 3 and scored.auc > 0.8


def digits_accuracy(card: dict[str, Any], weights: bytes) -> float:
    """The release's accuracy on the bundled digits (its training images)."""
    schema = load_schema_yaml((DIGITS / "schema.yaml").read_text())
    with np.load(DIGITS / "digits.npz") as npz:
        images, labels = npz["images"], npz["labels"]
    x = encode_pixels(schema, images[:, None]).reshape(len(images), -1)  # type: ignore[arg-type]
    proba = predict_class_proba(load_release(weights, card), x)
    return float((proba.argmax(axis=1) == labels).mean())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_bundled_digits_register_and_train_ten_classes(
    client: Any, keys: Any, settings: Any
) -> None:
    from tests.conftest import auth

    headers = auth(keys.alice)
    _register(settings, DIGITS / "digits.npz", DIGITS / "schema.yaml")
    _refusals_charge_nothing(client, headers, "digits", 10)
    body = {"dataset": "digits", "method": "dpsgd", "epsilon": 8.0, "delta": 1e-5}
    card, weights = _release(client, headers, settings, body)
    assert card["privacy"]["guarantee"] == "proven"
    assert card["model"] == {"kind": "logistic", "classes": 10}
    assert card["mechanism"]["parameters"] == 10 * 65
    assert "softmax" in card["output"]
    accuracy = digits_accuracy(card, weights)
    print(f"digits, DP-SGD ε = 8: accuracy on the training images {accuracy:.3f}")
    assert accuracy > 2 / 10
    # The analyst's scoring of an image folder or file gives the same accuracy.
    scored = score_images(load_release(weights, card), DIGITS / "digits.npz")
    assert scored.probabilities.shape == (1797, 10) and scored.accuracy == accuracy
    assert scored.auc is not None and scored.auc > 0.9
    # The proven ExpM (Langevin sampler) at ε = 1, its default steps.
    body = {"dataset": "digits", "method": "expm", "epsilon": 1.0, "delta": 1e-5}
    card, weights = _release(client, headers, settings, body)
    assert card["privacy"]["guarantee"] == "proven"
    assert card["model"] == {"kind": "logistic", "classes": 10}
    assert card["mechanism"]["parameters"] == 10 * 65 and card["mechanism"]["classes"] == 10
    accuracy = digits_accuracy(card, weights)
    print(f"digits, ExpM Langevin ε = 1: accuracy on the training images {accuracy:.3f}")
    assert accuracy > 3 / 10
