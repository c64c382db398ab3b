"""Private evaluation (issue 21), first part: a holdout reserved at registration, which
no training load reads. Runs on SQLite and PostgreSQL (the ``settings`` fixture)."""

from __future__ import annotations

import gzip
import io
import stat
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from sqlalchemy import select

from service.datasets.tabular import parse_schema
from service.db import engine_for, transaction
from service.ledger.tables import Dataset
from tests.conftest import SMALL_SCHEMA, Keys, write_toy_csv
from worker.data import HOLDOUT_FILE, ROWS_FILE, dataset_dir, load_holdout, load_training_set
from worker.registration import RegistrationError, register_dataset

HELD = "held"


def _register_held(settings: Any, *, n: int = 600, fraction: float = 0.25) -> Any:
    engine = engine_for(settings.resolved_database_url)
    csv = write_toy_csv(settings.home / "held.csv", n=n, seed=3)
    return register_dataset(
        engine,
        settings,
        schema=parse_schema({**SMALL_SCHEMA, "name": HELD}),
        csv_path=csv,
        epsilon_total=10.0,
        delta_total=1e-5,
        holdout_fraction=fraction,
    )


@pytest.fixture
def held(settings: Any, keys: Keys) -> Any:
    """The toy dataset (no holdout, from ``keys``) and ``held``, the same kind of rows with
    a quarter kept as the holdout."""
    return _register_held(settings)


def _rows(path: Path) -> pd.DataFrame:
    with gzip.open(path, "rb") as fh:
        return pd.read_csv(io.BytesIO(fh.read()), dtype=str)


def test_registration_keeps_a_holdout_no_training_load_reads(settings: Any, held: Any) -> None:
    engine = engine_for(settings.resolved_database_url)
    kept = held.report.rows_kept
    n_h = held.holdout_rows
    assert n_h is not None and n_h >= 1
    # n_h = floor(0.25 n̂) of the noisy count n̂ = n_rows + n_h; n_rows counts training rows.
    assert n_h == int(0.25 * (held.noisy_n_rows + n_h))
    with transaction(engine) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == HELD)).one()
        assert (ds.n_rows, ds.holdout_rows) == (held.noisy_n_rows, n_h)
        public_schema = ds.public_schema
    folder = dataset_dir(settings.resolved_data_dir, HELD)
    holdout_path, rows_path = folder / HOLDOUT_FILE, folder / ROWS_FILE
    assert stat.S_IMODE(holdout_path.stat().st_mode) == 0o600
    holdout, training = _rows(holdout_path), _rows(rows_path)
    assert len(holdout) == n_h and len(training) == kept - n_h
    key = ["a", "b", "c", "label"]
    held_rows = set(map(tuple, holdout[key].to_numpy()))
    train_rows = set(map(tuple, training[key].to_numpy()))
    assert not held_rows & train_rows  # continuous features: rows are distinct
    # What a training job loads is exactly the training file, none of the holdout.
    loaded = load_training_set(
        settings.resolved_data_dir,
        public_schema,
        torch.device("cpu"),
        before_first_read=lambda: None,
    )
    evaluation = load_holdout(
        settings.resolved_data_dir,
        public_schema,
        torch.device("cpu"),
        before_first_read=lambda: None,
    )
    assert loaded.n == kept - n_h and evaluation.n == n_h
    train_x = {tuple(r) for r in loaded.x.numpy().round(6).tolist()}
    held_x = {tuple(r) for r in evaluation.x.numpy().round(6).tolist()}
    assert not train_x & held_x


def test_holdout_refusals_at_registration(settings: Any, keys: Keys) -> None:
    engine = engine_for(settings.resolved_database_url)
    csv = write_toy_csv(settings.home / "r.csv", n=50, seed=1)
    schema = parse_schema({**SMALL_SCHEMA, "name": "r"})
    common = {"csv_path": csv, "epsilon_total": 10.0, "delta_total": 1e-5}
    for bad in (0.0, 0.6, float("nan")):
        with pytest.raises(RegistrationError, match="fraction must be in"):
            register_dataset(engine, settings, schema=schema, holdout_fraction=bad, **common)
    images = schema.model_copy(update={"kind": "images"})
    with pytest.raises(RegistrationError, match="tabular datasets only"):
        register_dataset(engine, settings, schema=images, holdout_fraction=0.2, **common)
    # floor(0.01 × ~50) = 0 rows: refused (to the admin), nothing registered.
    with pytest.raises(RegistrationError, match="at least one"):
        register_dataset(engine, settings, schema=schema, holdout_fraction=0.01, **common)
    with transaction(engine) as s:
        assert s.scalars(select(Dataset).where(Dataset.name == "r")).first() is None
        toy = s.scalars(select(Dataset).where(Dataset.name == "toy")).one()
        assert toy.holdout_rows is None


def test_migration_0008_adds_and_drops_holdout_rows(settings: Any, held: Any) -> None:
    from sqlalchemy import inspect

    from service.migrate import downgrade, upgrade

    url = settings.resolved_database_url

    def columns() -> set[str]:
        engine_for.cache_clear()
        return {c["name"] for c in inspect(engine_for(url)).get_columns("datasets")}

    assert "holdout_rows" in columns()
    engine_for.cache_clear()
    downgrade(url, "0007")
    assert "holdout_rows" not in columns()
    engine_for.cache_clear()
    upgrade(url)
    assert "holdout_rows" in columns()
    with transaction(engine_for(url)) as s:
        assert {d.name: d.holdout_rows for d in s.scalars(select(Dataset))} == {
            "toy": None,
            HELD: None,  # not recorded before 0008: an old ledger has no holdout
        }
    engine_for.cache_clear()
