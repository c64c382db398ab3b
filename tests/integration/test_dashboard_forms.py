"""Dashboard pages and forms (issue 9): each form changes the ledger exactly as the admin API
route does (they call the same functions of service/admin.py), refuses bad input with a 4xx
page and changes nothing then, needs the session's CSRF token; the per-dataset chart has one
marker per charge, refund and release."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import func, select, update

from service.db import engine_for, transaction
from service.ledger.tables import EntryKind, Job, JobStatus, LedgerEntry
from tests.conftest import auth
from tests.integration.test_dashboard import DPSGD
from tests.integration.test_dashboard_sessions import csrf_of


def signed_in(client: Any, keys: Any) -> str:
    """Sign in as the admin; returns the session's CSRF token."""
    r = client.post("/dashboard/login", data={"api_key": keys.admin})
    assert r.status_code == 200 and "Datasets and budgets" in r.text
    return csrf_of(r.text)


def ledger_rows(settings: Any) -> list[LedgerEntry]:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        rows = list(s.scalars(select(LedgerEntry).order_by(LedgerEntry.id)))
        s.expunge_all()
        return rows


def accounting(client: Any, keys: Any) -> dict[str, Any]:
    r = client.get("/v1/admin/datasets/toy/accounting", headers=auth(keys.admin))
    assert r.status_code == 200
    return dict(r.json())


def post(client: Any, path: str, data: dict[str, str]) -> Any:
    return client.post(path, data=data, follow_redirects=False)


def test_budget_and_nominal_forms_write_what_the_api_writes(
    client: Any, keys: Any, settings: Any
) -> None:
    csrf = signed_in(client, keys)
    r = post(client, "/dashboard/datasets/toy/budget",
             {"csrf": csrf, "epsilon_total": "12.5", "delta_total": "2e-5"})  # fmt: skip
    assert r.status_code == 303 and r.headers["location"].endswith("?done=budget")
    assert "Budget saved." in client.get(r.headers["location"]).text
    by_form = ledger_rows(settings)[-1]
    a = accounting(client, keys)
    assert (a["epsilon_total"], a["delta_total"]) == (12.5, 2e-5)
    api = client.put("/v1/admin/datasets/toy/budget", headers=auth(keys.admin),
                     json={"epsilon_total": 12.5, "delta_total": 2e-5})  # fmt: skip
    assert api.status_code == 200
    by_api = ledger_rows(settings)[-1]
    assert by_form.kind == by_api.kind == EntryKind.budget
    assert (by_form.event, by_form.reason) == (by_api.event, by_api.reason)
    # Refused: below what is spent (409), not a number or out of range (422); nothing written.
    before = len(ledger_rows(settings))
    for data, status in (
        ({"epsilon_total": "0.001", "delta_total": "2e-5"}, 409),
        ({"epsilon_total": "abc", "delta_total": "2e-5"}, 422),
        ({"epsilon_total": "nan", "delta_total": "2e-5"}, 422),
        ({"epsilon_total": "5", "delta_total": "1.5"}, 422),
        ({}, 422),
    ):
        r = post(client, "/dashboard/datasets/toy/budget", {"csrf": csrf, **data})
        assert r.status_code == status and "Nothing was changed" in r.text, data
    missing = {"csrf": csrf, "epsilon_total": "5", "delta_total": "0"}
    assert post(client, "/dashboard/datasets/nope/budget", missing).status_code == 404
    assert len(ledger_rows(settings)) == before
    assert accounting(client, keys)["epsilon_total"] == 12.5
    # The nominal policy toggle.
    expm = {"dataset": "toy", "method": "expm_nf", "epsilon": 0.5, "delta": 0}
    r = post(client, "/dashboard/datasets/toy/nominal", {"csrf": csrf, "allow_nominal": "false"})
    assert r.status_code == 303
    refused = client.post("/v1/jobs", json=expm, headers=auth(keys.alice))
    assert refused.json()["type"] == "/problems/nominal-not-allowed"
    assert 'value="false" checked' in client.get("/dashboard/datasets/toy").text
    r = post(client, "/dashboard/datasets/toy/nominal", {"csrf": csrf, "allow_nominal": "true"})
    assert r.status_code == 303
    assert client.post("/v1/jobs", json=expm, headers=auth(keys.alice)).status_code == 202
    bad = post(client, "/dashboard/datasets/toy/nominal", {"csrf": csrf, "allow_nominal": "x"})
    assert bad.status_code == 422


