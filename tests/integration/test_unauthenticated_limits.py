"""Issue 19 item 9: traffic with no key to charge (missing or invalid API keys, dashboard
sign-in guesses, ``/metrics``) is rate-limited per client address, and ``/metrics`` can
require a bearer token."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.app import create_app
from service.config import Settings
from tests.conftest import auth


@contextmanager
def _client(settings: Settings, **update: Any) -> Iterator[TestClient]:
    # The suite's fixture turns the address limits off (tests/conftest.py); on here.
    limited = settings.model_copy(update={"address_rate_limits": True, **update})
    with TestClient(create_app(limited, run_sweeper=False), raise_server_exceptions=False) as c:
        yield c


def _limited(r: Any) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == "/problems/rate-limited"
    assert int(r.headers["Retry-After"]) >= 1


def test_address_limits_are_on_by_default() -> None:
    fields = Settings.model_fields
    assert fields["address_rate_limits"].default is True
    assert fields["trust_forwarded_for"].default is False
    assert fields["metrics_token"].default is None


def test_invalid_keys_get_429_after_the_burst_and_valid_keys_are_not_slowed(
    settings: Settings, keys: Any
) -> None:
    with _client(settings, unauth_rate_limit_burst=5, unauth_rate_limit_per_s=0.01) as c:
        bad = [c.get("/v1/datasets", headers=auth(f"enc_guess{i}")) for i in range(4)]
        missing = c.get("/v1/datasets")  # no key at all spends from the same bucket
        assert [r.status_code for r in [*bad, missing]] == [401] * 5
        over = c.get("/v1/datasets", headers=auth("enc_guess5"))
        _limited(over)
        assert int(over.headers["Retry-After"]) >= 90  # one token per 100 s
        _limited(c.get("/v1/datasets"))
        # Same address, valid keys: their own buckets, untouched by the guesses.
        for _ in range(10):
            assert c.get("/v1/datasets", headers=auth(keys.alice)).status_code == 200
        assert c.get("/v1/admin/ledger", headers=auth(keys.admin)).status_code == 200
        # ...and the address is still refused without one.
        _limited(c.get("/v1/datasets", headers=auth("enc_guess6")))


def test_dashboard_sign_in_attempts_get_429_after_the_burst(settings: Settings, keys: Any) -> None:
    with _client(settings) as c:  # defaults: a burst of 10, then one a minute
        codes = [
            c.post("/dashboard/login", data={"api_key": f"guess{i}"}).status_code for i in range(10)
        ]
        assert codes == [401] * 10
        # Over the limit even the right key is not looked at.
        r = c.post("/dashboard/login", data={"api_key": keys.admin}, follow_redirects=False)
        _limited(r)
        assert 30 <= int(r.headers["Retry-After"]) <= 60
        # The API keys' buckets are separate.
        assert c.get("/v1/datasets", headers=auth(keys.alice)).status_code == 200


def test_successful_sign_ins_count_too(settings: Settings, keys: Any) -> None:
    with _client(settings, login_rate_limit_burst=3) as c:
        for _ in range(3):
            r = c.post("/dashboard/login", data={"api_key": keys.admin}, follow_redirects=False)
            assert r.status_code == 303
        _limited(c.post("/dashboard/login", data={"api_key": keys.admin}))


def test_forwarded_for_is_ignored_unless_trusted(settings: Settings) -> None:
    def guesses(c: TestClient) -> list[int]:
        return [
            c.post(
                "/dashboard/login",
                data={"api_key": "guess"},
                headers={"X-Forwarded-For": f"203.0.113.{i}"},
            ).status_code
            for i in range(3)
        ]

    with _client(settings, login_rate_limit_burst=2) as c:
        assert guesses(c) == [401, 401, 429]  # a spoofed header gives no fresh bucket
    with _client(settings, login_rate_limit_burst=2, trust_forwarded_for=True) as c:
        assert guesses(c) == [401, 401, 401]  # each proxied client has its own


def test_metrics_is_rate_limited(settings: Settings) -> None:
    with _client(settings, unauth_rate_limit_burst=3, unauth_rate_limit_per_s=0.01) as c:
        assert [c.get("/metrics").status_code for _ in range(3)] == [200] * 3
        _limited(c.get("/metrics"))


def test_metrics_token_is_required_when_set(settings: Settings) -> None:
    with _client(settings, metrics_token=SecretStr("s3cret-scrape")) as c:
        for headers in ({}, auth("wrong"), {"Authorization": "Basic s3cret-scrape"}):
            r = c.get("/metrics", headers=headers)
            assert r.status_code == 401, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["type"] == "/problems/unauthorized"
            assert "enclave_http_requests" not in r.text
        r = c.get("/metrics", headers=auth("s3cret-scrape"))
        assert r.status_code == 200 and "enclave_jobs" in r.text
    with _client(settings) as c:  # unset: public, as before
        assert c.get("/metrics").status_code == 200
