"""Public schemas of image datasets (``kind: images``) and their encoding, by the schema
alone (issue 20).

An image dataset is a set of labelled images of one declared size. What is public is the
schema: the height, width and channels every image must have, the class labels (K ≥ 2,
in the order of the encoded label 0 … K − 1), how raw pixel values map to [0, 1], and
how the private files are laid out (``source``). As for the other kinds, encoding is a
pure function of the schema and the image being encoded: pixels are clipped to the
declared [min, max] and scaled to (v − min)/(max − min) ∈ [0, 1]; no statistic of other
images (no mean, no standard deviation) enters.

Source formats (``source.format``), each read by ``worker/images.py`` from the path the
admin gives (docs/schema.md, "Image datasets"):

- ``folders``: a folder with one sub-folder per class, named as the class, of PNG/JPEG files;
- ``csv``: a folder of PNG/JPEG files and a labels CSV in it (file name, label);
- ``npz``: a NumPy ``.npz`` file with an images array and a labels array, named;
- ``idx``: MNIST's IDX files (images and labels, each optionally gzip-compressed);
- ``cifar``: CIFAR's Python batches (pickled dicts, read by a restricted unpickler).

This module never opens a file: reading the private images is the worker's job.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field, model_validator

from service.datasets.tabular import OnInvalid, _Strict

__all__ = [
    "MAX_ENCODED_WIDTH",
    "CifarSource",
    "CsvLabelsSource",
    "FolderSource",
    "IdxSource",
    "ImageSchema",
    "ImageSource",
    "NpzSource",
    "PixelScaling",
    "encode_pixels",
]

MAX_SIDE = 4096
"""The largest height or width a schema may declare."""
MAX_ENCODED_WIDTH = 1 << 22
"""The largest H·W·C a schema may declare (a 1024 × 1024 RGB image is 3·2^20)."""


# A file name inside the folder the admin names: no separator, not "." or "..", so that
# a public schema can never point the worker outside that folder.
def _file_name(text: str) -> str:
    if text in (".", "..") or any(c in text for c in "/\\\x00"):
        raise ValueError(f"{text!r} is not a plain file name (no folder, '.' or '..')")
    return text


FileName = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_file_name)]
ClassName = Annotated[str, Field(min_length=1, max_length=200)]
LabelValues = Literal["name", "index"]
"""How a stored label names its class: ``name``, its text equals a declared class
(integers are compared as their decimal text, ``3`` → ``"3"``); ``index``, an integer
0 … K − 1, the position in ``classes``."""


class PixelScaling(_Strict):
    """Raw pixel values in [min, max] map linearly to [0, 1]; a value outside is
    rejected (the whole image) or clipped, per ``on_invalid``. NaN or infinite values
    always reject the image."""

    min: float = 0.0
    max: float
    on_invalid: OnInvalid = "reject"

    @model_validator(mode="after")
    def _bounds(self) -> PixelScaling:
        if not self.min < self.max:
            raise ValueError("pixels: min must be < max")
        return self


class FolderSource(_Strict):
    """The path is a folder with one sub-folder per class, named exactly as the class;
    every file in a sub-folder (hidden ones aside) is one image (PNG or JPEG)."""

    format: Literal["folders"]


class CsvLabelsSource(_Strict):
    """The path is a folder of images (PNG or JPEG) holding a labels CSV, ``labels_file``,
    with a header line and one line per image: its file name relative to the folder and
    its label."""

    format: Literal["csv"]
    labels_file: FileName = "labels.csv"
    file_column: str = Field(default="file", min_length=1)
    label_column: str = Field(default="label", min_length=1)
    separator: str = Field(default=",", min_length=1, max_length=1)
    label_values: LabelValues = "name"

    @model_validator(mode="after")
    def _columns(self) -> CsvLabelsSource:
        if self.file_column == self.label_column:
            raise ValueError("source: the file and label columns must differ")
        return self


class NpzSource(_Strict):
    """The path is a NumPy ``.npz`` file (read without pickles) holding the arrays
    ``images`` and ``labels``; the images' axes are ``layout`` (``nhw``: grayscale, no
    channel axis)."""

    format: Literal["npz"]
    images: str = Field(default="images", min_length=1)
    labels: str = Field(default="labels", min_length=1)
    layout: Literal["nchw", "nhwc", "nhw"] = "nhwc"
    label_values: LabelValues = "name"

    @model_validator(mode="after")
    def _arrays(self) -> NpzSource:
        if self.images == self.labels:
            raise ValueError("source: the images and labels arrays must differ")
        return self


class IdxSource(_Strict):
    """The path is a folder holding MNIST's IDX files: ``images`` (N × H × W, or
    N × H × W × C) and ``labels`` (N), each raw or gzip-compressed (detected from its first
    bytes). Labels are indices into ``classes``."""

    format: Literal["idx"]
    images: FileName = "train-images-idx3-ubyte.gz"
    labels: FileName = "train-labels-idx1-ubyte.gz"

    @model_validator(mode="after")
    def _files(self) -> IdxSource:
        if self.images == self.labels:
            raise ValueError("source: the images and labels files must differ")
        return self


class CifarSource(_Strict):
    """The path is a folder holding CIFAR's Python batches (``data_batch_1`` …): pickled
    dicts with ``data`` (N × C·H·W uint8, channel-major rows) and ``label_key`` (N
    indices into ``classes``: ``labels`` for CIFAR-10, ``fine_labels`` or
    ``coarse_labels`` for CIFAR-100)."""

    format: Literal["cifar"]
    batches: list[FileName] = Field(min_length=1, max_length=100)
    label_key: Literal["labels", "fine_labels", "coarse_labels"] = "labels"

    @model_validator(mode="after")
    def _distinct(self) -> CifarSource:
        if len(set(self.batches)) != len(self.batches):
            raise ValueError("source.batches: duplicate file names")
        return self


ImageSource = Annotated[
    FolderSource | CsvLabelsSource | NpzSource | IdxSource | CifarSource,
    Field(discriminator="format"),
]


class ImageSchema(_Strict):
    """The public schema of an image dataset: K ≥ 2 classes, one declared image size."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    kind: Literal["images"]
    height: int = Field(ge=1, le=MAX_SIDE)
    width: int = Field(ge=1, le=MAX_SIDE)
    channels: Literal[1, 3]
    classes: list[ClassName] = Field(min_length=2, max_length=1000)
    pixels: PixelScaling
    source: ImageSource

    @model_validator(mode="after")
    def _consistent(self) -> ImageSchema:
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("classes: duplicate class names")
        if self.n_features > MAX_ENCODED_WIDTH:
            raise ValueError(
                f"height × width × channels = {self.n_features} exceeds {MAX_ENCODED_WIDTH}"
            )
        nhw = isinstance(self.source, NpzSource) and self.source.layout == "nhw"
        if nhw and self.channels != 1:
            raise ValueError("source.layout nhw has no channel axis: it needs channels: 1")
        if isinstance(self.source, FolderSource):
            bad = [c for c in self.classes if c in (".", "..") or "/" in c or "\\" in c]
            if bad:
                raise ValueError(
                    f"classes: {bad[0]!r} cannot be a folder name (source.format: folders)"
                )
        return self

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W), one image's axes as the readers return them."""
        return (self.channels, self.height, self.width)

    @property
    def n_features(self) -> int:
        """The encoded width H·W·C (the flattened pixels)."""
        return self.height * self.width * self.channels

    @property
    def feature_names(self) -> list[str]:
        """The encoded inputs' names in flattening order (channel-major, then row, then
        column): ``px_c_y_x``."""
        return [
            f"px_{c}_{y}_{x}"
            for c in range(self.channels)
            for y in range(self.height)
            for x in range(self.width)
        ]

    @property
    def n_classes(self) -> int:
        return len(self.classes)


def encode_pixels(schema: ImageSchema, pixels: np.ndarray) -> np.ndarray:
    """Raw pixels (n, C, H, W) → float32 in [0, 1] by the declared scaling alone:
    clip to [min, max], then (v − min)/(max − min). Clipped again here whatever the
    validation did, so the [0, 1] guarantee the sensitivity analyses rely on holds for
    any input; NaN is refused (validation rejects such images first)."""
    if pixels.ndim != 4 or tuple(pixels.shape[1:]) != schema.shape:
        raise ValueError(f"pixels of shape {pixels.shape}, expected (n, {schema.shape})")
    values = pixels.astype(np.float64, copy=False)
    if np.isnan(values).any():
        raise ValueError("NaN pixels (validate the images first)")
    lo, hi = schema.pixels.min, schema.pixels.max
    return ((np.clip(values, lo, hi) - lo) / (hi - lo)).astype(np.float32)
