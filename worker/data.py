"""Private data: registration (validation against the public schema) and loading.

Only the enclave runs this module. The private volume (`ENCLAVE_DATA_DIR`) holds one
folder per dataset with the validated rows (folders 0700, files 0600 whatever the umask:
``service.private_files``); the ledger holds only the public schema and the public row
count.

:data:`WORKER_KINDS` is the worker's table of data kinds (issue 23), the counterpart of
the service's ``service.datasets.kinds.DATA_KINDS`` (a contract test keeps both naming the
same kinds): how registration reads, validates and stores a kind's private rows, how a job
loads and encodes them, and what the model card says about that encoding.

A job's encoded arrays are kept beside the rows (``worker.encoded``, issue 26): built
when the dataset is registered (or by the first job that finds none), keyed by the rows
file's digest, the public schema and :data:`ENCODING_VERSION`, read back by later jobs.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import numpy as np
import pandas as pd
import torch

from service.datasets import tabular as _tabular_module
from service.datasets import timeseries as _timeseries_module
from service.datasets.images import ImageSchema, encode_pixels
from service.datasets.kinds import DEFAULT_KIND, DatasetSchema
from service.datasets.tabular import (
    TabularSchema,
    ValidationReport,
    encode,
    parse_schema,
    validate_frame,
)
from service.datasets.timeseries import (
    TimeSeriesReport,
    TimeSeriesSchema,
    ValidatedSeries,
    encode_series,
    validate_series,
    wide_to_long,
)
from service.private_files import make_private_dir, open_private_file
from worker.encoded import Arrays, cached_arrays
from worker.image_arrays import read_npz_bytes
from worker.image_types import ImageReadError, ValidatedImages
from worker.images import check_images
from worker.mechanisms.base import TabularTrainingSet

ROWS_FILE = "rows.csv.gz"
# A dataset's private evaluation holdout (issue 21), in the format of its kind's training
# files, read only by evaluation jobs (:func:`load_holdout`), never by a training loader:
# tabular rows, an image dataset's images and labels, a time series' stays.
HOLDOUT_FILE = "holdout.csv.gz"
HOLDOUT_IMAGES_FILE = "holdout.npz"
HOLDOUT_OBSERVATIONS_FILE = "holdout_observations.csv.gz"
HOLDOUT_OUTCOMES_FILE = "holdout_outcomes.csv.gz"
# A time-series dataset: its validated observations (long format) and outcomes.
OBSERVATIONS_FILE = "observations.csv.gz"
OUTCOMES_FILE = "outcomes.csv.gz"
# An image dataset: its kept images' raw pixels (n, C, H, W) and class indices (n).
IMAGES_FILE = "images.npz"
# Bump when what a loader returns for the same rows and schema changes (the encoding
# modules' source and the numpy/pandas versions are in the cache key as well).
ENCODING_VERSION = 1

log = logging.getLogger("enclave.worker.data")


def dataset_dir(data_dir: Path, name: str) -> Path:
    return data_dir / name


class CsvReadError(ValueError):
    """The file cannot be read with the schema's CSV options (one line for the admin)."""


@dataclass(frozen=True)
class Prepared:
    frame: pd.DataFrame
    report: ValidationReport


def _read_csv(path: Path, kwargs: dict[str, Any]) -> pd.DataFrame:
    """A raw file as text, or :class:`CsvReadError` with one line."""
    try:
        return pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, UnicodeError, OSError, EOFError, ValueError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CsvReadError(
            f"cannot read {path.name} with the schema's csv options: {first}"
        ) from None


def prepare_csv(schema: TabularSchema, csv_path: Path) -> Prepared:
    """Read a raw CSV as the schema's `csv` options describe it and apply the declared
    validation rules. Registration and `enclave datasets check` both call this, so the dry
    run reports exactly what registration would keep."""
    validated = validate_frame(schema, _read_csv(csv_path, schema.read_csv_kwargs()))
    return Prepared(validated.frame, validated.report)


@dataclass(frozen=True)
class PreparedSeries:
    validated: ValidatedSeries

    @property
    def report(self) -> TimeSeriesReport:
        return self.validated.report


