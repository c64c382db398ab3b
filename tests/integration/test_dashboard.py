"""The admin dashboard renders budgets, rules, guarantee labels and the ledger, and says
what each figure means (which ones are valid, which are information only)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from service.db import engine_for, transaction
from service.ledger.tables import Job
from tests.conftest import auth


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_dashboard_requires_an_admin_and_shows_the_ledger(
    client: Any, keys: Any, settings: Any
) -> None:
    body = {"dataset": "toy", "method": "expm_nf", "epsilon": 0.5, "delta": 0}
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202
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
    # Audit defect 9: the PLD figure was called "tighter" while it can be looser, and the
    # valid spent figure and the remaining-ε figure were explained nowhere.
    assert "tighter but" not in text and "may be tighter or looser" in text
    assert "ε spent (valid)" in text and "one further pure ε-DP request" in text
    assert "a nominal job has read its rows" not in text  # queued: nothing read yet
    # Audit defect 2: the relation and the public row count are stated for the admin too.
    assert "add/remove one row" in text and "DP noisy count" in text
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(update(Job).where(Job.id == r.json()["id"]).values(data_touched=True))
    text = client.get("/dashboard").text
    assert "NOMINAL: a nominal job has read its rows" in text  # the dataset's label now
