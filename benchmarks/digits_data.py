"""The bundled digits (examples/digits: scikit-learn's 1,797 8×8 images, 10 classes) as the
worker reads them, for the digits benchmarks: pixels encoded by the public schema
(`encode_pixels`), flattened to 64 features, with the schema as the plan sees it.

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


def load_digits_set() -> DigitsSet:
    schema = load_schema_yaml((DIGITS / "schema.yaml").read_text())
    assert isinstance(schema, ImageSchema)
    with np.load(DIGITS / "digits.npz") as npz:
        images, labels = npz["images"], npz["labels"]
    x = encode_pixels(schema, images[:, None]).reshape(len(images), -1)
    data = TabularTrainingSet(x=torch.from_numpy(x), y=torch.from_numpy(labels.astype(np.float32)))
    return DigitsSet(x=x, labels=labels, data=data, public=schema.model_dump(mode="json"))
