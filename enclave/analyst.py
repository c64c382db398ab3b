"""Analyst-side helpers that read files: a release downloaded from the API and a public
CSV, scored in one call.

The service package never reads a CSV (tests/unit/test_boundary.py), so the file reading
lives here; the encoding and the prediction are :mod:`service.releases` (numpy only).
Everything here runs on the analyst's machine, on public data.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from service.datasets.tabular import TabularSchema, ValidationReport
from service.datasets.timeseries import (
    TimeSeriesReport,
    TimeSeriesSchema,
    encode_series,
    validate_series,
)
from service.releases import (
    LoadedRelease,
    encode_rows,
    load_release,
    n_classes,
    predict_class_proba,
    predict_proba,
)

if TYPE_CHECKING:
    from worker.image_types import ImageReport

CARD_FILE = "card.json"
WEIGHTS_FILE = "model.safetensors"


def read_public_csv(schema: TabularSchema, path: str | Path) -> pd.DataFrame:
    """Read a CSV with the schema's csv options (separator, header, names, NA tokens,
    compression), as the enclave read the private rows."""
    return pd.read_csv(path, **schema.read_csv_kwargs())


def open_release(path: str | Path) -> LoadedRelease:
    """A release saved as ``card.json`` + ``model.safetensors`` (the two downloads of
    ``GET /v1/jobs/{id}/release/card`` and ``…/weights``): ``path`` is their folder or
    either file. The weights are checked against the card's SHA-256."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    card = json.loads((folder / CARD_FILE).read_text())
    return load_release((folder / WEIGHTS_FILE).read_bytes(), card)


@dataclass(frozen=True)
class Scored:
    """Predictions for the kept rows of a CSV. ``probabilities`` (P(y = 1), or for a
    release of K ≥ 3 classes one column per class) and ``y`` follow ``kept_index``
    (labels of the CSV's rows, 0-based); ``dropped`` says why every other row was dropped.
    ``auc`` is None without labels or with one class only; for K ≥ 3 classes it is the
    macro average of the one-vs-rest AUCs (None unless every class occurs), and
    ``accuracy`` the share of rows whose most probable class is theirs (None for a binary
    release or without labels)."""

    probabilities: np.ndarray
    kept_index: pd.Index
    dropped: dict[Hashable, str]
    y: np.ndarray | None
    auc: float | None
    report: ValidationReport
    accuracy: float | None = None


def score_csv(
    release: LoadedRelease | str | Path, csv_path: str | Path, *, sample: int = 0
) -> Scored:
    """Score a public CSV with a release: read it by the release's public schema, encode
    it (with the target when the file has it), predict, and give the AUC when labelled
    (K ≥ 3 classes: the accuracy and the macro one-vs-rest AUC)."""
    loaded = release if isinstance(release, LoadedRelease) else open_release(release)
    rows = encode_rows(loaded.schema, read_public_csv(loaded.schema, csv_path))
    k = n_classes(loaded)
    if k >= 3:
        matrix = predict_class_proba(loaded, rows.x, sample=sample)
        accuracy = auc = None
        if rows.y is not None and len(rows.y):
            accuracy = float((matrix.argmax(axis=1) == rows.y).mean())
            if len(np.unique(rows.y)) == k:
                auc = float(roc_auc_score(rows.y, matrix, multi_class="ovr", average="macro"))
        return Scored(matrix, rows.kept_index, rows.dropped, rows.y, auc, rows.report, accuracy)
    proba = predict_proba(loaded, rows.x, sample=sample)
    auc = None
    if rows.y is not None and len(np.unique(rows.y)) == 2:
        auc = float(roc_auc_score(rows.y, proba))
    return Scored(proba, rows.kept_index, rows.dropped, rows.y, auc, rows.report)


@dataclass(frozen=True)
class ScoredSeries:
    """GRU-D's predictions for the kept stays of public time-series files, in
    ``stay_ids`` order, with their outcomes ``y``: P(y = 1), or for a release of K ≥ 3
    classes one column per class (softmax) with ``accuracy`` the share of stays whose most
    probable class is theirs; ``auc`` is None with one class only (K ≥ 3: the macro
    one-vs-rest AUC, None unless every class occurs)."""

    probabilities: np.ndarray
    stay_ids: list[str]
    y: np.ndarray
    auc: float | None
    report: TimeSeriesReport
    accuracy: float | None = None


