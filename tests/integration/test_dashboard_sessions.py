"""Dashboard sign-in (issue 9): server-side sessions, never a key in a cookie; sign-out,
key rotation/revocation and expiry end a session at once; CSRF tokens on every POST form;
security headers on every dashboard response; no forced refresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update

from service.auth import hash_api_key
from service.dashboard.security import HEADERS
from service.db import engine_for, transaction
from service.ledger.tables import DashboardSession
from tests.conftest import auth

SIGN_IN = "Sign in with an admin API key"


def sign_in(client: Any, key: str) -> str:
    """Sign in; returns the session token the cookie holds."""
    r = client.post("/dashboard/login", data={"api_key": key}, follow_redirects=False)
    assert r.status_code == 303, r.text
    token = client.cookies.get("enclave_session")
    assert token
    return str(token)


def page_with(client: Any, token: str, path: str = "/dashboard") -> Any:
    """GET a page sending only this session cookie (as an old browser tab would)."""
    client.cookies.clear()
    return client.get(path, headers={"Cookie": f"enclave_session={token}"})


def csrf_of(html: str) -> str:
    marker = 'name="csrf" value="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]


def test_the_cookie_holds_a_session_token_never_the_key(
    client: Any, keys: Any, settings: Any
) -> None:
    r = client.post("/dashboard/login", data={"api_key": keys.admin}, follow_redirects=False)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert keys.admin not in cookie and keys.admin not in r.text
    attrs = [a.strip().lower() for a in cookie.split(";")]
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/dashboard" in attrs
    assert "secure" not in attrs  # plain http here; https requests get Secure
    token = client.cookies.get("enclave_session")
    assert token and token != keys.admin
    with transaction(engine_for(settings.resolved_database_url)) as s:
        rows = list(s.scalars(select(DashboardSession)))
    # Only the token's hash is stored, bound to the key the session was opened with.
    assert len(rows) == 1 and rows[0].token_hash == hash_api_key(token)
    assert rows[0].key_hash == hash_api_key(keys.admin)
    assert token not in {rows[0].token_hash, rows[0].csrf_token}
    expected = datetime.now(UTC) + timedelta(seconds=settings.dashboard_session_ttl_s)
    expires = rows[0].expires_at.replace(tzinfo=UTC)
    assert abs((expires - expected).total_seconds()) < 60
    assert "Datasets and budgets" in client.get("/dashboard").text
    # An analyst key or garbage opens nothing.
    bad = client.post("/dashboard/login", data={"api_key": keys.alice}, follow_redirects=False)
    assert bad.status_code == 401 and "not an admin key" in bad.text
    assert client.post("/dashboard/login", data={}).status_code == 401


def test_the_cookie_is_secure_over_https(client: Any, keys: Any) -> None:
    r = client.post(
        "https://testserver/dashboard/login",
        data={"api_key": keys.admin},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert "secure" in [a.strip().lower() for a in r.headers["set-cookie"].split(";")]


def test_sign_out_ends_the_session(client: Any, keys: Any, settings: Any) -> None:
    token = sign_in(client, keys.admin)
    page = page_with(client, token)
    assert "Datasets and budgets" in page.text
    r = client.post(
        "/dashboard/logout",
        data={"csrf": csrf_of(page.text)},
        headers={"Cookie": f"enclave_session={token}"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalar(select(func.count()).select_from(DashboardSession)) == 0
    # The old cookie, replayed, is sent back to the sign-in form.
    old = page_with(client, token)
    assert SIGN_IN in old.text and "Datasets and budgets" not in old.text
    r = client.get("/dashboard", headers={"Cookie": f"enclave_session={token}"},
                   follow_redirects=False)  # fmt: skip
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"


def test_rotating_or_revoking_the_admin_key_ends_its_sessions(client: Any, keys: Any) -> None:
    token = sign_in(client, keys.admin)
    other = client.post("/v1/admin/analysts", json={"name": "root2", "role": "admin"},
                        headers=auth(keys.admin)).json()["api_key"]  # fmt: skip
    assert "Datasets and budgets" in page_with(client, token).text
    # Rotation: the session was opened with the old key, so it ends at once.
    r = client.post("/v1/admin/analysts/admin/key", json={}, headers=auth(other))
    assert r.status_code == 200
    assert SIGN_IN in page_with(client, token).text
    # A session opened with the new key ends when that key is revoked.
    token = sign_in(client, r.json()["api_key"])
    assert "Datasets and budgets" in page_with(client, token).text
    assert client.delete("/v1/admin/analysts/admin/key", headers=auth(other)).status_code == 204
    assert SIGN_IN in page_with(client, token).text


def test_an_expired_session_is_refused(client: Any, keys: Any, settings: Any) -> None:
    token = sign_in(client, keys.admin)
    assert "Datasets and budgets" in page_with(client, token).text
    with transaction(engine_for(settings.resolved_database_url)) as s:
        past = datetime.now(UTC) - timedelta(seconds=1)
        s.execute(update(DashboardSession).values(expires_at=past))
    assert SIGN_IN in page_with(client, token).text
    # The next sign-in clears expired rows.
    sign_in(client, keys.admin)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalar(select(func.count()).select_from(DashboardSession)) == 1


def test_a_post_without_the_sessions_csrf_token_is_refused(client: Any, keys: Any) -> None:
    token = sign_in(client, keys.admin)
    good = csrf_of(page_with(client, token).text)
    cookie = {"Cookie": f"enclave_session={token}"}
    for data in ({}, {"csrf": ""}, {"csrf": good[:-1] + ("A" if good[-1] != "A" else "B")}):
        client.cookies.clear()
        r = client.post("/dashboard/logout", data=data, headers=cookie, follow_redirects=False)
        assert r.status_code == 403 and "Nothing was changed" in r.text
        assert r.headers["x-frame-options"] == "DENY"
    # Nothing changed: the session still works. Another session's token does not fit.
    assert "Datasets and budgets" in page_with(client, token).text
    other = sign_in(client, keys.admin)
    client.cookies.clear()
    r = client.post("/dashboard/logout", data={"csrf": good},
                    headers={"Cookie": f"enclave_session={other}"})  # fmt: skip
    assert r.status_code == 403


def test_security_headers_on_every_dashboard_response(client: Any, keys: Any) -> None:
    responses = [
        client.get("/dashboard/login"),
        client.get("/dashboard", follow_redirects=False),
        client.get("/dashboard/style.css"),
        client.get("/dashboard/no-such-page"),
        client.post("/dashboard/login", data={"api_key": "x"}),
    ]
    sign_in(client, keys.admin)
    responses.append(client.get("/dashboard"))
    for r in responses:
        for name, value in HEADERS.items():
            assert r.headers.get(name) == value, (r.url, name)
    csp = HEADERS["Content-Security-Policy"]
    assert "script-src" not in csp and "default-src 'none'" in csp  # no script at all
    assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    page = responses[-1].text
    assert "<script" not in page and 'http-equiv="refresh"' not in page and "style=" not in page
    # The API keeps its own headers.
    assert "content-security-policy" not in client.get("/healthz").headers
