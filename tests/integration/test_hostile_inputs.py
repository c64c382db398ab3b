"""Hostile inputs never reach the ledger database as a 500 (SQLite and PostgreSQL).

NUL characters in any path parameter, query parameter, header, form field or JSON string
(value or key), and integers beyond int64, are a 422 ``validation-error`` problem naming
the field, before any route runs: nothing is charged. A database error that is not an
outage is a 500 that is logged with the request id; a value the database refuses is 422.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import sqlalchemy.exc

from tests.conftest import auth
from tests.integration.test_api import DPSGD, _charged, _is_problem
from tests.integration.test_selections import ARCH

NUL = "a\x00b"
BODY_ROUTES = ["/v1/quote", "/v1/jobs", "/v1/selections/quote", "/v1/selections"]


# The dashboard's routes are not in the OpenAPI document.
DASHBOARD = [
    ("GET", "/dashboard/datasets/{name}", ["done"]),
    ("POST", "/dashboard/datasets/{name}/budget", []),
    ("POST", "/dashboard/datasets/{name}/nominal", []),
    ("POST", "/dashboard/datasets/{name}/caps", []),
    ("POST", "/dashboard/analysts/{name}/rotate", []),
    ("POST", "/dashboard/analysts/{name}/revoke", []),
    ("POST", "/dashboard/jobs/{job_id}/refund", []),
    ("GET", "/dashboard/jobs", ["page", "done"]),
    ("GET", "/dashboard/ledger", ["page"]),
]


def _routes(client: Any) -> list[tuple[str, str, list[str], bool]]:
    """(method, path template, query parameter names, has a JSON body) for every route."""
    out = []
    for template, item in client.app.openapi()["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            query = [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]
            out.append((method.upper(), template, query, "requestBody" in op))
    return out + [(m, t, q, False) for m, t, q in DASHBOARD]


def _refused(r: Any, loc: list[Any]) -> None:
    body = _is_problem(r, 422, "validation-error")
    assert loc in [e["loc"] for e in body["errors"]], body
    assert "\x00" not in body.get("instance", "")  # a hostile path is not echoed raw


def test_nul_in_every_path_parameter_is_422_naming_it(client: Any, keys: Any) -> None:
    seen = 0
    for method, template, _, _ in _routes(client):
        names = re.findall(r"{(\w+)}", template)
        for name in names:
            path = template
            for other in names:
                path = path.replace(f"{{{other}}}", "a%00b" if other == name else "x")
            for key in (keys.admin, keys.alice):
                _refused(client.request(method, path, headers=auth(key)), ["path", name])
                seen += 1
    assert seen >= 30  # the jobs, datasets, analysts and dashboard routes with parameters
    _refused(client.get("/v1/jobs/%00", headers=auth(keys.alice)), ["path", "job_id"])


def test_nul_in_every_query_parameter_is_422_naming_it(client: Any, keys: Any) -> None:
    seen = 0
    for method, template, query, _ in _routes(client):
        path = template.replace("{", "").replace("}", "")
        for name in query:
            r = client.request(method, f"{path}?{name}=a%00b", headers=auth(keys.admin))
            _refused(r, ["query", name])
            seen += 1
    assert seen >= 6
    # An unknown parameter too: nothing with a NUL gets past the door.
    _refused(client.get("/v1/jobs?x%00y=1", headers=auth(keys.alice)), ["query", "x\x00y"])


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_nul_in_json_strings_is_422_naming_the_field_and_charges_nothing(
    client: Any, keys: Any, settings: Any, path: str
) -> None:
    base = DPSGD if path in ("/v1/quote", "/v1/jobs") else ARCH
    _refused(
        client.post(path, json={**base, "dataset": NUL}, headers=auth(keys.alice)),
        ["body", "dataset"],
    )
    # Nested values and keys are walked too.
    nested = {**base, "x": [{"y": NUL}], "k\x00": 1}
    r = client.post(path, json=nested, headers=auth(keys.alice))
    _refused(r, ["body", "x", 0, "y"])
    _refused(r, ["body", "k\x00"])
    # Without a content type the framework still reads the body as JSON: so do we.
    raw = b'{"dataset": "a\\u0000b"}'
    r = client.post(path, content=raw, headers={**auth(keys.alice), "content-type": ""})
    _refused(r, ["body", "dataset"])
    assert _charged(settings) == 0


def test_nul_in_every_json_body_is_422(client: Any, keys: Any) -> None:
    seen = 0
    for method, template, _, has_body in _routes(client):
        if has_body:
            path = template.replace("{", "").replace("}", "")
            r = client.request(method, path, json={"name": NUL}, headers=auth(keys.admin))
            _refused(r, ["body", "name"])
            seen += 1
    assert seen >= 10


def test_nul_in_form_fields_and_headers_is_422(client: Any, keys: Any) -> None:
    _refused(client.post("/dashboard/login", data={"api_key": NUL}), ["body", "api_key"])
    r = client.post("/dashboard/login", files={"api_key": (None, NUL)})  # multipart
    _refused(r, ["body", "api_key"])
    # The form still reaches the route when it is clean.
    assert client.post("/dashboard/login", data={"api_key": "nope"}).status_code < 500
    r = client.post("/v1/jobs", json=DPSGD, headers={**auth(keys.alice), "Idempotency-Key": NUL})
    _refused(r, ["header", "idempotency-key"])


@pytest.mark.parametrize(
    "query",
    [
        "after_id=9223372036854775808",
        "after_id=99999999999999999999999",
        "after_id=-9223372036854775809",
        "limit=9223372036854775808",
    ],
)
def test_integers_beyond_int64_in_queries_are_422(client: Any, keys: Any, query: str) -> None:
    r = client.get(f"/v1/admin/ledger?{query}", headers=auth(keys.admin))
    _refused(r, ["query", query.split("=")[0]])
    # The largest int64 is fine (an empty page).
    r = client.get("/v1/admin/ledger?after_id=9223372036854775807", headers=auth(keys.admin))
    assert r.status_code == 200 and r.json() == []


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_integers_beyond_int64_in_json_are_422(
    client: Any, keys: Any, settings: Any, path: str
) -> None:
    if path in ("/v1/quote", "/v1/jobs"):
        body, loc = {**DPSGD, "dpsgd": {"epochs": 2**64, "batch_size": 50}}, "dpsgd"
        where = ["body", "dpsgd", "epochs"]
    else:
        body, loc = {**ARCH, "training": {"epochs": -(2**63) - 1, "batch_size": 50}}, "training"
        where = ["body", "training", "epochs"]
    assert loc in body
    _refused(client.post(path, json=body, headers=auth(keys.alice)), where)
    assert _charged(settings) == 0


def test_a_database_error_that_is_not_an_outage_is_a_logged_500(
    client: Any, keys: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import service.api.routes.jobs as jobs

    def broken(*_: Any, **__: Any) -> Any:
        raise sqlalchemy.exc.ProgrammingError("SELECT 1", {}, Exception("boom"))

    monkeypatch.setattr(jobs, "transaction", broken)
    caplog.set_level(logging.ERROR, logger="enclave.api")
    rid = "hostile-inputs-1"
    r = client.get("/v1/jobs", headers={**auth(keys.alice), "X-Request-ID": rid})
    assert r.status_code == 500 and r.headers["X-Request-ID"] == rid
    assert "boom" not in r.text  # a 5xx says nothing about itself
    [record] = [rec for rec in caplog.records if getattr(rec, "request_id", None) == rid]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert isinstance(record.exc_info[1], sqlalchemy.exc.ProgrammingError)


def test_an_unexpected_exception_is_a_logged_500_with_the_request_id(
    client: Any, keys: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import service.api.routes.jobs as jobs

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(jobs, "transaction", broken)
    caplog.set_level(logging.ERROR, logger="enclave.api")
    rid = "hostile-inputs-2"
    r = client.get("/v1/jobs", headers={**auth(keys.alice), "X-Request-ID": rid})
    assert r.status_code == 500 and r.headers["X-Request-ID"] == rid
    assert r.headers["content-type"].startswith("application/problem+json")
    [record] = [rec for rec in caplog.records if getattr(rec, "request_id", None) == rid]
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)


def test_a_value_the_database_refuses_is_422(
    client: Any, keys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop behind the request checks: a DataError is the request's fault."""
    import service.api.routes.jobs as jobs

    def refused(*_: Any, **__: Any) -> Any:
        raise sqlalchemy.exc.DataError("SELECT 1", {}, Exception("boom-42"))

    monkeypatch.setattr(jobs, "transaction", refused)
    r = client.get("/v1/jobs", headers=auth(keys.alice))
    _is_problem(r, 422, "validation-error")
    assert "boom-42" not in r.text  # the database's words stay in the server
