"""A stored row whose JSON fails its documented type (issue 26: tampering, or a newer
writer's key the model lacks) does not fail a listing.

The job's plan, the ledger entry's event and the release's card are corrupted in the
database itself; then: the analyst's listing leaves the job out (200) and a single-item
request for it is a 409 ``unreadable-record`` problem, never a 5xx; the admin's listings
show the row flagged (``unreadable`` says where and why) with the stored JSON as it is;
every other row is served as before (no ``unreadable`` key); each is logged as a warning.

Runs on SQLite and PostgreSQL (the ``settings`` fixture's parametrisation)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import select

from service.db import engine_for, transaction
from service.ledger.tables import EntryKind, Job, LedgerEntry, Release
from tests.conftest import Keys, auth
from tests.integration.test_dashboard import sign_in
from worker.runner import Outcome, execute_job

BODY = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def _submit(client: Any, keys: Keys) -> str:
    r = client.post("/v1/jobs", json=BODY, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _problem(r: Any, status: int, slug: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == f"/problems/{slug}"


def test_a_job_whose_stored_plan_fails_its_type_is_flagged_not_a_500(
    client: Any, keys: Keys, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    good, bad = _submit(client, keys), _submit(client, keys)
    alice, admin = auth(keys.alice), auth(keys.admin)
    before = client.get(f"/v1/admin/jobs/{bad}", headers=admin).json()
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, bad)
        stored = dict(job.plan)
        stored["mechanism"] = {**stored["mechanism"], "steps": "many", "added_later": [1]}
        job.plan = stored
    caplog.set_level(logging.WARNING)

    listed = client.get("/v1/jobs", headers=alice)
    assert listed.status_code == 200, listed.text
    assert [j["id"] for j in listed.json()] == [good]
    assert "unreadable" not in listed.json()[0]
    _problem(client.get(f"/v1/jobs/{bad}", headers=alice), 409, "unreadable-record")
    assert client.get(f"/v1/jobs/{good}", headers=alice).status_code == 200
    assert any(
        r.levelno == logging.WARNING and bad in r.getMessage() and "mechanism" in r.getMessage()
        for r in caplog.records
    )

    rows = client.get("/v1/admin/jobs", headers=admin)
    assert rows.status_code == 200, rows.text
    by_id = {j["id"]: j for j in rows.json()}
    assert set(by_id) == {good, bad}
    assert "unreadable" not in by_id[good]
    flagged = by_id[bad]
    assert "plan.mechanism" in flagged["unreadable"] and "steps" in flagged["unreadable"]
    assert "many" not in flagged["unreadable"]  # where and why, never the value
    assert flagged["plan"] == stored  # the stored JSON as it is
    assert list(flagged["plan"]["mechanism"]) == list(stored["mechanism"])
    # Everything else as the unflagged view showed it before the corruption.
    assert {k: v for k, v in flagged.items() if k not in ("plan", "unreadable")} == {
        k: v for k, v in before.items() if k != "plan"
    }
    one = client.get(f"/v1/admin/jobs/{bad}", headers=admin)
    assert one.status_code == 200 and one.json() == flagged

    # Tests the cursor paging too: one row a page, the flagged one served on its page.
    first = client.get("/v1/admin/jobs?limit=1", headers=admin)
    assert first.status_code == 200 and first.json()[0]["id"] == bad
    second = client.get("/v1/jobs?limit=1", headers=alice)
    assert second.status_code == 200 and second.json() == []  # the page held only `bad`
    assert "X-Next-Cursor" in second.headers


def test_a_ledger_entry_whose_stored_event_fails_its_type_is_flagged(
    client: Any, keys: Keys, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = _submit(client, keys)
    admin = auth(keys.admin)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        entry = s.scalars(
            select(LedgerEntry).where(
                LedgerEntry.job_id == job_id, LedgerEntry.kind == EntryKind.charge
            )
        ).one()
        entry_id = entry.id
        broken = {"type": "no_such_event", "version": 1}
        entry.event = broken
    caplog.set_level(logging.WARNING)
    for url in ("/v1/admin/ledger", "/v1/admin/ledger?dataset=toy"):
        r = client.get(url, headers=admin)
        assert r.status_code == 200, r.text
        entries = {e["id"]: e for e in r.json()}
        assert entries[entry_id]["event"] == broken
        assert entries[entry_id]["unreadable"].startswith("event")
        assert all("unreadable" not in e for i, e in entries.items() if i != entry_id)
    assert any(str(entry_id) in r.getMessage() for r in caplog.records)
    # The hash chain covers the event: verification names the tampered entry.
    verified = client.get("/v1/admin/ledger/verify", headers=admin)
    assert verified.status_code == 200, verified.text
    assert not verified.json()["ok"]
    assert {"where": f"entry {entry_id}", "field": "event"}.items() <= next(
        m for m in verified.json()["mismatches"] if m["field"] == "event"
    ).items()


def test_a_release_whose_stored_card_fails_its_type_is_a_409_problem(
    client: Any, keys: Keys, settings: Any
) -> None:
    job_id = _submit(client, keys)
    assert execute_job(job_id, settings) == Outcome.released
    alice = auth(keys.alice)
    assert client.get(f"/v1/jobs/{job_id}/release", headers=alice).status_code == 200
    with transaction(engine_for(settings.resolved_database_url)) as s:
        release = s.get_one(Release, job_id)
        card = dict(release.card)
        card["mechanism"] = {**card["mechanism"], "epochs": "many"}
        release.card = card
    _problem(client.get(f"/v1/jobs/{job_id}/release", headers=alice), 409, "unreadable-record")
    # The job itself (its plan) is still served.
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).status_code == 200


def test_the_dashboard_and_the_admin_api_show_a_plan_without_its_numbers(
    client: Any, keys: Keys, settings: Any
) -> None:
    """A plan whose ε is not a number: the admin's row has ε null (the plan as stored)."""
    bad = _submit(client, keys)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, bad)
        job.plan = {**job.plan, "epsilon": "lots"}
    row = client.get(f"/v1/admin/jobs/{bad}", headers=auth(keys.admin)).json()
    assert row["epsilon"] is None and row["plan"]["epsilon"] == "lots"
    assert row["unreadable"].startswith("plan.epsilon")
    sign_in(client, keys.admin)
    page = client.get("/dashboard/jobs")
    assert page.status_code == 200
    assert "stored record unreadable" in page.text
