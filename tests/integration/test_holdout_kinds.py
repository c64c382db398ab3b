"""Evaluation holdouts of image and time-series datasets (issues 20/21): registration with
``--holdout-fraction`` splits the kept images (stays) by the same rule as tabular rows
(n_h = ⌊F·n̂⌋, a permutation drawn by the enclave) into two files that partition them;
the training loader returns exactly the training part, the holdout loader exactly the
holdout; an evaluation of a 10-class image release (the bundled digits) and of a GRU-D
release run end to end through the API and the in-process worker, the image one reading
the holdout alone, each released accuracy close to the exact one computed here; refusals
are one-line CLI errors that register nothing, and an image dataset without a holdout
refuses evaluations with a 422.

SQLite only: the ledger side of holdouts is the tabular tests' (test_evaluations.py), on
both databases; what is new here is the worker's per-kind files."""

from __future__ import annotations

import dataclasses
import gzip
import io
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from sqlalchemy import select
from typer.testing import CliRunner

from enclave.cli import app
from service.datasets.images import ImageSchema, encode_pixels
from service.datasets.kinds import load_schema_yaml
from service.db import engine_for, transaction
from service.ledger.tables import Dataset
from service.modelspec import GrudSpec
from service.releases import load_release, predict_class_proba
from tests.conftest import Keys, auth
from tests.integration.test_timeseries import write_tiny_series
from worker.data import (
    HOLDOUT_IMAGES_FILE,
    HOLDOUT_OBSERVATIONS_FILE,
    HOLDOUT_OUTCOMES_FILE,
    IMAGES_FILE,
    OBSERVATIONS_FILE,
    OUTCOMES_FILE,
    WORKER_KINDS,
    dataset_dir,
    load_holdout,
    load_training_set,
)
from worker.image_arrays import read_npz_bytes
from worker.models import build_module
from worker.registration import Registered, register_dataset
from worker.runner import Outcome, execute_job

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits"
CPU = torch.device("cpu")


def _digits_schema() -> ImageSchema:
    schema = load_schema_yaml((DIGITS / "schema.yaml").read_text())
    assert isinstance(schema, ImageSchema)
    return schema


def _register_digits(settings: Any, fraction: float | None = 0.25) -> Registered:
    return register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=_digits_schema(),
        csv_path=DIGITS / "digits.npz",
        epsilon_total=40.0,
        delta_total=1e-4,
        holdout_fraction=fraction,
    )


def _images(path: Path) -> tuple[np.ndarray, np.ndarray]:
    arrays = read_npz_bytes(path.read_bytes())
    return arrays["pixels"], arrays["y"]


def _keyed(pixels: np.ndarray, y: np.ndarray) -> Counter[bytes]:
    """Each image with its label as one hashable key (a multiset of rows)."""
    return Counter(p.tobytes() + bytes([int(c)]) for p, c in zip(pixels, y, strict=True))


def _public(settings: Any, name: str) -> tuple[dict[str, Any], int, int | None]:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == name)).one()
        return ds.public_schema, ds.n_rows, ds.holdout_rows


