"""Issue 20, K-class MLPs end to end: on test_multiclass's generated 3-class tabular data, a
DP-SGD job on an MLP with three logits (engine exact, tanh; engine ghost, ReLU) is released
through the API and the in-process worker with a proven card whose model carries
``classes: 3``; the analyst scores the release (enclave.analyst.score_csv and `enclave
jobs score`: accuracy and macro AUC), the same accuracy as the worker's torch module
loaded with the released weights, well above chance (1/3); and hyperparameter tuning
releases a K-class MLP too. JL on a K-class MLP is refused with a 422 charging nothing
(test_multiclass's REFUSED)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from enclave.analyst import CARD_FILE, WEIGHTS_FILE, score_csv
from enclave.cli import app
from service.modelspec import MlpSpec
from service.releases import encode_rows, load_release
from tests.integration.test_multiclass import HYPER, _register, _release, _three_classes
from worker.models import build_module

runner = CliRunner()


def _saved(folder: Path, card: dict[str, Any], weights: bytes) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / CARD_FILE).write_text(json.dumps(card))
    (folder / WEIGHTS_FILE).write_bytes(weights)
    return folder


def _module_accuracy(card: dict[str, Any], weights: bytes, csv: Path) -> float:
    """The worker's torch module of the card's model, loaded with the release's weights,
    on the encoded rows of ``csv``: its argmax accuracy."""
    release = load_release(weights, card)
    import pandas as pd

    rows = encode_rows(release.schema, pd.read_csv(csv))
    module = build_module(MlpSpec.model_validate(card["model"]), rows.x.shape[1])
    module.load_state_dict({k: torch.from_numpy(v) for k, v in release.sample_weights().items()})
    with torch.no_grad():
        logits = module(torch.from_numpy(rows.x))
    assert logits.shape == (len(rows.x), 3)
    return float((logits.argmax(dim=1).numpy() == rows.y).mean())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_three_class_mlp_trains_by_dpsgd_and_is_scored(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    from tests.conftest import auth

    headers = auth(keys.alice)
    csv, schema_path = _three_classes(tmp_path)
    _register(settings, csv, schema_path)
    options = {"epochs": 8, "batch_size": 100, "learning_rate": 2.0}
    for engine, activation in (("exact", "tanh"), ("ghost", "relu")):
        model = {"kind": "mlp", "hidden": [16], "activation": activation}
        body = {
            "dataset": "tri",
            "method": "dpsgd",
            "epsilon": 4.0,
            "delta": 1e-5,
            "model": model,
            "dpsgd": {**options, "engine": engine},
        }
        quote = client.post("/v1/quote", json=body, headers=headers)
        assert quote.status_code == 200, quote.text
        card, weights = _release(client, headers, settings, body)
        assert card["privacy"]["guarantee"] == "proven"
        fitted = {"kind": "mlp", "hidden": [16], "classes": 3}
        assert card["model"] == (fitted if activation == "tanh" else {**model, "classes": 3})
        assert card["mechanism"]["parameters"] == (3 + 1) * 16 + (16 + 1) * 3
        assert card["mechanism"].get("engine", "exact") == engine
        assert "softmax" in card["output"] and "north, east, west" in card["output"]
        folder = _saved(tmp_path / f"release-{engine}", card, weights)
        scored = score_csv(folder, csv)
        assert scored.probabilities.shape == (1500, 3)
        assert scored.accuracy is not None and scored.auc is not None
        print(
            f"3-class MLP ({activation}), DP-SGD {engine} ε = 4: accuracy "
            f"{scored.accuracy:.3f}, macro AUC {scored.auc:.3f}"
        )
        assert scored.accuracy == pytest.approx(_module_accuracy(card, weights, csv), abs=1e-3)
        assert scored.accuracy > 2 / 3 and scored.auc > 0.8
        assert np.allclose(scored.probabilities.sum(axis=1), 1.0)
        r = runner.invoke(app, ["jobs", "score", str(folder), str(csv)])
        assert r.exit_code == 0, r.output
        assert f"{scored.accuracy:.4f}" in r.output and f"{scored.auc:.4f}" in r.output
    # Hyperparameter tuning of a K-class MLP: candidates scored by their noisy accuracy.
    # Learning rates 2 and 4, not HYPER's 0.5 and 2: at 0.5 (2 epochs) the [8] tanh net
    # sometimes stays far from fitted (mean 0.941, sd 0.049 where selected) and the noisy
    # selection picks it about half the time. 460 releases at HYPER's grid: mean 0.962,
    # sd 0.041, 2 below 2/3 (0.627, 0.656), one failing test in ~230, which CI saw once
    # (0.6647). At [2, 4]: 1500 releases, mean 0.9795, sd 0.0052, min 0.915, none below
    # 2/3; a generalised Pareto fit to the lowest 10 % puts P(accuracy <= 2/3) at 6e-6
    # (normal tail: z = 60). The exact and ghost releases above: 260 runs each, mean
    # 0.983, sd 0.0015, min 0.979 (z > 200). Measured through this test's API and worker
    # path (a /tmp script looping its releases), 2026-11-26.
    tuning = {
        **HYPER,
        "dataset": "tri",
        "model": {"kind": "mlp", "hidden": [8]},
        "learning_rates": [2.0, 4.0],
    }
    r = client.post("/v1/selections", json=tuning, headers=headers)
    assert r.status_code == 202, r.text
    from worker.runner import Outcome, execute_job

    assert execute_job(r.json()["id"], settings) == Outcome.released
    tuned = client.get(f"/v1/jobs/{r.json()['id']}/release", headers=headers).json()
    assert tuned["privacy"]["guarantee"] == "proven"
    assert tuned["model"] == {"kind": "mlp", "hidden": [8], "activation": "tanh", "classes": 3}
    weights = client.get(f"/v1/jobs/{r.json()['id']}/release/weights", headers=headers).content
    scored = score_csv(_saved(tmp_path / "tuned", tuned, weights), csv)
    print(f"3-class MLP, tuned DP-SGD ε = 3 (workflow): accuracy {scored.accuracy:.3f}")
    assert scored.accuracy is not None and scored.accuracy > 2 / 3
