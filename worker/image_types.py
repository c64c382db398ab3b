"""The vocabulary of the image readers (worker/images.py, worker/image_arrays.py): the
reasons an image is rejected, the size bounds on untrusted files, and what a reader and
validation return (issue 20). Its own module so that both reader modules use it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from service.datasets.images import (
    ImageSchema,
)

MAX_DECODED_BYTES = 4 << 30
"""The most bytes one array file (npz member, IDX file, CIFAR batch) may decode to."""
EXAMPLES = 5
"""How many offending names the report shows per reason."""

# The reasons an image is rejected, in the order they take precedence.
UNREADABLE = "unreadable file"
TOO_LARGE = "file too large"
WRONG_SIZE = "wrong size"
WRONG_CHANNELS = "wrong channels"
NOT_A_FILE = "not an image file"
NO_CLASS_FOLDER = "not in a class folder"
BAD_NAME = "bad file name"
MISSING_FILE = "missing file"
REPEATED = "file listed more than once"
MISSING_LABEL = "missing label"
UNKNOWN_LABEL = "unknown label"
NOT_FINITE = "pixel NaN or infinite"
BELOW_MIN = "pixel below min"
ABOVE_MAX = "pixel above max"


class ImageReadError(ValueError):
    """A file that cannot be used as the schema's source says (one line for the admin)."""


def max_image_file_bytes(schema: ImageSchema) -> int:
    """The largest PNG/JPEG file read for one image: four bytes per declared value (a
    16-bit PNG's raw size is two, and compression only shrinks it) plus 1 MiB for
    metadata. A bigger file is refused unread (a 2 GB "8 × 8 image" is not one)."""
    return 4 * schema.n_features + (1 << 20)


@dataclass(frozen=True)
class Refused:
    """An image that could not be read: its name, the reason, and a detail for the
    admin (what was found)."""

    name: str
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class RawImages:
    """What a reader returns: ``pixels`` (n, C, H, W) in the file's dtype, ``labels``
    (n) as text ("" where none), ``names`` (n) to report images by, and ``refused``,
    the images that could not be read at all."""

    pixels: np.ndarray
    labels: list[str]
    names: list[str]
    refused: list[Refused] = field(default_factory=list)


@dataclass(frozen=True)
class ImageReport:
    """What validation did to the images, per reason with the first few names, and the
    kept images per class. Exact counts: for the admin inside the enclave only."""

    images_in: int
    images_kept: int
    rejected: dict[str, int]
    examples: dict[str, tuple[str, ...]]
    per_class: dict[str, int]
    clipped: int = 0
    hint: str | None = None

    @property
    def rows_kept(self) -> int:
        """The dataset's row count: one row of the neighbouring relation is one image."""
        return self.images_kept

    @property
    def empty_classes(self) -> list[str]:
        return [name for name, n in self.per_class.items() if n == 0]

    def lines(self) -> list[str]:
        """The report in words, one line per fact (``enclave datasets check``)."""
        out = [
            f"{self.images_kept} images kept of {self.images_in} "
            f"({self.images_in - self.images_kept} rejected)"
        ]
        for reason, n in self.rejected.items():
            out.append(f"  rejected, {reason}: {n} (first: {', '.join(self.examples[reason])})")
        if self.clipped:
            out.append(f"  clipped to the declared pixel range: {self.clipped} images")
        out.append(
            "  per class: " + ", ".join(f"{name}: {n}" for name, n in self.per_class.items())
        )
        if self.empty_classes:
            out.append(f"  empty class(es), no image kept: {', '.join(self.empty_classes)}")
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


@dataclass(frozen=True)
class ValidatedImages:
    """The kept images: ``pixels`` (n, C, H, W) in the file's dtype (encoding clips and
    scales them, ``service.datasets.images.encode_pixels``), ``y`` (n) class indices
    0 … K − 1 in the schema's order, ``names`` (n), and the report."""

    pixels: np.ndarray
    y: np.ndarray
    names: list[str]
    report: ImageReport
