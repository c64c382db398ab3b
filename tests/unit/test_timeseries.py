"""Time-series schemas: validation per line with a report, and the encoding into GRU-D's
inputs (values, masks, deltas, public imputation means), checked against a hand-computed
example."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from service.datasets.kinds import load_schema_yaml, parse_dataset_schema
from service.datasets.tabular import SchemaError
from service.datasets.timeseries import TimeSeriesSchema, encode_series, validate_series
from service.modelspec import GrudSpec
from worker.models import Grud, build_module

TINY = {
    "name": "tiny-icu",
    "kind": "timeseries",
    "grid": {"step_hours": 1.0, "steps": 4},
    "outcome": {"column": "died", "positive": ["yes"], "negative": ["no"]},
    "variables": [
        {"name": "hr", "unit": "bpm", "min": 0, "max": 200, "mean": 80, "on_invalid": "clip"},
        {"name": "sbp", "unit": "mmHg", "min": 50, "max": 250, "mean": 120},
    ],
}

OBSERVATIONS = """stay_id,time,variable,value
s1,0.5,hr,100
s1,0.9,hr,120
s1,2.0,sbp,150
s1,3.5,hr,300
s2,1.25,sbp,50
"""
OUTCOMES = """stay_id,died
s1,yes
s2,no
s3,no
"""


def _schema(**changes: object) -> TimeSeriesSchema:
    schema = parse_dataset_schema({**TINY, **changes})
    assert isinstance(schema, TimeSeriesSchema)
    return schema


def _read(schema: TimeSeriesSchema, obs: str, outcomes: str = OUTCOMES) -> tuple:
    raw = pd.read_csv(io.StringIO(obs), **schema.read_csv_kwargs())
    out = pd.read_csv(io.StringIO(outcomes), **schema.read_outcomes_kwargs())
    return raw, out


def test_round_trip_from_a_long_csv_equals_the_hand_computed_grud_inputs() -> None:
    schema = _schema()
    validated = validate_series(schema, *_read(schema, OBSERVATIONS))
    assert validated.report.rows_kept == 3
    assert validated.report.observations.clipped == {"hr": {"above max": 1}}
    enc = encode_series(schema, validated)
    assert enc.stay_ids == ["s1", "s2", "s3"] and enc.x.shape == (3, 3, 4, 2)
    np.testing.assert_array_equal(enc.y, [1, 0, 0])
    values, masks, deltas = enc.x[:, 0], enc.x[:, 1], enc.x[:, 2]
    # s1: hr 120 (the later of two in hour 0) → 0.6; 300 clipped to 200 → 1.0 in hour 3;
    # sbp 150 → (150 − 50)/200 = 0.5 in hour 2. s2: sbp 50 → 0 in hour 1. s3: nothing.
    expected_values = np.zeros((3, 4, 2), dtype=np.float32)
    expected_values[0, 0, 0], expected_values[0, 3, 0], expected_values[0, 2, 1] = 0.6, 1.0, 0.5
    np.testing.assert_allclose(values, expected_values, atol=1e-7)
    expected_masks = np.zeros((3, 4, 2), dtype=np.float32)
    expected_masks[0, 0, 0] = expected_masks[0, 3, 0] = expected_masks[0, 2, 1] = 1
    expected_masks[1, 1, 1] = 1
    np.testing.assert_array_equal(masks, expected_masks)
    # δ₀ = 0; δ_t = 1 h if observed at t − 1, else 1 h + δ_{t−1} (Che et al. eq. 2).
    np.testing.assert_array_equal(deltas[0, :, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(deltas[0, :, 1], [0, 1, 2, 1])
    np.testing.assert_array_equal(deltas[1, :, 1], [0, 1, 1, 2])
    np.testing.assert_array_equal(deltas[2], [[0, 0], [1, 1], [2, 2], [3, 3]])
    # Public means on the value scale: hr 80/200, sbp (120 − 50)/200.
    assert schema.scaled_means == pytest.approx((0.4, 0.35))
    grud = build_module(GrudSpec(hidden=2), 2, public_means=schema.scaled_means)
    assert isinstance(grud, Grud)
    x = torch.as_tensor(enc.x)
    last = grud.last_observed(x[:, 0], x[:, 1])
    # Before a variable's first observation GRU-D carries the public mean, then the last value.
    np.testing.assert_allclose(last[0, :, 0].numpy(), [0.6, 0.6, 0.6, 1.0], atol=1e-6)
    np.testing.assert_allclose(last[0, :, 1].numpy(), [0.35, 0.35, 0.5, 0.5], atol=1e-6)
    np.testing.assert_allclose(last[2].numpy(), [[0.4, 0.35]] * 4, atol=1e-6)


def test_longer_grid_steps_bin_times_and_scale_deltas() -> None:
    schema = _schema(grid={"step_hours": 2.0, "steps": 2})
    validated = validate_series(
        schema, *_read(schema, "stay_id,time,variable,value\ns1,3.9,hr,50\n")
    )
    enc = encode_series(schema, validated)
    np.testing.assert_array_equal(enc.x[0, 1, :, 0], [0, 1])  # 3.9 h is in step 1
    np.testing.assert_array_equal(enc.x[0, 2, :, 0], [0, 2])  # deltas in hours


BAD = """stay_id,time,variable,value
s1,0,hr,80
s1,0,weight,70
s1,1,sbp,400
s1,1,hr,nan
s1,9,hr,80
s1,-1,hr,80
s2,2,sbp,120
s2,2,sbp,125
s2,3,hr,
s9,0,hr,80
,0,hr,80
"""


def test_bad_lines_are_counted_per_column_and_reason() -> None:
    schema = _schema()
    report = validate_series(schema, *_read(schema, BAD)).report
    obs = report.observations
    assert obs.rows_in == 11 and obs.rows_kept == 1
    assert obs.rejected == {
        "stay_id": {"missing value": 1, "no valid outcome for the stay": 1},
        "variable": {"unknown variable": 1},
        "time": {"outside the horizon": 2, "duplicated time stamp": 2},
        "value": {"above max": 1, "NaN or infinite": 1, "missing value": 1},
    }
    text = "\n".join(report.lines())
    assert "stays (outcomes file): 3 stays kept of 3" in text
    assert "rejected for time: 4 (duplicated time stamp: 2, outside the horizon: 2)" in text


def test_bad_outcomes_and_missing_columns_give_a_report() -> None:
    schema = _schema()
    outcomes = "stay_id,died\ns1,yes\ns1,no\ns2,maybe\n,no\ns3,no\n"
    validated = validate_series(
        schema, *_read(schema, "stay_id,time,variable\ns3,0,hr\n", outcomes)
    )
    report = validated.report
    assert report.stays.rows_kept == 1  # s3 only
    assert report.rows_kept == 0  # no observation line is usable: refused
    assert report.stays.rejected == {
        "stay_id": {"missing value": 1, "stay listed more than once": 2},
        "died": {"unknown outcome value": 1},
    }
    assert report.observations.missing_columns == ("value",)
    assert report.observations.rows_kept == 0
    assert "missing column(s): value" in "\n".join(report.lines())


def test_wrong_separator_gets_a_hint() -> None:
    schema = _schema()
    raw, out = _read(schema, OBSERVATIONS.replace(",", ";"), OUTCOMES.replace(",", ";"))
    report = validate_series(schema, raw, out).report
    assert report.rows_kept == 0
    assert report.stays.hint is not None and "semicolon" in report.stays.hint


def test_schema_errors_are_one_line(tmp_path: Path) -> None:
    bad = {**TINY, "variables": [{**TINY["variables"][0], "mean": 500}]}  # type: ignore[index]
    with pytest.raises(SchemaError) as err:
        load_schema_yaml(yaml.safe_dump(bad))
    assert "\n" not in str(err.value) and "mean must lie in [min, max]" in str(err.value)
    with pytest.raises(SchemaError, match="grid"):
        load_schema_yaml(yaml.safe_dump({k: v for k, v in TINY.items() if k != "grid"}))
    assert isinstance(load_schema_yaml(yaml.safe_dump(TINY)), TimeSeriesSchema)


def test_grud_expm_memory_estimate_is_on_the_high_side_of_the_measurement() -> None:
    """benchmarks/results/grud_memory.md: 4.37 MiB per θ sample for 64 series × 48 h,
    V = 8, H = 16 (forward and backward); the estimate may exceed it, not undercut it."""
    from service.methods.expm_nf import expm_memory_bytes
    from service.plans import build_plan
    from service.schemas import JobRequest

    def need(samples: int) -> int:
        request = JobRequest(
            dataset="icu", method="expm_nf", epsilon=1.0, delta=0.0,
            model=GrudSpec(hidden=16),
            expm_nf={"n_samples_per_step": samples, "batch_size": 64},
        )  # fmt: skip
        plan = build_plan(request, n_rows=2000, n_features=8, dataset_kind="timeseries")
        bytes_ = expm_memory_bytes(plan, n_features=8, series_steps=48)
        assert bytes_ is not None
        return bytes_

    per_sample = (need(64) - need(16)) / 48
    assert 4.37 * 2**20 <= per_sample <= 3 * 4.37 * 2**20


def test_outcomes_read_off_the_observations_file_must_agree_per_stay() -> None:
    schema = _schema(outcome={**TINY["outcome"], "source": "observations"})  # type: ignore[dict-item]
    obs = (
        "stay_id,time,variable,value,died\n"
        "s1,0.5,hr,100,yes\ns1,2.0,sbp,150,yes\n"
        "s2,1.0,hr,90,no\ns2,2.0,hr,95,yes\n"  # two outcomes for one stay: rejected
        "s3,1.0,hr,90,no\n"
    )
    raw = pd.read_csv(io.StringIO(obs), **schema.read_csv_kwargs())
    validated = validate_series(schema, raw, None)
    report = validated.report
    assert report.rows_kept == 2
    assert report.stays.rejected == {"stay_id": {"outcome differs between lines": 2}}
    assert report.observations.rejected == {"stay_id": {"no valid outcome for the stay": 2}}
    enc = encode_series(schema, validated)
    assert enc.stay_ids == ["s1", "s3"]
    np.testing.assert_array_equal(enc.y, [1, 0])
    file_sourced = validate_series(
        _schema(), *_read(_schema(), obs, "stay_id,died\ns1,yes\ns3,no\n")
    )
    np.testing.assert_array_equal(enc.x, encode_series(_schema(), file_sourced).x)
    with pytest.raises(ValueError, match="file of their own"):
        validate_series(_schema(), raw, None)


def test_wide_per_stay_files_encode_as_their_long_lines() -> None:
    """layout wide: a file per stay, a line per time, a column per variable; empty cells
    are unobserved. The hand-computed example again, written wide."""
    from service.datasets.timeseries import wide_to_long

    schema = _schema(layout="wide")
    s1 = "time,hr,sbp\n0.5,100,\n0.9,120,\n2.0,,150\n3.5,300,\n"
    s2 = "time,hr,sbp,weight\n1.25,,50,\n2.0,,,70\n"  # weight: no such variable
    frames = {
        stay: pd.read_csv(io.StringIO(text), **schema.read_csv_kwargs())
        for stay, text in (("s1", s1), ("s2", s2))
    }
    lines = wide_to_long(schema, frames)
    assert len(lines) == 6
    outcomes = pd.read_csv(io.StringIO(OUTCOMES), **schema.read_outcomes_kwargs())
    validated = validate_series(schema, lines, outcomes)
    assert validated.report.observations.rejected == {"variable": {"unknown variable": 1}}
    long = validate_series(_schema(), *_read(_schema(), OBSERVATIONS))
    np.testing.assert_array_equal(
        encode_series(schema, validated).x, encode_series(_schema(), long).x
    )
    no_time = wide_to_long(schema, {"s1": pd.DataFrame({"hr": ["80"]})})
    report = validate_series(schema, no_time, outcomes).report.observations
    assert report.rejected == {"time": {"missing value": 1}}
    with pytest.raises(SchemaError, match="outcomes file"):
        load_schema_yaml(
            yaml.safe_dump(
                {**TINY, "layout": "wide", "outcome": {**TINY["outcome"], "source": "observations"}}
            )  # type: ignore[dict-item]
        )
