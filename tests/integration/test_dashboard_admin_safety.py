"""Issue 26 (admin): an information-only refund is labelled as such wherever refunds are
shown; the nominal switch is written to the ledger; a blank lifetime keeps a rotated key's
expiry; revoking asks first and never takes the last live admin key; the spending chart
zooms to what is spent; a refusal's Back link returns to the page the form was on."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from typer.testing import CliRunner

from enclave.cli import app
from service.dashboard.security import CONTENT_SECURITY_POLICY
from service.dashboard.views import here, safe_back
from service.db import engine_for, transaction
from service.ledger.audit import verify_all
from service.ledger.tables import Analyst, EntryKind, Job, JobStatus
from tests.conftest import auth
from tests.integration.test_dashboard import DPSGD
from tests.integration.test_dashboard_forms import ledger_rows, post, signed_in

WIDE = {"COLUMNS": "250"}  # rich tables are not folded in the CLI's output


def failed_job(client: Any, keys: Any, settings: Any, *, data_touched: bool) -> str:
    job = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(
            update(Job)
            .where(Job.id == job)
            .values(status=JobStatus.failed, data_touched=data_touched)
        )
    return str(job)


def back_link(page: str) -> str:
    found = re.search(r'<p><a href="([^"]*)">Back</a></p>', page)
    assert found, page
    return html.unescape(found.group(1))


def expires_at(settings: Any, name: str) -> datetime | None:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        ts = s.scalars(select(Analyst.key_expires_at).where(Analyst.name == name)).one()
    return ts.replace(tzinfo=UTC) if ts is not None and ts.tzinfo is None else ts


# ------------------------------------------------------------------ 1. information-only refunds


def test_an_information_only_refund_is_labelled_as_such(
    client: Any, keys: Any, settings: Any
) -> None:
    real = failed_job(client, keys, settings, data_touched=False)
    touched = failed_job(client, keys, settings, data_touched=True)
    by_cli = failed_job(client, keys, settings, data_touched=True)
    csrf = signed_in(client, keys)
    r = post(client, f"/dashboard/jobs/{real}/refund", {"csrf": csrf, "reason": "worker lost"})
    assert r.status_code == 303 and r.headers["location"].endswith("?done=refund")
    r = post(client, f"/dashboard/jobs/{touched}/refund",
             {"csrf": csrf, "reason": "read, then lost", "override": "true"})  # fmt: skip
    assert r.headers["location"].endswith("?done=refund_information_only")
    jobs = client.get(r.headers["location"]).text
    assert "Information-only refund recorded in the ledger" in jobs
    row = {j: re.search(rf'<td title="{j}">.*?</tr>', jobs, flags=re.S) for j in (real, touched)}
    assert row[real] and "refunded (see the ledger)" in row[real].group(0)
    assert row[touched] and "information-only refund recorded" in row[touched].group(0)
    assert "refunded (see the ledger)" not in row[touched].group(0)
    # The ledger page's kind column, the API's entry JSON, the CLI.
    page = client.get("/dashboard/ledger").text
    assert re.search(rf"<td>refund \(information only\)</td>\s*<td>{touched[:8]}</td>", page)
    assert re.search(rf"<td>refund</td>\s*<td>{real[:8]}</td>", page)
    entries = client.get("/v1/admin/ledger", headers=auth(keys.admin)).json()
    labels = {e["job_id"]: (e["kind"], e["label"]) for e in entries if e["kind"] == "refund"}
    assert labels == {real: ("refund", "refund"), touched: ("refund", "refund (information only)")}
    runner = CliRunner()
    out = runner.invoke(
        app, ["admin", "refund", by_cli, "--reason", "lost", "--override"], env=WIDE
    )
    assert out.exit_code == 0 and "information-only refund of job " + by_cli in out.output
    shown = runner.invoke(app, ["ledger", "show"], env=WIDE)
    assert shown.exit_code == 0 and shown.output.count("refund (information only)") == 2


# ------------------------------------------------------------------ 2. the nominal switch


def test_the_nominal_switch_is_written_to_the_ledger(client: Any, keys: Any, settings: Any) -> None:
    csrf = signed_in(client, keys)
    before = len(ledger_rows(settings))
    r = post(client, "/dashboard/datasets/toy/nominal", {"csrf": csrf, "allow_nominal": "false"})
    assert r.status_code == 303
    api = client.put("/v1/admin/datasets/toy/nominal", json={"allow_nominal": True},
                     headers=auth(keys.admin))  # fmt: skip
    assert api.status_code == 200 and api.json()["allow_nominal"] is True
    assert CliRunner().invoke(app, ["datasets", "nominal", "toy", "--deny"]).exit_code == 0
    written = ledger_rows(settings)[before:]
    assert [(e.kind, e.event, e.reason, e.epsilon_micro) for e in written] == [
        (EntryKind.budget, {"action": "set_nominal", "allow_nominal": allow},
         f"nominal methods {'allowed' if allow else 'refused'} by the admin", 0)
        for allow in (False, True, False)
    ]  # fmt: skip
    assert [e.prev_hash for e in written[1:]] == [e.hash for e in written[:-1]]
    page = client.get("/dashboard/ledger").text
    assert page.count("<td>budget (nominal policy)</td>") == 3
    assert "nominal methods refused by the admin" in page
    verified = client.get("/v1/admin/ledger/verify", headers=auth(keys.admin)).json()
    assert verified["ok"] and not verified["mismatches"]
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert all(chain.ok for chain in verify_all(s))
    # A refused switch (no such dataset, a bad value) writes nothing.
    assert post(client, "/dashboard/datasets/nope/nominal",
                {"csrf": csrf, "allow_nominal": "true"}).status_code == 404  # fmt: skip
    assert post(client, "/dashboard/datasets/toy/nominal",
                {"csrf": csrf, "allow_nominal": "x"}).status_code == 422  # fmt: skip
    assert len(ledger_rows(settings)) == before + 3


# ------------------------------------------------------------------ 3. rotating keeps the expiry


def test_a_blank_lifetime_keeps_the_keys_expiry(client: Any, keys: Any, settings: Any) -> None:
    admin = auth(keys.admin)
    r = client.post("/v1/admin/analysts", json={"name": "carol", "expires_in_days": 10},
                    headers=admin)  # fmt: skip
    assert r.status_code == 201
    expiry = expires_at(settings, "carol")
    assert expiry is not None
    # The dashboard: a blank lifetime keeps it; the page says so.
    csrf = signed_in(client, keys)
    assert "blank: keep the current expiry" in client.get("/dashboard/analysts").text
    r = post(client, "/dashboard/analysts/carol/rotate", {"csrf": csrf, "expires_in_days": ""})
    assert r.status_code == 200 and "stopped working" in r.text
    assert expires_at(settings, "carol") == expiry
    # The API: no lifetime (absent or null) keeps it too.
    for body in ({}, {"expires_in_days": None}):
        r = client.post("/v1/admin/analysts/carol/key", json=body, headers=admin)
        assert r.status_code == 200, r.text
        assert datetime.fromisoformat(r.json()["expires_at"]).replace(tzinfo=UTC) == expiry
    # A lifetime replaces it; "no expiry" removes it, on purpose only; both at once: 422.
    r = client.post("/v1/admin/analysts/carol/key", json={"expires_in_days": 30}, headers=admin)
    assert expires_at(settings, "carol") > expiry + timedelta(days=19)  # type: ignore[operator]
    both = {"expires_in_days": 3, "no_expiry": True}
    assert client.post("/v1/admin/analysts/carol/key", json=both, headers=admin).status_code == 422
    r = post(client, "/dashboard/analysts/carol/rotate",
             {"csrf": csrf, "expires_in_days": "", "no_expiry": "true"})  # fmt: skip
    assert r.status_code == 200 and expires_at(settings, "carol") is None
    r = post(client, "/dashboard/analysts/carol/rotate", {"csrf": csrf})
    assert r.status_code == 200 and expires_at(settings, "carol") is None  # none stays none
    # An expired key has no expiry to keep: a blank lifetime is refused (API and dashboard).
    with transaction(engine_for(settings.resolved_database_url)) as s:
        past = datetime.now(UTC) - timedelta(days=1)
        s.execute(update(Analyst).where(Analyst.name == "carol").values(key_expires_at=past))
    api = client.post("/v1/admin/analysts/carol/key", json={}, headers=admin)
    assert api.status_code == 409 and "no expiry to keep" in api.json()["detail"]
    page = post(client, "/dashboard/analysts/carol/rotate", {"csrf": csrf, "expires_in_days": ""})
    assert page.status_code == 409 and "no expiry to keep" in page.text
    cli = CliRunner().invoke(app, ["analysts", "rotate", "carol"])
    assert cli.exit_code == 1 and "no expiry to keep" in cli.output
    r = post(client, "/dashboard/analysts/carol/rotate", {"csrf": csrf, "expires_in_days": "7"})
    assert r.status_code == 200
    renewed = expires_at(settings, "carol")
    assert renewed is not None and renewed > datetime.now(UTC) + timedelta(days=6)


# ------------------------------------------------------------------ 4. revoking


def test_revoking_asks_first_and_never_takes_the_last_admin_key(
    client: Any, keys: Any, settings: Any
) -> None:
    csrf = signed_in(client, keys)
    ask = post(client, "/dashboard/analysts/alice/revoke", {"csrf": csrf})
    assert ask.status_code == 200 and "Revoke alice's key?" in ask.text
    assert ask.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "<script" not in ask.text
    assert 'name="confirm" value="yes"' in ask.text and f'value="{csrf}"' in ask.text
    assert client.get("/v1/datasets", headers=auth(keys.alice)).status_code == 200  # not yet
    done = post(client, "/dashboard/analysts/alice/revoke", {"csrf": csrf, "confirm": "yes"})
    assert done.status_code == 303
    assert client.get("/v1/datasets", headers=auth(keys.alice)).status_code == 401
    # The only admin's own key: refused at both steps, by the API and by the CLI.
    for data in ({"csrf": csrf}, {"csrf": csrf, "confirm": "yes"}):
        r = post(client, "/dashboard/analysts/admin/revoke", data)
        assert r.status_code == 409 and "last live admin key" in r.text, data
    api = client.delete("/v1/admin/analysts/admin/key", headers=auth(keys.admin))
    assert api.status_code == 409 and "last live admin key" in api.json()["detail"]
    cli = CliRunner().invoke(app, ["analysts", "revoke", "admin"])
    assert cli.exit_code == 1 and "last live admin key" in cli.output
    assert "Datasets and budgets" in client.get("/dashboard").text  # still signed in
    # A revoked or expired second admin does not count; a live one does.
    r = client.post("/v1/admin/analysts", json={"name": "root2", "role": "admin"},
                    headers=auth(keys.admin))  # fmt: skip
    assert client.delete("/v1/admin/analysts/root2/key", headers=auth(keys.admin)).is_success
    assert (
        client.delete("/v1/admin/analysts/admin/key", headers=auth(keys.admin)).status_code == 409
    )
    rotated = client.post("/v1/admin/analysts/root2/key", json={}, headers=auth(keys.admin))
    root2 = rotated.json()["api_key"]
    ask = post(client, "/dashboard/analysts/admin/revoke", {"csrf": csrf})
    assert ask.status_code == 200 and "it is your own key" in ask.text
    r = post(client, "/dashboard/analysts/admin/revoke", {"csrf": csrf, "confirm": "yes"})
    assert r.status_code == 303
    assert client.get("/v1/datasets", headers=auth(keys.admin)).status_code == 401
    assert client.delete("/v1/admin/analysts/root2/key", headers=auth(root2)).status_code == 409


# ------------------------------------------------------------------ 5. the chart's zoom


def y_ticks(page: str) -> list[float]:
    svg = page[page.index("<svg") : page.index("</svg>")]
    return [
        float(t) for t in re.findall(r'<text class="tick"[^>]*text-anchor="end">([\d.e+-]+)<', svg)
    ]


def test_the_chart_zooms_to_what_is_spent(client: Any, keys: Any) -> None:
    budget = {"epsilon_total": 50, "delta_total": 1e-5}
    r = client.put("/v1/admin/datasets/toy/budget", json=budget, headers=auth(keys.admin))
    assert r.status_code == 200
    assert client.post("/v1/jobs", json={**DPSGD, "epsilon": 0.5},
                       headers=auth(keys.alice)).status_code == 202  # fmt: skip
    spent = client.get("/v1/admin/datasets/toy/accounting", headers=auth(keys.admin)).json()
    spent = spent["epsilon_spent"]
    assert 0 < spent < 5
    signed_in(client, keys)
    whole = client.get("/dashboard/datasets/toy").text
    assert max(y_ticks(whole)) == pytest.approx(52.5, rel=1e-2)  # the budget × 1.05
    assert 'class="budget"' in whole and 'href="/dashboard/datasets/toy?scale=spent"' in whole
    zoomed = client.get("/dashboard/datasets/toy?scale=spent").text
    assert max(y_ticks(zoomed)) == pytest.approx(spent * 1.1, rel=1e-2)
    assert 'class="budget"' not in zoomed and "the budget ε total 50 is above it" in zoomed
    assert 'href="/dashboard/datasets/toy">Show the whole budget</a>' in zoomed
    assert "<script" not in zoomed
    assert client.get("/dashboard/datasets/toy?scale=huge").status_code == 400


# ------------------------------------------------------------------ 6. Back links


@pytest.mark.parametrize(
    "raw",
    [
        "https://evil.example/dashboard",
        "//evil.example/dashboard",
        "/\\evil.example/dashboard",
        "\\\\evil.example",
        "javascript:alert(1)",
        "/dashboard/../v1/admin/ledger",
        "/dashboardx",
        "/v1/admin/ledger",
        "dashboard/jobs",
        "/dashboard/jobs#frag",
        "/dashboard/jobs\r\nLocation: https://evil.example",
        "/dashboard//evil.example",
        "/dashboard/" + "x" * 3000,
        "",
    ],
)
def test_a_back_field_off_the_dashboard_is_ignored(raw: str) -> None:
    assert safe_back(raw, "/dashboard/jobs") == "/dashboard/jobs"


def test_back_fields_name_the_page_without_its_notice() -> None:
    assert safe_back("/dashboard/jobs?status=failed&cursor=abc", "/x") == (
        "/dashboard/jobs?status=failed&cursor=abc"
    )
    assert safe_back("/dashboard", "/x") == "/dashboard"
    assert here("/dashboard/jobs", "status=failed&done=refund&cursor=a") == (
        "/dashboard/jobs?status=failed&cursor=a"
    )
    assert here("/dashboard/analysts", "done=revoked") == "/dashboard/analysts"


def test_a_refusals_back_link_returns_to_the_forms_page(
    client: Any, keys: Any, settings: Any
) -> None:
    job = failed_job(client, keys, settings, data_touched=True)
    csrf = signed_in(client, keys)
    listing = client.get("/dashboard/jobs?status=failed&analyst=alice&done=refund").text
    back = re.search(r'name="back" value="([^"]*)"', listing)
    assert back and html.unescape(back.group(1)) == "/dashboard/jobs?status=failed&analyst=alice"
    # Refused (the job read rows and no override): Back returns to that page, not page 1.
    r = post(client, f"/dashboard/jobs/{job}/refund",
             {"csrf": csrf, "reason": "lost", "back": html.unescape(back.group(1))})  # fmt: skip
    assert r.status_code == 409
    assert back_link(r.text) == "/dashboard/jobs?status=failed&analyst=alice"
    paged = "/dashboard/jobs?status=failed&cursor=opaque"
    r = post(client, f"/dashboard/jobs/{job}/refund", {"csrf": csrf, "reason": "x", "back": paged})
    assert r.status_code == 422 and back_link(r.text) == paged
    # Anything else falls back to the form's own page.
    r = post(client, f"/dashboard/jobs/{job}/refund",
             {"csrf": csrf, "reason": "lost", "back": "https://evil.example/"})  # fmt: skip
    assert back_link(r.text) == "/dashboard/jobs"
    # The dataset page's forms carry it too (zoomed stays zoomed; budget, nominal, gate, caps).
    page = client.get("/dashboard/datasets/toy?scale=spent").text
    assert page.count('name="back" value="/dashboard/datasets/toy?scale=spent"') == 4
    r = post(client, "/dashboard/datasets/toy/budget",
             {"csrf": csrf, "epsilon_total": "abc", "delta_total": "0",
              "back": "/dashboard/datasets/toy?scale=spent"})  # fmt: skip
    assert r.status_code == 422 and back_link(r.text) == "/dashboard/datasets/toy?scale=spent"
    r = post(client, "/dashboard/analysts/nobody/rotate",
             {"csrf": csrf, "back": "//evil.example/"})  # fmt: skip
    assert r.status_code == 404 and back_link(r.text) == "/dashboard/analysts"
    assert 'name="back" value="/dashboard/analysts"' in client.get("/dashboard/analysts").text
