"""Public schemas of time-series datasets (``kind: timeseries``) and their encoding into
GRU-D's inputs, by the schema alone.

A time-series dataset is a set of **stays** (e.g. ICU admissions), each a binary or
K-class outcome and irregular observations of declared variables. The private files are a
long-format CSV, one observation per line (stay id, time in hours since the stay's start, variable,
value), and an outcomes CSV, one line per stay (stay id, outcome). What is public is the
schema: the variables with units, bounds and imputation means, the time grid, the column
names and the outcome encoding. As in :mod:`service.datasets.tabular`, every transformation is
a pure function of the schema and the rows being transformed: no statistic of other rows
enters (the imputation means are declared, never estimated).

Row rules (docs/schema.md, "Time-series datasets"): an observation is rejected for a
missing field, an unknown variable, a value that is not a finite number, a time outside
[0, horizon), a stay without a valid outcome, or a duplicated time stamp (two or more
lines with the same stay, time and variable: every one of them is rejected, since the
file does not say which value holds). A finite value outside the variable's [min, max]
is clipped or rejected per its ``on_invalid``. Several observations of one variable in
one grid step (at different times) are allowed: the latest one is the step's value.
An outcomes line is rejected for a missing stay id, a missing or undeclared outcome, or
a stay id that appears on more than one line (all of them).

Encoding (Che et al. 2018, "Recurrent Neural Networks for Multivariate Time Series with
Missing Values", Sci. Rep. 8:6085): for T grid steps of ``step_hours`` and V variables,
values x (scaled to [0, 1] by the declared bounds, 0 where unobserved), masks m (1 =
observed) and deltas δ, the time since the variable's last observation in hours
(δ₀ = 0; δ_t = step + δ_{t−1} if m_{t−1} = 0, else step; eq. 2), packed as (n, 3, T, V).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from service.datasets.tabular import (
    CsvOptions,
    DeclaredValues,
    OnInvalid,
    ValidationReport,
    _absent,
    _clean_text,
    _Strict,
    parse_numeric,
    read_csv_kwargs,
    reasons_array,
    separator_hint,
    summarise_problems,
)
from service.modelspec import MAX_CLASSES

__all__ = [
    "EncodedSeries",
    "LongColumns",
    "SeriesOutcome",
    "TimeGrid",
    "TimeSeriesReport",
    "TimeSeriesSchema",
    "ValidatedSeries",
    "Variable",
    "deltas_from_masks",
    "encode_series",
    "pack_grud_inputs",
    "validate_series",
    "wide_to_long",
]


class Variable(_Strict):
    """One measured variable: its unit, public bounds and public imputation mean (in the
    variable's unit; GRU-D imputes it, scaled like the values, before a first observation)."""

    name: str = Field(min_length=1)
    unit: str
    min: float
    max: float
    mean: float
    on_invalid: OnInvalid = "reject"

    @model_validator(mode="after")
    def _bounds(self) -> Variable:
        if not self.min < self.max:
            raise ValueError(f"variable {self.name!r}: min must be < max")
        if not self.min <= self.mean <= self.max:
            raise ValueError(f"variable {self.name!r}: mean must lie in [min, max]")
        return self

    def scale(self, values: np.ndarray) -> np.ndarray:
        """Values in the unit → [0, 1] by the declared bounds (clipped)."""
        return np.clip((values - self.min) / (self.max - self.min), 0.0, 1.0)


class TimeGrid(_Strict):
    """Observation times are hours since the stay's start; step t covers
    [t·step_hours, (t + 1)·step_hours), for t = 0 … steps − 1 (the horizon)."""

    step_hours: float = Field(default=1.0, gt=0, le=24 * 365)
    steps: int = Field(ge=2, le=1000)

    @property
    def horizon_hours(self) -> float:
        return self.step_hours * self.steps


class LongColumns(_Strict):
    """The long-format observations file's column names."""

    stay: str = Field(default="stay_id", min_length=1)
    time: str = Field(default="time", min_length=1)
    variable: str = Field(default="variable", min_length=1)
    value: str = Field(default="value", min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> LongColumns:
        if len({self.stay, self.time, self.variable, self.value}) != 4:
            raise ValueError("the stay, time, variable and value columns must differ")
        return self


class SeriesOutcome(DeclaredValues):
    """Where each stay's outcome is written, and its public values: ``positive`` and
    ``negative`` (a binary outcome, y = 1 for a positive value) or ``classes`` (K ≥ 3
    values, y = the value's index in the list), never both, as a tabular target's. An
    absent field is left out of every dump, so a binary schema's stored form and
    encoded-cache key are unchanged.

    ``source: file`` (default): an outcomes file, one line per stay with a header, with
    the stay-id column ``stay`` and the outcome column ``column``. ``source:
    observations``: ``column`` is a column of the observations file, and every line of a
    stay must carry the same outcome (``stay`` is not used)."""

    source: Literal["file", "observations"] = "file"
    stay: str = Field(default="stay_id", min_length=1)
    column: str = Field(default="label", min_length=1)
    positive: list[str] | None = Field(default=None, min_length=1, exclude_if=_absent)
    negative: list[str] | None = Field(default=None, min_length=1, exclude_if=_absent)
    classes: list[str] | None = Field(
        default=None, min_length=3, max_length=MAX_CLASSES, exclude_if=_absent
    )

    @model_validator(mode="after")
    def _consistent(self) -> SeriesOutcome:
        if self.stay == self.column:
            raise ValueError("the outcome column must differ from the stay column")
        self._check_values("outcome")
        return self

    def encode(self, labels: pd.Series) -> np.ndarray:
        """(n,) float32 y: 1 for a positive value and 0 otherwise, or with ``classes`` the
        value's index in them (labels are validated values)."""
        if self.classes is None:
            assert self.positive is not None
            return labels.isin(self.positive).to_numpy(dtype=np.float32)
        index = {value: k for k, value in enumerate(self.classes)}
        return labels.map(index).to_numpy(dtype=np.float32)


class TimeSeriesSchema(_Strict):
    """The public schema of a time-series dataset with a binary or K-class outcome per stay."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    kind: Literal["timeseries"]
    # long: one observations file, a line per observation; wide: a file per stay (named
    # by the stay id), a line per time, a column per variable (see wide_to_long).
    layout: Literal["long", "wide"] = "long"
    csv: CsvOptions = Field(default_factory=CsvOptions)
    columns: LongColumns = Field(default_factory=LongColumns)
    grid: TimeGrid
    outcome: SeriesOutcome
    variables: list[Variable] = Field(min_length=1, max_length=512)

    @model_validator(mode="after")
    def _consistent(self) -> TimeSeriesSchema:
        names = [v.name for v in self.variables]
        if len(set(names)) != len(names):
            raise ValueError("duplicate variable names")
        c = self.columns
        if self.outcome.source == "observations" and self.outcome.column in (
            c.stay,
            c.time,
            c.variable,
            c.value,
        ):
            raise ValueError("the outcome column must differ from the observation columns")
        if self.layout == "wide" and self.outcome.source != "file":
            raise ValueError("wide per-stay files need an outcomes file (outcome.source: file)")
        return self

    @property
    def feature_names(self) -> list[str]:
        return [v.name for v in self.variables]

    @property
    def n_features(self) -> int:
        """V, the width GRU-D is built with (its inputs are (n, 3, T, V))."""
        return len(self.variables)

    @property
    def n_classes(self) -> int:
        """The outcome's number of classes K (2 for positive and negative values)."""
        return self.outcome.n_classes

    @property
    def scaled_means(self) -> tuple[float, ...]:
        """The public imputation means on the [0, 1] scale of the encoded values."""
        return tuple((v.mean - v.min) / (v.max - v.min) for v in self.variables)

    def read_csv_kwargs(self) -> dict[str, object]:
        """:func:`pandas.read_csv` keyword arguments for the observations file."""
        return read_csv_kwargs(self.csv)

    def read_outcomes_kwargs(self) -> dict[str, object]:
        """… for the outcomes file: the same options, but always its own header line."""
        kwargs = read_csv_kwargs(self.csv)
        kwargs.pop("names", None)
        kwargs["header"] = 0
        return kwargs


@dataclass(frozen=True)
class TimeSeriesReport:
    """The validation of both files: observations (lines of the long CSV) and stays
    (lines of the outcomes file). ``rows_kept`` is the number of stays kept, the dataset's
    row count, or 0 when no observation line was kept: files without a single usable
    observation are refused (a wrong separator or column name, not a dataset). Like the
    tabular report, it is for the admin inside the enclave only."""

    observations: ValidationReport
    stays: ValidationReport

    @property
    def rows_kept(self) -> int:
        return self.stays.rows_kept if self.observations.rows_kept else 0

    def lines(self) -> list[str]:
        obs = self.observations.lines()
        stays = self.stays.lines()
        return [
            "stays (outcomes file): " + stays[0].replace("rows", "stays", 1),
            *stays[1:],
            "observations (long file): " + obs[0].replace("rows", "lines", 1),
            *obs[1:],
        ]


@dataclass(frozen=True)
class ValidatedSeries:
    """Rows that passed: ``observations`` (columns stay, time, variable, value as named in
    the schema; values clipped where declared) and ``outcomes`` (stay, outcome), one line
    per kept stay in the outcomes file's order."""

    observations: pd.DataFrame
    outcomes: pd.DataFrame
    report: TimeSeriesReport


def _outcomes_from_observations(
    schema: TimeSeriesSchema, observations: pd.DataFrame
) -> pd.DataFrame:
    """One line per distinct (stay, outcome) pair of the observations file, as an outcomes
    file would hold them: a stay with two different outcomes appears twice (and is
    rejected as repeated)."""
    o, stay = schema.outcome, schema.columns.stay
    cols = {c: _clean_text(observations[c], None) for c in (stay, o.column) if c in observations}
    pairs = pd.DataFrame(cols).drop_duplicates()
    return pairs.rename(columns={stay: o.stay}).reset_index(drop=True)


def _validate_outcomes(
    schema: TimeSeriesSchema, raw: pd.DataFrame
) -> tuple[pd.DataFrame, ValidationReport]:
    o, n = schema.outcome, len(raw)
    missing_cols = tuple(c for c in (o.stay, o.column) if c not in raw.columns)
    problems: dict[str, np.ndarray] = {
        c: reasons_array(n, [(np.ones(n, dtype=bool), "missing column")]) for c in missing_cols
    }
    stay = _clean_text(raw[o.stay], None) if o.stay in raw.columns else None
    label = _clean_text(raw[o.column], schema.csv.strip_suffix) if o.column in raw.columns else None
    if stay is not None:
        absent = (stay.isna() | (stay == "")).to_numpy(dtype=bool)
        repeated = ~absent & stay.duplicated(keep=False).to_numpy(dtype=bool)
        why = (
            "stay listed more than once" if o.source == "file" else "outcome differs between lines"
        )
        problems[o.stay] = reasons_array(n, [(absent, "missing value"), (repeated, why)])
    if label is not None:
        absent = (label.isna() | (label == "")).to_numpy(dtype=bool)
        allowed = o.values
        unknown = ~absent & ~label.isin(allowed).fillna(False).to_numpy(dtype=bool)
        problems[o.column] = reasons_array(
            n, [(absent, "missing value"), (unknown, "unknown outcome value")]
        )
    kept, rejected = summarise_problems(problems, n)
    frame = pd.DataFrame(columns=[o.stay, o.column])
    if stay is not None and label is not None:
        frame = pd.DataFrame(
            {o.stay: stay.to_numpy(dtype=object), o.column: label.to_numpy(dtype=object)}
        )
        frame = frame.iloc[kept].reset_index(drop=True)
    report = ValidationReport(
        rows_in=n,
        rows_kept=len(kept),
        rejected=rejected,
        missing_columns=missing_cols,
        hint=separator_hint(schema.csv, raw) if n and not len(kept) else None,
    )
    return frame, report


def validate_series(
    schema: TimeSeriesSchema, observations: pd.DataFrame, outcomes: pd.DataFrame | None
) -> ValidatedSeries:
    """Apply the schema's rules (module docstring) to every line of both files (read as
    text, e.g. with :meth:`TimeSeriesSchema.read_csv_kwargs`) and count why lines went.
    ``outcomes`` None: the outcomes are read off the observations file (``outcome.source:
    observations``); the stays' report then counts distinct (stay, outcome) pairs."""
    if outcomes is None:
        if schema.outcome.source != "observations":
            raise ValueError("this schema's outcomes are in a file of their own")
        outcomes = _outcomes_from_observations(schema, observations)
    kept_outcomes, stays_report = _validate_outcomes(schema, outcomes)
    c, n = schema.columns, len(observations)
    needed = (c.stay, c.time, c.variable, c.value)
    missing_cols = tuple(name for name in needed if name not in observations.columns)
    problems: dict[str, np.ndarray] = {
        name: reasons_array(n, [(np.ones(n, dtype=bool), "missing column")])
        for name in missing_cols
    }
    clipped: dict[str, dict[str, int]] = {}
    frame = pd.DataFrame(columns=list(needed))
    if not missing_cols:
        stay = _clean_text(observations[c.stay], None)
        variable = _clean_text(observations[c.variable], None)
        time, time_pairs = parse_numeric(_clean_text(observations[c.time], None))
        value, value_pairs = parse_numeric(_clean_text(observations[c.value], None))

        stay_absent = (stay.isna() | (stay == "")).to_numpy(dtype=bool)
        known_stays = set(kept_outcomes[schema.outcome.stay])
        no_outcome = ~stay_absent & ~stay.isin(known_stays).fillna(False).to_numpy(dtype=bool)
        problems[c.stay] = reasons_array(
            n, [(stay_absent, "missing value"), (no_outcome, "no valid outcome for the stay")]
        )
        var_absent = (variable.isna() | (variable == "")).to_numpy(dtype=bool)
        index = {v.name: i for i, v in enumerate(schema.variables)}
        codes = variable.map(index).to_numpy(dtype=float, na_value=np.nan)
        unknown = ~var_absent & np.isnan(codes)
        problems[c.variable] = reasons_array(
            n, [(var_absent, "missing value"), (unknown, "unknown variable")]
        )
        with np.errstate(invalid="ignore"):
            outside = np.isfinite(time) & ((time < 0) | (time >= schema.grid.horizon_hours))
        usable_stamp = ~stay_absent & ~var_absent & ~unknown & np.isfinite(time)
        stamp = pd.DataFrame({"s": stay, "t": time, "v": variable})
        duplicated = usable_stamp & stamp.duplicated(keep=False).to_numpy(dtype=bool)
        problems[c.time] = reasons_array(
            n,
            [
                *time_pairs,
                (outside, "outside the horizon"),
                (duplicated, "duplicated time stamp"),
            ],
        )
        # Bounds by each line's variable; unknown variables were rejected above.
        code = np.where(np.isnan(codes), 0, codes).astype(np.int64)
        lows = np.array([v.min for v in schema.variables])[code]
        highs = np.array([v.max for v in schema.variables])[code]
        clips = np.array([v.on_invalid == "clip" for v in schema.variables])[code] & ~unknown
        with np.errstate(invalid="ignore"):
            low = np.isfinite(value) & ~unknown & (value < lows)
            high = np.isfinite(value) & ~unknown & (value > highs)
        problems[c.value] = reasons_array(
            n, [*value_pairs, (low & ~clips, "below min"), (high & ~clips, "above max")]
        )
        kept_so_far, _ = summarise_problems(problems, n)
        ok = np.zeros(n, dtype=bool)
        ok[kept_so_far] = True
        for v in schema.variables:
            if v.on_invalid != "clip":
                continue
            mine = ok & (variable == v.name).fillna(False).to_numpy(dtype=bool)
            by = {"below min": int((mine & low).sum()), "above max": int((mine & high).sum())}
            if any(by.values()):
                clipped[v.name] = {k: m for k, m in by.items() if m}
        value = np.clip(value, lows, highs)
        frame = pd.DataFrame(
            {
                c.stay: stay.to_numpy(dtype=object),
                c.time: time,
                c.variable: variable.to_numpy(dtype=object),
                c.value: value,
            }
        )
    kept, rejected = summarise_problems(problems, n)
    frame = frame.iloc[kept].reset_index(drop=True) if not missing_cols else frame
    obs_report = ValidationReport(
        rows_in=n,
        rows_kept=len(kept),
        rejected=rejected,
        clipped=clipped,
        missing_columns=missing_cols,
        hint=separator_hint(schema.csv, observations) if n and not len(kept) else None,
    )
    return ValidatedSeries(
        observations=frame,
        outcomes=kept_outcomes,
        report=TimeSeriesReport(observations=obs_report, stays=stays_report),
    )


def wide_to_long(schema: TimeSeriesSchema, stays: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per-stay wide files (``layout: wide``; each read as text: the time column and one
    column per variable) → the lines of the long format that :func:`validate_series`
    checks: one per non-empty cell, with the mapping's key as the stay id. An empty cell
    is an unobserved value, not a missing one; a column that names no variable gives
    "unknown variable" lines, and a file without the time column "missing value" times."""
    c = schema.columns
    parts = []
    for stay, frame in stays.items():
        if c.time not in frame.columns:
            frame = frame.assign(**{c.time: pd.NA})
        long = frame.melt(id_vars=[c.time], var_name=c.variable, value_name=c.value)
        text = long[c.value].astype("string").str.strip()
        long = long[(text.notna() & (text != "")).to_numpy(dtype=bool)]
        parts.append(long.assign(**{c.stay: stay}))
    columns = [c.stay, c.time, c.variable, c.value]
    if not parts:
        return pd.DataFrame(columns=columns, dtype=object)
    return pd.concat(parts, ignore_index=True)[columns].astype(object)


def deltas_from_masks(masks: np.ndarray, *, step_hours: float = 1.0) -> np.ndarray:
    """Che et al. (2018) eq. 2 on a regular grid: time since each variable's last
    observation, in hours. ``masks`` has shape (n, T, V); δ₀ = 0."""
    deltas = np.zeros_like(masks, dtype=np.float32)
    for t in range(1, masks.shape[1]):
        deltas[:, t] = np.where(masks[:, t - 1] > 0, step_hours, step_hours + deltas[:, t - 1])
    return deltas


def pack_grud_inputs(values: np.ndarray, masks: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """(n, T, V) ×3 → (n, 3, T, V) float32: GRU-D's input channels (values, masks, deltas);
    unobserved values are zeroed so that NaNs never enter."""
    values = np.where(masks > 0, np.nan_to_num(values), 0.0)
    return np.stack([values, masks, deltas], axis=1).astype(np.float32)


@dataclass(frozen=True)
class EncodedSeries:
    """GRU-D's inputs for n stays: ``x`` (n, 3, T, V) float32 (scaled values, masks,
    deltas in hours), ``y`` (n,) float32 in {0, 1} (K classes: the class index), and the
    stays' ids in that order."""

    x: np.ndarray
    y: np.ndarray
    stay_ids: list[str]
    feature_names: list[str]


def encode_series(schema: TimeSeriesSchema, validated: ValidatedSeries) -> EncodedSeries:
    """Encode validated rows by the schema alone (module docstring). A stay with no kept
    observation is all-unobserved (GRU-D then imputes the public means)."""
    c, o, grid = schema.columns, schema.outcome, schema.grid
    stays = [str(s) for s in validated.outcomes[o.stay]]
    n, steps, width = len(stays), grid.steps, schema.n_features
    obs = validated.observations
    stay_pos = pd.Index(stays).get_indexer(obs[c.stay].astype(str))
    if (stay_pos < 0).any():
        raise ValueError("observations of a stay without an outcome (validate_series first)")
    index = {v.name: i for i, v in enumerate(schema.variables)}
    var_pos = obs[c.variable].map(index).to_numpy(dtype=np.int64)
    time = obs[c.time].to_numpy(dtype=np.float64)
    step = np.clip(np.floor(time / grid.step_hours), 0, steps - 1).astype(np.int64)
    lows = np.array([v.min for v in schema.variables])[var_pos]
    highs = np.array([v.max for v in schema.variables])[var_pos]
    value = obs[c.value].to_numpy(dtype=np.float64)
    scaled = np.clip((value - lows) / (highs - lows), 0.0, 1.0)
    # The latest observation in a grid step wins: sort by (cell, time), keep each cell's last.
    cell = (stay_pos * steps + step) * width + var_pos
    order = np.lexsort((time, cell))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = cell[order][1:] != cell[order][:-1]
    pick = order[last]
    values = np.zeros((n, steps, width), dtype=np.float64)
    masks = np.zeros((n, steps, width), dtype=np.float32)
    values[stay_pos[pick], step[pick], var_pos[pick]] = scaled[pick]
    masks[stay_pos[pick], step[pick], var_pos[pick]] = 1.0
    deltas = deltas_from_masks(masks, step_hours=grid.step_hours)
    y = o.encode(validated.outcomes[o.column])
    return EncodedSeries(
        x=pack_grud_inputs(values, masks, deltas),
        y=y,
        stay_ids=stays,
        feature_names=schema.feature_names,
    )
