"""The HTTP API against a real ledger database (SQLite file and PostgreSQL)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.db import engine_for, transaction
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import LedgerEntry
from tests.conftest import auth

DPSGD = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def _charged(settings: Any) -> int:
    """Charges for jobs (registration's noisy-count charge is not one)."""
    from sqlalchemy import func, select

    with transaction(engine_for(settings.resolved_database_url)) as s:
        return int(
            s.scalar(
                select(func.count())
                .select_from(LedgerEntry)
                .where(LedgerEntry.kind == "charge", LedgerEntry.job_id.is_not(None))
            )
            or 0
        )


def _is_problem(r: Any, status: int, slug: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"] == f"/problems/{slug}"
    assert body["status"] == status
    return body


def test_health(client: Any) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200


def test_datasets_show_public_schema_and_budget(client: Any, keys: Any) -> None:
    r = client.get("/v1/datasets", headers=auth(keys.alice))
    assert r.status_code == 200
    [ds] = r.json()
    # A DP noisy count (ε = 0.1: two-sided geometric, std ≈ 14 rows; beyond ±300 has
    # probability e^{-30}), never the exact 400 by construction of the API.
    assert ds["name"] == "toy" and abs(ds["n_rows"] - 400) <= 300
    assert ds["count_epsilon"] == pytest.approx(0.1)
    assert ds["public_schema"]["target"]["column"] == "label"
    assert ds["budget"]["rule"] == "rdp" and ds["budget"]["epsilon_total"] == 10.0
    assert 0 < ds["budget"]["remaining_epsilon"] <= 10.0


def test_submit_charges_before_running_and_is_visible_only_to_owner(
    client: Any, keys: Any, settings: Any
) -> None:
    r = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] == "queued" and job["guarantee"] == "proven"
    assert job["plan"]["mechanism"]["noise_multiplier"] > 0
    assert _charged(settings) == 1
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth(keys.alice)).status_code == 200
    _is_problem(client.get(f"/v1/jobs/{job['id']}", headers=auth(keys.bob)), 404, "not-found")
    assert client.get("/v1/jobs", headers=auth(keys.bob)).json() == []
    # The admin sees it in the ledger.
    ledger = client.get("/v1/admin/ledger", headers=auth(keys.admin)).json()
    assert [e["kind"] for e in ledger] == ["budget", "charge", "charge"]  # count, then job


def test_quote_agrees_with_admission_and_charges_nothing(
    client: Any, keys: Any, settings: Any
) -> None:
    q = client.post("/v1/quote", json=DPSGD, headers=auth(keys.alice)).json()
    assert q["admitted"] is True
    assert _charged(settings) == 0
    job = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()
    assert job["plan"] == q["plan"]
    after = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    assert after == q["dataset_after"]


def test_quote_shows_stated_and_charged_epsilon(client: Any, keys: Any) -> None:
    """The analyst sees, before submitting, both the stated ε and what the ledger charges:
    with the PLD accountant the charged (RDP) ε is larger than the stated one."""
    pld = {**DPSGD, "dpsgd": {**DPSGD["dpsgd"], "accountant": "pld"}}
    q = client.post("/v1/quote", json=pld, headers=auth(keys.alice)).json()
    assert q["plan"]["epsilon"] == DPSGD["epsilon"]
    assert q["charged_epsilon"] > q["plan"]["epsilon"]
    rdp = client.post("/v1/quote", json=DPSGD, headers=auth(keys.alice)).json()
    # RDP-calibrated: the charge converts back to about the stated ε (the ledger's grid of
    # orders is coarser than calibration's, and calibration aims a hair below ε).
    assert 0.95 <= rdp["charged_epsilon"] / rdp["plan"]["epsilon"] <= 1.1
    expm = {"dataset": "toy", "method": "expm_nf", "epsilon": 0.5, "delta": 0}
    assert (
        client.post("/v1/quote", json=expm, headers=auth(keys.alice)).json()["charged_epsilon"]
        is None
    )


