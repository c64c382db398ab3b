"""Private image files: readers for each source format of an image schema
(``service/datasets/images.py``) and the validation report ``enclave datasets check``
prints (issue 20). The PNG/JPEG sources and validation are here; the array-file sources
(.npz, IDX, CIFAR batches) are worker/image_arrays.py, and what both return
(:class:`RawImages`, the reasons, the size bounds) is worker/image_types.py.

Every reader returns :class:`RawImages`: the pixels as an (n, C, H, W) array in the
file's own dtype, each image's label as text, and the images that could not be read,
each with its reason. :func:`validate_images` then applies the schema's label and pixel
rules and counts, per reason, what was rejected, with the first few offending names.
A whole file that cannot be used (not an IDX file, arrays of the wrong shape, a pickle
that asks for anything but a CIFAR batch's numpy arrays) is an :class:`ImageReadError`,
one line for the admin, never a traceback.

Untrusted input: PNG/JPEG go through Pillow with only those two decoders enabled and the
declared size checked from the header before any pixel is decoded; files above a size
bound, and arrays whose decoded size exceeds :data:`MAX_DECODED_BYTES`, are refused
before they are read; ``.npz`` files are read without pickles; CIFAR batches (pickles:
unpickling runs code) go through :class:`CifarUnpickler`, which resolves only the numpy
names a batch needs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from service.datasets.images import (
    CifarSource,
    CsvLabelsSource,
    FolderSource,
    IdxSource,
    ImageSchema,
    NpzSource,
)

__all__ = [
    "EXAMPLES",
    "ImageReadError",
    "ImageReport",
    "RawImages",
    "ValidatedImages",
    "check_images",
    "max_image_file_bytes",
    "read_images",
    "validate_images",
]


from worker.image_arrays import (
    _read_cifar,
    _read_idx_pair,
    _read_npz,
)
from worker.image_types import (
    ABOVE_MAX,
    BAD_NAME,
    BELOW_MIN,
    EXAMPLES,
    MISSING_FILE,
    MISSING_LABEL,
    NO_CLASS_FOLDER,
    NOT_A_FILE,
    NOT_FINITE,
    REPEATED,
    TOO_LARGE,
    UNKNOWN_LABEL,
    UNREADABLE,
    WRONG_CHANNELS,
    WRONG_SIZE,
    ImageReadError,
    ImageReport,
    RawImages,
    Refused,
    ValidatedImages,
    max_image_file_bytes,
)

# ---------------------------------------------------------------------------------------
# PNG / JPEG files


def _to_chw(array: np.ndarray) -> np.ndarray:
    """(H, W) or (H, W, C) → (C, H, W)."""
    return array[None] if array.ndim == 2 else np.moveaxis(array, -1, 0)


_GRAY_MODES = ("L", "I;16", "I;16B", "I;16L", "I")


def read_image_file(schema: ImageSchema, path: Path, name: str) -> np.ndarray | Refused:
    """One PNG or JPEG as (C, H, W), or why not. Grayscale (``channels: 1``) takes the
    modes L, 1 (as 0/255), I;16 and I; colour (``channels: 3``) takes RGB and palette
    images (as RGB). The size is checked from the header, before decoding."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            return Refused(name, NOT_A_FILE, "not a regular file")
    except OSError as exc:
        return Refused(name, UNREADABLE, type(exc).__name__)
    if size > max_image_file_bytes(schema):
        return Refused(name, TOO_LARGE, f"{size} bytes")
    try:
        with Image.open(path, formats=("PNG", "JPEG")) as im:
            if im.size != (schema.width, schema.height):
                return Refused(name, WRONG_SIZE, f"{im.size[1]}×{im.size[0]}")
            mode = im.mode
            if schema.channels == 1 and mode == "1":
                array = np.asarray(im.convert("L"))
            elif schema.channels == 1 and mode in _GRAY_MODES:
                array = np.asarray(im)
            elif schema.channels == 3 and mode in ("RGB", "P"):
                array = np.asarray(im.convert("RGB"))
            else:
                return Refused(name, WRONG_CHANNELS, f"mode {mode}")
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
        return Refused(name, UNREADABLE, type(exc).__name__)
    return _to_chw(array)


