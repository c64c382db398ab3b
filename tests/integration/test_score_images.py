"""`enclave jobs score RELEASE_DIR PATH` on images (issue 20): a release trained on an
image dataset scores an image folder or .npz in its public schema's source format.

Two public image datasets cut from the bundled digits are registered, a DP-SGD job is
released through the API and the in-process worker, the release is written to a folder as
`enclave jobs download` writes it, and the command's accuracy and AUC are checked against
the release's predictions computed here (encode the pixels, predict, sklearn's AUC): two
classes as a folder of PNG class folders (AUC), three as an .npz (macro one-vs-rest AUC).
Unreadable input and a folder where the schema reads an .npz exit 1 with one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from sklearn.metrics import roc_auc_score
from typer.testing import CliRunner

from enclave.analyst import CARD_FILE, WEIGHTS_FILE
from enclave.cli import app
from service.datasets.kinds import load_schema_yaml
from service.db import engine_for
from service.releases import load_release, predict_class_proba, predict_proba
from tests.conftest import auth

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits"
runner = CliRunner()


def _digits(classes: list[str]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The bundled digits of ``classes`` (public sample data), their labels (the digits,
    as stored) and the bundled schema narrowed to them."""
    with np.load(DIGITS / "digits.npz") as npz:
        images, labels = npz["images"], npz["labels"]
    keep = np.isin(labels, [int(c) for c in classes])
    schema = yaml.safe_load((DIGITS / "schema.yaml").read_text())
    schema.update(name=f"digits-{''.join(classes)}", classes=classes)
    return images[keep], labels[keep], schema


def _as_folders(folder: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """The images as 8-bit grayscale PNGs in one folder per class (source.format folders)."""
    root = folder / "images"
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        (root / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.astype(np.uint8), mode="L").save(root / str(label) / f"{i}.png")
    return root


def _register(settings: Any, schema: dict[str, Any], path: Path, folder: Path) -> str:
    from worker.registration import register_dataset

    (folder / "schema.yaml").write_text(yaml.safe_dump(schema))
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=load_schema_yaml((folder / "schema.yaml").read_text()),
        csv_path=path,
        epsilon_total=20.0,
        delta_total=1e-4,
    )
    return str(schema["name"])


def _release(
    client: Any, keys: Any, settings: Any, dataset: str, folder: Path, epsilon: float
) -> Path:
    """A DP-SGD release, written as `enclave jobs download` writes it."""
    from worker.runner import Outcome, execute_job

    headers = auth(keys.alice)
    body = {"dataset": dataset, "method": "dpsgd", "epsilon": epsilon, "delta": 1e-5}
    r = client.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert execute_job(job, settings) == Outcome.released
    out = folder / "release"
    out.mkdir()
    card = client.get(f"/v1/jobs/{job}/release", headers=headers)
    (out / CARD_FILE).write_bytes(card.content)
    weights = client.get(f"/v1/jobs/{job}/release/weights", headers=headers)
    (out / WEIGHTS_FILE).write_bytes(weights.content)
    assert json.loads(card.content)["preprocessing"]["public_schema"]["kind"] == "images"
    return out


def _indices(labels: np.ndarray, schema: dict[str, Any]) -> np.ndarray:
    """Each label's index in the schema's classes (what the release predicts)."""
    return np.array([schema["classes"].index(str(label)) for label in labels])


def _pixels(images: np.ndarray) -> np.ndarray:
    """The pixels as the enclave encodes the digits: scaled by the declared max of 16."""
    return (images.reshape(len(images), -1) / 16.0).astype(np.float64)


