"""The authorization matrix, generated from the live app (issue 11): every operation of
/openapi.json and every /dashboard route, called by every kind of caller.

Each route must match exactly one rule below, else the test fails: a new route is covered
the day it appears, and a route nobody thought about is a failure, not a silent pass.
Callers: nobody, a malformed key, a revoked key, an expired key, analyst B on analyst A's
job, analyst A herself and the admin. No forbidden call may answer 2xx, no call may answer
5xx, and no answer to anyone but A (or the admin) may hold A's job ids, API key or the
canary she put in her Idempotency-Key, unless the request itself carried it (a 404 names
the id it was asked for).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import pytest
from sqlalchemy import update

from service.db import engine_for, transaction
from service.ledger.tables import Analyst
from tests.conftest import auth, flat_routes
from tests.integration.test_api import DPSGD

CANARY = "canary-5f1d0c2e-alice-only"


class Access(Enum):
    public = "public"  # anyone, no key
    analyst = "analyst"  # any live key
    owned = "owned"  # a live key whose owner (or the admin) owns the job in the path
    admin = "admin"  # the admin's key only


# (path pattern, access): the first match decides; a route matching none fails the test.
API_RULES: list[tuple[str, Access]] = [
    (r"^/(healthz|readyz|problems/\{slug\})$", Access.public),
    (r"^/v1/admin/", Access.admin),
    (r"^/v1/jobs/\{job_id\}(/|$)", Access.owned),
    (r"^/v1/(datasets|datasets/\{name\}|quote|jobs|selections|selections/quote)$", Access.analyst),
    (r"^/v1/(evaluations|evaluations/quote)$", Access.analyst),
]
DASHBOARD_RULES: list[tuple[str, Access]] = [
    (r"^/dashboard/(login|style\.css)$", Access.public),
    (r"^/dashboard(/|$)", Access.admin),
]


def rule_for(rules: list[tuple[str, Access]], path: str) -> Access | None:
    return next((access for pattern, access in rules if re.search(pattern, path)), None)


@dataclass(frozen=True)
class Caller:
    name: str
    headers: dict[str, str]
    # What the caller may do: None for no identity at all (401 expected everywhere but
    # public routes).
    role: str | None


@dataclass
class World:
    alice_jobs: list[str]
    secrets: list[str]  # alice's: never in an answer to anyone but alice or the admin
    callers: list[Caller]
    dead_keys: dict[str, str]  # "revoked" and "expired"


def _world(client: Any, keys: Any, settings: Any) -> World:
    admin = auth(keys.admin)
    jobs = []
    for i in range(2):
        r = client.post(
            "/v1/jobs", json=DPSGD, headers={**auth(keys.alice), "Idempotency-Key": f"{CANARY}-{i}"}
        )
        assert r.status_code == 202, r.text
        jobs.append(r.json()["id"])
    assert client.post("/v1/jobs", json=DPSGD, headers=auth(keys.bob)).status_code == 202
    made = {}
    for name in ("revoked", "expired", "erin"):
        r = client.post("/v1/admin/analysts", json={"name": name}, headers=admin)
        assert r.status_code == 201, r.text
        made[name] = r.json()["api_key"]
    assert client.delete("/v1/admin/analysts/revoked/key", headers=admin).status_code == 204
    with transaction(engine_for(settings.resolved_database_url)) as s:
        past = datetime.now(UTC) - timedelta(seconds=1)
        s.execute(update(Analyst).where(Analyst.name == "expired").values(key_expires_at=past))
    callers = [
        Caller("nobody", {}, None),
        Caller("malformed", {"Authorization": "Bearer \x7f not a key"}, None),
        Caller("wrong scheme", {"Authorization": f"Basic {keys.alice}"}, None),
        Caller("revoked", auth(made["revoked"]), None),
        Caller("expired", auth(made["expired"]), None),
        Caller("analyst B", auth(keys.bob), "other"),
        Caller("analyst A", auth(keys.alice), "owner"),
        Caller("admin", admin, "admin"),
    ]
    dead = {name: made[name] for name in ("revoked", "expired")}
    return World(jobs, [*jobs, CANARY, keys.alice], callers, dead)


def _expected(access: Access, role: str | None) -> Callable[[int], bool]:
    """Which statuses are right for this caller on a route of this access."""

    def allowed(code: int) -> bool:  # may still refuse the body (4xx), never the caller
        return code < 500 and code not in (401, 403)

    if access is Access.public:
        return lambda code: code < 500
    if role is None:
        return lambda code: code == 401
    if access is Access.admin and role != "admin":
        return lambda code: code == 403
    if access is Access.owned and role == "other":
        return lambda code: code == 404  # another analyst's job does not exist for B
    return allowed


def _fill(path: str, world: World) -> str:
    """Path parameters: alice's job, the toy dataset, a spare analyst the admin may rotate
    and revoke, bob for caps, a problem slug."""
    values = {
        "job_id": world.alice_jobs[0],
        "name": "erin" if "/analysts/" in path else "toy",
        "analyst": "bob",
        "slug": "unauthorized",
        "audit_id": "no-such-audit",
    }

    def one(m: re.Match[str]) -> str:
        assert m.group(1) in values, f"no value for path parameter {m.group(0)} in {path}"
        return values[m.group(1)]

    return re.sub(r"\{(\w+)\}", one, path)


SELECTION = {
    "dataset": "toy",
    "kind": "architecture",
    "epsilon": 1.0,
    "delta": 1e-6,
    "space": {"depths": [1], "widths": [2]},
    "search": {"algorithm": "rs", "trainings": 1},
    "training": {"epochs": 1, "batch_size": 50},
}
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/jobs"): DPSGD,
    ("POST", "/v1/quote"): DPSGD,
    ("POST", "/v1/selections"): SELECTION,
    ("POST", "/v1/selections/quote"): SELECTION,
    # Another caller's job (or none) does not exist: 404 for everyone, after authentication.
    ("POST", "/v1/evaluations"): {"job_id": "no-such-job", "epsilon": 0.5},
    ("POST", "/v1/evaluations/quote"): {"job_id": "no-such-job", "epsilon": 0.5},
    ("POST", "/v1/admin/audits"): {"method": "dpsgd", "epsilon": 1, "delta": 1e-5, "canaries": 10},
}


def _check_leaks(world: World, caller: Caller, sent: str, body: str, label: str) -> None:
    if caller.role in ("owner", "admin"):
        return
    for secret in world.secrets:
        if secret not in sent:
            assert secret not in body, f"{label} as {caller.name} leaks {secret!r}"


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_every_api_operation_refuses_the_wrong_callers(
    client: Any, keys: Any, settings: Any
) -> None:
    world = _world(client, keys, settings)
    document = client.get("/openapi.json").json()
    calls, unruled, wrong = 0, [], []
    for path, operations in document["paths"].items():
        access = rule_for(API_RULES, path)
        if access is None:
            unruled.append(path)
            continue
        for method, op in operations.items():
            label = f"{method.upper()} {path}"
            # The document says what the rule says: public routes and only those need no key.
            assert (access is Access.public) == (not op.get("security")), label
            url = _fill(path, world)
            body = BODIES.get((method.upper(), path), {} if "requestBody" in op else None)
            for caller in world.callers:
                r = client.request(method.upper(), url, headers=caller.headers, json=body)
                calls += 1
                if not _expected(access, caller.role)(r.status_code):
                    wrong.append(f"{label} as {caller.name}: {r.status_code} {r.text[:200]}")
                _check_leaks(world, caller, url + repr(body), r.text, label)
    assert not unruled, f"routes without an authorization rule: {unruled}"
    assert not wrong, "\n".join(wrong)
    assert calls >= 20 * len(world.callers)


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_every_dashboard_route_needs_an_admin_session(
    client: Any, keys: Any, settings: Any
) -> None:
    world = _world(client, keys, settings)
    sessions: dict[str, str | None] = {}
    logins = {"analyst A": keys.alice, **world.dead_keys, "admin": keys.admin}
    for who, key in logins.items():
        client.cookies.clear()
        r = client.post("/dashboard/login", data={"api_key": key}, follow_redirects=False)
        sessions[who] = client.cookies.get("enclave_session")
        assert (sessions[who] is not None) == (who == "admin"), (who, r.status_code)
    client.cookies.clear()
    sessions["nobody"] = None
    sessions["forged"] = "forged-session-token"
    routes = [
        (method, route.path)
        for route in flat_routes(client.app.routes)
        if route.path.startswith("/dashboard")
        for method in sorted(route.methods)
    ]
    assert len(routes) >= 10
    unruled, wrong = [], []
    for method, path in routes:
        access = rule_for(DASHBOARD_RULES, path)
        if access is None:
            unruled.append(path)
            continue
        url = _fill(path, world)
        for who, token in sessions.items():
            headers = {"Cookie": f"enclave_session={token}"} if token else {}
            # Forms carry no CSRF token: even the admin's session must be refused (403).
            r = client.request(method, url, headers=headers, follow_redirects=False)
            code = r.status_code
            if access is Access.public:
                ok = code < 500
            elif who != "admin":
                ok = code == 303 and r.headers["location"] == "/dashboard/login"
            else:
                ok = code == (200 if method == "GET" else 403)
            if not ok:
                wrong.append(f"{method} {path} as {who}: {code}")
            if who != "admin":
                caller = Caller(who, headers, None)
                _check_leaks(world, caller, url, r.text, f"{method} {path}")
    assert not unruled, f"dashboard routes without an authorization rule: {unruled}"
    assert not wrong, "\n".join(wrong)
