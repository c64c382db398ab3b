"""Private data: registration (validation against the public schema) and loading.

Only the enclave runs this module. The private volume (`ENCLAVE_DATA_DIR`) holds one
folder per dataset with the validated rows; the ledger holds only the public schema and
the public row count.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from service.dataschema import TabularSchema, ValidationReport, encode, parse_schema, validate_frame
from worker.mechanisms.base import TabularTrainingSet

ROWS_FILE = "rows.csv.gz"


def dataset_dir(data_dir: Path, name: str) -> Path:
    return data_dir / name


class CsvReadError(ValueError):
    """The file cannot be read with the schema's CSV options (one line for the admin)."""


@dataclass(frozen=True)
class Prepared:
    frame: pd.DataFrame
    report: ValidationReport


def prepare_csv(schema: TabularSchema, csv_path: Path) -> Prepared:
    """Read a raw CSV as the schema's `csv` options describe it and apply the declared
    validation rules. Registration and `enclave datasets check` both call this, so the dry
    run reports exactly what registration would keep."""
    try:
        raw = pd.read_csv(csv_path, **schema.read_csv_kwargs())
    except (pd.errors.ParserError, UnicodeError, OSError, EOFError, ValueError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CsvReadError(
            f"cannot read {csv_path.name} with the schema's csv options: {first}"
        ) from None
    validated = validate_frame(schema, raw)
    return Prepared(validated.frame, validated.report)


def store_rows(data_dir: Path, schema: TabularSchema, frame: pd.DataFrame) -> Path:
    target = dataset_dir(data_dir, schema.name)
    target.mkdir(parents=True, exist_ok=True)
    path = target / ROWS_FILE
    tmp = target / (ROWS_FILE + ".tmp")
    frame.to_csv(tmp, index=False, compression="gzip")
    tmp.replace(path)
    return path


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
    """
    schema = parse_schema(public_schema)
    with (dataset_dir(data_dir, schema.name) / ROWS_FILE).open("rb") as fh:
        before_first_read()
        raw = pd.read_csv(
            fh,
            compression="gzip",
            dtype=str,
            keep_default_na=False,
            na_values=[""],
        )
    table = encode(schema, validate_frame(schema, raw).frame)
    x = torch.as_tensor(table.x, dtype=torch.float32, device=device)
    y = torch.as_tensor(table.y, dtype=torch.float32, device=device)
    if not (math.isfinite(float(x.sum())) and x.min() >= 0 and x.max() <= 1):
        raise ValueError("encoded features left [0, 1]")
    return TabularTrainingSet(x=x, y=y)