def test_cap_form_sets_the_cap_the_api_would(client: Any, keys: Any, settings: Any) -> None:
    csrf = signed_in(client, keys)
    assert client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).status_code == 202
    r = post(client, "/dashboard/datasets/toy/caps",
             {"csrf": csrf, "analyst": "alice", "epsilon": "3", "delta": "1e-5"})  # fmt: skip
    assert r.status_code == 303
    by_form = ledger_rows(settings)[-1]
    assert by_form.event == {"action": "set_cap", "epsilon": 3.0, "delta": "0.00001"}
    api = client.put("/v1/admin/datasets/toy/caps/alice", headers=auth(keys.admin),
                     json={"epsilon": 3, "delta": 1e-5})  # fmt: skip
    assert api.status_code == 200
    by_api = ledger_rows(settings)[-1]
    assert (by_form.event, by_form.reason, by_form.analyst_id) == (
        by_api.event, by_api.reason, by_api.analyst_id,
    )  # fmt: skip
    page = client.get("/dashboard/datasets/toy").text
    assert "<td>alice</td>" in page and "(3, 1e-05)" in page
    assert "alice" in client.get("/dashboard/analysts").text
    # A cap the next request does not fit refuses it (the cap is in force).
    r = post(client, "/dashboard/datasets/toy/caps",
             {"csrf": csrf, "analyst": "bob", "epsilon": "0.1", "delta": "1e-5"})  # fmt: skip
    assert r.status_code == 303
    assert client.post("/v1/jobs", json=DPSGD, headers=auth(keys.bob)).status_code == 409
    before = len(ledger_rows(settings))
    for data, status in (
        ({"analyst": "nobody", "epsilon": "1", "delta": "0"}, 404),
        ({"analyst": "alice", "epsilon": "0.001", "delta": "1e-5"}, 409),  # below spent
        ({"analyst": "alice", "epsilon": "-1", "delta": "0"}, 422),
    ):
        r = post(client, "/dashboard/datasets/toy/caps", {"csrf": csrf, **data})
        assert r.status_code == status and "Nothing was changed" in r.text, data
    assert len(ledger_rows(settings)) == before


def test_analyst_forms_create_rotate_and_revoke_keys(client: Any, keys: Any) -> None:
    csrf = signed_in(client, keys)
    r = post(client, "/dashboard/analysts",
             {"csrf": csrf, "name": "carol", "role": "analyst", "expires_in_days": ""})  # fmt: skip
    assert r.status_code == 200 and "shown once" in r.text
    carol = re.search(r'value="(enc_[^"]+)"', r.text)
    assert carol
    assert client.get("/v1/datasets", headers=auth(carol.group(1))).status_code == 200
    dup = post(client, "/dashboard/analysts", {"csrf": csrf, "name": "carol", "role": "analyst"})
    assert dup.status_code == 409 and "exists" in dup.text
    for bad in ({"name": "no spaces"}, {"name": "x", "role": "root"},
                {"name": "dave", "expires_in_days": "-3"}):  # fmt: skip
        assert post(client, "/dashboard/analysts", {"csrf": csrf, **bad}).status_code == 422
    r = post(client, "/dashboard/analysts/carol/rotate", {"csrf": csrf, "expires_in_days": "30"})
    assert r.status_code == 200 and "stopped working" in r.text
    new = re.search(r'value="(enc_[^"]+)"', r.text)
    assert new and new.group(1) != carol.group(1)
    assert client.get("/v1/datasets", headers=auth(carol.group(1))).status_code == 401
    assert client.get("/v1/datasets", headers=auth(new.group(1))).status_code == 200
    r = post(client, "/dashboard/analysts/carol/revoke", {"csrf": csrf})
    assert r.status_code == 200 and "Revoke carol's key?" in r.text  # asks first (issue 26)
    assert client.get("/v1/datasets", headers=auth(new.group(1))).status_code == 200
    r = post(client, "/dashboard/analysts/carol/revoke", {"csrf": csrf, "confirm": "yes"})
    assert r.status_code == 303
    assert client.get("/v1/datasets", headers=auth(new.group(1))).status_code == 401
    page = client.get("/dashboard/analysts").text
    assert re.search(r"<td>carol</td><td>analyst</td><td[^>]*>revoked</td>", page)
    assert post(client, "/dashboard/analysts/nobody/revoke", {"csrf": csrf}).status_code == 404
    assert post(client, "/dashboard/analysts/nobody/rotate", {"csrf": csrf}).status_code == 404


