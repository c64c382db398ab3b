"""Public schemas: CSV options, the per-column validation report, one-line schema errors,
and the analyst's encoding of public rows (with or without the target)."""

from __future__ import annotations

import copy
import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from pydantic import ValidationError

from enclave.analyst import open_release, read_public_csv, score_csv
from service.datasets.kinds import load_schema_yaml
from service.datasets.tabular import (
    SchemaError,
    TabularSchema,
    Target,
    parse_schema,
    validate_frame,
)
from service.datasets.timeseries import SeriesOutcome
from service.modelspec import LogisticSpec
from service.plans import build_plan
from service.releases import encode_for, encode_rows, predict_proba, sha256_bytes
from service.schemas import JobRequest
from tests.conftest import SMALL_SCHEMA, write_toy_csv
from worker.data import prepare_csv
from worker.release import model_card, weights_bytes, write_release

REPO = Path(__file__).resolve().parents[2]
ADULT = REPO / "examples" / "adult"


def _schema(**csv: object) -> TabularSchema:
    data = copy.deepcopy(SMALL_SCHEMA)
    data["csv"] = {**data["csv"], **csv}
    return parse_schema(data)


def _adult() -> TabularSchema:
    return load_schema_yaml((ADULT / "schema.yaml").read_text())


def test_adult_reads_as_before_with_the_default_csv_options() -> None:
    schema = _adult()
    assert schema.csv.separator == "," and schema.csv.compression == "infer"
    report = prepare_csv(schema, ADULT / "adult.data.gz").report
    # The counts the bundled example gave before the csv options existed.
    assert (report.rows_in, report.rows_kept) == (32561, 30162)
    assert report.rejected == {
        "workclass": {"missing value": 1836},
        "occupation": {"missing value": 1843},
        "native-country": {"missing value": 583},
    }


def test_space_separated_file_reads_with_the_separator_option(tmp_path: Path) -> None:
    text = gzip.decompress((ADULT / "adult.test.gz").read_bytes()).decode()
    spaced = tmp_path / "adult-test.txt.gz"
    spaced.write_bytes(gzip.compress(text.replace(", ", " ").encode()))
    comma = prepare_csv(_adult(), ADULT / "adult.test.gz").report
    data = yaml.safe_load((ADULT / "schema.yaml").read_text())
    data["csv"]["separator"] = " "
    right = prepare_csv(parse_schema(data), spaced).report
    assert right == comma and right.rows_kept == 15060
    wrong = prepare_csv(_adult(), spaced).report
    assert wrong.rows_kept == 0
    assert wrong.rejected["age"] == {"not a number": 16281}
    assert wrong.rejected["income"] == {"missing value": 16281}
    assert wrong.hint is not None and "csv.separator: ' '" in wrong.hint


def test_wrong_separator_with_a_header_names_the_missing_columns(tmp_path: Path) -> None:
    csv = write_toy_csv(tmp_path / "toy.csv", n=50)
    semi = tmp_path / "toy-semicolon.csv"
    semi.write_text(csv.read_text().replace(",", ";"))
    report = prepare_csv(_schema(), semi).report
    assert report.rows_kept == 0 and report.missing_columns == ("a", "b", "c", "label")
    assert report.rejected["b"] == {"missing column": 50}
    assert report.hint is not None and "semicolon" in report.hint
    assert any("missing column(s): a, b, c, label" in line for line in report.lines())
    assert prepare_csv(_schema(separator=";"), semi).report.rows_kept == 50


