"""Job listings (issue 26): keyset paging and filters on GET /v1/jobs and GET
/v1/admin/jobs, the admin's and the analyst's CLI, and the dashboard's filter form.

Jobs are seeded as ledger rows (copies of one admitted job's request and plan) with ties
in ``created_at``, so paging must break ties by the id to visit every job exactly once."""

from __future__ import annotations

import base64
import copy
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import inspect, select
from typer.testing import CliRunner

from enclave.cli import app
from service.db import engine_for, transaction
from service.job_pages import BadCursor, decode_cursor, encode_cursor
from service.ledger.tables import Analyst, Job, JobStatus
from tests.conftest import Keys, auth

BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
STATUSES = list(JobStatus)
runner = CliRunner()


@dataclass(frozen=True)
class Seeded:
    id: str
    analyst: str
    created_at: datetime
    status: str
    method: str
    guarantee: str


def seed(settings: Any, keys: Keys, client: Any) -> list[Seeded]:
    """One admitted job of alice's, then 24 more rows: alice 14, bob 10, four to a
    ``created_at`` (ties), statuses, methods and guarantees cycling."""
    body = {"dataset": "toy", "method": "expm_nf", "epsilon": 0.5, "delta": 0}
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    # Each seeded row's plan is a real plan of its method (a stored plan's mechanism is
    # validated against its method's type when it is served).
    plans = {"expm_nf": r.json()["plan"]}
    for method, delta in (("dpsgd", 1e-5), ("expm", 1e-5)):
        quote = {"dataset": "toy", "method": method, "epsilon": 0.5, "delta": delta}
        q = client.post("/v1/quote", json=quote, headers=auth(keys.alice))
        assert q.status_code == 200, q.text
        plans[method] = q.json()["plan"]
    engine = engine_for(settings.resolved_database_url)
    out: list[Seeded] = []
    with transaction(engine) as s:
        ids = dict(s.execute(select(Analyst.name, Analyst.id)).tuples().all())
        first = s.get_one(Job, r.json()["id"])
        first.created_at = BASE - timedelta(hours=1)
        out.append(Seeded(first.id, "alice", first.created_at, "queued", "expm_nf", "nominal"))
        for i in range(24):
            who = "alice" if i % 12 < 7 else "bob"
            method = ("dpsgd", "expm", "expm_nf")[i % 3]
            guarantee = ("proven", "asymptotic", "nominal")[i % 3]
            plan = copy.deepcopy(plans[method]) | {"guarantee": guarantee}
            job = Job(
                id=str(uuid.uuid4()),
                analyst_id=ids[who],
                dataset_id=first.dataset_id,
                request_hash=first.request_hash,
                request=first.request,
                plan=plan,
                status=STATUSES[i % 5],
                created_at=BASE + timedelta(seconds=i // 4),
            )
            s.add(job)
            out.append(
                Seeded(job.id, who, job.created_at, STATUSES[i % 5].value, method, guarantee)
            )
    return out


def newest_first(jobs: list[Seeded]) -> list[str]:
    return [j.id for j in sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)]


def walk(client: Any, key: str, path: str, params: dict[str, Any]) -> tuple[list[str], int]:
    """Every page of a listing by its Link header: the ids in order, and the page count."""
    seen: list[str] = []
    pages = 0
    url: str | None = path
    query: dict[str, Any] | None = params
    while url is not None:
        r = client.get(url, params=query, headers=auth(key))
        assert r.status_code == 200, r.text
        assert isinstance(r.json(), list)  # the body keeps its shape: a list of jobs
        seen += [j["id"] for j in r.json()]
        pages += 1
        link = r.headers.get("link")
        cursor = r.headers.get("x-next-cursor")
        assert (link is None) == (cursor is None)
        if link is None:
            break
        m = re.fullmatch(r'<([^>]+)>; rel="next"', link)
        assert m is not None, link
        url, query = m.group(1), None
        assert url.startswith(path + "?")
        assert parse_qs(urlsplit(url).query)["cursor"] == [cursor]
        assert pages < 100
    return seen, pages