PreparedAny: TypeAlias = Prepared | PreparedSeries | ValidatedImages
"""What a kind's ``prepare`` returns: the kept rows and their report (``.report``)."""


def _read_wide(schema: TimeSeriesSchema, folder: Path) -> dict[str, pd.DataFrame]:
    """``layout: wide``: every file in ``folder`` (hidden ones aside) is one stay, its id
    the file name up to the first dot (``icu-00001.csv.gz`` → ``icu-00001``)."""
    if not folder.is_dir():
        raise CsvReadError(f"{folder.name}: layout wide reads a folder of per-stay files")
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    stays = {p.name.split(".")[0]: p for p in files}
    if len(stays) != len(files):
        raise CsvReadError(f"{folder.name}: two files name the same stay")
    return {stay: _read_csv(path, schema.read_csv_kwargs()) for stay, path in stays.items()}


def prepare_series(
    schema: TimeSeriesSchema, csv_path: Path, outcomes_path: Path | None
) -> PreparedSeries:
    """:func:`prepare_csv` for a time-series dataset: the long-format observations file
    and the per-stay outcomes file (None: the outcomes are a column of the observations,
    ``outcome.source: observations``), read and validated by the schema."""
    if schema.layout == "wide":
        observations = wide_to_long(schema, _read_wide(schema, csv_path))
    else:
        observations = _read_csv(csv_path, schema.read_csv_kwargs())
    outcomes = None
    if outcomes_path is not None:
        outcomes = _read_csv(outcomes_path, schema.read_outcomes_kwargs())
    return PreparedSeries(validate_series(schema, observations, outcomes))


def _prepare_tabular(schema: DatasetSchema, csv_path: Path, outcomes_path: Path | None) -> Prepared:
    assert isinstance(schema, TabularSchema)
    if outcomes_path is not None:
        raise CsvReadError("an outcomes file is for time-series datasets only")
    return prepare_csv(schema, csv_path)


def _prepare_timeseries(
    schema: DatasetSchema, csv_path: Path, outcomes_path: Path | None
) -> PreparedSeries:
    assert isinstance(schema, TimeSeriesSchema)
    from_file = schema.outcome.source == "file"
    if from_file and outcomes_path is None:
        raise CsvReadError("a time-series dataset needs its outcomes file (--outcomes)")
    if not from_file and outcomes_path is not None:
        raise CsvReadError(
            "this schema reads the outcomes from the observations file "
            "(outcome.source: observations): leave out --outcomes"
        )
    return prepare_series(schema, csv_path, outcomes_path)


def _prepare_images(
    schema: DatasetSchema, path: Path, outcomes_path: Path | None
) -> ValidatedImages:
    """The images at ``path`` (a folder or a file, as ``source.format`` says), read and
    validated by the schema (worker/images.py)."""
    assert isinstance(schema, ImageSchema)
    if outcomes_path is not None:
        raise CsvReadError("an outcomes file is for time-series datasets only")
    try:
        return check_images(schema, path)
    except ImageReadError as exc:
        raise CsvReadError(str(exc)) from None


def _no_refusal(schema: DatasetSchema) -> str | None:
    return None


def prepare_dataset(
    schema: DatasetSchema, csv_path: Path, outcomes_path: Path | None = None
) -> PreparedAny:
    """The dry run and registration's first step, for any kind of schema (its
    :data:`WORKER_KINDS` entry's ``prepare``)."""
    return WORKER_KINDS[schema.kind].prepare(schema, csv_path, outcomes_path)


