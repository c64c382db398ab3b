"""A dataset's public schema of any kind, chosen by its ``kind``: ``tabular``
(service/datasets/tabular.py), ``timeseries`` (service/datasets/timeseries.py, which
builds on the tabular module's pieces) or ``images`` (service/datasets/images.py).
Its own module so that the tabular module need not import the time-series one (issue
23: the two used to import each other; now only timeseries imports tabular).

:data:`DATA_KINDS` is the service's one table of data kinds (issue 23): everything the
service needs from a kind (parse its public schema, its encoded width, the models that
fit it, its row-norm bound, the admin's dry-run line) is an entry's field, and the
places that used to branch on ``kind == "timeseries"`` look the kind up here. The
worker's side (loading and encoding private rows) is ``worker.data.WORKER_KINDS``; a
contract test keeps the two tables naming the same kinds. A new kind is one entry here,
one there (and its schema class in :data:`DatasetSchema`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import yaml
from pydantic import ValidationError

from service.datasets.images import ImageSchema
from service.datasets.tabular import (
    SchemaError,
    TabularSchema,
    _one_line,
    parse_schema,
    row_norm_sq_bound,
)
from service.datasets.timeseries import TimeSeriesSchema
from service.modelspec import GrudSpec, LogisticSpec, ModelSpec

__all__ = [
    "DATA_KINDS",
    "DEFAULT_KIND",
    "DataKind",
    "DatasetSchema",
    "load_schema_yaml",
    "parse_dataset_schema",
]

DatasetSchema: TypeAlias = TabularSchema | TimeSeriesSchema | ImageSchema
"""A public schema of any kind."""


@dataclass(frozen=True)
class DataKind:
    """What the service needs from one kind of dataset (an entry of :data:`DATA_KINDS`)."""

    name: str
    """The schema's ``kind`` value, the entry's key."""
    parse: Callable[[dict[str, Any]], DatasetSchema]
    """The public schema from its JSON/YAML mapping (raises pydantic's ValidationError).
    The parsed schema's ``n_features`` is the encoded width plans are built with."""
    model_kinds: frozenset[str]
    """The model kinds (``ModelSpec.kind``) that fit a dataset of this kind."""
    default_model: Callable[[], ModelSpec]
    """The model the admission policy probes a dataset of this kind with."""
    norm_sq_bound: Callable[[Any], int] | None
    """B ≥ ‖(x, 1)‖² for every encoded row, from the parsed schema alone (the ExpM
    samplers' sensitivity bound); None: the kind has none (those methods refuse it)."""
    mapping_keys: str
    """The top-level keys of a schema of this kind (for the "not a mapping" message)."""
    describe: Callable[[Any], str]
    """The dry run's headline for the admin (``enclave datasets check``)."""


def _describe_tabular(schema: TabularSchema) -> str:
    return f"schema {schema.name!r}: {schema.n_features} encoded features"


def _describe_series(schema: TimeSeriesSchema) -> str:
    grid = schema.grid
    return (
        f"schema {schema.name!r}: {schema.n_features} variables on {grid.steps} steps "
        f"of {grid.step_hours:g} h"
    )


def _describe_images(schema: ImageSchema) -> str:
    return (
        f"schema {schema.name!r}: {schema.n_classes} classes of {schema.height}×{schema.width} "
        f"images, {schema.channels} channel(s) ({schema.n_features} encoded features)"
    )


def _image_norm_sq_bound(schema: ImageSchema) -> int:
    """‖(x, 1)‖² ≤ H·W·C + 1: every encoded pixel lies in [0, 1] (encode_pixels clips to
    the declared range before scaling), plus the bias 1."""
    return schema.n_features + 1


DEFAULT_KIND = "tabular"
"""The kind of a schema that names none."""

DATA_KINDS: dict[str, DataKind] = {
    "tabular": DataKind(
        name="tabular",
        parse=parse_schema,
        model_kinds=frozenset({"logistic", "mlp"}),
        default_model=LogisticSpec,
        norm_sq_bound=row_norm_sq_bound,
        mapping_keys="name, csv, target, columns",
        describe=_describe_tabular,
    ),
    "timeseries": DataKind(
        name="timeseries",
        parse=TimeSeriesSchema.model_validate,
        model_kinds=frozenset({"grud"}),
        default_model=GrudSpec,
        norm_sq_bound=None,
        mapping_keys="name, kind, grid, outcome, variables",
        describe=_describe_series,
    ),
    # Logistic regression and MLPs on the flattened pixels, CNNs on the images (issue 20).
    "images": DataKind(
        name="images",
        parse=ImageSchema.model_validate,
        model_kinds=frozenset({"logistic", "mlp", "cnn"}),
        default_model=LogisticSpec,
        norm_sq_bound=_image_norm_sq_bound,
        mapping_keys="name, kind, height, width, channels, classes, pixels, source",
        describe=_describe_images,
    ),
}
"""The service's data kinds by name; the worker's are ``worker.data.WORKER_KINDS``."""


def parse_dataset_schema(data: dict[str, Any]) -> DatasetSchema:
    """A public schema of any kind, chosen by its ``kind`` (``tabular`` when absent). A
    kind no entry names is parsed as tabular, whose validation reports the bad ``kind``."""
    kind = data.get("kind", DEFAULT_KIND)
    entry = DATA_KINDS.get(kind) if isinstance(kind, str) else None
    return (entry or DATA_KINDS[DEFAULT_KIND]).parse(data)


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
        kinds = "; ".join(f"{k.name}: {k.mapping_keys}" for k in DATA_KINDS.values())
        raise SchemaError(f"a schema must be a YAML mapping ({kinds})")
    try:
        return parse_dataset_schema(data)
    except ValidationError as exc:
        raise SchemaError(_one_line(exc, data)) from None
