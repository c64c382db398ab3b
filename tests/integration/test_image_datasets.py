"""Image datasets through the admin's commands (issue 20): `enclave datasets check` reports
on the bundled digits and refuses a broken file in one line; registration takes a
two-class image dataset (stored, loaded back as the flattened encoded pixels) and refuses
ten classes before reading anything, while the models are binary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from enclave.cli import app
from service.datasets.images import ImageSchema, encode_pixels
from service.datasets.kinds import load_schema_yaml
from service.db import engine_for
from tests.integration.test_method_contract import TINY
from worker.data import load_training_set

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits"
runner = CliRunner()


def test_check_reports_on_the_bundled_digits() -> None:
    args = ["--csv", str(DIGITS / "digits.npz"), "--schema", str(DIGITS / "schema.yaml")]
    r = runner.invoke(app, ["datasets", "check", *args])
    assert r.exit_code == 0, r.output
    assert "schema 'digits': 10 classes of 8×8 images, 1 channel(s) (64 encoded" in r.output
    assert "1797 images kept of 1797 (0 rejected)" in r.output
    assert "per class: 0: 178, 1: 182, 2: 177" in r.output


def test_check_refuses_an_unusable_file_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 truncated")
    args = ["--csv", str(tmp_path / "bad.npz"), "--schema", str(DIGITS / "schema.yaml")]
    r = runner.invoke(app, ["datasets", "check", *args])
    assert r.exit_code == 1 and "refused: cannot read bad.npz as .npz" in r.output
    assert "Traceback" not in r.output
    # Every image rejected: exit 1, with the report and a hint.
    x = np.full((3, 8, 8), 17, dtype=np.uint8)  # above the declared max of 16
    np.savez(tmp_path / "hot.npz", images=x, labels=np.array([1, 2, 3]))
    args = ["--csv", str(tmp_path / "hot.npz"), "--schema", str(DIGITS / "schema.yaml")]
    r = runner.invoke(app, ["datasets", "check", *args])
    assert r.exit_code == 1 and "0 images kept of 3" in r.output
    assert "rejected, pixel above max: 3 (first: hot.npz[0], hot.npz[1], hot.npz[2])" in r.output


def _zeros_and_ones(folder: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """The digits 0 and 1 as a two-class image dataset (public sample data)."""
    with np.load(DIGITS / "digits.npz") as npz:
        images, labels = npz["images"], npz["labels"]
    keep = labels <= 1
    np.savez(folder / "zo.npz", images=images[keep], labels=labels[keep])
    schema = yaml.safe_load((DIGITS / "schema.yaml").read_text())
    schema.update(name="zeros-ones", classes=["0", "1"])
    (folder / "zo.yaml").write_text(yaml.safe_dump(schema))
    return folder / "zo.npz", folder / "zo.yaml", images[keep], labels[keep]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_register_two_classes(settings: Any, tmp_path: Path) -> None:
    # Ten classes register too since multinomial logistic regression exists (issue 20):
    # tests/integration/test_multiclass.py registers and trains the bundled digits.
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    budget = ["--epsilon", "5", "--delta", "1e-5"]
    npz, schema_path, images, labels = _zeros_and_ones(tmp_path)
    two = ["--csv", str(npz), "--schema", str(schema_path)]
    r = runner.invoke(app, ["datasets", "register", "zeros-ones", *two, *budget])
    assert r.exit_code == 0, r.output
    assert f"{len(labels)} images kept of {len(labels)} (0 rejected)" in r.output
    assert "public row count:" in r.output and "warning" not in r.output
    stored = settings.resolved_data_dir / "zeros-ones" / "images.npz"
    assert stored.stat().st_mode & 0o777 == 0o600

    schema = load_schema_yaml(schema_path.read_text())
    assert isinstance(schema, ImageSchema)
    touched: list[bool] = []
    data = load_training_set(
        settings.resolved_data_dir,
        schema.model_dump(mode="json"),
        torch.device("cpu"),
        before_first_read=lambda: touched.append(True),
    )
    assert touched == [True]
    expected = encode_pixels(schema, images[:, None]).reshape(len(images), 64)
    assert torch.equal(data.x, torch.from_numpy(expected))
    assert torch.equal(data.y, torch.from_numpy(labels.astype(np.float32)))
    assert data.n_features == 64


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("key", sorted(TINY), ids=lambda key: "-".join(filter(None, key)))
def test_a_job_of_each_method_on_two_image_classes(
    key: tuple[str, str | None], client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    from service.releases import load_release
    from tests.conftest import auth
    from worker.registration import register_dataset
    from worker.runner import Outcome, execute_job

    npz, schema_path, images, labels = _zeros_and_ones(tmp_path)
    schema = load_schema_yaml(schema_path.read_text())
    assert isinstance(schema, ImageSchema)
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=schema,
        csv_path=npz,
        epsilon_total=20.0,
        delta_total=1e-5,
        allow_nominal=True,
    )
    body = {"dataset": "zeros-ones", "model": {"kind": "logistic"}, **TINY[key]}
    wrong = {**body, "model": {"kind": "grud", "hidden": 3}}
    refused = client.post("/v1/quote", json=wrong, headers=auth(keys.alice))
    assert refused.status_code == 422 and "does not fit a images dataset" in refused.text
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    assert execute_job(r.json()["id"], settings) == Outcome.released
    card = client.get(f"/v1/jobs/{r.json()['id']}/release", headers=auth(keys.alice)).json()
    names = card["preprocessing"]["feature_names"]
    assert len(names) == 64 and names[:2] == ["px_0_0_0", "px_0_0_1"] and names[-1] == "px_0_7_7"
    assert "flattened channel-major" in card["preprocessing"]["description"]
    weights = client.get(
        f"/v1/jobs/{r.json()['id']}/release/weights", headers=auth(keys.alice)
    ).content
    state = load_release(weights, card).sample_weights(0)
    assert {tuple(np.shape(v)) for v in state.values()} == {(1, 64), (1,)}
    b, w = (np.asarray(v, dtype=np.float64) for v in sorted(state.values(), key=np.size))
    x = encode_pixels(schema, images[:, None]).reshape(len(images), 64)
    accuracy = float((((x @ w.T + b)[:, 0] > 0) == labels).mean())
    print(f"{key}: accuracy on the training images {accuracy:.3f}")
    if key[0] == "dpsgd":
        # Zeros and ones are far apart: DP-SGD's release separates them.
        assert accuracy > 0.75