def _stack(schema: ImageSchema, arrays: list[np.ndarray]) -> np.ndarray:
    if not arrays:
        return np.zeros((0, *schema.shape), dtype=np.uint8)
    return np.stack(arrays)


def _visible(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _read_folders(schema: ImageSchema, root: Path) -> RawImages:
    if not root.is_dir():
        raise ImageReadError(f"{root.name}: source.format folders reads a folder of class folders")
    arrays: list[np.ndarray] = []
    labels: list[str] = []
    names: list[str] = []
    refused: list[Refused] = []
    for entry in _visible(root):
        if not entry.is_dir():
            refused.append(Refused(entry.name, NO_CLASS_FOLDER))
            continue
        for path in _visible(entry):
            name = f"{entry.name}/{path.name}"
            got = read_image_file(schema, path, name)
            if isinstance(got, Refused):
                refused.append(got)
                continue
            arrays.append(got)
            labels.append(entry.name)
            names.append(name)
    return RawImages(_stack(schema, arrays), labels, names, refused)


def _inside(folder: Path, text: str) -> Path | None:
    """``folder / text`` when that names a path inside ``folder`` (no absolute path, no
    ``..`` out of it), else None."""
    if not text or "\x00" in text or Path(text).is_absolute():
        return None
    base = folder.resolve()
    path = (folder / text).resolve()
    return path if path != base and path.is_relative_to(base) else None


def _read_csv_labels(schema: ImageSchema, folder: Path) -> RawImages:
    source = schema.source
    assert isinstance(source, CsvLabelsSource)
    if not folder.is_dir():
        raise ImageReadError(f"{folder.name}: source.format csv reads a folder of images")
    labels_path = folder / source.labels_file
    try:
        table = pd.read_csv(
            labels_path, sep=source.separator, dtype=str, keep_default_na=False, header=0
        )
    except (OSError, UnicodeError, ValueError, pd.errors.ParserError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImageReadError(f"cannot read the labels file {source.labels_file}: {first}") from None
    missing = [c for c in (source.file_column, source.label_column) if c not in table.columns]
    if missing:
        raise ImageReadError(
            f"{source.labels_file} has no column {missing[0]!r} (it has: "
            f"{', '.join(map(str, table.columns))}; set source.file_column/label_column)"
        )
    files = table[source.file_column].str.strip().tolist()
    counts = pd.Series(files).value_counts()
    arrays: list[np.ndarray] = []
    labels: list[str] = []
    names: list[str] = []
    refused: list[Refused] = []
    for text, label in zip(files, table[source.label_column].str.strip(), strict=True):
        path = _inside(folder, text)
        if path is None:
            refused.append(Refused(text or "(empty)", BAD_NAME))
        elif counts[text] > 1:
            refused.append(Refused(text, REPEATED))
        elif not path.exists():
            refused.append(Refused(text, MISSING_FILE))
        else:
            got = read_image_file(schema, path, text)
            if isinstance(got, Refused):
                refused.append(got)
                continue
            arrays.append(got)
            labels.append(label)
            names.append(text)
    return RawImages(_stack(schema, arrays), labels, names, refused)


_READERS: dict[type, Callable[[ImageSchema, Path], RawImages]] = {
    FolderSource: _read_folders,
    CsvLabelsSource: _read_csv_labels,
    NpzSource: _read_npz,
    IdxSource: _read_idx_pair,
    CifarSource: _read_cifar,
}


def read_images(schema: ImageSchema, path: Path) -> RawImages:
    """The images at ``path`` as the schema's ``source`` says (module docstring)."""
    return _READERS[type(schema.source)](schema, path)


# ---------------------------------------------------------------------------------------
# Validation


def _class_indices(schema: ImageSchema, labels: list[str]) -> np.ndarray:
    """Each label's class index, −1 where it names none of ``classes``. IDX and CIFAR
    labels, and ``label_values: index``, are indices; other labels are class names."""
    by_index = isinstance(schema.source, IdxSource | CifarSource) or (
        getattr(schema.source, "label_values", "name") == "index"
    )
    if by_index:
        k = schema.n_classes
        digits = re.compile(r"^\+?[0-9]{1,9}$")
        return np.array(
            [int(s) if digits.match(s) and int(s) < k else -1 for s in labels], dtype=np.int64
        )
    index = {name: i for i, name in enumerate(schema.classes)}
    return np.array([index.get(s, -1) for s in labels], dtype=np.int64)


def _pixel_reasons(schema: ImageSchema, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image: the first pixel rule it breaks ("" if none), and whether it has a value
    outside [min, max] (clipped when ``on_invalid: clip``)."""
    n = len(pixels)
    flat = pixels.reshape(n, -1)
    lo, hi = schema.pixels.min, schema.pixels.max
    if n == 0 or flat.shape[1] == 0:
        return np.full(n, "", dtype=object), np.zeros(n, dtype=bool)
    if flat.dtype.kind == "f":
        ok = np.isfinite(flat)
        finite = ok.all(axis=1)
        low = np.where(ok, flat, hi).min(axis=1) < lo
        high = np.where(ok, flat, lo).max(axis=1) > hi
    else:  # integers: no NaN, and no float copy of the whole array
        finite = np.ones(n, dtype=bool)
        low, high = flat.min(axis=1) < lo, flat.max(axis=1) > hi
    reasons = np.full(n, "", dtype=object)
    if schema.pixels.on_invalid == "reject":
        reasons[high] = ABOVE_MAX
        reasons[low] = BELOW_MIN
    reasons[~finite] = NOT_FINITE
    return reasons, finite & (low | high)


def validate_images(schema: ImageSchema, raw: RawImages) -> ValidatedImages:
    """Apply the schema's rules to every image read, after the reading's own refusals:
    a missing label, a label naming no declared class, a NaN or infinite pixel, and a
    pixel outside [min, max] (rejected, or counted as clipped with ``on_invalid: clip``;
    the encoding clips). One reason per image, the first in this order."""
    n = len(raw.names)
    y = _class_indices(schema, raw.labels)
    missing = np.array([s == "" for s in raw.labels], dtype=bool)
    pixel_reasons, clipped = _pixel_reasons(schema, raw.pixels)
    reasons = pixel_reasons.copy()
    reasons[(y < 0) & ~missing] = UNKNOWN_LABEL
    reasons[missing] = MISSING_LABEL
    kept = np.flatnonzero(reasons == "")

    found: list[tuple[str, str]] = [
        (r.name + (f" ({r.detail})" if r.detail else ""), r.reason) for r in raw.refused
    ]
    for i in np.flatnonzero(reasons != ""):
        detail = f" (label {raw.labels[i]!r})" if reasons[i] == UNKNOWN_LABEL else ""
        found.append((raw.names[i] + detail, str(reasons[i])))
    rejected: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    for name, reason in found:
        rejected[reason] = rejected.get(reason, 0) + 1
        if len(examples.setdefault(reason, [])) < EXAMPLES:
            examples[reason].append(name)
    rejected = dict(sorted(rejected.items(), key=lambda item: (-item[1], item[0])))
    counts = np.bincount(y[kept], minlength=schema.n_classes)
    report = ImageReport(
        images_in=n + len(raw.refused),
        images_kept=len(kept),
        rejected=rejected,
        examples={reason: tuple(names) for reason, names in examples.items()},
        per_class={name: int(c) for name, c in zip(schema.classes, counts, strict=True)},
        clipped=int(clipped[kept].sum()),
        hint=_hint(schema, rejected) if not len(kept) else None,
    )
    return ValidatedImages(
        pixels=raw.pixels[kept],
        y=y[kept],
        names=[raw.names[i] for i in kept],
        report=report,
    )


def _hint(schema: ImageSchema, rejected: dict[str, int]) -> str:
    """Why no image passed, guessed from the most common reason (admin-only)."""
    if not rejected:
        return "no image found: check the path and source.format"
    top = max(rejected, key=lambda r: rejected[r])
    return {
        UNKNOWN_LABEL: "no label names a declared class: check classes and source.label_values",
        WRONG_SIZE: f"the images are not {schema.height}×{schema.width}: check height and width",
        WRONG_CHANNELS: f"the images do not have {schema.channels} channel(s): check channels",
        ABOVE_MAX: "pixels exceed pixels.max: check the declared range (or on_invalid: clip)",
    }.get(top, f"most images were rejected for {top!r}")


def check_images(schema: ImageSchema, path: Path) -> ValidatedImages:
    """Read and validate, as registration would (``enclave datasets check``)."""
    return validate_images(schema, read_images(schema, path))
