"""The admin dashboard renders budgets, rules, guarantee labels and the ledger."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import auth


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_dashboard_requires_an_admin_and_shows_the_ledger(client: Any, keys: Any) -> None:
    body = {"dataset": "toy", "method": "expm_nf", "epsilon": 0.5, "delta": 0}
    assert client.post("/v1/jobs", json=body, headers=auth(keys.alice)).status_code == 202
    page = client.get("/dashboard")
    assert page.status_code == 200 and "Sign in" in page.text
    bad = client.post("/dashboard/login", data={"api_key": keys.alice}, follow_redirects=False)
    assert bad.status_code == 401
    ok = client.post("/dashboard/login", data={"api_key": keys.admin}, follow_redirects=False)
    assert ok.status_code == 303
    page = client.get("/dashboard")
    assert page.status_code == 200
    text = page.text
    assert "toy" in text and "rdp" in text
    assert "NOMINAL: not proven" in text  # the ExpM+NF job's guarantee label
    assert "verified" in text and "charge" in text
    assert "PLD" in text and "information only" in text