def test_image_registration_splits_the_images_into_training_and_holdout(settings: Any) -> None:
    reg = _register_digits(settings)
    kept, n_h = reg.report.rows_kept, reg.holdout_rows
    assert kept == 1797 and n_h is not None
    # The tabular rule: n_h = ⌊F·n̂⌋ of the noisy count n̂ = n_rows + n_h.
    assert n_h == int(0.25 * (reg.noisy_n_rows + n_h)) and 1 <= n_h < kept
    public_schema, n_rows, holdout_rows = _public(settings, "digits")
    assert (n_rows, holdout_rows) == (reg.noisy_n_rows, n_h)

    folder = dataset_dir(settings.resolved_data_dir, "digits")
    assert (folder / HOLDOUT_IMAGES_FILE).stat().st_mode & 0o777 == 0o600
    train_px, train_y = _images(folder / IMAGES_FILE)
    held_px, held_y = _images(folder / HOLDOUT_IMAGES_FILE)
    assert (len(train_px), len(held_px)) == (kept - n_h, n_h)
    with np.load(DIGITS / "digits.npz") as npz:
        everything = _keyed(npz["images"][:, None], npz["labels"])
    train, held = _keyed(train_px, train_y), _keyed(held_px, held_y)
    # The two files partition the kept images (all distinct in the digits).
    assert len(everything) == 1797 and not train & held and train + held == everything

    # The training loader returns the training file exactly, none of the holdout; the
    # holdout loader the holdout file, encoded the same way.
    touched: list[str] = []
    training = load_training_set(
        settings.resolved_data_dir,
        public_schema,
        CPU,
        before_first_read=lambda: touched.append("train"),
    )
    holdout = load_holdout(
        settings.resolved_data_dir,
        public_schema,
        CPU,
        before_first_read=lambda: touched.append("holdout"),
    )
    assert touched == ["train", "holdout"]
    schema = _digits_schema()
    for data, px, y in ((training, train_px, train_y), (holdout, held_px, held_y)):
        assert torch.equal(data.x, torch.from_numpy(encode_pixels(schema, px).reshape(-1, 64)))
        assert torch.equal(data.y, torch.from_numpy(y.astype(np.float32)))
    loaded_train = {r.tobytes() for r in training.x.numpy()}
    loaded_held = {r.tobytes() for r in holdout.x.numpy()}
    assert len(loaded_train) == kept - n_h and not loaded_train & loaded_held


def _rows(path: Path) -> pd.DataFrame:
    with gzip.open(path, "rb") as fh:
        return pd.read_csv(io.BytesIO(fh.read()), dtype=str)


def test_time_series_registration_splits_whole_stays(settings: Any, tmp_path: Path) -> None:
    obs, outcomes, schema_path = write_tiny_series(tmp_path, stays=80)
    files = ["--csv", str(obs), "--outcomes", str(outcomes), "--schema", str(schema_path)]
    args = ["datasets", "register", "tiny-icu", *files, "--epsilon", "20", "--delta", "1e-5"]
    r = CliRunner().invoke(app, [*args, "--holdout-fraction", "0.25"])
    assert r.exit_code == 0, r.output
    public_schema, n_rows, n_h = _public(settings, "tiny-icu")
    assert f"evaluation holdout: {n_h} rows" in r.output
    kept = 80
    assert n_h == int(0.25 * (n_rows + n_h)) and 1 <= n_h < kept
    folder = dataset_dir(settings.resolved_data_dir, "tiny-icu")
    train_out, held_out = _rows(folder / OUTCOMES_FILE), _rows(folder / HOLDOUT_OUTCOMES_FILE)
    train_obs = _rows(folder / OBSERVATIONS_FILE)
    held_obs = _rows(folder / HOLDOUT_OBSERVATIONS_FILE)
    train_stays, held_stays = set(train_out["stay_id"]), set(held_out["stay_id"])
    assert (len(train_out), len(held_out)) == (kept - n_h, n_h)
    assert not train_stays & held_stays and len(train_stays | held_stays) == kept
    # Each stay's observations went with it, all of them.
    raw = pd.read_csv(obs, dtype=str)
    assert set(held_obs["stay_id"]) <= held_stays and set(train_obs["stay_id"]) <= train_stays
    assert len(train_obs) + len(held_obs) == len(raw)
    assert len(held_obs) == int(raw["stay_id"].isin(held_stays).sum())

    training = load_training_set(
        settings.resolved_data_dir, public_schema, CPU, before_first_read=lambda: None
    )
    holdout = load_holdout(
        settings.resolved_data_dir, public_schema, CPU, before_first_read=lambda: None
    )
    assert (training.n, holdout.n) == (kept - n_h, n_h)
    assert tuple(holdout.x.shape[1:]) == tuple(training.x.shape[1:])
    labels = {"yes": 1.0, "no": 0.0}
    expected = [labels[v] for v in held_out["died"]]
    assert holdout.y.tolist() == expected  # the holdout's stays, in the stored order