def score_series(
    release: LoadedRelease | str | Path,
    csv_path: str | Path,
    outcomes_path: str | Path | None = None,
    *,
    sample: int = 0,
) -> ScoredSeries:
    """Score public stays with a GRU-D release: read the long-format observations (and
    the outcomes file, unless the schema's outcomes are a column of the observations) by
    the release's public schema, validate and encode them as the enclave does
    (:mod:`service.datasets.timeseries`), and run the released GRU-D (needs torch)."""
    import torch
    from pydantic import TypeAdapter

    from service.modelspec import ModelSpec
    from worker.models import build_module

    loaded = release if isinstance(release, LoadedRelease) else open_release(release)
    schema = TimeSeriesSchema.model_validate(loaded.card["preprocessing"]["public_schema"])
    if schema.layout != "long":
        raise ValueError("score_series reads the long format (layout: long)")
    observations = pd.read_csv(csv_path, **schema.read_csv_kwargs())
    outcomes = None
    if outcomes_path is not None:
        outcomes = pd.read_csv(outcomes_path, **schema.read_outcomes_kwargs())
    validated = validate_series(schema, observations, outcomes)
    enc = encode_series(schema, validated)
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(loaded.card["model"])
    module = build_module(spec, schema.n_features)
    weights = loaded.sample_weights(sample)
    module.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
    k = n_classes(loaded)
    with torch.no_grad():
        logits = module(torch.as_tensor(enc.x)).double()
    if k >= 3:
        matrix = torch.softmax(logits, dim=1).numpy()
        y = enc.y.astype(np.int64)
        accuracy = float((matrix.argmax(axis=1) == y).mean()) if len(y) else None
        auc = None
        if len(np.unique(y)) == k:
            auc = float(roc_auc_score(y, matrix, multi_class="ovr", average="macro"))
        return ScoredSeries(matrix, enc.stay_ids, y, auc, validated.report, accuracy)
    proba = torch.sigmoid(logits).numpy()
    auc = float(roc_auc_score(enc.y, proba)) if len(np.unique(enc.y)) == 2 else None
    return ScoredSeries(proba, enc.stay_ids, enc.y, auc, validated.report)


@dataclass(frozen=True)
class ScoredImages:
    """A release's predictions for public images (a folder or file in the release's
    schema's ``source`` format, read and validated as the enclave reads them): P(y = 1)
    for a binary release, one column per class for K ≥ 3; ``names`` the kept images,
    ``y`` their class indices, ``accuracy`` the share whose most probable class is
    theirs, ``auc`` the AUC (binary) or the macro one-vs-rest AUC (None unless every
    class occurs); ``report`` what validation kept and rejected, and why."""

    probabilities: np.ndarray
    names: list[str]
    y: np.ndarray
    accuracy: float
    auc: float | None
    report: ImageReport


def score_images(
    release: LoadedRelease | str | Path, path: str | Path, *, sample: int = 0
) -> ScoredImages:
    """Score public images with a logistic or CNN release trained on an image dataset: read and
    validate them by the release's public schema (worker/images.py, as ``enclave datasets
    check`` does), encode the pixels as the enclave does
    (:func:`service.datasets.images.encode_pixels`), predict."""
    from service.datasets.images import ImageSchema, encode_pixels
    from worker.images import check_images

    loaded = release if isinstance(release, LoadedRelease) else open_release(release)
    schema = ImageSchema.model_validate(loaded.card["preprocessing"]["public_schema"])
    images = check_images(schema, Path(path))
    if not len(images.y):
        raise ValueError(
            f"no image of {Path(path).name} passed the release's public schema: "
            + "; ".join(line.strip() for line in images.report.lines())
        )
    x = encode_pixels(schema, images.pixels).reshape(len(images.y), schema.n_features)
    y = images.y.astype(np.int64)
    k = n_classes(loaded)
    if k >= 3:
        proba = predict_class_proba(loaded, x, sample=sample)
        accuracy = float((proba.argmax(axis=1) == y).mean()) if len(y) else 0.0
        auc = None
        if len(np.unique(y)) == k:
            auc = float(roc_auc_score(y, proba, multi_class="ovr", average="macro"))
    else:
        proba = predict_proba(loaded, x, sample=sample)
        accuracy = float(((proba > 0.5) == y).mean()) if len(y) else 0.0
        auc = float(roc_auc_score(y, proba)) if len(np.unique(y)) == 2 else None
    return ScoredImages(proba, images.names, y, accuracy, auc, images.report)
