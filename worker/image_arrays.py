"""Array-file sources of image datasets: NumPy ``.npz`` (read without pickles), MNIST's
IDX files (optionally gzipped) and CIFAR-10's Python batches, which are pickles and go
through :class:`CifarUnpickler` (it resolves only the numpy names a batch needs, each to a
stand-in that cannot allocate beyond the stream). Each reader returns
:class:`~worker.image_types.RawImages`; worker/images.py dispatches to them by the
schema's ``source.format`` (issue 20; split from worker/images.py to keep each module to
one idea: the untrusted binary formats here, image files and validation there).
"""

from __future__ import annotations

import gzip
import io
import math
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from service.datasets.images import (
    CifarSource,
    IdxSource,
    ImageSchema,
    NpzSource,
)
from worker.image_types import (
    MAX_DECODED_BYTES,
    ImageReadError,
    RawImages,
)

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


def read_npz_bytes(raw: bytes) -> dict[str, np.ndarray]:
    """Every array of an in-memory .npz (no pickles)."""
    with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
        return {key: np.asarray(npz[key]) for key in npz.files}
