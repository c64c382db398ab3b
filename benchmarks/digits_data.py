"""The bundled digits (examples/digits: scikit-learn's 1,797 8×8 images, 10 classes) as the
worker reads them, for the digits benchmarks: pixels encoded by the public schema
(`encode_pixels`), flattened to 64 features, with the schema as the plan sees it. Also a
generated image set of any shape (MNIST's 28×28×1, CIFAR's 32×32×3), the same way
(`generated_sets`: no download, reproducible from a public seed).

    from digits_data import load_digits_set   # benchmarks/ on sys.path (run as a script)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from service.datasets.images import ImageSchema, encode_pixels
from service.datasets.kinds import load_schema_yaml
from worker.mechanisms.base import TabularTrainingSet

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


@dataclass(frozen=True)
class DigitsSet:
    x: npt.NDArray[Any]  # (1797, 64) encoded pixels
    labels: npt.NDArray[Any]  # (1797,) integer classes 0..9
    data: TabularTrainingSet  # the same, as the mechanisms take it
    public: dict[str, Any]  # the public schema as JSON (what plan_for_dataset reads)


def _image_set(
    schema: ImageSchema, images: npt.NDArray[Any], labels: npt.NDArray[Any]
) -> DigitsSet:
    """Images (n, C, H, W) and integer labels as the worker reads them: encoded by the
    schema, flattened (C, H, W) row-major."""
    x = encode_pixels(schema, images).reshape(len(images), -1)
    data = TabularTrainingSet(x=torch.from_numpy(x), y=torch.from_numpy(labels.astype(np.float32)))
    return DigitsSet(x=x, labels=labels, data=data, public=schema.model_dump(mode="json"))


def load_digits_set() -> DigitsSet:
    schema = load_schema_yaml((DIGITS / "schema.yaml").read_text())
    assert isinstance(schema, ImageSchema)
    with np.load(DIGITS / "digits.npz") as npz:
        images, labels = npz["images"], npz["labels"]
    return _image_set(schema, images[:, None], labels)


GENERATED_SEED = 20
"""The public seed of the generated images (the issue's number)."""
GENERATED_CLASSES = 10
_SIGNAL = 0.35  # weight of the class pattern against the per-pixel noise
_ON = 0.3  # the share of a class pattern's 4×4 blocks that are on
_SHIFT = 3  # the largest cyclic shift of a pattern, pixels, each axis


def generated_description(n: int, n_test: int, shape: tuple[int, int, int]) -> str:
    """How generated_sets makes its images, in words (for the results)."""
    h, w, c = shape
    return (
        f"{n:,} training and {n_test:,} held-out images of {h}×{w}×{c}, "
        f"{GENERATED_CLASSES} balanced classes, generated with numpy's "
        f"default_rng({GENERATED_SEED}) by benchmarks/digits_data.py (generated_sets): each "
        f"class has a random pattern of 4×4-pixel blocks, each on (1) with probability {_ON} "
        "else off (0), per channel; an image is its class's pattern shifted cyclically by up "
        f"to ±{_SHIFT} pixels on each axis, times a random contrast in [0.5, 1], weighted "
        f"{_SIGNAL} against {1 - _SIGNAL:.2f} × u² per pixel (u uniform in [0, 1]), rounded to "
        "bytes 0-255 (schema pixels 0-255)."
    )


def generated_sets(n: int, n_test: int, shape: tuple[int, int, int]) -> tuple[DigitsSet, DigitsSet]:
    """A training and a held-out set of generated (H, W, C) images (generated_description says how
    they are made), with a public schema as the plan sees it; the same bits for the same
    arguments."""
    h, w, c = shape
    rng = np.random.default_rng(GENERATED_SEED)
    blocks = (c, -(-h // 4), -(-w // 4))
    on = rng.random((GENERATED_CLASSES, *blocks)) < _ON
    patterns = on.astype(np.float64).repeat(4, axis=2).repeat(4, axis=3)[:, :, :h, :w]
    total = n + n_test
    labels = rng.permutation(np.arange(total) % GENERATED_CLASSES)
    shifts = rng.integers(-_SHIFT, _SHIFT + 1, size=(total, 2))
    contrast = rng.uniform(0.5, 1.0, size=(total, 1, 1, 1))
    shifted = np.stack(
        [
            np.roll(patterns[k], (int(dy), int(dx)), axis=(1, 2))
            for k, (dy, dx) in zip(labels, shifts, strict=True)
        ]
    )
    mixed = _SIGNAL * contrast * shifted + (1 - _SIGNAL) * rng.random((total, c, h, w)) ** 2
    images = np.round(255 * mixed).astype(np.uint8)
    schema = ImageSchema.model_validate(
        {
            "name": "generated",
            "kind": "images",
            "height": h,
            "width": w,
            "channels": c,
            "classes": [str(k) for k in range(GENERATED_CLASSES)],
            "pixels": {"min": 0, "max": 255},
            "source": {"format": "npz", "layout": "nchw"},
        }
    )
    return (
        _image_set(schema, images[:n], labels[:n]),
        _image_set(schema, images[n:], labels[n:]),
    )