def _write_gzip_csv(path: Path, frame: pd.DataFrame) -> None:
    """Write ``frame`` gzip-compressed to a temporary file beside ``path``, created ``0600``
    whatever the umask (issue 26), flushed and fsynced, then renamed over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(open_private_file(tmp), "wb") as fh:
        frame.to_csv(fh, index=False, compression="gzip")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def store_prepared(data_dir: Path, schema: DatasetSchema, prepared: PreparedAny) -> Path:
    """Write the validated rows to the private volume (the dataset's folder), as the
    schema's :data:`WORKER_KINDS` entry stores them, then the encoded arrays a job will
    load (:func:`warm_encoded`)."""
    path = WORKER_KINDS[schema.kind].store(data_dir, schema, prepared)
    warm_encoded(data_dir, schema)
    return path


def warm_encoded(data_dir: Path, schema: DatasetSchema) -> None:
    """Build the stored rows' encoded cache (``worker.encoded``) the way a job loads them,
    so the first job reads it too. Never fails a registration: a dataset whose rows
    cannot be encoded is logged (the exception's type only) and its jobs report it."""
    try:
        WORKER_KINDS[schema.kind].load(
            data_dir,
            schema.model_dump(mode="json"),
            torch.device("cpu"),
            before_first_read=lambda: None,
        )
    except Exception as exc:
        log.warning(
            "dataset %s: could not build the encoded cache (%s)", schema.name, type(exc).__name__
        )


def _store_tabular(data_dir: Path, schema: DatasetSchema, prepared: PreparedAny) -> Path:
    assert isinstance(schema, TabularSchema) and isinstance(prepared, Prepared)
    return store_rows(data_dir, schema, prepared.frame)


def _write_series(target: Path, validated: ValidatedSeries, files: tuple[str, str]) -> Path:
    """Write a time series' (observations, outcomes) to ``files`` in ``target``; the
    observations' path."""
    observations, outcomes = files
    _write_gzip_csv(target / outcomes, validated.outcomes)
    _write_gzip_csv(target / observations, validated.observations)
    return target / observations


def _store_timeseries(data_dir: Path, schema: DatasetSchema, prepared: PreparedAny) -> Path:
    assert isinstance(prepared, PreparedSeries)
    target = make_private_dir(dataset_dir(data_dir, schema.name))
    return _write_series(target, prepared.validated, (OBSERVATIONS_FILE, OUTCOMES_FILE))


def _write_images(path: Path, images: ValidatedImages) -> Path:
    """The kept images' raw pixels and class indices as ``path`` (an .npz), written to a
    temporary file beside it (``0600``), flushed, fsynced and renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(open_private_file(tmp), "wb") as fh:
        np.savez(fh, pixels=images.pixels, y=images.y)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    return path


def _store_images(data_dir: Path, schema: DatasetSchema, prepared: PreparedAny) -> Path:
    assert isinstance(prepared, ValidatedImages)
    target = make_private_dir(dataset_dir(data_dir, schema.name))
    return _write_images(target / IMAGES_FILE, prepared)


def store_rows(data_dir: Path, schema: TabularSchema, frame: pd.DataFrame) -> Path:
    target = make_private_dir(dataset_dir(data_dir, schema.name))
    _write_gzip_csv(target / ROWS_FILE, frame)
    return target / ROWS_FILE


def split_holdout(
    schema: DatasetSchema, prepared: PreparedAny, *, holdout_rows: int, rng: np.random.Generator
) -> tuple[PreparedAny, PreparedAny]:
    """(training rows, holdout rows) of any kind: the kept rows (tabular rows, images,
    stays) in a uniformly random order drawn from ``rng`` (the enclave's secure generator;
    the permutation is not kept), the first ``holdout_rows`` of them the holdout, the rest
    the training rows in that order. Needs 1 ≤ holdout_rows < the rows kept. The kind's
    :class:`HoldoutKind` ``take`` selects rows; the report stays the whole dataset's."""
    kept = prepared.report.rows_kept
    if not (1 <= holdout_rows < kept):
        raise ValueError(f"holdout_rows must be in [1, {kept}), got {holdout_rows}")
    take = _holdout_kind(schema.kind).take
    order = rng.permutation(kept)
    training, holdout = order[holdout_rows:], order[:holdout_rows]
    return take(schema, prepared, training), take(schema, prepared, holdout)


def store_holdout(data_dir: Path, schema: DatasetSchema, holdout: PreparedAny) -> Path:
    """Write a dataset's holdout rows beside its training rows, in its kind's format
    (``0600``, as :func:`store_prepared` writes the training rows)."""
    target = make_private_dir(dataset_dir(data_dir, schema.name))
    return _holdout_kind(schema.kind).store(target, holdout)


def load_holdout(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    """A dataset's holdout, validated and encoded by the public schema exactly as its
    kind's training loader encodes the training rows (no encoded cache: it is small, and
    the cache beside the rows holds the training rows' arrays). ``before_first_read`` as
    for :func:`load_training_set`."""
    kind = public_schema.get("kind", DEFAULT_KIND)
    holdout = _holdout_kind(kind if isinstance(kind, str) else DEFAULT_KIND)
    return holdout.load(data_dir, public_schema, device, before_first_read=before_first_read)


def _take_tabular(schema: DatasetSchema, prepared: PreparedAny, rows: np.ndarray) -> Prepared:
    assert isinstance(prepared, Prepared)
    return Prepared(prepared.frame.iloc[rows].reset_index(drop=True), prepared.report)


def _store_tabular_holdout(target: Path, holdout: PreparedAny) -> Path:
    assert isinstance(holdout, Prepared)
    _write_gzip_csv(target / HOLDOUT_FILE, holdout.frame)
    return target / HOLDOUT_FILE


def _load_tabular_holdout(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    schema = parse_schema(public_schema)
    with (dataset_dir(data_dir, schema.name) / HOLDOUT_FILE).open("rb") as fh:
        before_first_read()
        raw = fh.read()
    table = encode(schema, validate_frame(schema, _read_stored(io.BytesIO(raw))).frame)
    x, y = torch.from_numpy(_float32(table.x)), torch.from_numpy(_float32(table.y))
    if not (math.isfinite(float(x.sum())) and (x.numel() == 0 or (x.min() >= 0 and x.max() <= 1))):
        raise ValueError("encoded features left [0, 1]")
    return TabularTrainingSet(x=x.to(device), y=y.to(device))


def _take_images(schema: DatasetSchema, prepared: PreparedAny, rows: np.ndarray) -> ValidatedImages:
    assert isinstance(prepared, ValidatedImages)
    names = [prepared.names[i] for i in rows.tolist()]
    return ValidatedImages(prepared.pixels[rows], prepared.y[rows], names, prepared.report)


def _store_images_holdout(target: Path, holdout: PreparedAny) -> Path:
    assert isinstance(holdout, ValidatedImages)
    return _write_images(target / HOLDOUT_IMAGES_FILE, holdout)


def _load_images_holdout(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    return _image_set(
        data_dir, public_schema, device, HOLDOUT_IMAGES_FILE, before_first_read=before_first_read
    )


def _take_series(schema: DatasetSchema, prepared: PreparedAny, rows: np.ndarray) -> PreparedSeries:
    """The stays at ``rows`` of the outcomes (one line per kept stay, each stay once) with
    all their observations: one row of the neighbouring relation is one stay."""
    assert isinstance(schema, TimeSeriesSchema) and isinstance(prepared, PreparedSeries)
    validated = prepared.validated
    outcomes = validated.outcomes.iloc[rows].reset_index(drop=True)
    stays = outcomes[schema.outcome.stay].astype(str)
    observations = validated.observations
    mine = observations[schema.columns.stay].astype(str).isin(stays).to_numpy(dtype=bool)
    part = ValidatedSeries(observations[mine].reset_index(drop=True), outcomes, prepared.report)
    return PreparedSeries(part)


def _store_series_holdout(target: Path, holdout: PreparedAny) -> Path:
    assert isinstance(holdout, PreparedSeries)
    files = (HOLDOUT_OBSERVATIONS_FILE, HOLDOUT_OUTCOMES_FILE)
    return _write_series(target, holdout.validated, files)


def _load_series_holdout(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    schema = TimeSeriesSchema.model_validate(public_schema)
    files = (HOLDOUT_OBSERVATIONS_FILE, HOLDOUT_OUTCOMES_FILE)
    raw_obs, raw_out = _read_series_files(data_dir, schema, files, before_first_read)
    arrays = _encode_series(schema, raw_obs, raw_out)
    return _series_set(schema, arrays, device)


def _read_stored(fh: Any) -> pd.DataFrame:
    return pd.read_csv(fh, compression="gzip", dtype=str, keep_default_na=False, na_values=[""])


@functools.cache
def _code_digest() -> str:
    """The encoding's version: :data:`ENCODING_VERSION`, the source of the modules that
    validate and encode (this one included) and the numpy and pandas versions."""
    h = hashlib.sha256(f"v{ENCODING_VERSION}|np {np.__version__}|pd {pd.__version__}".encode())
    for module in (_tabular_module, _timeseries_module, sys.modules[__name__]):
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()


def encoded_key(kind: str, schema_json: str, raw_files: list[bytes]) -> str:
    """The encoded cache's key: the kind, the parsed public schema (its JSON), the raw
    rows files' digests and :func:`_code_digest`."""
    fields = {
        "kind": kind,
        "schema": schema_json,
        "rows": [hashlib.sha256(raw).hexdigest() for raw in raw_files],
        "code": _code_digest(),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _float32(values: Any) -> np.ndarray:
    """As the loaders always converted (torch's float32 conversion, on the CPU)."""
    return torch.as_tensor(values, dtype=torch.float32).numpy()


def _on_device(arrays: Arrays, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(arrays["x"]).to(device), torch.from_numpy(arrays["y"]).to(device)


def load_training_set(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    """Load a registered dataset's validated rows and encode them by the public schema.

    ``before_first_read`` runs after the private file was opened and before its first byte
    is read: the runner marks the job as having touched data there, so a failure before
    (no such file, no permission) leaves a job whose charge can be refunded without an
    override, and nothing is read unless the mark succeeded (it raises otherwise).

    The schema's :data:`WORKER_KINDS` entry loads it; a kind no entry names goes to the
    tabular loader, whose schema validation reports the bad ``kind``.
    """
    kind = public_schema.get("kind", DEFAULT_KIND)
    entry = WORKER_KINDS.get(kind) if isinstance(kind, str) else None
    load = (entry or WORKER_KINDS[DEFAULT_KIND]).load
    return load(data_dir, public_schema, device, before_first_read=before_first_read)


def _load_tabular(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    """The encoded rows (n, d) of a registered tabular dataset, by its schema (from the
    encoded cache when its key matches)."""
    schema = parse_schema(public_schema)
    folder = dataset_dir(data_dir, schema.name)
    with (folder / ROWS_FILE).open("rb") as fh:
        before_first_read()
        raw = fh.read()

    def build() -> Arrays:
        table = encode(schema, validate_frame(schema, _read_stored(io.BytesIO(raw))).frame)
        return {"x": _float32(table.x), "y": _float32(table.y)}

    key = encoded_key("tabular", schema.model_dump_json(), [raw])
    x, y = _on_device(cached_arrays(folder, key, ("x", "y"), build), device)
    if not (math.isfinite(float(x.sum())) and x.min() >= 0 and x.max() <= 1):
        raise ValueError("encoded features left [0, 1]")
    return TabularTrainingSet(x=x, y=y, one_hot_blocks=schema.one_hot_blocks)


def _read_series_files(
    data_dir: Path,
    schema: TimeSeriesSchema,
    files: tuple[str, str],
    before_first_read: Callable[[], None],
) -> tuple[bytes, bytes]:
    """The raw (observations, outcomes) files ``files`` of a time-series dataset, both
    opened before ``before_first_read`` runs."""
    folder = dataset_dir(data_dir, schema.name)
    observations, outcomes = files
    with (folder / observations).open("rb") as obs, (folder / outcomes).open("rb") as out:
        before_first_read()
        return obs.read(), out.read()


def _encode_series(schema: TimeSeriesSchema, raw_obs: bytes, raw_out: bytes) -> Arrays:
    validated = validate_series(
        schema, _read_stored(io.BytesIO(raw_obs)), _read_stored(io.BytesIO(raw_out))
    )
    enc = encode_series(schema, validated)
    return {"x": _float32(enc.x), "y": _float32(enc.y)}


def _series_set(
    schema: TimeSeriesSchema, arrays: Arrays, device: torch.device
) -> TabularTrainingSet:
    """The encoded stays on ``device``, their ranges checked."""
    x, y = _on_device(arrays, device)
    values_masks = x[:, :2]
    deltas = x[:, 2]
    if not (
        math.isfinite(float(x.sum()))
        and (x.numel() == 0 or (values_masks.min() >= 0 and values_masks.max() <= 1))
        and (deltas.numel() == 0 or deltas.max() <= schema.grid.horizon_hours)
    ):
        raise ValueError("encoded series left their ranges")
    return TabularTrainingSet(x=x, y=y, public_means=schema.scaled_means)


def _load_series(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    """GRU-D's inputs (n, 3, T, V) for a registered time-series dataset, by its schema
    (from the encoded cache when its key matches)."""
    schema = TimeSeriesSchema.model_validate(public_schema)
    files = (OBSERVATIONS_FILE, OUTCOMES_FILE)
    raw_obs, raw_out = _read_series_files(data_dir, schema, files, before_first_read)
    key = encoded_key("timeseries", schema.model_dump_json(), [raw_obs, raw_out])
    folder = dataset_dir(data_dir, schema.name)
    arrays = cached_arrays(
        folder, key, ("x", "y"), lambda: _encode_series(schema, raw_obs, raw_out)
    )
    return _series_set(schema, arrays, device)


def _image_set(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    file: str,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    """The flattened encoded pixels (n, H·W·C) in [0, 1] of the images stored as ``file``
    in an image dataset's folder and their class indices as y in {0, …, K − 1} (two
    classes: y in {0, 1})."""
    schema = ImageSchema.model_validate(public_schema)
    with (dataset_dir(data_dir, schema.name) / file).open("rb") as fh:
        before_first_read()
        arrays = read_npz_bytes(fh.read())
    return image_training_set(schema, arrays["pixels"], arrays["y"], device)


def image_training_set(
    schema: ImageSchema, pixels: np.ndarray, y: np.ndarray, device: torch.device
) -> TabularTrainingSet:
    """Validated images (raw pixels (n, C, H, W), class indices y) as a training set: the
    flattened encoded pixels (n, H·W·C) in [0, 1] and y in {0, …, K − 1} as float32. A
    registered dataset's (:func:`_image_set`) and a bundled public one's
    (worker/audits.py's ``load_public``)."""
    x = encode_pixels(schema, pixels).reshape(len(pixels), schema.n_features)
    if len(y) != len(x) or not np.isin(y, np.arange(schema.n_classes)).all():
        raise ValueError("stored image labels left the declared classes")
    return TabularTrainingSet(
        x=torch.from_numpy(x).to(device), y=torch.from_numpy(y.astype(np.float32)).to(device)
    )


def _load_images(
    data_dir: Path,
    public_schema: dict,
    device: torch.device,
    *,
    before_first_read: Callable[[], None],
) -> TabularTrainingSet:
    """A registered image dataset's training images (:func:`_image_set` of
    :data:`IMAGES_FILE`)."""
    return _image_set(
        data_dir, public_schema, device, IMAGES_FILE, before_first_read=before_first_read
    )


class _Load(Protocol):
    def __call__(
        self,
        data_dir: Path,
        public_schema: dict,
        device: torch.device,
        *,
        before_first_read: Callable[[], None],
    ) -> TabularTrainingSet: ...


@dataclass(frozen=True)
class HoldoutKind:
    """How one kind keeps its private evaluation holdout (issue 21; :func:`split_holdout`
    draws the permutation and the sizes for every kind, by one rule)."""

    take: Callable[[DatasetSchema, PreparedAny, np.ndarray], PreparedAny]
    """The kept rows at these positions, in this order (one row of the neighbouring
    relation each: a tabular row, an image, a stay with all its observations)."""
    store: Callable[[Path, PreparedAny], Path]
    """Write holdout rows into the dataset's folder, beside (never into) the training
    files; the path written."""
    load: _Load
    """An evaluation's holdout: read the holdout file(s), encode them as ``load`` encodes
    the training rows."""


@dataclass(frozen=True)
class WorkerDataKind:
    """What the worker needs from one kind of dataset (an entry of :data:`WORKER_KINDS`)."""

    name: str
    """The schema's ``kind`` value, the entry's key (as in the service's DATA_KINDS)."""
    prepare: Callable[[DatasetSchema, Path, Path | None], PreparedAny]
    """Registration's and the dry run's first step: read the private file(s) (the
    optional second path is a time series' outcomes file) and validate them."""
    store: Callable[[Path, DatasetSchema, PreparedAny], Path]
    """Write the validated rows to the private volume; the path written."""
    load: _Load
    """A job's training set: read the stored rows and encode them by the public schema."""
    preprocessing: str
    """The model card's description of the (data-independent) encoding."""
    refusal: Callable[[DatasetSchema], str | None] = _no_refusal
    """Why registration refuses this schema for now (None: it does not); checked before
    any private file is read. ``enclave datasets check`` reads the files regardless."""
    holdout: HoldoutKind | None = None
    """How registration keeps an evaluation holdout of this kind (None: it refuses one)."""


WORKER_KINDS: dict[str, WorkerDataKind] = {
    "tabular": WorkerDataKind(
        name="tabular",
        prepare=_prepare_tabular,
        store=_store_tabular,
        load=_load_tabular,
        holdout=HoldoutKind(_take_tabular, _store_tabular_holdout, _load_tabular_holdout),
        preprocessing=(
            "Data-independent: numeric columns are clipped to the schema's declared "
            "[min, max] (after log1p where declared) and scaled to [0, 1]; categorical "
            "columns are one-hot over the declared levels; the target is 1 for the "
            "declared positive values."
        ),
    ),
    "timeseries": WorkerDataKind(
        name="timeseries",
        prepare=_prepare_timeseries,
        store=_store_timeseries,
        load=_load_series,
        holdout=HoldoutKind(_take_series, _store_series_holdout, _load_series_holdout),
        preprocessing=(
            "Data-independent: each stay's observations are binned on the schema's time grid "
            "(the latest observation in a step wins), values clipped to the variable's declared "
            "[min, max] and scaled to [0, 1]; GRU-D's inputs are (values, masks, hours since "
            "the last observation) of shape (3, T, V), and its imputation means are the "
            "schema's public means (service/datasets/timeseries.py); the outcome is 1 for the "
            "declared positive values. One row of the neighbouring relation is one stay (all "
            "its observations and its outcome)."
        ),
    ),
    "images": WorkerDataKind(
        name="images",
        prepare=_prepare_images,
        store=_store_images,
        load=_load_images,
        holdout=HoldoutKind(_take_images, _store_images_holdout, _load_images_holdout),
        preprocessing=(
            "Data-independent: each image's pixels are clipped to the schema's declared "
            "[min, max] and scaled to [0, 1] (service/datasets/images.py encode_pixels), "
            "then flattened channel-major to H·W·C features; the target is the class's "
            "index in the schema's classes (two classes: 0 and 1). One row of the "
            "neighbouring relation is one image."
        ),
    ),
}
"""The worker's data kinds by name; the service's are ``service.datasets.kinds.DATA_KINDS``."""


def _holdout_kind(kind: str) -> HoldoutKind:
    """The :class:`HoldoutKind` of a kind (ValueError: the kind keeps no holdout)."""
    entry = WORKER_KINDS.get(kind)
    if entry is None or entry.holdout is None:
        raise ValueError(f"{kind} datasets keep no evaluation holdout")
    return entry.holdout


def holdout_refusal(kind: str) -> str | None:
    """Why registration cannot keep a holdout for this kind (None: it can)."""
    entry = WORKER_KINDS.get(kind)
    if entry is None or entry.holdout is None:
        return f"{kind} datasets cannot keep an evaluation holdout yet"
    return None
