"""A dataset's public schema of any kind, chosen by its ``kind``: ``tabular``
(service/datasets/tabular.py) or ``timeseries`` (service/datasets/timeseries.py, which
builds on the tabular module's pieces). Its own module so that the tabular module need not
import the time-series one (issue 23: the two used to import each other; now only
timeseries imports tabular)."""

from __future__ import annotations

from typing import Any, TypeAlias

import yaml
from pydantic import ValidationError

from service.datasets.tabular import SchemaError, TabularSchema, _one_line, parse_schema
from service.datasets.timeseries import TimeSeriesSchema

__all__ = ["DatasetSchema", "load_schema_yaml", "parse_dataset_schema"]

DatasetSchema: TypeAlias = TabularSchema | TimeSeriesSchema
"""A public schema of any kind."""


def parse_dataset_schema(data: dict[str, Any]) -> DatasetSchema:
    """A public schema of any kind, chosen by its ``kind`` (``tabular`` when absent)."""
    if data.get("kind") == "timeseries":
        return TimeSeriesSchema.model_validate(data)
    return parse_schema(data)


def load_schema_yaml(text: str) -> DatasetSchema:
    """Parse a schema document; every problem is a :class:`SchemaError` with one line."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise SchemaError(f"the schema is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SchemaError(
            "a schema must be a YAML mapping (tabular: name, csv, target, columns; "
            "timeseries: name, kind, grid, outcome, variables)"
        )
    try:
        return parse_dataset_schema(data)
    except ValidationError as exc:
        raise SchemaError(_one_line(exc, data)) from None
