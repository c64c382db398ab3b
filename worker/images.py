"""Private image files: readers for each source format of an image schema
(``service/datasets/images.py``) and the validation report ``enclave datasets check``
prints (issue 20).

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

import gzip
import io
import math
import pickle
import re
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

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
    "MAX_DECODED_BYTES",
    "CifarUnpickler",
    "ImageReadError",
    "ImageReport",
    "RawImages",
    "ValidatedImages",
    "check_images",
    "max_image_file_bytes",
    "read_images",
    "validate_images",
]

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


# ---------------------------------------------------------------------------------------
# Array files: .npz, IDX, CIFAR batches


def _check_decoded(what: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    size = math.prod(shape) * dtype.itemsize
    if size > MAX_DECODED_BYTES:
        raise ImageReadError(
            f"{what}: {size / 2**30:.1f} GiB decoded, above the "
            f"{MAX_DECODED_BYTES / 2**30:g} GiB limit of one file"
        )


def _to_nchw(schema: ImageSchema, what: str, images: np.ndarray, layout: str) -> np.ndarray:
    """Images in ``layout`` → (n, C, H, W), or :class:`ImageReadError` naming both shapes."""
    c, h, w = schema.shape
    expected = {"nchw": (c, h, w), "nhwc": (h, w, c), "nhw": (h, w)}[layout]
    if images.ndim != len(expected) + 1 or tuple(images.shape[1:]) != expected:
        raise ImageReadError(
            f"{what}: images of shape {tuple(images.shape)}, the schema declares "
            f"(n, {', '.join(map(str, expected))}) ({layout})"
        )
    if images.dtype.kind not in "uif":
        raise ImageReadError(f"{what}: pixels of dtype {images.dtype}, not numbers")
    if layout == "nhw":
        return images[:, None]
    return np.moveaxis(images, -1, 1) if layout == "nhwc" else images


def _label_text(what: str, labels: Any, n: int) -> list[str]:
    """Stored labels → text, one per image (integers as decimal text)."""
    array = np.asarray(labels)
    if array.ndim != 1 or len(array) != n:
        raise ImageReadError(f"{what}: {array.shape} labels for {n} images (one per image)")
    if array.dtype.kind not in "iuUSf":
        raise ImageReadError(f"{what}: labels of dtype {array.dtype}, not integers or text")
    try:
        return [s.strip() for s in array.astype(str).tolist()]
    except UnicodeError:
        raise ImageReadError(f"{what}: labels are not ASCII text") from None


_NPY_HEADERS: dict[tuple[int, int], Callable[[BinaryIO], tuple[Any, bool, np.dtype]]] = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _npz_array(npz: Any, path: Path, key: str) -> np.ndarray:
    """One array of an .npz file, its declared size checked before it is decompressed."""
    if key not in npz.files:
        raise ImageReadError(
            f"{path.name} has no array {key!r} (it holds: {', '.join(npz.files) or 'none'})"
        )
    member = f"{key}.npy" if f"{key}.npy" in npz.zip.namelist() else key
    with npz.zip.open(member) as fp:
        version = np.lib.format.read_magic(fp)
        if version not in _NPY_HEADERS:
            raise ImageReadError(f"{path.name}[{key}]: unsupported .npy version {version}")
        shape, _, dtype = _NPY_HEADERS[version](fp)
    _check_decoded(f"{path.name}[{key}]", tuple(shape), dtype)
    return np.asarray(npz[key])


def _read_npz(schema: ImageSchema, path: Path) -> RawImages:
    source = schema.source
    assert isinstance(source, NpzSource)
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not isinstance(npz, np.lib.npyio.NpzFile):
                raise ImageReadError(f"{path.name}: a single array, not an .npz file")
            images = _npz_array(npz, path, source.images)
            raw_labels = _npz_array(npz, path, source.labels)
    except ImageReadError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImageReadError(f"cannot read {path.name} as .npz: {first}") from None
    pixels = _to_nchw(schema, f"{path.name}[{source.images}]", images, source.layout)
    labels = _label_text(f"{path.name}[{source.labels}]", raw_labels, len(pixels))
    names = [f"{path.name}[{i}]" for i in range(len(pixels))]
    return RawImages(pixels, labels, names)


_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _open_maybe_gzip(path: Path) -> BinaryIO:
    """The file, decompressed when it starts with gzip's magic bytes."""
    with path.open("rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else path.open("rb")  # type: ignore[return-value]


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (LeCun et al.'s MNIST format: two zero bytes, a type code, the number
    of dimensions, each dimension as a big-endian uint32, then the values big-endian),
    optionally gzip-compressed. Truncated or overlong files are refused."""
    try:
        with _open_maybe_gzip(path) as fh:
            head = fh.read(4)
            if len(head) < 4 or head[:2] != b"\0\0" or head[2] not in _IDX_TYPES or not head[3]:
                raise ImageReadError(f"{path.name}: not an IDX file (bad magic number)")
            ndim = head[3]
            raw_dims = fh.read(4 * ndim)
            if len(raw_dims) < 4 * ndim:
                raise ImageReadError(f"{path.name}: truncated IDX header")
            dims = struct.unpack(f">{ndim}I", raw_dims)
            dtype = np.dtype(_IDX_TYPES[head[2]])
            _check_decoded(path.name, dims, dtype)
            size = math.prod(dims) * dtype.itemsize
            data = fh.read(size)
            if len(data) < size:
                raise ImageReadError(f"{path.name}: truncated ({len(data)} of {size} data bytes)")
            if fh.read(1):
                raise ImageReadError(f"{path.name}: bytes after the declared {dims} values")
    except ImageReadError:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        raise ImageReadError(f"cannot read {path.name}: {type(exc).__name__}") from None
    return np.frombuffer(data, dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="))


def _read_idx_pair(schema: ImageSchema, folder: Path) -> RawImages:
    source = schema.source
    assert isinstance(source, IdxSource)
    if not folder.is_dir():
        raise ImageReadError(f"{folder.name}: source.format idx reads a folder of IDX files")
    images = read_idx(_existing(folder, source.images))
    layout = "nhw" if images.ndim == 3 else "nhwc"
    pixels = _to_nchw(schema, source.images, images, layout)
    labels = _label_text(source.labels, read_idx(_existing(folder, source.labels)), len(pixels))
    names = [f"{source.images}[{i}]" for i in range(len(pixels))]
    return RawImages(pixels, labels, names)


def _existing(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise ImageReadError(f"{folder.name} has no file {name}")
    return path


class _Standin:
    """A stand-in for a global a CIFAR pickle names. No attribute can be set on it (no
    ``__dict__``, no slots), so a pickle's BUILD opcode cannot change it for later loads."""

    __slots__ = ()


class _NdarrayMarker(_Standin):
    """Stands for ``numpy.ndarray``: it can be passed to ``_reconstruct`` but not called
    (``ndarray(shape)`` would allocate any size)."""

    __slots__ = ()


_NDARRAY = _NdarrayMarker()


class _Reconstruct(_Standin):
    """numpy's ``ndarray.__reduce__`` always pickles ``_reconstruct(ndarray, (0,), b'b')``
    then the real shape and bytes in ``__setstate__``; anything else is refused, so an
    array's memory is bounded by the bytes in the stream."""

    __slots__ = ()

    def __call__(self, subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
        if subtype is not _NDARRAY or tuple(shape) != (0,):
            raise pickle.UnpicklingError("refused: not numpy's own array pickle")
        return np.ndarray((0,), dtype=dtype)


class _Frombuffer(_Standin):
    """numpy's protocol-5 array pickle: the bytes in the stream, viewed as ``shape``."""

    __slots__ = ()

    def __call__(self, buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
        if not isinstance(buf, bytes | bytearray | pickle.PickleBuffer):
            raise pickle.UnpicklingError("refused: not numpy's own array pickle")
        data = buf.raw() if isinstance(buf, pickle.PickleBuffer) else buf
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape, order=order)


class _Latin1(_Standin):
    """``_codecs.encode(text, 'latin1')``: how Python 3 writes bytes at protocol 2."""

    __slots__ = ()

    def __call__(self, text: Any, encoding: Any = "latin1") -> bytes:
        if not isinstance(text, str) or encoding != "latin1":
            raise pickle.UnpicklingError("refused: _codecs.encode other than text to latin1")
        return text.encode("latin-1")


_CIFAR_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _Reconstruct(),
    ("numpy._core.multiarray", "_reconstruct"): _Reconstruct(),
    ("numpy.core.numeric", "_frombuffer"): _Frombuffer(),
    ("numpy._core.numeric", "_frombuffer"): _Frombuffer(),
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): np.dtype,  # an immutable built-in type
    ("_codecs", "encode"): _Latin1(),
}


class CifarUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR batch and nothing else: unpickling calls whatever global a
    pickle names, so a tampered batch could run any code. Only the names numpy's array
    pickles use (protocols 2 to 5) resolve, each to a restricted stand-in that no
    opcode can modify (:data:`_CIFAR_GLOBALS`: nothing is imported, ``numpy.dtype`` is an
    immutable type); every other global is refused with
    :class:`pickle.UnpicklingError`. Persistent ids are refused by the base class."""

    def find_class(self, module: str, name: str) -> Any:
        found = _CIFAR_GLOBALS.get((module, name))
        if found is not None:
            return found
        raise pickle.UnpicklingError(
            f"refused: the pickle asks for {module}.{name}, which a CIFAR batch never needs"
        )


def load_cifar_batch(path: Path) -> dict[str, Any]:
    """A CIFAR batch's dict (keys as text), read by :class:`CifarUnpickler`."""
    size = path.stat().st_size
    if size > MAX_DECODED_BYTES:
        raise ImageReadError(f"{path.name}: {size} bytes, above the one-file limit")
    try:
        with path.open("rb") as fh:
            batch = CifarUnpickler(fh, encoding="bytes").load()
    except pickle.UnpicklingError as exc:
        raise ImageReadError(f"{path.name}: {exc}") from None
    except (OSError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise ImageReadError(f"{path.name}: not a CIFAR batch ({type(exc).__name__})") from None
    if not isinstance(batch, dict):
        raise ImageReadError(f"{path.name}: not a CIFAR batch (a {type(batch).__name__})")
    return {k.decode("latin-1") if isinstance(k, bytes) else str(k): v for k, v in batch.items()}


def _read_cifar(schema: ImageSchema, folder: Path) -> RawImages:
    source = schema.source
    assert isinstance(source, CifarSource)
    if not folder.is_dir():
        raise ImageReadError(f"{folder.name}: source.format cifar reads a folder of batches")
    parts: list[np.ndarray] = []
    labels: list[str] = []
    names: list[str] = []
    for file in source.batches:
        batch = load_cifar_batch(_existing(folder, file))
        data = batch.get("data")
        if not isinstance(data, np.ndarray) or data.ndim != 2 or data.dtype != np.uint8:
            raise ImageReadError(f"{file}: no 'data' array of uint8 rows")
        if data.shape[1] != schema.n_features:
            c, h, w = schema.shape
            raise ImageReadError(
                f"{file}: rows of {data.shape[1]} values, the schema declares "
                f"{c}×{h}×{w} = {schema.n_features}"
            )
        if source.label_key not in batch:
            raise ImageReadError(f"{file}: no {source.label_key!r} (source.label_key)")
        labels += _label_text(f"{file}[{source.label_key}]", batch[source.label_key], len(data))
        parts.append(data.reshape(len(data), *schema.shape))
        names += [f"{file}[{i}]" for i in range(len(data))]
    return RawImages(np.concatenate(parts), labels, names)


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


def read_npz_bytes(raw: bytes) -> dict[str, np.ndarray]:
    """Every array of an in-memory .npz (no pickles)."""
    with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
        return {key: np.asarray(npz[key]) for key in npz.files}
