"""The encoded data cache beside a dataset's rows (issue 26, worker/encoded.py): a cached
load gives the uncached load's arrays bit for bit; changed rows, a changed schema or a
new encoding version invalidate it; a damaged file is detected and rebuilt, never used;
its files are 0600 whatever the umask; nothing is read before ``before_first_read``."""

from __future__ import annotations

import io
import logging
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import worker.data as data
from service.datasets.kinds import load_schema_yaml
from service.datasets.tabular import encode, parse_schema, validate_frame
from service.datasets.timeseries import TimeSeriesSchema, encode_series, validate_series
from tests.conftest import SMALL_SCHEMA, write_toy_csv
from tests.integration.test_timeseries import write_tiny_series
from worker.data import (
    OBSERVATIONS_FILE,
    OUTCOMES_FILE,
    ROWS_FILE,
    _read_stored,
    dataset_dir,
    load_training_set,
    prepare_dataset,
    store_prepared,
    store_rows,
)
from worker.encoded import ENCODED_FILE, LOCK_FILE, arrays_digest, read_encoded
from worker.mechanisms.base import TabularTrainingSet

CPU = torch.device("cpu")


@pytest.fixture(params=[0o022, 0o000], ids=lambda m: f"umask{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _registered(tmp_path: Path, schema: dict = SMALL_SCHEMA, seed: int = 0) -> Path:
    parsed = parse_schema(schema)
    csv = write_toy_csv(tmp_path / f"toy{seed}.csv", n=300, seed=seed)
    data_dir = tmp_path / "data"
    store_prepared(data_dir, parsed, prepare_dataset(parsed, csv))
    return data_dir


def _load(data_dir: Path, schema: dict = SMALL_SCHEMA) -> TabularTrainingSet:
    return load_training_set(data_dir, schema, CPU, before_first_read=lambda: None)


def _reference(data_dir: Path, schema: dict = SMALL_SCHEMA) -> tuple[torch.Tensor, torch.Tensor]:
    """The loader before the cache: read, validate, encode, float32."""
    parsed = parse_schema(schema)
    with (dataset_dir(data_dir, parsed.name) / ROWS_FILE).open("rb") as fh:
        table = encode(parsed, validate_frame(parsed, _read_stored(fh)).frame)
    return (
        torch.as_tensor(table.x, dtype=torch.float32),
        torch.as_tensor(table.y, dtype=torch.float32),
    )


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()


def _cache(data_dir: Path, name: str = "toy") -> Path:
    return dataset_dir(data_dir, name) / ENCODED_FILE


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_registration_writes_the_cache_and_cached_loads_equal_uncached_ones(
    tmp_path: Path,
) -> None:
    data_dir = _registered(tmp_path)
    cache = _cache(data_dir)
    assert cache.is_file()
    ref_x, ref_y = _reference(data_dir)
    cached = _load(data_dir)  # from the file registration wrote
    assert _same_bits(cached.x, ref_x) and _same_bits(cached.y, ref_y)
    cache.unlink()
    rebuilt = _load(data_dir)  # encodes, writes the cache again
    assert cache.is_file()
    assert _same_bits(rebuilt.x, ref_x) and _same_bits(rebuilt.y, ref_y)
    again = _load(data_dir)
    assert _same_bits(again.x, ref_x) and _same_bits(again.y, ref_y)


def test_time_series_cached_loads_equal_uncached_ones(tmp_path: Path) -> None:
    obs, outcomes, schema_path = write_tiny_series(tmp_path, stays=20)
    schema = load_schema_yaml(schema_path.read_text())
    assert isinstance(schema, TimeSeriesSchema)
    data_dir = tmp_path / "data"
    store_prepared(data_dir, schema, prepare_dataset(schema, obs, outcomes))
    folder = dataset_dir(data_dir, schema.name)
    with (folder / OBSERVATIONS_FILE).open("rb") as o, (folder / OUTCOMES_FILE).open("rb") as y:
        enc = encode_series(schema, validate_series(schema, _read_stored(o), _read_stored(y)))
    ref_x = torch.as_tensor(enc.x, dtype=torch.float32)
    ref_y = torch.as_tensor(enc.y, dtype=torch.float32)
    public = schema.model_dump(mode="json")
    assert (folder / ENCODED_FILE).is_file()
    for _ in range(2):  # from registration's cache, then from a rebuilt one
        got = load_training_set(data_dir, public, CPU, before_first_read=lambda: None)
        assert _same_bits(got.x, ref_x) and _same_bits(got.y, ref_y)
        assert got.public_means == schema.scaled_means
        (folder / ENCODED_FILE).unlink()


def test_a_changed_schema_invalidates_the_cache(tmp_path: Path) -> None:
    data_dir = _registered(tmp_path)
    before = _load(data_dir)
    wider = {
        **SMALL_SCHEMA,
        "columns": [
            {**SMALL_SCHEMA["columns"][0], "max": 20},
            *SMALL_SCHEMA["columns"][1:],
        ],
    }
    after = _load(data_dir, wider)
    ref_x, ref_y = _reference(data_dir, wider)
    assert _same_bits(after.x, ref_x) and _same_bits(after.y, ref_y)
    assert not torch.equal(after.x, before.x)  # column a is scaled by 20 now, not 10
    # The file now holds the new schema's arrays; the old schema rebuilds them again.
    assert _same_bits(_load(data_dir).x, before.x)


def test_changed_rows_invalidate_the_cache(tmp_path: Path) -> None:
    data_dir = _registered(tmp_path)
    before = _load(data_dir)
    parsed = parse_schema(SMALL_SCHEMA)
    other = prepare_dataset(parsed, write_toy_csv(tmp_path / "other.csv", n=300, seed=7))
    store_rows(data_dir, parsed, other.frame)  # new rows, the old cache left in place
    after = _load(data_dir)
    ref_x, ref_y = _reference(data_dir)
    assert _same_bits(after.x, ref_x) and _same_bits(after.y, ref_y)
    assert not torch.equal(after.x, before.x)


def test_a_new_encoding_version_invalidates_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = _registered(tmp_path)
    cache = _cache(data_dir)
    schema = parse_schema(SMALL_SCHEMA)
    raw = (dataset_dir(data_dir, "toy") / ROWS_FILE).read_bytes()
    old_key = data.encoded_key("tabular", schema.model_dump_json(), [raw])
    assert read_encoded(cache.parent, old_key, ("x", "y"))[1] == "ok"
    monkeypatch.setattr(data, "ENCODING_VERSION", data.ENCODING_VERSION + 1)
    data._code_digest.cache_clear()
    try:
        new_key = data.encoded_key("tabular", schema.model_dump_json(), [raw])
        assert new_key != old_key
        assert read_encoded(cache.parent, new_key, ("x", "y"))[1] == "stale"
        _load(data_dir)
        assert read_encoded(cache.parent, new_key, ("x", "y"))[1] == "ok"
    finally:
        data._code_digest.cache_clear()


def _flip_byte(path: Path, at: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[at] ^= 0xFF
    path.write_bytes(bytes(blob))


def _forged(path: Path) -> None:
    """A well-formed file (valid zip, CRCs and headers) whose x was changed without its
    digest: only the digest check catches it."""
    with np.load(path, allow_pickle=False) as npz:
        members = {name: npz[name] for name in npz.files}
    members["x"] = members["x"].copy()
    members["x"].flat[0] = 0.5 if members["x"].flat[0] != 0.5 else 0.25
    buf = io.BytesIO()
    np.savez(buf, **members)
    path.write_bytes(buf.getvalue())


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: _flip_byte(p, p.stat().st_size // 2), id="flipped-byte"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), id="cut"),
        pytest.param(lambda p: p.write_bytes(b""), id="empty"),
        pytest.param(_forged, id="digest-mismatch"),
    ],
)
def test_a_damaged_cache_is_detected_and_rebuilt_never_used(
    tmp_path: Path, damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = _registered(tmp_path)
    cache = _cache(data_dir)
    ref_x, ref_y = _reference(data_dir)
    assert callable(damage)
    damage(cache)
    with caplog.at_level(logging.WARNING, logger="enclave.worker.data"):
        got = _load(data_dir)
    assert _same_bits(got.x, ref_x) and _same_bits(got.y, ref_y)
    assert any("damaged" in r.getMessage() for r in caplog.records)
    with zipfile.ZipFile(cache) as zf:  # rewritten whole
        assert zf.testzip() is None
    with np.load(cache, allow_pickle=False) as npz:
        assert str(npz["digest"][()]) == arrays_digest(
            str(npz["key"][()]), {"x": npz["x"], "y": npz["y"]}
        )


def test_the_cache_files_are_owner_only_whatever_the_umask(umask: int, tmp_path: Path) -> None:
    data_dir = _registered(tmp_path)
    folder = dataset_dir(data_dir, "toy")
    (folder / ".encoded-left-by-a-dead-worker.tmp").write_bytes(b"partial")
    _cache(data_dir).unlink()
    _load(data_dir)  # rebuilt under the lock, leftovers removed
    assert sorted(p.name for p in folder.iterdir()) == sorted([ENCODED_FILE, LOCK_FILE, ROWS_FILE])
    assert _mode(folder) == 0o700
    for name in (ENCODED_FILE, LOCK_FILE, ROWS_FILE):
        assert _mode(folder / name) == 0o600, name


def test_nothing_is_read_or_built_before_the_mark(tmp_path: Path) -> None:
    data_dir = _registered(tmp_path)
    _cache(data_dir).unlink()

    def refuse() -> None:
        raise RuntimeError("the job could not be marked")

    with pytest.raises(RuntimeError):
        load_training_set(data_dir, SMALL_SCHEMA, CPU, before_first_read=refuse)
    assert not _cache(data_dir).exists()


def test_a_cache_that_cannot_be_written_does_not_fail_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import worker.encoded as encoded

    data_dir = _registered(tmp_path)
    _cache(data_dir).unlink()

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(encoded, "write_encoded", full)
    with caplog.at_level(logging.WARNING, logger="enclave.worker.data"):
        got = _load(data_dir)
    ref_x, _ = _reference(data_dir)
    assert _same_bits(got.x, ref_x)
    assert not _cache(data_dir).exists()
    assert any("could not write" in r.getMessage() for r in caplog.records)
