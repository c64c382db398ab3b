"""Public dataset schemas and the data-independent preprocessing they define.

A schema is registered by the data owner and is public: column types, declared bounds,
categorical levels and the target encoding. Every transformation here is a pure function
of the schema and the row being transformed, never of statistics of other rows, so the
same code preprocesses private rows inside the enclave and an analyst's public holdout
outside it, and costs no privacy budget.

This module never opens a file: reading the private CSV is the worker's job
(:mod:`worker.data`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

OnInvalid = Literal["reject", "clip"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class NumericColumn(_Strict):
    name: str = Field(min_length=1)
    type: Literal["numeric"]
    min: float
    max: float
    transform: Literal["none", "log1p"] = "none"
    on_invalid: OnInvalid = "reject"

    @model_validator(mode="after")
    def _bounds(self) -> NumericColumn:
        if not self.min < self.max:
            raise ValueError(f"column {self.name!r}: min must be < max")
        if self.transform == "log1p" and self.min < 0:
            raise ValueError(f"column {self.name!r}: log1p needs min >= 0")
        return self


class CategoricalColumn(_Strict):
    name: str = Field(min_length=1)
    type: Literal["categorical"]
    levels: list[str] = Field(min_length=1)
    # Unknown levels can only be rejected: there is nothing to clip them to.
    on_invalid: Literal["reject"] = "reject"

    @model_validator(mode="after")
    def _unique(self) -> CategoricalColumn:
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"column {self.name!r}: duplicate levels")
        return self


Column = Annotated[NumericColumn | CategoricalColumn, Field(discriminator="type")]


class CsvOptions(_Strict):
    header: bool = True
    skip_rows: int = Field(default=0, ge=0)
    comment: str | None = None
    missing: list[str] = Field(default_factory=list)
    strip_suffix: str | None = None
    names: list[str] | None = None


class Target(_Strict):
    column: str
    positive: list[str] = Field(min_length=1)
    negative: list[str] = Field(min_length=1)


class TabularSchema(_Strict):
    """The public schema of a tabular dataset with a binary target."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    kind: Literal["tabular"] = "tabular"
    csv: CsvOptions = Field(default_factory=CsvOptions)
    target: Target
    columns: list[Column] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> TabularSchema:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError("duplicate column names")
        if self.target.column in names:
            raise ValueError("the target column must not also be a feature")
        if set(self.target.positive) & set(self.target.negative):
            raise ValueError("a target value cannot be both positive and negative")
        return self

    @property
    def feature_names(self) -> list[str]:
        out: list[str] = []
        for col in self.columns:
            if isinstance(col, NumericColumn):
                out.append(col.name)
            else:
                out.extend(f"{col.name}={level}" for level in col.levels)
        return out

    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    def read_csv_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`pandas.read_csv` that read this schema's files."""
        kwargs: dict[str, Any] = {
            "header": 0 if self.csv.header else None,
            "skiprows": self.csv.skip_rows,
            "na_values": self.csv.missing,
            "keep_default_na": False,
            "skipinitialspace": True,
            "dtype": str,
        }
        if self.csv.comment:
            kwargs["comment"] = self.csv.comment
        if self.csv.names:
            kwargs["names"] = self.csv.names
        return kwargs


def parse_schema(data: dict[str, Any]) -> TabularSchema:
    return TabularSchema.model_validate(data)


def load_schema_yaml(text: str) -> TabularSchema:
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("a schema must be a YAML mapping")
    return parse_schema(data)


@dataclass(frozen=True)
class ValidationReport:
    """What row validation did. Only the admin inside the enclave sees it."""

    rows_in: int
    rows_kept: int
    rejected_by_column: dict[str, int] = field(default_factory=dict)
    clipped_by_column: dict[str, int] = field(default_factory=dict)

    @property
    def rows_rejected(self) -> int:
        return self.rows_in - self.rows_kept


@dataclass(frozen=True)
class EncodedTable:
    """Model-ready arrays: features in [0, 1], targets in {0, 1}."""

    x: np.ndarray  # float32, shape (n, d)
    y: np.ndarray  # float32, shape (n,)
    feature_names: list[str]