def test_report_counts_each_reason_per_column(tmp_path: Path) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text(
        "a,b,c,label\n"
        "1,0.5,x,yes\n"  # fine
        "11,0.5,y,no\n"  # a above max: clipped, kept
        "-3,0.5,y,no\n"  # a below min: clipped, kept
        "1,5,x,yes\n"  # b above max: rejected
        "1,-2,x,yes\n"  # b below min: rejected
        "1,NaN,x,yes\n"  # b NaN
        "1,inf,x,yes\n"  # b infinite
        "1,abc,x,yes\n"  # b not a number
        "1,,x,yes\n"  # b missing
        "1,0.5,w,yes\n"  # c unknown level
        "1,0.5,x,maybe\n"  # unknown target value
        "zz,9,q,yes\n"  # three reasons in one row
    )
    checked = validate_frame(_schema(), pd.read_csv(csv, **_schema().read_csv_kwargs()))
    report = checked.report
    assert (report.rows_in, report.rows_kept) == (12, 3)
    assert report.rejected == {
        "a": {"not a number": 1},
        "b": {"above max": 2, "below min": 1, "NaN or infinite": 2, "not a number": 1,
              "missing value": 1},
        "c": {"unknown level": 2},
        "label": {"unknown target value": 1},
    }  # fmt: skip
    assert report.clipped == {"a": {"above max": 1, "below min": 1}}
    assert list(checked.kept) == [0, 1, 2]
    assert checked.dropped()[11] == "a: not a number; b: above max; c: unknown level"
    assert checked.frame["a"].tolist() == [1.0, 10.0, 0.0]
    assert "  rejected for b: 7 (" in "\n".join(report.lines())


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["target"].update(positive=[2]),
         "target.positive[0]: Input should be a valid string (got 2)"),
        (lambda d: d.update(colour="red"), "colour: Extra inputs are not permitted"),
        (lambda d: d["csv"].update(sep=";"), "csv.sep: Extra inputs are not permitted"),
        (lambda d: d["columns"][0].update(max="ten"),
         "columns[0] (a).max: Input should be a valid number"),
        (lambda d: d["columns"][1].update(max=-5), "columns[1] (b): column 'b': min must be < max"),
        (lambda d: d["columns"][2].update(type="text"), "columns[2] (c): Input tag 'text'"),
        (lambda d: d.pop("target"), "target: Field required"),
        (lambda d: d.update(columns=[]), "columns: List should have at least 1 item"),
    ],
)  # fmt: skip
def test_schema_errors_are_one_line(edit: object, expected: str) -> None:
    data = copy.deepcopy(SMALL_SCHEMA)
    edit(data)  # type: ignore[operator]
    with pytest.raises(SchemaError) as info:
        load_schema_yaml(yaml.safe_dump(data))
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("name: [unclosed", "not valid YAML at line 1"), ("- a\n- b\n", "must be a YAML mapping")],
)
def test_unreadable_schema_documents_are_one_line(text: str, expected: str) -> None:
    with pytest.raises(SchemaError, match=expected) as info:
        load_schema_yaml(text)
    assert "\n" not in str(info.value)


def test_encode_rows_returns_kept_index_and_a_reason_for_every_dropped_row() -> None:
    raw = pd.DataFrame(
        {"a": ["1", "2", "3", "4"], "b": ["0", "7", "0", "0.5"], "c": ["x", "y", "w", "z"],
         "label": ["yes", "no", "no", "no"]},
        index=["r1", "r2", "r3", "r4"],
    )  # fmt: skip
    rows = encode_rows(_schema(), raw)
    assert list(rows.kept_index) == ["r1", "r4"]
    assert rows.dropped == {"r2": "b: above max", "r3": "c: unknown level"}
    assert rows.y is not None and rows.y.tolist() == [1.0, 0.0]
    np.testing.assert_allclose(rows.x[1], [0.4, 0.75, 0, 0, 1])
    unlabelled = encode_rows(_schema(), raw.drop(columns=["label"]))
    assert unlabelled.y is None and list(unlabelled.kept_index) == ["r1", "r4"]
    np.testing.assert_array_equal(unlabelled.x, rows.x)
    # An unknown target value drops the row only when the target is encoded.
    raw.loc["r1", "label"] = "maybe"
    assert list(encode_rows(_schema(), raw, labelled=False).kept_index) == ["r1", "r4"]
    assert encode_rows(_schema(), raw).dropped["r1"] == "label: unknown target value"
    with pytest.raises(ValueError, match="no target column 'label'"):
        encode_rows(_schema(), raw.drop(columns=["label"]), labelled=True)
    with pytest.raises(ValueError, match=r"no column\(s\) \['b'\]"):
        encode_rows(_schema(), raw.drop(columns=["b"]))


def _toy_release(tmp_path: Path) -> Path:
    """A real release (worker.release) of the toy data's true logistic model: the labels
    of write_toy_csv follow logit = 0.6(a − 5) + 2b + 1.5[c = z]; on the encoded features
    (a/10, (b + 1)/2, one-hot c) that is 6·a' + 4·b' + 1.5·z − 5."""
    schema = _schema()
    request = JobRequest(dataset="toy", method="expm_nf", epsilon=1.0, model=LogisticSpec())
    plan = build_plan(request, n_rows=400, n_features=schema.n_features)
    weights = weights_bytes(
        [{"linear.weight": torch.tensor([[6.0, 4.0, 0.0, 0.0, 1.5]]),
          "linear.bias": torch.tensor([-5.0])}]
    )  # fmt: skip
    card = model_card(
        job_id="job", run_token="run", plan=plan, public_schema=schema.model_dump(mode="json"),
        count_epsilon=0.01, weights_sha256=sha256_bytes(weights), samples=1,
    )  # fmt: skip
    return write_release(tmp_path / "releases", "job", "run", weights, card).directory


