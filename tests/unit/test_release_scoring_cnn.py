"""The analyst's numpy forward of a CNN release (service/releases.py: cnn_logits, used by
predict_proba / predict_class_proba and so by `enclave jobs score` on images) computes what
the worker's torch module (worker/models/cnn.py) computes, on random weights and layer
shapes: strides, padding, pooling of odd maps, binary and K-class heads, row blocks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from service.modelspec import CnnSpec, ModelSpec
from service.releases import LoadedRelease, predict_class_proba, predict_proba
from worker.models import build_module

CASES: list[dict[str, Any]] = [
    {"conv": [{"channels": 4, "kernel": 3, "padding": 1, "pool": "avg2"}], "classes": 10},
    {
        "conv": [
            {"channels": 3, "kernel": 2, "stride": 2, "padding": 0},
            {"channels": 5, "kernel": 3, "padding": 2, "pool": "avg2"},
        ],
        "classes": None,
    },
    {
        "conv": [
            {"channels": 2, "kernel": 5, "padding": 3, "pool": "avg2"},
            {"channels": 6, "kernel": 1, "stride": 2},
        ],
        "classes": 3,
    },
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("image", [(1, 8, 8), (3, 9, 7)])
def test_numpy_forward_is_the_torch_modules(case: dict[str, Any], image: tuple[int, ...]) -> None:
    c, h, w = image
    spec = CnnSpec.model_validate(
        {
            "kind": "cnn",
            "conv": case["conv"],
            **({"classes": case["classes"]} if case["classes"] else {}),
            "image": {"channels": c, "height": h, "width": w},
        }
    )
    x = np.random.default_rng(1).uniform(0.0, 1.0, (300, c * h * w))  # two row blocks
    assert_scores_are_the_modules(spec, x)


def assert_scores_are_the_modules(spec: ModelSpec, x: np.ndarray) -> None:
    """The release's probabilities (predict_class_proba for a spec with classes, else
    predict_proba) are the float64 torch module's softmax or sigmoid on x, to rtol 1e-10,
    for random weights (seed 0) in a release built from the module's state dict."""
    torch.manual_seed(0)
    module = build_module(spec, x.shape[1]).double()
    tensors = {f"sample_0.{k}": v.detach().numpy() for k, v in module.state_dict().items()}
    card = {"model": spec.model_dump(mode="json"), "preprocessing": {}}
    release = LoadedRelease(card=card, tensors=tensors)
    with torch.no_grad():
        logits = module(torch.from_numpy(x)).numpy()
    if getattr(spec, "classes", None):
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        expected = e / e.sum(axis=1, keepdims=True)
        got = predict_class_proba(release, x)
    else:
        expected = 1.0 / (1.0 + np.exp(-logits))
        got = predict_proba(release, x)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
