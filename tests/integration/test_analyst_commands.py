"""Issue 26 (analyst): `enclave jobs datasets list|show` and `enclave jobs cancel` against a
live API, and the quote's explanation of "remaining ε" when the ledger refuses."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from enclave.cli import app
from enclave.privacy_text import REMAINING_EXPLANATION, privacy_number
from tests.conftest import Keys, auth

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

runner = CliRunner()
REQUEST = ["--dataset", "toy", "--method", "dpsgd", "--epsilon", "1", "--delta", "1e-5"]


def jobs(live: str, key: str, *args: str) -> Any:
    env = {"ENCLAVE_URL": live, "ENCLAVE_API_KEY": key, "COLUMNS": "250"}
    return runner.invoke(app, ["jobs", *args], env=env)


def one_error_line(result: Any) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return str(lines[0])


def unwrapped(text: str) -> str:
    return " ".join(text.split())


def test_datasets_list_and_show(live: str, keys: Keys) -> None:
    ds = httpx.get(f"{live}/v1/datasets/toy", headers=auth(keys.alice)).json()
    remaining = ds["budget"]["remaining_epsilon"]  # 10 less the count's ε and the RDP cost

    listing = jobs(live, keys.alice, "datasets", "list")
    assert listing.exit_code == 0, listing.output + listing.stderr
    out = listing.output
    assert "toy" in out and "tabular" in out and str(ds["n_rows"]) in out and "rdp" in out
    # Six significant digits, rounded down (never more than the ledger would admit).
    assert privacy_number(remaining, down=True) in out
    assert repr(remaining) not in out and "no cap" in out
    assert unwrapped(REMAINING_EXPLANATION) in unwrapped(out)

    show = jobs(live, keys.alice, "datasets", "show", "toy", "--schema")
    assert show.exit_code == 0, show.output + show.stderr
    out = show.output
    assert "Dataset toy" in out and "a, b, c" in out and "label" in out and "rdp rule" in out
    assert "DP noisy count, ε = 0.1 charged at registration" in out
    assert "your cap" in out and "no cap on this dataset" in out
    assert json.loads(out[out.index("{") :]) == ds["public_schema"]

    # One error line, as every analyst command.
    assert one_error_line(jobs(live, keys.alice, "datasets", "show", "nope")) == (
        "error: Not found: no dataset named 'nope'"
    )
    no_key = runner.invoke(app, ["jobs", "datasets", "list"], env={"ENCLAVE_API_KEY": ""})
    assert one_error_line(no_key).startswith("error: no API key")


def test_cancel_refunds_a_queued_job(live: str, keys: Keys) -> None:
    def remaining() -> float:
        ds = httpx.get(f"{live}/v1/datasets/toy", headers=auth(keys.alice)).json()
        return float(ds["budget"]["remaining_epsilon"])

    before = remaining()
    s = jobs(live, keys.alice, "submit", *REQUEST)
    assert s.exit_code == 0, s.output + s.stderr
    job_id = s.output.strip().splitlines()[-1]
    assert remaining() < before

    assert one_error_line(jobs(live, keys.bob, "cancel", job_id)).startswith("error: Not found: ")
    c = jobs(live, keys.alice, "cancel", job_id)
    assert c.exit_code == 0, c.output + c.stderr
    assert f"job {job_id} cancelled: ε = 1, δ = 1e-05 refunded" in unwrapped(c.output)
    assert remaining() == before
    job = httpx.get(f"{live}/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "cancelled"

    again = one_error_line(jobs(live, keys.alice, "cancel", job_id))
    assert again == "error: Conflict: only queued jobs can be cancelled (this one is cancelled)"
    missing = one_error_line(jobs(live, keys.alice, "cancel", "no-such-job"))
    assert missing.startswith("error: Not found: ")


def test_refused_quote_explains_remaining_under_the_rdp_rule(live: str, keys: Keys) -> None:
    ds = httpx.get(f"{live}/v1/datasets/toy", headers=auth(keys.alice)).json()
    remaining = ds["budget"]["remaining_epsilon"]
    # The case: a DP-SGD request whose stated ε is below the remaining ε, refused.
    epsilon = f"{remaining - 0.3:.2f}"
    r = jobs(live, keys.alice, "quote", *REQUEST[:4], "--epsilon", epsilon, "--delta", "1e-5")
    assert float(epsilon) < remaining
    assert one_error_line(r).startswith("error: not admitted: the dataset's budget is exceeded")
    out = unwrapped(r.output)
    assert unwrapped(REMAINING_EXPLANATION) in out
    assert "Why refused:" in out and "remaining on the dataset's budget" in out
    assert "ε of one further PURE request" in out and "charged_epsilon" in out
    assert "a stated ε below the remaining ε can be refused" in out
    # No raw floats: every ε and δ has at most 6 significant digits.
    assert repr(remaining) not in r.output

    # Admitted under the RDP rule: what "remaining" means, but no refusal.
    ok = jobs(live, keys.alice, "quote", *REQUEST)
    assert ok.exit_code == 0, ok.output + ok.stderr
    assert unwrapped(REMAINING_EXPLANATION) in unwrapped(ok.output)
    assert "Why refused" not in ok.output