def _one_error_line(r: Any) -> str:
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1, r.output
    return lines[0]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_two_class_release_scores_a_folder_of_images(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    images, labels, schema = _digits(["1", "7"])
    schema["source"] = {"format": "folders"}
    root = _as_folders(tmp_path, images, labels)
    dataset = _register(settings, schema, root, tmp_path)
    release = _release(client, keys, settings, dataset, tmp_path, epsilon=1.0)

    loaded = load_release(
        (release / WEIGHTS_FILE).read_bytes(), json.loads((release / CARD_FILE).read_text())
    )
    y = _indices(labels, schema)
    p = predict_proba(loaded, _pixels(images))
    accuracy = float(((p > 0.5) == y).mean())
    auc = float(roc_auc_score(y, p))
    print(f"digits 1/7 as PNG folders, DP-SGD ε = 1: accuracy {accuracy:.3f}, AUC {auc:.3f}")
    assert accuracy > 0.7 and auc > 0.8  # chance: 0.5 and 0.5

    preds = tmp_path / "preds.csv"
    r = runner.invoke(app, ["jobs", "score", str(release), str(root), "--predictions", str(preds)])
    assert r.exit_code == 0, r.output
    assert "(2 classes)" in r.output and "macro" not in r.output
    assert f"{accuracy:.4f}" in r.output and f"{auc:.4f}" in r.output
    assert f"{len(labels)}" in r.output and "per class: 1: 182, 7: 179" in r.output
    frame = pd.read_csv(preds)
    assert list(frame.columns) == ["image", "label", "probability"]
    assert len(frame) == len(labels)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_three_class_release_scores_an_npz_and_refuses_unreadable_input(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    images, labels, schema = _digits(["3", "5", "8"])
    npz = tmp_path / "digits358.npz"
    np.savez(npz, images=images, labels=labels)
    dataset = _register(settings, schema, npz, tmp_path)
    release = _release(client, keys, settings, dataset, tmp_path, epsilon=1.0)

    card = json.loads((release / CARD_FILE).read_text())
    assert card["model"] == {"kind": "logistic", "classes": 3}
    proba = predict_class_proba(
        load_release((release / WEIGHTS_FILE).read_bytes(), card), _pixels(images)
    )
    y = _indices(labels, schema)
    accuracy = float((proba.argmax(axis=1) == y).mean())
    auc = float(roc_auc_score(y, proba, multi_class="ovr", average="macro"))
    print(f"digits 3/5/8 as .npz, DP-SGD ε = 1: accuracy {accuracy:.3f}, macro AUC {auc:.3f}")
    assert accuracy > 0.6 and auc > 0.8  # chance: 1/3 and 0.5

    preds = tmp_path / "preds.csv"
    r = runner.invoke(app, ["jobs", "score", str(release), str(npz), "--predictions", str(preds)])
    assert r.exit_code == 0, r.output
    assert "(3 classes)" in r.output and "AUC (macro one-vs-rest)" in r.output
    assert f"{accuracy:.4f}" in r.output and f"{auc:.4f}" in r.output
    frame = pd.read_csv(preds)
    assert list(frame.columns) == ["image", "label", "p_0", "p_1", "p_2"]
    np.testing.assert_allclose(frame[["p_0", "p_1", "p_2"]].to_numpy(), proba, rtol=1e-6)

    # Unreadable input: one line each, no traceback.
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 truncated")
    line = _one_error_line(
        runner.invoke(app, ["jobs", "score", str(release), str(tmp_path / "bad.npz")])
    )
    assert line.startswith("error: cannot score bad.npz") and "cannot read bad.npz as .npz" in line
    line = _one_error_line(runner.invoke(app, ["jobs", "score", str(release), str(tmp_path)]))
    assert line.startswith(f"error: cannot score {tmp_path.name}")
    # Every image outside the schema (pixels above the declared max): refused, with why.
    np.savez(tmp_path / "hot.npz", images=np.full((3, 8, 8), 17, np.uint8), labels=[3, 5, 8])
    line = _one_error_line(
        runner.invoke(app, ["jobs", "score", str(release), str(tmp_path / "hot.npz")])
    )
    assert "no image of hot.npz passed" in line and "pixel above max: 3" in line