def test_quote_shows_the_plans_expected_time_and_memory(client: Any, keys: Any) -> None:
    """The quote carries the same estimate that refuses plans over the worker's limits
    (service/resources.py), from public values only: the plan and the public schema."""
    from service.datasets.kinds import parse_dataset_schema
    from service.resources import plan_resources
    from service.schemas import PrivacyPlan

    q = client.post("/v1/quote", json=DPSGD, headers=auth(keys.alice)).json()
    toy = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()
    expected = plan_resources(
        PrivacyPlan.model_validate(q["plan"]), schema=parse_dataset_schema(toy["public_schema"])
    )
    assert q["estimate"]["seconds"] == expected.seconds and expected.seconds > 0
    assert q["estimate"]["memory_bytes"] == expected.memory_bytes and expected.memory_bytes > 0
    assert "ceiling" in q["estimate"]["note"]
    longer = {**DPSGD, "dpsgd": {**DPSGD["dpsgd"], "epochs": 4 * DPSGD["dpsgd"]["epochs"]}}
    q4 = client.post("/v1/quote", json=longer, headers=auth(keys.alice)).json()
    assert q4["estimate"]["seconds"] > q["estimate"]["seconds"]
    mcmc = {"dataset": "toy", "method": "expm", "epsilon": 1.0, "delta": 1e-5,
            "expm": {"sampler": "mcmc"}}  # fmt: skip
    q = client.post("/v1/quote", json=mcmc, headers=auth(keys.alice)).json()
    assert q["estimate"]["seconds"] > 0  # every method has a time estimate (release hold)


@pytest.mark.parametrize(
    ("body", "status", "slug"),
    [
        ({**DPSGD, "epsilon": 0}, 422, "validation-error"),
        ({**DPSGD, "epsilon": -1}, 422, "validation-error"),
        ({**DPSGD, "epsilon": "lots"}, 422, "validation-error"),
        ({**DPSGD, "epsilon": 1e308 * 10}, 422, "validation-error"),
        ({**DPSGD, "dataset": "nope"}, 404, "not-found"),
        ({**DPSGD, "method": "magic"}, 422, "validation-error"),
        ({**DPSGD, "model": {"kind": "transformer"}}, 422, "validation-error"),
        ({**DPSGD, "unknown_field": 1}, 422, "validation-error"),
        ({**DPSGD, "seed": 1234}, 422, "validation-error"),  # no caller ever seeds DP noise
        ({**DPSGD, "dpsgd": {"seed": 1}}, 422, "validation-error"),
        ({**DPSGD, "delta": 0}, 422, "invalid-plan"),
        ({**DPSGD, "dpsgd": {"batch_size": 100000}}, 422, "invalid-plan"),
        ({**DPSGD, "epsilon": 1e-9}, 422, "validation-error"),  # below the ledger's unit
        ({**DPSGD, "epsilon": 1e-5}, 422, "invalid-plan"),  # DP-SGD cannot reach it
        ({**DPSGD, "delta": 1e-39}, 422, "validation-error"),  # was a 500 on PostgreSQL
        ({**DPSGD, "delta": 0.4, "samples": 3}, 422, "invalid-plan"),  # job δ = 1.2
        ({k: v for k, v in DPSGD.items() if k != "epsilon"}, 422, "validation-error"),
    ],
)
def test_bad_input_is_a_clear_4xx_and_charges_nothing(
    client: Any, keys: Any, settings: Any, body: dict, status: int, slug: str
) -> None:
    raw = json.dumps(body, allow_nan=True)
    r = client.post(
        "/v1/jobs", content=raw, headers={**auth(keys.alice), "content-type": "application/json"}
    )
    _is_problem(r, status, slug)
    assert _charged(settings) == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinities_are_rejected(
    client: Any, keys: Any, settings: Any, literal: str
) -> None:
    raw = json.dumps(DPSGD).replace('"epsilon": 1.0', f'"epsilon": {literal}')
    r = client.post(
        "/v1/jobs", content=raw, headers={**auth(keys.alice), "content-type": "application/json"}
    )
    assert 400 <= r.status_code < 500
    assert r.headers["content-type"].startswith("application/problem+json")
    assert _charged(settings) == 0


