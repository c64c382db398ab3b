"""A registered dataset's encoded training arrays, kept beside its rows (issue 26).

Reading and encoding the validated rows is most of a small job's cost (0.4 s for Adult,
more than its DP-SGD training), and it gives the same arrays for every job on the same
rows, schema and code. So the worker keeps them, once encoded, in the dataset's own
folder of the private data volume, :data:`ENCODED_FILE` (a numpy ``.npz``, never
compressed), and a job reads them back when their key matches.

- **Key** (:func:`worker.data` computes it): a SHA-256 over the digest of the raw rows
  file(s), the public schema (as parsed) and the encoding's version (a constant, the
  encoding modules' source and the numpy/pandas versions). Changed rows, a changed schema
  or a code change of the encoding give another key: the file is stale and is rebuilt.
- **Integrity**: the file also holds a SHA-256 over the key and every array's name,
  dtype, shape and bytes; a file that cannot be read, lacks an array or fails the digest
  is never used: it is rebuilt from the rows (one warning, without its contents).
- **Writes**: only under an exclusive ``flock`` on :data:`LOCK_FILE` in the same folder
  (a second worker waits, then finds the first one's file), to a temporary file beside
  it (``mkstemp``, ``0600``, fchmod-ed as ``service.private_files`` asks), flushed,
  fsynced and renamed over the old one, so a reader sees the old file or the new one,
  never half of one. Readers take no lock. A write that fails (a full or read-only
  volume) is logged and the job goes on with the arrays it just encoded.
- **Where**: nowhere but the dataset's folder, which only the worker reads; the
  arrays, the key (derived from the rows' digest) and the file's digest are never logged,
  returned by the API or written elsewhere. The folder goes with the dataset.

Timing: a job that finds no valid cache (the first one after registration if registration
could not write it, after a code change of the encoding, or after the file was damaged)
reads and encodes the rows and is slower than the jobs after it. Whether the cache is
there depends only on the order of jobs and registrations, the code version and the
state of the disk, never on the values of the private rows; the encoding's own duration
grows with the number of rows, as it did before the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from service.private_files import PRIVATE_FILE_MODE, open_private_file

ENCODED_FILE = "encoded.npz"
LOCK_FILE = ".encoded.lock"
TMP_PREFIX = ".encoded-"
TMP_SUFFIX = ".tmp"
# Names the file holds besides the arrays.
_KEY = "key"
_DIGEST = "digest"

log = logging.getLogger("enclave.worker.data")

Arrays = dict[str, np.ndarray]


def arrays_digest(key: str, arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over ``key`` and each array's name, dtype, shape and bytes (by name)."""
    h = hashlib.sha256(key.encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"|{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def read_encoded(folder: Path, key: str, names: tuple[str, ...]) -> tuple[Arrays | None, str]:
    """The arrays ``names`` of ``folder``'s cache when it holds ``key`` and passes its
    digest; else None and why (``missing``, ``stale``, or ``damaged``: unreadable, the
    wrong arrays, or a digest that does not match)."""
    path = folder / ENCODED_FILE
    try:
        with np.load(path, allow_pickle=False) as npz:
            if set(npz.files) != {*names, _KEY, _DIGEST}:
                return None, "damaged"
            if str(npz[_KEY][()]) != key:
                return None, "stale"
            arrays = {name: npz[name] for name in names}
            digest = str(npz[_DIGEST][()])
    except FileNotFoundError:
        return None, "missing"
    except Exception:  # a truncated or overwritten file: zip, CRC, header or dtype errors
        return None, "damaged"
    if arrays_digest(key, arrays) != digest:
        return None, "damaged"
    return arrays, "ok"


def write_encoded(folder: Path, key: str, arrays: Mapping[str, np.ndarray]) -> Path:
    """Write ``arrays`` with ``key`` and their digest to a temporary ``0600`` file in
    ``folder``, fsync it and rename it over :data:`ENCODED_FILE` (atomic)."""
    if {_KEY, _DIGEST} & set(arrays):
        raise ValueError("'key' and 'digest' are the cache's own names")
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX, suffix=TMP_SUFFIX)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            payload: dict[str, Any] = {
                _KEY: np.array(key),
                _DIGEST: np.array(arrays_digest(key, arrays)),
                **arrays,
            }
            np.savez(fh, **payload)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(folder / ENCODED_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return folder / ENCODED_FILE


@contextmanager
def _build_lock(folder: Path) -> Iterator[bool]:
    """Hold the folder's build lock; yields False (no lock, nothing to be written) when
    the lock file cannot be opened (a read-only volume)."""
    try:
        fd = open_private_file(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        log.warning(
            "dataset %s: cannot lock the encoded cache (%s); this job encodes without it",
            folder.name,
            exc.strerror or type(exc).__name__,
        )
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # releases the lock


def _remove_stale_temps(folder: Path) -> None:
    """Temporary files left by a writer that died (called under the lock: no live
    writer has one)."""
    for path in folder.glob(f"{TMP_PREFIX}*{TMP_SUFFIX}"):
        path.unlink(missing_ok=True)


def _built(build: Callable[[], Arrays], names: tuple[str, ...]) -> Arrays:
    arrays = build()
    if set(arrays) != set(names):
        raise ValueError(f"the encoding gave {sorted(arrays)}, not {sorted(names)}")
    return arrays


def cached_arrays(
    folder: Path, key: str, names: tuple[str, ...], build: Callable[[], Arrays]
) -> Arrays:
    """The cached arrays of ``folder`` for ``key``, or ``build()``'s, written to the
    cache for the next job (see the module docstring)."""
    arrays, why = read_encoded(folder, key, names)
    if arrays is not None:
        return arrays
    if why == "damaged":
        log.warning("dataset %s: the encoded cache is damaged; rebuilding it", folder.name)
    with _build_lock(folder) as locked:
        if not locked:
            return _built(build, names)
        arrays, _ = read_encoded(folder, key, names)  # another worker may have built it
        if arrays is not None:
            return arrays
        _remove_stale_temps(folder)
        arrays = _built(build, names)
        try:
            write_encoded(folder, key, arrays)
        except OSError as exc:
            log.warning(
                "dataset %s: could not write the encoded cache (%s); this job encodes without it",
                folder.name,
                exc.strerror or type(exc).__name__,
            )
        return arrays


__all__ = [
    "ENCODED_FILE",
    "LOCK_FILE",
    "arrays_digest",
    "cached_arrays",
    "read_encoded",
    "write_encoded",
]