def test_a_ten_class_image_release_is_evaluated_on_the_holdout_alone(
    client: Any, keys: Keys, settings: Any
) -> None:
    reg = _register_digits(settings)
    n_h = reg.holdout_rows
    alice = auth(keys.alice)
    body = {"dataset": "digits", "method": "dpsgd", "epsilon": 8.0, "delta": 1e-5}
    r = client.post("/v1/jobs", json=body, headers=alice)
    assert r.status_code == 202, r.text
    trained = str(r.json()["id"])
    assert r.json()["plan"]["n_rows"] == reg.noisy_n_rows  # training plans: n̂ − n_h
    assert execute_job(trained, settings) == Outcome.released

    metrics = ["accuracy", "log_loss", "confusion"]
    ask = {"job_id": trained, "epsilon": 1.5, "metrics": metrics}
    q = client.post("/v1/evaluations/quote", json=ask, headers=alice)
    assert q.status_code == 200 and q.json()["admitted"] is True, q.text
    assert q.json()["plan"]["n_rows"] == n_h
    r = client.post("/v1/evaluations", json=ask, headers=alice)
    assert r.status_code == 202, r.text
    evaluation = str(r.json()["id"])
    # The evaluation reads the holdout file only: with the training images moved away it
    # still runs (and a training job could not).
    folder = dataset_dir(settings.resolved_data_dir, "digits")
    (folder / IMAGES_FILE).rename(folder / "moved.npz")
    try:
        assert execute_job(evaluation, settings) == Outcome.released
    finally:
        (folder / "moved.npz").rename(folder / IMAGES_FILE)

    ev = client.get(f"/v1/jobs/{evaluation}/release", headers=alice).json()["evaluation"]
    assert ev["job_id"] == trained and ev["classes"] == 10 and ev["holdout_rows"] == n_h
    assert set(ev["metrics"]) == set(metrics)
    counts = ev["metrics"]["confusion"]["counts"]
    assert len(counts) == 10 and all(len(row) == 10 for row in counts)
    # The exact accuracy of the release on the holdout images, computed here from the
    # holdout file; the noisy value is within 0.1 of it (discrete Laplace of scale 3 on a
    # count of ~450 rows: |noise| > 45 has probability ~e^-15).
    card = client.get(f"/v1/jobs/{trained}/release", headers=alice).json()
    weights = client.get(f"/v1/jobs/{trained}/release/weights", headers=alice).content
    px, y = _images(folder / HOLDOUT_IMAGES_FILE)
    x = encode_pixels(_digits_schema(), px).reshape(len(px), 64)
    proba = predict_class_proba(load_release(weights, card), x)
    exact = float((proba.argmax(axis=1) == y).mean())
    acc = ev["metrics"]["accuracy"]
    print(f"digits, DP-SGD eps 8: holdout accuracy {exact:.3f}, released {acc['value']:.3f}")
    assert exact > 0.5 and abs(acc["value"] - exact) < 0.1
    assert acc["interval"]["lower"] <= acc["value"] <= acc["interval"]["upper"]
    log_loss = ev["metrics"]["log_loss"]
    assert log_loss["interval"]["lower"] <= log_loss["value"] <= log_loss["interval"]["upper"]
    trained_card = client.get(f"/v1/jobs/{trained}/release", headers=alice).json()
    assert [e["evaluation_job"] for e in trained_card["evaluations"]] == [evaluation]