def test_paging_visits_every_job_once_with_ties(client: Any, keys: Keys, settings: Any) -> None:
    jobs = seed(settings, keys, client)
    alice = [j for j in jobs if j.analyst == "alice"]
    seen, pages = walk(client, keys.alice, "/v1/jobs", {"limit": 4})
    assert seen == newest_first(alice) and pages == -(-len(alice) // 4)
    seen, pages = walk(client, keys.admin, "/v1/admin/jobs", {"limit": 7})
    assert seen == newest_first(jobs) and pages == -(-len(jobs) // 7)
    # One page holds them all: no next-page headers. The default limit is 100.
    r = client.get("/v1/jobs", headers=auth(keys.alice))
    assert [j["id"] for j in r.json()] == newest_first(alice)
    assert "x-next-cursor" not in r.headers and "link" not in r.headers
    # The migration's indexes are there (both databases are migrated by the fixtures).
    names = {
        ix["name"] for ix in inspect(engine_for(settings.resolved_database_url)).get_indexes("jobs")
    }
    assert {"ix_jobs_created_at_id", "ix_jobs_analyst_created_at_id"} <= names


def test_each_filter(client: Any, keys: Keys, settings: Any) -> None:
    jobs = seed(settings, keys, client)

    def admin(**params: Any) -> list[str]:
        return walk(client, keys.admin, "/v1/admin/jobs", {"limit": 3, **params})[0]

    def mine(**params: Any) -> list[str]:
        return walk(client, keys.alice, "/v1/jobs", {"limit": 3, **params})[0]

    alice = [j for j in jobs if j.analyst == "alice"]
    for status in ("queued", "failed", "released"):
        assert admin(status=status) == newest_first([j for j in jobs if j.status == status])
        assert mine(status=status) == newest_first([j for j in alice if j.status == status])
    for method in ("dpsgd", "expm", "expm_nf"):
        assert admin(method=method) == newest_first([j for j in jobs if j.method == method])
    assert mine(method="selection") == []
    for g in ("proven", "asymptotic", "nominal"):
        assert mine(guarantee=g) == newest_first([j for j in alice if j.guarantee == g])
    assert admin(analyst="bob") == newest_first([j for j in jobs if j.analyst == "bob"])
    assert admin(analyst="nobody") == [] and admin(dataset="nothing") == []
    assert admin(dataset="toy") == newest_first(jobs)
    after, before = BASE + timedelta(seconds=2), BASE + timedelta(seconds=4)
    window = [j for j in jobs if after <= j.created_at < before]
    assert len(window) == 8
    assert admin(created_after=after.isoformat(), created_before=before.isoformat()) == (
        newest_first(window)
    )
    # Without an offset a time is UTC; with one, it is converted.
    assert admin(created_after="2026-03-01T12:00:02") == newest_first(
        [j for j in jobs if j.created_at >= after]
    )
    assert admin(created_before="2026-03-01T13:00:00+01:00") == newest_first(
        [j for j in jobs if j.created_at < BASE]
    )
    combined = [j for j in jobs if j.analyst == "alice" and j.method == "expm"]
    assert admin(analyst="alice", method="expm") == newest_first(combined)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_bad_cursors_and_filters_are_422_problems(client: Any, keys: Keys, settings: Any) -> None:
    seed(settings, keys, client)
    forged = base64.urlsafe_b64encode(b'["2026-03-01T12:00:00", 7]').decode()
    naive = base64.urlsafe_b64encode(b'["2026-03-01T12:00:00", "x"]').decode()
    bad = [
        {"cursor": "x"},
        {"cursor": "!!!!"},
        {"cursor": "a" * 201},
        {"cursor": base64.urlsafe_b64encode(b"not json").decode()},
        {"cursor": base64.urlsafe_b64encode(b"[1, 2, 3]").decode()},
        {"cursor": forged},
        {"cursor": naive},
        {"cursor": ""},
        {"status": "finished"},
        {"method": "sgd"},
        {"guarantee": "certain"},
        {"created_after": "yesterday"},
        {"created_before": "2026-13-01"},
        {"limit": 0},
        {"limit": 1001},
        {"limit": "ten"},
        {"dataset": "x" * 65},
    ]
    for params in bad:
        for path, key in (("/v1/jobs", keys.alice), ("/v1/admin/jobs", keys.admin)):
            r = client.get(path, params=params, headers=auth(key))
            assert r.status_code == 422, (path, params, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["type"] == "/problems/validation-error"
    r = client.get("/v1/admin/jobs", params={"analyst": ""}, headers=auth(keys.admin))
    assert r.status_code == 422
    # Round trip, and what the decoder refuses.
    ts = datetime(2026, 3, 1, 12, 0, 0, 5, tzinfo=UTC)
    assert decode_cursor(encode_cursor(ts, "abc")) == (ts, "abc")
    assert decode_cursor(encode_cursor(ts.replace(tzinfo=None), "abc")) == (ts, "abc")
    for cursor in ("", "x", forged, naive):
        with pytest.raises(BadCursor):
            decode_cursor(cursor)


def test_an_analyst_cannot_page_into_anothers_jobs(client: Any, keys: Keys, settings: Any) -> None:
    jobs = seed(settings, keys, client)
    alice = {j.id for j in jobs if j.analyst == "alice"}
    bob = [j for j in jobs if j.analyst == "bob"]
    # alice's cursor (and the admin's, which passes over bob's jobs) used by bob: a
    # position only; bob sees his own jobs older than it, never alice's.
    for key in (keys.alice, keys.admin):
        path = "/v1/jobs" if key == keys.alice else "/v1/admin/jobs"
        r = client.get(path, params={"limit": 3}, headers=auth(key))
        cursor = r.headers["x-next-cursor"]
        position = decode_cursor(cursor)
        seen, _ = walk(client, keys.bob, "/v1/jobs", {"cursor": cursor, "limit": 2})
        assert not alice & set(seen)
        assert seen == newest_first([j for j in bob if (j.created_at, j.id) < position])
    seen, _ = walk(client, keys.bob, "/v1/jobs", {"limit": 4})
    assert seen == newest_first(bob)
    # The admin endpoint stays the admin's, filters or not.
    r = client.get("/v1/admin/jobs", params={"analyst": "alice"}, headers=auth(keys.bob))
    assert r.status_code == 403


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_analyst_cli_lists_own_jobs(live: str, client: Any, keys: Keys, settings: Any) -> None:
    jobs = seed(settings, keys, client)
    env = {"ENCLAVE_URL": live, "ENCLAVE_API_KEY": keys.bob, "COLUMNS": "250"}

    def ids_in(output: str) -> list[str]:
        known = {j.id for j in jobs}
        return [w for w in re.findall(r"[0-9a-f-]{36}", output) if w in known]

    bob = newest_first([j for j in jobs if j.analyst == "bob"])
    r = runner.invoke(app, ["jobs", "list", "--all", "--limit", "3"], env=env)
    assert r.exit_code == 0, r.output
    assert ids_in(r.output) == bob
    r = runner.invoke(app, ["jobs", "list", "--limit", "3", "--status", "failed"], env=env)
    assert r.exit_code == 0 and "--cursor" not in r.output
    assert ids_in(r.output) == newest_first(
        [j for j in jobs if j.analyst == "bob" and j.status == "failed"]
    )
    r = runner.invoke(app, ["jobs", "list", "--limit", "3"], env=env)
    cursor = re.search(r"more jobs: --cursor (\S+)", r.output)
    assert cursor is not None
    r = runner.invoke(app, ["jobs", "list", "--limit", "3", "--cursor", cursor.group(1)], env=env)
    assert ids_in(r.output) == bob[3:6]
    r = runner.invoke(app, ["jobs", "list", "--method", "sgd"], env=env)
    assert r.exit_code == 1 and r.stderr.startswith("error: Invalid request"), r.stderr