def _clean_text(series: pd.Series, suffix: str | None) -> pd.Series:
    s = series.astype("string").str.strip()
    if suffix:
        s = s.str.removesuffix(suffix)
    return s


def validate_frame(
    schema: TabularSchema, raw: pd.DataFrame
) -> tuple[pd.DataFrame, ValidationReport]:
    """Apply each column's declared rule; return the kept rows and a report.

    Numeric values that are missing, NaN or infinite are rejected (there is no public value
    to impute); finite values outside [min, max] are clipped or rejected per `on_invalid`.
    Categorical values outside the declared levels, and targets outside the declared
    positive/negative values, are rejected.
    """
    needed = [c.name for c in schema.columns] + [schema.target.column]
    missing_cols = [n for n in needed if n not in raw.columns]
    if missing_cols:
        raise ValueError(f"the data has no column(s) {missing_cols}")
    n = len(raw)
    keep = np.ones(n, dtype=bool)
    rejected: dict[str, int] = {}
    clipped: dict[str, int] = {}
    out: dict[str, Any] = {}
    for col in schema.columns:
        if isinstance(col, NumericColumn):
            values = pd.to_numeric(_clean_text(raw[col.name], None), errors="coerce")
            arr = values.to_numpy(dtype=float, na_value=math.nan)
            bad = ~np.isfinite(arr)
            outside = np.isfinite(arr) & ((arr < col.min) | (arr > col.max))
            if col.on_invalid == "clip":
                clipped[col.name] = int(outside.sum())
                arr = np.clip(arr, col.min, col.max)
            else:
                bad = bad | outside
            rejected[col.name] = int(bad.sum())
            keep &= ~bad
            out[col.name] = arr
        else:
            text = _clean_text(raw[col.name], None)
            ok = text.isin(col.levels).fillna(False).to_numpy(dtype=bool)
            rejected[col.name] = int((~ok).sum())
            keep &= ok
            out[col.name] = text.to_numpy(dtype=object)
    target = _clean_text(raw[schema.target.column], schema.csv.strip_suffix)
    allowed = schema.target.positive + schema.target.negative
    ok = target.isin(allowed).fillna(False).to_numpy(dtype=bool)
    rejected[schema.target.column] = int((~ok).sum())
    keep &= ok
    out[schema.target.column] = target.to_numpy(dtype=object)
    frame = pd.DataFrame(out).loc[keep].reset_index(drop=True)
    report = ValidationReport(
        rows_in=n,
        rows_kept=int(keep.sum()),
        rejected_by_column={k: v for k, v in rejected.items() if v},
        clipped_by_column={k: v for k, v in clipped.items() if v},
    )
    return frame, report


def encode(schema: TabularSchema, frame: pd.DataFrame) -> EncodedTable:
    """Encode validated rows: numeric → [0, 1] by the declared bounds, categorical → one-hot.

    `frame` must come from :func:`validate_frame`; values are clipped again so the [0, 1]
    guarantee (which the sensitivity analyses rely on) holds for any input.
    """
    blocks: list[np.ndarray] = []
    for col in schema.columns:
        if isinstance(col, NumericColumn):
            v = np.clip(frame[col.name].to_numpy(dtype=np.float64), col.min, col.max)
            lo, hi = col.min, col.max
            if col.transform == "log1p":
                v, lo, hi = np.log1p(v), math.log1p(lo), math.log1p(hi)
            blocks.append(((v - lo) / (hi - lo))[:, None])
        else:
            index = {level: i for i, level in enumerate(col.levels)}
            codes = np.array([index.get(str(v), -1) for v in frame[col.name]], dtype=np.int64)
            onehot = np.zeros((len(codes), len(col.levels)))
            valid = codes >= 0
            onehot[np.nonzero(valid)[0], codes[valid]] = 1.0
            blocks.append(onehot)
    x = np.concatenate(blocks, axis=1).astype(np.float32) if blocks else np.zeros((len(frame), 0))
    y = frame[schema.target.column].isin(schema.target.positive).to_numpy(dtype=np.float32)
    return EncodedTable(x=x, y=y, feature_names=schema.feature_names)