def test_malformed_json_oversized_body_and_wrong_key(client: Any, keys: Any, settings: Any) -> None:
    h = {**auth(keys.alice), "content-type": "application/json"}
    _is_problem(client.post("/v1/jobs", content="{not json", headers=h), 400, "malformed-json")
    big = json.dumps({**DPSGD, "pad": "x" * 200_000})
    _is_problem(client.post("/v1/jobs", content=big, headers=h), 413, "payload-too-large")
    _is_problem(client.post("/v1/jobs", json=DPSGD, headers=auth("enc_wrong")), 401, "unauthorized")
    _is_problem(client.post("/v1/jobs", json=DPSGD), 401, "unauthorized")
    _is_problem(
        client.post("/v1/admin/analysts", json={"name": "x"}, headers=auth(keys.alice)),
        403,
        "forbidden",
    )
    _is_problem(client.get("/v1/nothing-here", headers=auth(keys.alice)), 404, "not-found")
    # Issue 11: a streamed (chunked, undeclared) body over the limit was a 400; TRACE was a
    # 405 without Allow; a form body on a JSON route was typed /problems/conflict.
    chunks = (big[i : i + 8192].encode() for i in range(0, len(big), 8192))
    _is_problem(client.post("/v1/jobs", content=chunks, headers=h), 413, "payload-too-large")
    r = client.request("TRACE", "/v1/jobs", headers=auth(keys.alice))
    _is_problem(r, 405, "method-not-allowed")
    assert "POST" in r.headers["allow"]
    form = {**auth(keys.alice), "content-type": "application/x-www-form-urlencoded"}
    r = client.post("/v1/jobs", content="a=1", headers=form)
    assert r.status_code in (400, 422) and r.json()["type"] != "/problems/conflict"
    assert _charged(settings) == 0


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_ledger_outage_is_503_with_retry_after(client: Any, keys: Any) -> None:
    """Issue 11: an unreachable ledger database answered 500 about:blank."""
    from sqlalchemy.engine import make_url

    from service.db import engine_for

    app = client.app  # type: ignore[attr-defined]
    url = make_url(str(app.state.engine.url)).set(port=1)  # nothing listens there
    app.state.engine = engine_for(url.render_as_string(hide_password=False))
    r = client.get("/v1/datasets", headers=auth(keys.alice))
    body = _is_problem(r, 503, "service-unavailable")
    assert r.headers["retry-after"] == "5" and "nothing was charged" in body["detail"]


def test_budget_exceeded_is_409_with_remaining(client: Any, keys: Any, settings: Any) -> None:
    big = {**DPSGD, "epsilon": 7.0}  # one fits in (10, 1e-5) under the RDP filter, two do not
    assert client.post("/v1/jobs", json=big, headers=auth(keys.alice)).status_code == 202
    r = client.post("/v1/jobs", json=big, headers=auth(keys.bob))
    body = _is_problem(r, 409, "budget-exceeded")
    assert "exceeded" in body["detail"]
    assert body["remaining"]["dataset"]["remaining_epsilon"] < 7.0
    assert _charged(settings) == 1


def test_idempotency_key(client: Any, keys: Any, settings: Any) -> None:
    h = {**auth(keys.alice), "Idempotency-Key": "k-1"}
    first = client.post("/v1/jobs", json=DPSGD, headers=h)
    again = client.post("/v1/jobs", json=DPSGD, headers=h)
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    _is_problem(
        client.post("/v1/jobs", json={**DPSGD, "epsilon": 2.0}, headers=h),
        422,
        "idempotency-conflict",
    )
    # Keys are per analyst: bob's "k-1" is a different job.
    other = client.post(
        "/v1/jobs", json=DPSGD, headers={**auth(keys.bob), "Idempotency-Key": "k-1"}
    )
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    assert _charged(settings) == 2