def test_holdout_refusals_for_images(
    client: Any, keys: Keys, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    args = ["datasets", "register", "digits", "--csv", str(DIGITS / "digits.npz")]
    args += ["--schema", str(DIGITS / "schema.yaml"), "--epsilon", "40", "--delta", "1e-4"]
    for bad in ("0", "0.6", "1"):
        r = runner.invoke(app, [*args, "--holdout-fraction", bad])
        assert r.exit_code == 1 and "refused: the holdout fraction must be in" in r.output
        assert "Traceback" not in r.output
    r = runner.invoke(app, [*args, "--holdout-fraction", "nan"])
    assert r.exit_code == 1 and "not a finite number" in r.output
    # ⌊0.0001 × n̂⌋ = 0 unless the noisy count of 1,797 images reached 10,000.
    r = runner.invoke(app, [*args, "--holdout-fraction", "0.0001"])
    assert r.exit_code == 1 and "refused: the holdout would have 0 rows" in r.output
    assert "it needs at least one" in r.output
    # A kind whose worker entry keeps no holdout is refused.
    entry = WORKER_KINDS["images"]
    monkeypatch.setitem(WORKER_KINDS, "images", dataclasses.replace(entry, holdout=None))
    r = runner.invoke(app, [*args, "--holdout-fraction", "0.2"])
    assert r.exit_code == 1, r.output
    assert "refused: images datasets cannot keep an evaluation holdout yet" in r.output
    monkeypatch.setitem(WORKER_KINDS, "images", entry)
    assert _public_names(settings) == {"toy"}  # nothing registered

    # Without a holdout, an evaluation of an image release is a 422 that charges nothing.
    _register_digits(settings, fraction=None)
    alice = auth(keys.alice)
    body = {"dataset": "digits", "method": "dpsgd", "epsilon": 2.0, "delta": 1e-5}
    trained = str(client.post("/v1/jobs", json=body, headers=alice).json()["id"])
    assert execute_job(trained, settings) == Outcome.released
    before = client.get("/v1/datasets", headers=alice).json()
    for path in ("/v1/evaluations/quote", "/v1/evaluations"):
        r = client.post(path, json={"job_id": trained, "epsilon": 1.0}, headers=alice)
        assert r.status_code == 422 and "has no evaluation holdout" in r.text, r.text
    assert client.get("/v1/datasets", headers=alice).json() == before


def _public_names(settings: Any) -> set[str]:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        return {d.name for d in s.scalars(select(Dataset))}


def test_a_grud_release_is_evaluated_on_held_out_stays(
    client: Any, keys: Keys, settings: Any, tmp_path: Path
) -> None:
    obs, outcomes, schema_path = write_tiny_series(tmp_path, stays=120)
    reg = register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=load_schema_yaml(schema_path.read_text()),
        csv_path=obs,
        outcomes_path=outcomes,
        epsilon_total=20.0,
        delta_total=1e-5,
        holdout_fraction=0.3,
    )
    alice = auth(keys.alice)
    options = {"epsilon": 4.0, "delta": 1e-5, "dpsgd": {"epochs": 2, "batch_size": 20}}
    body = {"dataset": "tiny-icu", "method": "dpsgd", "model": {"kind": "grud", "hidden": 3}}
    r = client.post("/v1/jobs", json={**body, **options}, headers=alice)
    assert r.status_code == 202, r.text
    trained = str(r.json()["id"])
    assert execute_job(trained, settings) == Outcome.released
    ask = {"job_id": trained, "epsilon": 6.0, "metrics": ["accuracy", "log_loss", "confusion"]}
    r = client.post("/v1/evaluations", json=ask, headers=alice)
    assert r.status_code == 202, r.text
    assert r.json()["plan"]["n_rows"] == reg.holdout_rows
    evaluation = str(r.json()["id"])
    assert execute_job(evaluation, settings) == Outcome.released
    ev = client.get(f"/v1/jobs/{evaluation}/release", headers=alice).json()["evaluation"]
    assert ev["classes"] == 2 and ev["holdout_rows"] == reg.holdout_rows
    assert len(ev["metrics"]["confusion"]["counts"]) == 2
    for metric in ("accuracy", "log_loss"):
        value = ev["metrics"][metric]
        assert value["interval"]["lower"] <= value["value"] <= value["interval"]["upper"]
    # GRU-D's exact accuracy on the held-out stays, from the release and the holdout
    # loader here: the noisy value is within 0.15 of it (discrete Laplace of scale 0.5 on
    # the count of correct stays: |noise| > 5 has probability ~e^-10).
    card = client.get(f"/v1/jobs/{trained}/release", headers=alice).json()
    weights = client.get(f"/v1/jobs/{trained}/release/weights", headers=alice).content
    state = load_release(weights, card).sample_weights(0)
    module = build_module(GrudSpec(hidden=3), 2)
    module.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    public_schema, _, _ = _public(settings, "tiny-icu")
    held = load_holdout(
        settings.resolved_data_dir, public_schema, CPU, before_first_read=lambda: None
    )
    with torch.no_grad():
        p = torch.sigmoid(module.eval()(held.x).reshape(-1))
    exact = float(((p > 0.5).float() == held.y).float().mean())
    noisy = ev["metrics"]["accuracy"]["value"]
    print(f"tiny-icu GRU-D, DP-SGD eps 4: holdout accuracy {exact:.3f}, released {noisy:.3f}")
    assert abs(noisy - exact) < 0.15
