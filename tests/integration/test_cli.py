"""The admin's `enclave` command on a real ledger."""

from __future__ import annotations

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
    assert again.exit_code == 2 and "already registered" in again.output
    assert "public row count:" in r.output and "DP noisy count" in r.output
    # A budget too small for the ledger, or for its own noisy count: one line, exit 2.
    # (The budget is checked before the name, so "toy" reaches these checks.)
    for eps, count, why in (("1e-7", None, "ε_total"), ("1", "2", "noisy row count")):
        args = [*register[:3], "--csv", str(csv), "--schema", str(schema)]
        args += ["--epsilon", eps, "--delta", "1e-6"]
        args += [] if count is None else ["--count-epsilon", count]
        bad = runner.invoke(app, args)
        assert bad.exit_code == 2 and "refused" in bad.output and why in bad.output, bad.output
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