def test_refund_form_refunds_a_failed_job(client: Any, keys: Any, settings: Any) -> None:
    csrf = signed_in(client, keys)
    job = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    spent = accounting(client, keys)["naive_epsilon_sum"]
    not_failed = post(client, f"/dashboard/jobs/{job}/refund", {"csrf": csrf, "reason": "oops"})
    assert not_failed.status_code == 409 and "only failed jobs" in not_failed.text
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(update(Job).where(Job.id == job).values(status=JobStatus.failed))
    assert post(client, f"/dashboard/jobs/{job}/refund",
                {"csrf": csrf, "reason": "x"}).status_code == 422  # fmt: skip
    assert 'action="/dashboard/jobs/' + job in client.get("/dashboard/jobs").text
    r = post(client, f"/dashboard/jobs/{job}/refund", {"csrf": csrf, "reason": "worker lost"})
    assert r.status_code == 303
    refund = ledger_rows(settings)[-1]
    assert refund.kind == EntryKind.refund and refund.reason == "worker lost"
    assert refund.epsilon_micro < 0 and refund.job_id == job
    assert accounting(client, keys)["naive_epsilon_sum"] < spent
    jobs_page = client.get("/dashboard/jobs").text
    assert (
        "refunded (see the ledger)" in jobs_page
        and f"/dashboard/jobs/{job}/refund" not in jobs_page
    )
    again = post(client, f"/dashboard/jobs/{job}/refund", {"csrf": csrf, "reason": "again"})
    assert again.status_code == 409 and "already refunded" in again.text
    assert post(client, "/dashboard/jobs/nope/refund",
                {"csrf": csrf, "reason": "none"}).status_code == 404  # fmt: skip


def test_forms_without_the_csrf_token_change_nothing(client: Any, keys: Any, settings: Any) -> None:
    csrf = signed_in(client, keys)
    job = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(update(Job).where(Job.id == job).values(status=JobStatus.failed))
    before = ledger_rows(settings)
    forms = [
        ("/dashboard/datasets/toy/budget", {"epsilon_total": "20", "delta_total": "1e-5"}),
        ("/dashboard/datasets/toy/nominal", {"allow_nominal": "false"}),
        ("/dashboard/datasets/toy/caps", {"analyst": "alice", "epsilon": "1", "delta": "0"}),
        ("/dashboard/analysts", {"name": "mallory", "role": "admin"}),
        ("/dashboard/analysts/alice/rotate", {}),
        ("/dashboard/analysts/alice/revoke", {}),
        (f"/dashboard/jobs/{job}/refund", {"reason": "forged"}),
    ]
    for path, data in forms:
        for token in (None, "", csrf[::-1]):
            sent = data if token is None else {**data, "csrf": token}
            r = post(client, path, sent)
            assert r.status_code == 403, (path, token)
    assert [e.hash for e in ledger_rows(settings)] == [e.hash for e in before]
    assert client.get("/v1/datasets", headers=auth(keys.alice)).status_code == 200
    assert "mallory" not in client.get("/dashboard/analysts").text
    assert client.post("/v1/jobs", json={"dataset": "toy", "method": "expm_nf", "epsilon": 0.5,
                       "delta": 0}, headers=auth(keys.alice)).status_code == 202  # fmt: skip


def test_the_chart_marks_every_charge_refund_and_release(
    client: Any, keys: Any, settings: Any
) -> None:
    ids = [
        client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"] for _ in range(3)
    ]
    assert client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth(keys.alice)).is_success
    signed_in(client, keys)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        count = {
            kind: s.scalar(
                select(func.count()).select_from(LedgerEntry).where(LedgerEntry.kind == kind)
            )
            for kind in (EntryKind.charge, EntryKind.refund, EntryKind.release)
        }
    assert count == {EntryKind.charge: 4, EntryKind.refund: 1, EntryKind.release: 0}
    page = client.get("/dashboard/datasets/toy").text
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert svg.count('class="pt charge"') == count[EntryKind.charge]  # incl. the noisy count
    assert svg.count('class="pt refund"') == 1 and svg.count('class="pt release"') == 0
    assert '<title id="chart-title">Cumulative ε spent on toy' in svg and "<figcaption>" in page
    # The line ends at the valid ε spent the accounting reports; markers' labels say so.
    spent = accounting(client, keys)["epsilon_spent"]
    labels = re.findall(r"<title>([^<]+)</title>", svg)
    assert labels[-1].startswith("refund of job " + ids[0][:8])
    assert labels[-1].endswith(f"ε spent {spent:.4g}")
    assert "script" not in svg