def test_cancel_queued_job_refunds(client: Any, keys: Any, settings: Any) -> None:
    before = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    job = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()
    _is_problem(
        client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(keys.bob)), 404, "not-found"
    )
    r = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(keys.alice))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    after = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    assert after == before
    _is_problem(
        client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(keys.alice)), 409, "conflict"
    )
    kinds = [e["kind"] for e in client.get("/v1/admin/ledger", headers=auth(keys.admin)).json()]
    assert kinds == ["budget", "charge", "charge", "refund"]  # registration's count, the job
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert all(r.ok for r in verify_all(s))
        assert check_totals(s) == []


def test_release_not_ready(client: Any, keys: Any) -> None:
    job = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()
    _is_problem(
        client.get(f"/v1/jobs/{job['id']}/release", headers=auth(keys.alice)),
        409,
        "release-not-ready",
    )


def test_admin_creates_analyst_key_once(client: Any, keys: Any) -> None:
    r = client.post("/v1/admin/analysts", json={"name": "carol"}, headers=auth(keys.admin))
    assert r.status_code == 201
    key = r.json()["api_key"]
    assert client.get("/v1/datasets", headers=auth(key)).status_code == 200
    _is_problem(
        client.post("/v1/admin/analysts", json={"name": "carol"}, headers=auth(keys.admin)),
        409,
        "conflict",
    )


def test_openapi_document_is_served(client: Any) -> None:
    doc = client.get("/openapi.json").json()
    assert "/v1/jobs" in doc["paths"] and "/v1/quote" in doc["paths"]


def test_rate_limits_answer_429_with_retry_after(settings: Any, keys: Any) -> None:
    """Issue 11 (free CPU): per-key token bucket and per-key / global caps on concurrent
    planning, each a 429 problem with Retry-After, and nothing charged."""
    import threading

    from fastapi.testclient import TestClient

    from service.app import create_app

    tight = settings.model_copy(
        update={"rate_limit_burst": 3, "rate_limit_per_s": 0.5, "planning_per_key": 1}
    )
    with TestClient(create_app(tight, run_sweeper=False), raise_server_exceptions=False) as c:
        codes = [c.get("/v1/datasets", headers=auth(keys.alice)).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = c.get("/v1/datasets", headers=auth(keys.alice))
        _is_problem(r, 429, "rate-limited")
        assert int(r.headers["retry-after"]) >= 1
        assert c.get("/v1/datasets", headers=auth(keys.bob)).status_code == 200  # per key
    limiter = create_app(tight, run_sweeper=False).state.limiter
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        with limiter.planning(7):
            started.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    started.wait(5)
    try:
        with pytest.raises(Exception) as exc, limiter.planning(7):
            pass
        assert getattr(exc.value, "status", None) == 429
        with limiter.planning(8):  # another key still plans
            pass
    finally:
        release.set()
        t.join()
    with limiter.planning(7):  # the slot came back
        pass
    assert _charged(settings) == 0


def test_global_planning_cap() -> None:
    from service.api.errors import ProblemError
    from service.limits import Limiter

    limiter = Limiter(rate_per_s=1.0, burst=1, planning_per_key=5, planning_global=1)
    with limiter.planning(1):
        with pytest.raises(ProblemError) as exc, limiter.planning(2):
            pass
        assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "2"
    with limiter.planning(2):
        pass


def test_plans_the_worker_cannot_hold_are_refused_at_quote_time(
    client: Any, keys: Any, settings: Any
) -> None:
    """Issue 11: an expm_nf MLP [256, 256, 256] with Sylvester layers was admitted and then
    ran out of memory after touching data. Now its estimate (service/resources.py) is
    compared with ENCLAVE_WORKER_MEMORY_BYTES at quote and submission time."""
    big = {
        "dataset": "toy",
        "method": "expm_nf",
        "epsilon": 1.0,
        "model": {"kind": "mlp", "hidden": [256, 256, 256]},
        "expm_nf": {"flow": "sylvester"},
    }
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=big, headers=auth(keys.alice))
        body = _is_problem(r, 422, "invalid-plan")
        assert "GiB" in body["detail"]
    small = {**big, "model": {"kind": "logistic"}, "expm_nf": {"flow": "planar"}}
    assert client.post("/v1/quote", json=small, headers=auth(keys.alice)).json()["admitted"]
    assert _charged(settings) == 0
