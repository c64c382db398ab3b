"""Dataset registration by the admin, inside the enclave (it reads the private CSV)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, select

from service.config import Settings
from service.dataschema import TabularSchema, ValidationReport
from service.db import transaction
from service.ledger.admission import new_dataset
from service.ledger.tables import Dataset
from worker.data import prepare_csv, store_rows


class RegistrationError(ValueError):
    pass


@dataclass(frozen=True)
class Registered:
    name: str
    n_rows: int
    report: ValidationReport
    path: Path


def register_dataset(
    engine: Engine,
    settings: Settings,
    *,
    schema: TabularSchema,
    csv_path: Path,
    epsilon_total: float,
    delta_total: float,
    allow_nominal: bool = False,
) -> Registered:
    """Validate the rows against the public schema, store them on the private volume and
    create the dataset's budget in the ledger. The admin is told how many rows were
    rejected or clipped (inside the enclave only)."""
    with transaction(engine) as s:
        if s.scalars(select(Dataset).where(Dataset.name == schema.name)).first():
            raise RegistrationError(f"a dataset named {schema.name!r} is already registered")
    prepared = prepare_csv(schema, csv_path)
    if prepared.report.rows_kept == 0:
        raise RegistrationError("no row passed validation")
    path = store_rows(settings.resolved_data_dir, schema, prepared.frame)
    with transaction(engine) as s:
        new_dataset(
            s,
            name=schema.name,
            public_schema=schema.model_dump(mode="json"),
            n_rows=prepared.report.rows_kept,
            epsilon_total=epsilon_total,
            delta_total=delta_total,
            allow_nominal=allow_nominal,
        )
    return Registered(schema.name, prepared.report.rows_kept, prepared.report, path)
