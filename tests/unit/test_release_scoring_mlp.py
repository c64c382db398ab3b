"""The analyst's numpy forward of an MLP release (service/releases.py: mlp_logits, used by
predict_proba / predict_class_proba and so by `enclave jobs score`) computes what the
worker's torch module (worker/models/mlp.py) computes: tanh and ReLU hidden layers, one
logit (sigmoid) or K (softmax, issue 20)."""

from __future__ import annotations

import numpy as np
import pytest

from service.modelspec import MlpSpec
from tests.unit.test_release_scoring_cnn import assert_scores_are_the_modules


@pytest.mark.parametrize("classes", [None, 3, 10])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("hidden", [[5], [16, 8, 4]])
def test_numpy_forward_is_the_torch_modules(
    classes: int | None, activation: str, hidden: list[int]
) -> None:
    spec = MlpSpec(hidden=hidden, activation=activation, classes=classes)  # type: ignore[arg-type]
    x = np.random.default_rng(2).uniform(0.0, 1.0, (200, 7))
    assert_scores_are_the_modules(spec, x)
