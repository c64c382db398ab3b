"""Issue 20, K-class time series end to end (SQLite): a tiny synthetic time-series dataset
whose outcome declares three classes (test data, not private) is registered; a DP-SGD job
on GRU-D with the exact engine is quoted (the plan's model has ``classes: 3``), charged,
run by the in-process worker and released with a proven card; the analyst scores public
stays with the release (enclave.analyst.score_series: softmax over the three classes,
accuracy), the same accuracy as the worker's torch module loaded with the released weights.
Ghost, JL and ExpM+NF on the K-class outcome are refused at quote and submission (422),
charging nothing (K-class GRU-D tuning and architecture search are
tests/integration/test_grud_classes_tuning.py's and test_grud_classes_architecture.py's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from service.datasets.kinds import load_schema_yaml
from service.modelspec import GrudSpec, parameter_count
from tests.integration.test_multiclass import _release, _remaining
from tests.unit.test_timeseries import TINY

CLASSES = ["low", "mid", "high"]


def write_three_class_series(folder: Path, *, stays: int, seed: int) -> tuple[Path, Path, Path]:
    """TINY's variables and grid, the outcome one of three classes by the heart rate's level
    (observed at most steps)."""
    rng = np.random.default_rng(seed)
    ids = [f"s{i}" for i in range(stays)]
    label = rng.integers(0, 3, stays)
    rows = []
    for i, stay in enumerate(ids):
        for hour in range(4):
            if rng.random() < 0.8:
                hr = 60 + 45 * label[i] + rng.normal(0, 8)
                rows.append((stay, hour + 0.5, "hr", round(float(hr), 1)))
            if rng.random() < 0.3:
                rows.append((stay, hour + 0.25, "sbp", round(float(rng.normal(120, 10)), 1)))
    obs = pd.DataFrame(rows, columns=["stay_id", "time", "variable", "value"])
    paths = (folder / "obs.csv", folder / "outcomes.csv", folder / "schema.yaml")
    obs.to_csv(paths[0], index=False)
    outcomes = pd.DataFrame({"stay_id": ids, "died": [CLASSES[k] for k in label]})
    outcomes.to_csv(paths[1], index=False)
    schema = {**TINY, "name": "tri-icu", "outcome": {"column": "died", "classes": CLASSES}}
    paths[2].write_text(yaml.safe_dump(schema))
    return paths


def register_three_class_series(settings: Any, tmp_path: Path, *, stays: int) -> Any:
    """Writes the series (seed 0) under ``tmp_path/private`` and registers it as 'tri-icu'
    (ε 20, δ 1e-5) the way an admin does; returns its public schema."""
    from service.db import engine_for
    from worker.registration import register_dataset

    private = tmp_path / "private"
    private.mkdir()
    obs, outcomes, schema_path = write_three_class_series(private, stays=stays, seed=0)
    schema = load_schema_yaml(schema_path.read_text())
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=schema,
        csv_path=obs,
        outcomes_path=outcomes,
        epsilon_total=20.0,
        delta_total=1e-5,
    )
    return schema


def score_released_series(
    card: dict[str, Any], weights: bytes, tmp_path: Path, *, stays: int
) -> tuple[Path, Path, Path, Any]:
    """Saves a released 3-class GRU-D as an analyst does and scores ``stays`` fresh public
    stays (seed 1) with enclave.analyst.score_series: one softmax row per stay, every stay
    kept, an accuracy. Returns the release folder, the public files and the scores."""
    from enclave.analyst import CARD_FILE, WEIGHTS_FILE, score_series

    folder = tmp_path / "release"
    folder.mkdir()
    (folder / CARD_FILE).write_text(json.dumps(card))
    (folder / WEIGHTS_FILE).write_bytes(weights)
    public = tmp_path / "public"
    public.mkdir()
    obs, outcomes, _ = write_three_class_series(public, stays=stays, seed=1)
    scored = score_series(folder, obs, outcomes)
    assert scored.probabilities.shape == (stays, 3) and scored.report.stays.rows_kept == stays
    assert np.allclose(scored.probabilities.sum(axis=1), 1.0)
    assert scored.accuracy is not None
    return folder, obs, outcomes, scored


def selection_refusals_charge_nothing(
    client: Any,
    headers: dict[str, str],
    body: dict[str, Any],
    refused: dict[str, tuple[dict[str, Any], str]],
) -> None:
    """Each change of ``body`` in ``refused`` is a problem+json 422 naming its text, at the
    selection quote and at submission, and the dataset's budget is unchanged after them."""
    before = _remaining(client, headers, body["dataset"])
    for what, (change, text) in refused.items():
        for path in ("/v1/selections/quote", "/v1/selections"):
            r = client.post(path, json={**body, **change}, headers=headers)
            assert r.status_code == 422, (what, path, r.text)
            assert r.headers["content-type"].startswith("application/problem+json"), what
            assert text in r.text, (what, r.text)
    assert _remaining(client, headers, body["dataset"]) == before  # nothing charged


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_three_class_grud_trains_by_exact_dpsgd_and_is_scored(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    from enclave.analyst import open_release
    from tests.conftest import auth
    from worker.models import build_module

    headers = auth(keys.alice)
    register_three_class_series(settings, tmp_path, stays=300)
    model = {"kind": "grud", "hidden": 4}
    options = {"epochs": 20, "batch_size": 60, "learning_rate": 1.0}
    body = {"dataset": "tri-icu", "method": "dpsgd", "epsilon": 8.0, "delta": 1e-5,
            "model": model, "dpsgd": options}  # fmt: skip
    before = _remaining(client, headers, "tri-icu")
    refused = [
        {**body, "dpsgd": {**options, "engine": "ghost"}},
        {**body, "dpsgd": {**options, "engine": "jl", "jl_projections": 4}},
        {"dataset": "tri-icu", "method": "expm_nf", "epsilon": 1.0, "delta": 0.0, "model": model},
    ]
    for request in refused:
        for path in ("/v1/quote", "/v1/jobs"):
            r = client.post(path, json=request, headers=headers)
            assert r.status_code == 422 and "3 classes" in r.json()["detail"], r.text
    assert _remaining(client, headers, "tri-icu") == before
    quote = client.post("/v1/quote", json=body, headers=headers)
    assert quote.status_code == 200, quote.text
    plan = quote.json()["plan"]
    assert plan["model"] == {**model, "classes": 3}

    card, weights = _release(client, headers, settings, body)
    assert card["privacy"]["guarantee"] == "proven"
    assert card["model"] == {**model, "classes": 3}
    assert card["mechanism"]["parameters"] == parameter_count(GrudSpec(hidden=4, classes=3), 2)
    assert card["mechanism"]["parameters"] == plan["mechanism"]["parameters"]
    assert "softmax" in card["output"] and "low, mid, high" in card["output"]
    assert "index in the declared classes" in card["preprocessing"]["description"]

    folder, obs, outcomes, scored = score_released_series(card, weights, tmp_path, stays=90)
    print(f"3-class GRU-D, DP-SGD exact ε = 8 (one run): accuracy {scored.accuracy:.3f}")
    # The worker's torch module with the released weights: the same argmax accuracy.
    module = build_module(GrudSpec.model_validate(card["model"]), 2)
    state = open_release(folder).sample_weights(0)
    module.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    from service.datasets.timeseries import TimeSeriesSchema, encode_series, validate_series

    schema = TimeSeriesSchema.model_validate(card["preprocessing"]["public_schema"])
    enc = encode_series(
        schema,
        validate_series(
            schema,
            pd.read_csv(obs, **schema.read_csv_kwargs()),
            pd.read_csv(outcomes, **schema.read_outcomes_kwargs()),
        ),
    )
    with torch.no_grad():
        logits = module(torch.as_tensor(enc.x))
    assert logits.shape == (90, 3)
    assert scored.accuracy == float((logits.argmax(dim=1).numpy() == enc.y).mean())