def test_score_csv_predicts_and_gives_the_auc(tmp_path: Path) -> None:
    release = _toy_release(tmp_path)
    holdout = write_toy_csv(tmp_path / "holdout.csv", n=2000, seed=7)
    with holdout.open("a") as f:
        f.write("5,0.5,w,yes\n")  # an unknown level: dropped, with its reason
    scored = score_csv(release, holdout)
    assert len(scored.probabilities) == len(scored.kept_index) == 2000
    assert scored.dropped == {2000: "c: unknown level"}
    assert scored.auc is not None and scored.auc > 0.75
    # The same rows through the lower-level helpers give the same numbers.
    loaded = open_release(release / "card.json")
    x, y = encode_for(loaded, read_public_csv(loaded.schema, holdout))
    np.testing.assert_array_equal(y, scored.y)
    np.testing.assert_array_equal(predict_proba(loaded, x), scored.probabilities)
    a, b, z = (read_public_csv(loaded.schema, holdout).iloc[0][k] for k in "abc")
    logit = 6 * float(a) / 10 + 4 * (float(b) + 1) / 2 + 1.5 * (z == "z") - 5
    assert scored.probabilities[0] == pytest.approx(1 / (1 + np.exp(-logit)), rel=1e-5)
    # Unlabelled rows: predictions, no AUC.
    unlabelled = tmp_path / "unlabelled.csv"
    pd.read_csv(holdout).drop(columns=["label"]).to_csv(unlabelled, index=False)
    bare = score_csv(release, unlabelled)
    assert bare.auc is None and bare.y is None
    np.testing.assert_allclose(bare.probabilities, scored.probabilities)
    # A tampered weights file is refused (the card's SHA-256).
    (release / "model.safetensors").write_bytes(b"x" * 10)
    with pytest.raises(ValueError, match="sha256"):
        open_release(release)


def test_regex_separator_and_a_warning_when_no_public_row_passes(tmp_path: Path) -> None:
    (tmp_path / "ws.txt").write_text("a   b c label\n1  0.5   x yes\n2 0.1 y no\n")
    assert prepare_csv(_schema(separator=r"\s+"), tmp_path / "ws.txt").report.rows_kept == 2
    (tmp_path / "pipes.txt").write_text("a||b||c||label\n1||0.5||x||yes\n")
    assert prepare_csv(_schema(separator=r"\|\|"), tmp_path / "pipes.txt").report.rows_kept == 1
    # Header-less rows read with the wrong separator: every row dropped, and a warning.
    names = _schema(header=False, names=["a", "b", "c", "label"])
    spaced = pd.read_csv(tmp_path / "ws.txt", **names.read_csv_kwargs())
    with pytest.warns(UserWarning, match="no row passed validation"):
        rows = encode_rows(_schema(), spaced)
    assert len(rows.kept_index) == 0 and len(rows.dropped) == 3


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"positive": ["a"], "negative": ["a"]}, "value cannot be both positive and negative"),
        ({"positive": ["a"], "classes": ["a", "b", "c"]}, "either positive/negative or classes"),
        ({"classes": ["a", "a", "c"]}, "classes must be distinct"),
        ({"positive": ["a"]}, "declares positive and negative values, or classes"),
    ],
)
def test_a_target_and_an_outcome_check_their_values_alike(values: dict, why: str) -> None:
    """One check of declared label values (service.datasets.tabular.DeclaredValues) for a
    tabular target and a time-series outcome, each naming itself."""
    for model, noun in ((Target, "target"), (SeriesOutcome, "outcome")):
        with pytest.raises(ValidationError, match=why) as caught:
            model(column="y", **values)
        assert noun in str(caught.value)
    target = Target(column="y", classes=["a", "b", "c"])
    outcome = SeriesOutcome(column="y", positive=["p"], negative=["n", "m"])
    assert (target.values, target.n_classes) == (["a", "b", "c"], 3)
    assert (outcome.values, outcome.n_classes) == (["p", "n", "m"], 2)
