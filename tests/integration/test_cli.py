"""The admin's `enclave` command on a real ledger."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from enclave.cli import app
from tests.conftest import SMALL_SCHEMA, write_toy_csv

runner = CliRunner()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_admin_workflow(settings: Any, tmp_path: Path) -> None:
    schema = tmp_path / "schema.yaml"
    schema.write_text(yaml.safe_dump(SMALL_SCHEMA))
    csv = write_toy_csv(tmp_path / "toy.csv", n=300)
    # Two bad rows: b out of its declared bounds (rejected), a above its max (clipped).
    with csv.open("a") as f:
        f.write("1.0,5.0,x,yes\n11.0,0.5,y,no\n")
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    register = ["datasets", "register", "toy", "--csv", str(csv), "--schema", str(schema),
                "--epsilon", "3", "--delta", "1e-6"]  # fmt: skip
    r = runner.invoke(app, register)
    assert r.exit_code == 0, r.output
    assert "301 rows kept of 302 (1 rejected)" in r.output
    assert "rejected for b: 1" in r.output and "clipped in a: 1" in r.output
    again = runner.invoke(app, register)
    assert again.exit_code == 1 and "already registered" in again.stderr
    assert "public row count:" in r.output and "DP noisy count" in r.output
    # A budget too small for the ledger, or for its own noisy count: one line, exit 1.
    # (The budget is checked before the name, so "toy" reaches these checks.)
    for eps, count, why in (("1e-7", None, "ε_total"), ("1", "2", "noisy row count")):
        args = [*register[:3], "--csv", str(csv), "--schema", str(schema)]
        args += ["--epsilon", eps, "--delta", "1e-6"]
        args += [] if count is None else ["--count-epsilon", count]
        bad = runner.invoke(app, args)
        assert bad.exit_code == 1 and "refused" in bad.stderr and why in bad.stderr, bad.output
    r = runner.invoke(app, ["analysts", "create", "alice"])
    assert r.exit_code == 0 and r.output.strip().splitlines()[-1].startswith("enc_")
    assert runner.invoke(app, ["analysts", "cap", "alice", "toy", "1", "1e-6"]).exit_code == 0
    assert runner.invoke(app, ["datasets", "budget", "toy", "5", "1e-6"]).exit_code == 0
    listing = runner.invoke(app, ["datasets", "list"])
    assert listing.exit_code == 0 and "toy" in listing.output
    assert runner.invoke(app, ["ledger", "verify"]).exit_code == 0
    r = runner.invoke(app, ["ledger", "check"])
    assert r.exit_code == 0 and "match" in r.output
    show = runner.invoke(app, ["ledger", "show"])
    assert show.exit_code == 0 and "set_budget" not in show.output and "budget" in show.output


def _write_schema(path: Path, **changes: Any) -> Path:
    data = {**SMALL_SCHEMA, **changes}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_check_reports_per_column_without_touching_the_ledger(
    settings: Any, tmp_path: Path
) -> None:
    """`datasets check` runs before `db upgrade` here: it never opens the ledger."""
    schema = _write_schema(tmp_path / "schema.yaml")
    csv = write_toy_csv(tmp_path / "toy.csv", n=100)
    spaced = tmp_path / "toy.txt"
    spaced.write_text(csv.read_text().replace(",", " "))
    wrong = runner.invoke(app, ["datasets", "check", "--csv", str(spaced), "--schema", str(schema)])
    assert wrong.exit_code == 1 and not isinstance(wrong.exception, ValueError), wrong.output
    assert (
        "0 rows kept of 100" in wrong.output and "missing column(s): a, b, c, label" in wrong.output
    )
    assert "rejected for a: 100 (missing column: 100)" in wrong.output
    assert "csv.separator: ' '" in wrong.output and "Traceback" not in wrong.output
    with csv.open("a") as f:
        f.write("1,0.5,w,yes\n20,0.5,x,no\n1,nan,x,yes\n1,3,x,no\n")
    ok = runner.invoke(app, ["datasets", "check", "--csv", str(csv), "--schema", str(schema)])
    assert ok.exit_code == 0, ok.output
    assert "101 rows kept of 104 (3 rejected)" in ok.output
    assert "rejected for b: 2 (NaN or infinite: 1, above max: 1)" in ok.output
    assert "rejected for c: 1 (unknown level: 1)" in ok.output
    assert "clipped in a: 1 (above max: 1)" in ok.output
    assert "nothing was registered" in ok.output
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    assert "toy" not in runner.invoke(app, ["datasets", "list"]).output


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("command", ["check", "register"])
def test_schema_errors_are_one_line_and_exit_nonzero(
    settings: Any, tmp_path: Path, command: str
) -> None:
    csv = write_toy_csv(tmp_path / "toy.csv", n=20)
    bad = _write_schema(
        tmp_path / "bad.yaml", target={"column": "label", "positive": [2], "negative": ["no"]}
    )
    args = ["datasets", command] + (["toy"] if command == "register" else [])
    args += ["--csv", str(csv), "--schema", str(bad)]
    args += ["--epsilon", "1", "--delta", "0"] if command == "register" else []
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert r.output.strip() == (
        "error: invalid schema: bad.yaml: target.positive[0]: Input should be a valid string "
        "(got 2)"
    )
    (tmp_path / "broken.yaml").write_text("name: toy\ncolumns: [\n")
    args[args.index(str(bad))] = str(tmp_path / "broken.yaml")
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    assert "not valid YAML" in r.output


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_register_space_separated_file_and_warn_when_no_method_is_admitted(
    settings: Any, tmp_path: Path
) -> None:
    csv = write_toy_csv(tmp_path / "toy.csv", n=300)
    spaced = tmp_path / "toy.txt.gz"
    spaced.write_bytes(gzip.compress(csv.read_text().replace(",", " ").encode()))
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    comma = _write_schema(tmp_path / "comma.yaml")
    register = ["datasets", "register", "toy", "--csv", str(spaced)]
    refused = runner.invoke(app, [*register, "--schema", str(comma), "--epsilon", "1",
                                  "--delta", "0"])  # fmt: skip
    assert refused.exit_code == 1 and "error: refused: no row passed validation" in refused.stderr
    assert "missing column(s): a, b, c, label" in refused.output
    assert "csv.separator: ' '" in refused.output
    spaced_schema = _write_schema(tmp_path / "space.yaml", csv={"header": True, "separator": " "})
    # δ = 0 and nominal methods off: DP-SGD needs δ > 0, ExpM+NF is nominal.
    r = runner.invoke(app, [*register, "--schema", str(spaced_schema), "--epsilon", "1",
                            "--delta", "0"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "300 rows kept of 300 (0 rejected)" in r.output
    warnings = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "admits no method" in warnings[0]
    assert "dpsgd: dpsgd needs delta > 0" in warnings[0]
    assert "expm_nf: dataset 'toy' does not allow methods with a nominal guarantee" in warnings[0]
    # Either door open: no warning.
    for name, extra in (
        ("toy2", ["--delta", "0", "--allow-nominal"]),
        ("toy3", ["--delta", "1e-6"]),
    ):
        schema = _write_schema(tmp_path / f"{name}.yaml", name=name,
                               csv={"header": True, "separator": " "})  # fmt: skip
        args = ["datasets", "register", name, "--csv", str(spaced), "--schema", str(schema),
                "--epsilon", "1", *extra]  # fmt: skip
        r = runner.invoke(app, args)
        assert r.exit_code == 0 and "warning:" not in r.output, r.output


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_unreadable_file_is_one_line(settings: Any, tmp_path: Path) -> None:
    schema = _write_schema(tmp_path / "schema.yaml")
    fake = tmp_path / "rows.csv.gz"
    fake.write_text("a,b,c,label\n1,0.5,x,yes\n")  # not gzip, despite its name
    r = runner.invoke(app, ["datasets", "check", "--csv", str(fake), "--schema", str(schema)])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: refused: cannot read rows.csv.gz"), lines
    plain = _write_schema(tmp_path / "plain.yaml", csv={"header": True, "compression": "none"})
    r = runner.invoke(app, ["datasets", "check", "--csv", str(fake), "--schema", str(plain)])
    assert r.exit_code == 0 and "1 rows kept of 1" in r.output, r.output


def _user_error(args: list[str], *expected: str) -> None:
    """One line on stderr, exit status 1, no traceback (an uncaught exception would also
    give exit code 1 in CliRunner, with the exception kept: hence the SystemExit check)."""
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert all(e in lines[0] for e in expected), lines[0]
    assert "Traceback" not in r.output


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_user_errors_are_one_line_and_exit_1(settings: Any, tmp_path: Path) -> None:
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    schema = tmp_path / "schema.yaml"
    schema.write_text(yaml.safe_dump(SMALL_SCHEMA))
    csv = write_toy_csv(tmp_path / "toy.csv", n=200)
    register = ["datasets", "register", "toy", "--csv", str(csv), "--schema", str(schema)]
    assert runner.invoke(app, [*register, "--epsilon", "3", "--delta", "1e-6"]).exit_code == 0
    assert runner.invoke(app, ["analysts", "create", "alice"]).exit_code == 0
    before = _ledger_rows(settings)

    _user_error(["analysts", "create", "alice"], "an analyst named 'alice' exists")
    _user_error(["analysts", "create", "not a name"], "name")
    _user_error(["analysts", "create", "carol", "--expires-days", "-1"], "expires_in_days")
    _user_error(["analysts", "rotate", "bob"], "no analyst named 'bob'")
    _user_error(["analysts", "revoke", "bob"], "no analyst named 'bob'")
    _user_error(["analysts", "cap", "bob", "toy", "1", "1e-6"], "no analyst named 'bob'")
    _user_error(["analysts", "cap", "alice", "nope", "1", "1e-6"], "no dataset named 'nope'")
    _user_error(["datasets", "budget", "nope", "5", "1e-6"], "no dataset named 'nope'")
    # Bad numbers: not a number, not finite, out of the API's ranges, below what is spent.
    _user_error(["datasets", "budget", "toy", "lots", "1e-6"], "not a number: 'lots'")
    _user_error(["datasets", "budget", "toy", "nan", "1e-6"], "not a finite number")
    _user_error(["datasets", "budget", "toy", "5", "2"], "delta_total")
    _user_error(["datasets", "budget", "toy", "--", "-1", "0"], "epsilon_total")
    _user_error(["datasets", "budget", "toy", "0.01", "1e-6"], "refused")
    _user_error(["analysts", "cap", "alice", "toy", "inf", "0"], "not a finite number")
    _user_error(["analysts", "cap", "alice", "toy", "1", "1.5"], "delta")
    _user_error([*register, "--epsilon", "x", "--delta", "0"], "not a number: 'x'")
    _user_error([*register, "--epsilon", "3", "--delta", "0"], "already registered")
    bad_schema = tmp_path / "bad.yaml"
    bad_schema.write_text("name: toy\ncolumns: [")
    _user_error(["datasets", "register", "toy", "--csv", str(csv), "--schema", str(bad_schema),
                 "--epsilon", "3", "--delta", "0"], "invalid schema")  # fmt: skip
    _user_error(["db", "upgrade", "--revision", "nonsense"], "nonsense")
    # None of the refused commands wrote to the ledger.
    assert _ledger_rows(settings) == before


def _ledger_rows(settings: Any) -> list[tuple[int, str]]:
    from sqlalchemy import select

    from service.db import engine_for, transaction
    from service.ledger.tables import LedgerEntry

    with transaction(engine_for(settings.resolved_database_url)) as s:
        return [(e.id, e.hash) for e in s.scalars(select(LedgerEntry).order_by(LedgerEntry.id))]


def test_version() -> None:
    from service.version import __version__

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"enclave {__version__}"
    assert __version__ != "0+unknown"
