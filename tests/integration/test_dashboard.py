"""The admin dashboard renders budgets, rules, guarantee labels, jobs and the ledger, and says
what each figure means (which ones are valid, which are information only)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import select, update

from service import admin as ops
from service.db import engine_for, transaction
from service.ledger.tables import Job, JobStatus, LedgerEntry
from service.schemas import BudgetUpdate
from tests.conftest import auth

DPSGD = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def sign_in(client: Any, key: str) -> None:
    r = client.post("/dashboard/login", data={"api_key": key}, follow_redirects=False)
    assert r.status_code == 303


def guarantee_cells(html: str) -> list[str]:
    """The guarantee column of the jobs table (the 9th cell of each row)."""
    rows = re.findall(r"<tr>\s*<td title=.*?</tr>", html, flags=re.S)
    return [re.sub(r"<[^>]+>", "", re.findall(r"<td.*?</td>", r, flags=re.S)[8]) for r in rows]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_dashboard_requires_an_admin_and_shows_the_budgets(
    client: Any, keys: Any, settings: Any
) -> None:
    body = {"dataset": "toy", "method": "expm_nf", "epsilon": 0.5, "delta": 0}
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202
    page = client.get("/dashboard")
    assert page.status_code == 200 and "Sign in" in page.text
    bad = client.post("/dashboard/login", data={"api_key": keys.alice}, follow_redirects=False)
    assert bad.status_code == 401
    sign_in(client, keys.admin)
    page = client.get("/dashboard")
    assert page.status_code == 200
    text = page.text
    assert "toy" in text and "rdp" in text
    assert "verified" in text
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


def test_only_released_jobs_show_a_guarantee(client: Any, keys: Any, settings: Any) -> None:
    """A cancelled or failed job released nothing: no PROVEN (or any) label for it."""
    ids = {}
    for name in ("cancelled", "failed", "released", "queued"):
        r = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice))
        assert r.status_code == 202, r.text
        ids[name] = r.json()["id"]
    assert client.post(f"/v1/jobs/{ids['cancelled']}/cancel", headers=auth(keys.alice)).is_success
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(
            update(Job)
            .where(Job.id == ids["failed"])
            .values(status=JobStatus.failed, error="the job failed")
        )
        s.execute(update(Job).where(Job.id == ids["released"]).values(status=JobStatus.released))
    sign_in(client, keys.admin)
    page = client.get("/dashboard/jobs")
    assert page.status_code == 200
    # Newest first: queued, released, failed, cancelled.
    assert guarantee_cells(page.text) == ["none", "PROVEN", "none", "none"]
    assert page.text.count("PROVEN") == 1
    assert "the job failed" in page.text and "alice" in page.text  # reason and analyst
    for status in ("cancelled", "failed", "released", "queued"):
        assert f"<td>{status}</td>" in page.text


def test_refund_rows_return_epsilon_and_delta(client: Any, keys: Any) -> None:
    r = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice))
    job = r.json()["id"]
    assert client.post(f"/v1/jobs/{job}/cancel", headers=auth(keys.alice)).is_success
    sign_in(client, keys.admin)
    page = client.get("/dashboard/ledger").text
    rows = {
        kind: re.findall(r"<td>([^<]*)</td>", row)
        for row in re.findall(r"<tr><td>\d+</td>.*?</tr>", page, flags=re.S)
        for kind in ("charge", "refund")
        if f"<td>{kind}</td>" in row and job[:8] in row
    }
    # cells: id, time, dataset, kind, job, ε, δ, reason
    charge, refund = rows["charge"], rows["refund"]
    assert float(refund[5]) == -float(charge[5]) < 0
    assert refund[6] == "-" + charge[6] and float(charge[6]) == pytest.approx(1e-5)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", refund[1])


def test_the_ledger_pages_through_every_entry(client: Any, keys: Any, settings: Any) -> None:
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        for i in range(60):
            ops.update_budget(s, "toy", BudgetUpdate(epsilon_total=10 + i, delta_total=1e-5))
        total = ops.count_ledger_entries(s)
        newest = ops.ledger_newest_first(s, limit=1)[0].id
    assert total > 60
    sign_in(client, keys.admin)
    seen: list[int] = []
    page_no = 1
    while True:
        page = client.get(f"/dashboard/ledger?page={page_no}")
        assert page.status_code == 200
        assert f"Page {page_no} of {-(-total // 50)} ({total} in all" in page.text
        seen += [int(x) for x in re.findall(r"<tr><td>(\d+)</td>", page.text)]
        if 'rel="next"' not in page.text:
            break
        page_no += 1
    assert page_no == 2 and len(seen) == total == len(set(seen))
    assert seen[0] == newest and seen == sorted(seen, reverse=True)
    # Past the end: the last page. Not a number: a 400 page, not a 5xx or a problem+json.
    assert client.get("/dashboard/ledger?page=99").text.count("<tr><td>") == total - 50
    for bad in ("abc", "0", "-1", "1e3", "99999999999"):
        r = client.get(f"/dashboard/ledger?page={bad}")
        assert r.status_code == 400 and "whole number" in r.text, bad
        assert r.headers["content-type"].startswith("text/html")
    # The jobs page pages by cursor (test_job_listing.py): a cursor it did not make is a 400.
    assert client.get("/dashboard/jobs?cursor=x").status_code == 400


def test_the_overview_shows_the_verification_details(client: Any, keys: Any, settings: Any) -> None:
    assert client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).status_code == 202
    sign_in(client, keys.admin)
    page = client.get("/dashboard").text
    assert "<strong>verified</strong>" in page and "intact" in page
    assert "Every running total matches its entries." in page
    with transaction(engine_for(settings.resolved_database_url)) as s:
        first = s.scalars(select(LedgerEntry).order_by(LedgerEntry.id)).first()
        assert first is not None
        s.execute(update(LedgerEntry).where(LedgerEntry.id == first.id).values(reason="edited"))
    # The overview verified up to a checkpoint at its first visit and now walks only what
    # is new (issue 26): an edit to an older entry is caught by the full walk, its button.
    assert 'action="/dashboard/verify"' in client.get("/dashboard").text
    page = client.get("/dashboard/verify").text
    assert "MISMATCH" in page and "digest mismatch" in page
    assert re.search(
        rf"<td>toy</td><td>\d+</td>\s*<td class=\"error\">digest mismatch</td><td>{first.id}</td>",
        page,
    )
