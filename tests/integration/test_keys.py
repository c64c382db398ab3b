"""API key lifecycle (issue 11, item 6): rotation, revocation and expiry, effective at once
for the API and the dashboard, from the API and from the CLI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import update
from typer.testing import CliRunner

from enclave.cli import app
from service.db import engine_for, transaction
from service.ledger.tables import Analyst
from tests.conftest import auth


def test_rotate_and_revoke_take_effect_at_once(client: Any, keys: Any) -> None:
    admin = auth(keys.admin)
    assert client.get("/v1/datasets", headers=auth(keys.alice)).status_code == 200
    r = client.post("/v1/admin/analysts/alice/key", json={}, headers=admin)
    assert r.status_code == 200, r.text
    new = r.json()["api_key"]
    assert new != keys.alice and r.json()["expires_at"] is None
    old = client.get("/v1/datasets", headers=auth(keys.alice))
    assert old.status_code == 401 and "revoked or expired" in old.json()["detail"]
    assert client.get("/v1/datasets", headers=auth(new)).status_code == 200
    assert client.delete("/v1/admin/analysts/alice/key", headers=admin).status_code == 204
    assert client.get("/v1/datasets", headers=auth(new)).status_code == 401
    assert client.delete("/v1/admin/analysts/nobody/key", headers=admin).status_code == 404
    assert client.delete("/v1/admin/analysts/bob/key", headers=auth(keys.bob)).status_code == 403


def test_expired_keys_authenticate_nobody(client: Any, keys: Any, settings: Any) -> None:
    r = client.post(
        "/v1/admin/analysts", json={"name": "carol", "expires_in_days": 1}, headers=auth(keys.admin)
    )
    assert r.status_code == 201
    carol = r.json()["api_key"]
    assert client.get("/v1/datasets", headers=auth(carol)).status_code == 200
    with transaction(engine_for(settings.resolved_database_url)) as s:
        past = datetime.now(UTC) - timedelta(seconds=1)
        s.execute(update(Analyst).where(Analyst.name == "carol").values(key_expires_at=past))
    assert client.get("/v1/datasets", headers=auth(carol)).status_code == 401


def test_a_revoked_admin_key_closes_the_dashboard_session(client: Any, keys: Any) -> None:
    ok = client.post("/dashboard/login", data={"api_key": keys.admin}, follow_redirects=False)
    assert ok.status_code == 303
    assert "Datasets and budgets" in client.get("/dashboard").text
    # A second admin revokes the first one's key: the open session stops working at once.
    other = client.post("/v1/admin/analysts", json={"name": "root2", "role": "admin"},
                        headers=auth(keys.admin)).json()["api_key"]  # fmt: skip
    assert client.delete("/v1/admin/analysts/admin/key", headers=auth(other)).status_code == 204
    page = client.get("/dashboard")
    assert "Datasets and budgets" not in page.text


def test_cli_rotate_and_revoke(settings: Any, keys: Any, client: Any) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["analysts", "rotate", "bob", "--expires-days", "30"])
    assert r.exit_code == 0, r.output
    new = r.output.strip().splitlines()[-1]
    assert new.startswith("enc_")
    assert client.get("/v1/datasets", headers=auth(keys.bob)).status_code == 401
    assert client.get("/v1/datasets", headers=auth(new)).status_code == 200
    assert runner.invoke(app, ["analysts", "revoke", "bob"]).exit_code == 0
    assert client.get("/v1/datasets", headers=auth(new)).status_code == 401
    missing = runner.invoke(app, ["analysts", "revoke", "nobody"])
    assert missing.exit_code == 1 and "no analyst" in missing.output
