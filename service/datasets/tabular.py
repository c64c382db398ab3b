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
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.modelspec import MAX_CLASSES

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


Compression = Literal["infer", "none", "gzip", "bz2", "zip", "xz", "zstd"]


class CsvOptions(_Strict):
    """How the dataset's files are written (docs/schema.md, "CSV options")."""

    separator: str = Field(default=",", min_length=1)
    header: bool = True
    skip_rows: int = Field(default=0, ge=0)
    comment: str | None = None
    missing: list[str] = Field(default_factory=list)
    strip_suffix: str | None = None
    names: list[str] | None = None
    compression: Compression = "infer"

    @model_validator(mode="after")
    def _names(self) -> CsvOptions:
        if self.names is not None and len(set(self.names)) != len(self.names):
            raise ValueError("csv.names: duplicate names")
        return self


def read_csv_kwargs(csv: CsvOptions) -> dict[str, Any]:
    """Keyword arguments for :func:`pandas.read_csv` that read files written as ``csv`` says."""
    kwargs: dict[str, Any] = {
        "sep": csv.separator,
        "compression": None if csv.compression == "none" else csv.compression,
        "header": 0 if csv.header else None,
        "skiprows": csv.skip_rows,
        "na_values": csv.missing,
        "keep_default_na": False,
        "skipinitialspace": True,
        "dtype": str,
    }
    if len(csv.separator) > 1 and csv.separator != r"\s+":
        kwargs["engine"] = "python"  # a regular expression (pandas would warn, then do so)
    if csv.comment:
        kwargs["comment"] = csv.comment
    if csv.names:
        kwargs["names"] = csv.names
    return kwargs


def _absent(value: Any) -> bool:
    return value is None


class DeclaredValues(_Strict):
    """The public values of a binary or K-class label, shared by a tabular target and a
    time-series outcome: ``positive`` and ``negative`` (binary, y = 1 for a positive value)
    or ``classes`` (K ≥ 3 values, y = the value's index in the list), never both. A
    subclass declares the three fields itself (its dump's field order keys the encoded
    cache) and calls :meth:`_check_values` from its validator with its noun."""

    if TYPE_CHECKING:
        positive: list[str] | None
        negative: list[str] | None
        classes: list[str] | None

    def _check_values(self, noun: str) -> None:
        a_noun = f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"
        binary = self.positive is not None or self.negative is not None
        if self.classes is not None:
            if binary:
                raise ValueError(f"{a_noun} declares either positive/negative or classes, not both")
            if len(set(self.classes)) != len(self.classes):
                raise ValueError(f"the {noun}'s classes must be distinct")
        elif self.positive is None or self.negative is None:
            raise ValueError(f"{a_noun} declares positive and negative values, or classes")
        elif set(self.positive) & set(self.negative):
            raise ValueError(f"{a_noun} value cannot be both positive and negative")

    @property
    def values(self) -> list[str]:
        """Every declared value."""
        if self.classes is not None:
            return list(self.classes)
        assert self.positive is not None and self.negative is not None
        return self.positive + self.negative

    @property
    def n_classes(self) -> int:
        """K: 2 for a positive/negative label, else the number of declared classes."""
        return 2 if self.classes is None else len(self.classes)


class Target(DeclaredValues):
    """The target column and its public values: ``positive`` and ``negative`` (a binary
    target, y = 1 for a positive value) or ``classes`` (K ≥ 3 values, y = the value's index
    in the list), never both. An absent field is left out of every dump, so a binary
    schema's stored form and encoded-cache key are unchanged."""

    column: str
    positive: list[str] | None = Field(default=None, min_length=1, exclude_if=_absent)
    negative: list[str] | None = Field(default=None, min_length=1, exclude_if=_absent)
    classes: list[str] | None = Field(
        default=None, min_length=3, max_length=MAX_CLASSES, exclude_if=_absent
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Target:
        self._check_values("target")
        return self


class TabularSchema(_Strict):
    """The public schema of a tabular dataset with a binary or K-class target."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    kind: Literal["tabular"] = "tabular"
    csv: CsvOptions = Field(default_factory=CsvOptions)
    target: Target
    columns: list[Column] = Field(min_length=1)
    max_rows: int | None = Field(
        default=None,
        ge=1,
        le=1 << 20,
        description=(
            "Optional public cap on the dataset's rows, stated by the data owner and checked "
            "at registration. The proven Langevin sampler's hidden-iterate accounting "
            "(expm, accounting 'hidden') needs it: its contraction constant grows with the "
            "rows (service/privacy/lattice_langevin.py)."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> TabularSchema:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError("duplicate column names")
        if self.target.column in names:
            raise ValueError("the target column must not also be a feature")
        return self

    @property
    def n_classes(self) -> int:
        """The target's number of classes K (2 for a binary target)."""
        return self.target.n_classes

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

    @property
    def one_hot_blocks(self) -> tuple[tuple[int, int], ...]:
        """(start, length) of each categorical column's one-hot block in the encoded
        vector (public: from the declared levels and the column order)."""
        out, start = [], 0
        for col in self.columns:
            width = 1 if isinstance(col, NumericColumn) else len(col.levels)
            if not isinstance(col, NumericColumn):
                out.append((start, width))
            start += width
        return tuple(out)

    def read_csv_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`pandas.read_csv` that read this schema's files."""
        return read_csv_kwargs(self.csv)


class SchemaError(ValueError):
    """A schema that cannot be used, said in one line (no traceback for the admin)."""


def _where(loc: tuple[int | str, ...], data: Any) -> str:
    """`columns[2] (age).min` for a pydantic error location; the union's tag is dropped."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        elif isinstance(node, dict) and part not in node and part in ("numeric", "categorical"):
            continue  # the discriminator's tag, not a key of the document
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "the schema"


def _one_line(exc: ValidationError, data: Any) -> str:
    errors = exc.errors()
    first = errors[0]
    msg = str(first["msg"]).removeprefix("Value error, ")
    given = first.get("input")
    if isinstance(given, str | int | float | bool) or given is None:
        msg += f" (got {given!r})"
    more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    return f"{_where(tuple(first['loc']), data)}: {msg}{more}"


def parse_schema(data: dict[str, Any]) -> TabularSchema:
    return TabularSchema.model_validate(data)


def row_norm_sq_bound(schema: TabularSchema) -> int:
    """B with ‖(x, 1)‖² ≤ B for every encoded row x of this schema, from the schema alone:
    each numeric column contributes at most 1 (scaled to [0, 1]), each categorical column
    exactly one 1 (one-hot over declared levels), and the bias 1. The tabular kind's
    row-norm bound in :data:`service.datasets.kinds.DATA_KINDS`; the same formula as
    :func:`service.methods.expm.row_norm_sq_bound` (pinned equal by a test), which the
    data-kind table cannot import (service.methods imports service.datasets)."""
    numeric = sum(1 for c in schema.columns if not isinstance(c, CategoricalColumn))
    categorical = len(schema.columns) - numeric
    return numeric + categorical + 1


@dataclass(frozen=True)
class ValidationReport:
    """What row validation did, as counts per column and reason. Only the admin inside
    the enclave sees the report of private rows (exact counts are not public)."""

    rows_in: int
    rows_kept: int
    rejected: dict[str, dict[str, int]] = field(default_factory=dict)
    clipped: dict[str, dict[str, int]] = field(default_factory=dict)
    missing_columns: tuple[str, ...] = ()
    hint: str | None = None

    @property
    def rows_rejected(self) -> int:
        return self.rows_in - self.rows_kept

    def lines(self) -> list[str]:
        """The report in words, one line per fact (registration and `datasets check`)."""

        def why(by: dict[str, int]) -> str:
            return ", ".join(f"{reason}: {n}" for reason, n in by.items())

        out = [f"{self.rows_kept} rows kept of {self.rows_in} ({self.rows_rejected} rejected)"]
        if self.missing_columns:
            out.append(f"missing column(s): {', '.join(self.missing_columns)}")
        for col, by in self.rejected.items():
            out.append(f"  rejected for {col}: {sum(by.values())} ({why(by)})")
        for col, by in self.clipped.items():
            out.append(f"  clipped in {col}: {sum(by.values())} ({why(by)})")
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


@dataclass(frozen=True)
class EncodedTable:
    """Model-ready arrays: features in [0, 1], targets in {0, 1} (float32) or, for a target
    of K ≥ 3 classes, class indices in {0, …, K − 1} (int64)."""

    x: np.ndarray  # float32, shape (n, d)
    y: np.ndarray  # float32 (binary) or int64 (K ≥ 3 classes), shape (n,)
    feature_names: list[str]


@dataclass(frozen=True)
class Validated:
    """Rows checked against the schema. ``frame`` holds the kept rows (renumbered from 0),
    ``kept`` their 0-based positions in the input; ``problems`` maps a column to the
    reason for each input row ("" where its value was fine)."""

    frame: pd.DataFrame
    kept: np.ndarray
    report: ValidationReport
    problems: dict[str, np.ndarray]

    def dropped(self) -> dict[int, str]:
        """Why each rejected input row (0-based position) was dropped, in words."""
        out: dict[int, list[str]] = {}
        for col, reasons in self.problems.items():
            for pos in np.flatnonzero(reasons != ""):
                out.setdefault(int(pos), []).append(f"{col}: {reasons[pos]}")
        return {pos: "; ".join(why) for pos, why in sorted(out.items())}


def _clean_text(series: pd.Series, suffix: str | None) -> pd.Series:
    s = series.astype("string").str.strip()
    if suffix:
        s = s.str.removesuffix(suffix)
    return s


_SEPARATORS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe", " ": "space"}


def separator_hint(csv: CsvOptions, raw: pd.DataFrame) -> str:
    """Why nothing parsed, guessed from the shape of what was read (admin-only)."""
    sample = [str(c) for c in raw.columns[:1]]
    if raw.shape[1]:
        sample += [str(v) for v in raw.iloc[:20, 0].dropna()]
    # A separator that the first column's values (mostly) contain is a good guess.
    counts = {
        sep: sum(sep in value for value in sample) for sep in _SEPARATORS if sep != csv.separator
    }
    best = max(counts, key=lambda sep: counts[sep]) if counts else None
    if best is not None and 2 * counts[best] >= len(sample):
        return (
            f"the first column looks {_SEPARATORS[best]}-separated: set "
            f"csv.separator: {best!r} in the schema (now {csv.separator!r})"
        )
    return "no row passed: check csv.separator, csv.header and csv.names against the file"


def parse_numeric(text: pd.Series) -> tuple[np.ndarray, list[tuple[np.ndarray, str]]]:
    """Stripped text → float64 values and the reasons a value is unusable (missing,
    unparsable, NaN or infinite), as (mask, reason) pairs in the order they take precedence.
    Values behind any reason are NaN or infinite in the array."""
    absent = (text.isna() | (text == "")).to_numpy(dtype=bool)
    arr = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float, na_value=math.nan)
    nan_text = text.str.lower().str.lstrip("+-").isin(["nan"]).fillna(False)
    nonfinite = ~absent & (np.isinf(arr) | nan_text.to_numpy(dtype=bool))
    unparsed = ~absent & ~nonfinite & np.isnan(arr)
    return arr, [
        (absent, "missing value"),
        (unparsed, "not a number"),
        (nonfinite, "NaN or infinite"),
    ]


def reasons_array(n: int, pairs: list[tuple[np.ndarray, str]]) -> np.ndarray:
    """Each of ``n`` rows' reason ("" where none applies); the first matching pair wins."""
    reasons = np.full(n, "", dtype=object)
    for mask, reason in reversed(pairs):
        reasons[mask] = reason
    return reasons


def summarise_problems(
    problems: dict[str, np.ndarray], n: int
) -> tuple[np.ndarray, dict[str, dict[str, int]]]:
    """The positions of the rows with no problem, and the rejections counted per column
    and reason (the report's ``rejected``)."""
    keep = np.ones(n, dtype=bool)
    rejected: dict[str, dict[str, int]] = {}
    for name, reasons in problems.items():
        keep &= reasons == ""
        values, counts = np.unique(reasons[reasons != ""], return_counts=True)
        if len(values):
            rejected[name] = {str(v): int(c) for v, c in zip(values, counts, strict=True)}
    return np.flatnonzero(keep), rejected


def validate_frame(schema: TabularSchema, raw: pd.DataFrame, *, labelled: bool = True) -> Validated:
    """Apply each column's declared rule to every row and say why each rejected row was.

    Numeric values that are missing, unparsable, NaN or infinite are rejected (there is no
    public value to impute); finite values outside [min, max] are clipped or rejected per
    `on_invalid`. Categorical values outside the declared levels, and targets outside the
    declared positive/negative values, are rejected. A column absent from ``raw`` rejects
    every row. ``labelled=False`` checks the features only (the target is not needed).
    """
    n = len(raw)
    needed = [c.name for c in schema.columns] + ([schema.target.column] if labelled else [])
    missing_cols = tuple(name for name in needed if name not in raw.columns)
    problems: dict[str, np.ndarray] = {}
    clipped: dict[str, dict[str, int]] = {}
    out: dict[str, Any] = {}

    def reasons_for(name: str, pairs: list[tuple[np.ndarray, str]]) -> None:
        problems[name] = reasons_array(n, pairs)

    for name in missing_cols:
        reasons_for(name, [(np.ones(n, dtype=bool), "missing column")])
    for col in schema.columns:
        if col.name in missing_cols:
            continue
        text = _clean_text(raw[col.name], None)
        absent = (text.isna() | (text == "")).to_numpy(dtype=bool)
        if isinstance(col, NumericColumn):
            arr, pairs = parse_numeric(text)
            with np.errstate(invalid="ignore"):
                low, high = np.isfinite(arr) & (arr < col.min), np.isfinite(arr) & (arr > col.max)
            if col.on_invalid == "clip":
                by = {"below min": int(low.sum()), "above max": int(high.sum())}
                if any(by.values()):
                    clipped[col.name] = {k: v for k, v in by.items() if v}
                arr = np.clip(arr, col.min, col.max)
            else:
                pairs += [(low, "below min"), (high, "above max")]
            reasons_for(col.name, pairs)
            out[col.name] = arr
        else:
            unknown = ~absent & ~text.isin(col.levels).fillna(False).to_numpy(dtype=bool)
            reasons_for(col.name, [(absent, "missing value"), (unknown, "unknown level")])
            out[col.name] = text.to_numpy(dtype=object)
    if labelled and schema.target.column not in missing_cols:
        target = _clean_text(raw[schema.target.column], schema.csv.strip_suffix)
        absent = (target.isna() | (target == "")).to_numpy(dtype=bool)
        allowed = schema.target.values
        unknown = ~absent & ~target.isin(allowed).fillna(False).to_numpy(dtype=bool)
        pairs = [(absent, "missing value"), (unknown, "unknown target value")]
        reasons_for(schema.target.column, pairs)
        out[schema.target.column] = target.to_numpy(dtype=object)
    kept, rejected = summarise_problems(problems, n)
    frame = pd.DataFrame(out).iloc[kept].reset_index(drop=True) if out else pd.DataFrame()
    report = ValidationReport(
        rows_in=n,
        rows_kept=len(kept),
        rejected=rejected,
        clipped=clipped,
        missing_columns=missing_cols,
        hint=separator_hint(schema.csv, raw) if n and not len(kept) else None,
    )
    return Validated(frame=frame, kept=kept, report=report, problems=problems)


def encode_features(schema: TabularSchema, frame: pd.DataFrame) -> np.ndarray:
    """Encode validated rows' features: numeric → [0, 1] by the declared bounds,
    categorical → one-hot. Values are clipped again so the [0, 1] guarantee (which the
    sensitivity analyses rely on) holds for any input. float32, shape (n, n_features)."""
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
    return np.concatenate(blocks, axis=1).astype(np.float32)


def encode_target(schema: TabularSchema, frame: pd.DataFrame) -> np.ndarray:
    """Binary: 1 for the declared positive values, 0 otherwise, float32. K ≥ 3 classes: the
    value's index in the declared classes, int64 (validated rows)."""
    values = frame[schema.target.column]
    if schema.target.classes is not None:
        index = {value: i for i, value in enumerate(schema.target.classes)}
        return np.array([index[str(v)] for v in values], dtype=np.int64)
    positive = schema.target.positive or []
    return values.isin(positive).to_numpy(dtype=np.float32)


def encode(schema: TabularSchema, frame: pd.DataFrame) -> EncodedTable:
    """Encode validated, labelled rows (`frame` from :func:`validate_frame`)."""
    return EncodedTable(
        x=encode_features(schema, frame),
        y=encode_target(schema, frame),
        feature_names=schema.feature_names,
    )
