"""The OpenAPI document is a contract: readable operation ids, one Problem schema on every
documented error, typed responses. Walks every operation of the live app's document."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

import pytest

from service.api.errors import PROBLEM_JSON, PROBLEMS
from service.app import create_app
from service.config import Settings
from service.ledger.tables import JobStatus
from service.schemas import Guarantee, method_names
from service.version import __version__

METHODS = {"get", "put", "post", "delete", "patch"}
PROBLEM_REF = "#/components/schemas/Problem"


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("home")
    app = create_app(Settings(home=home, database_url=f"sqlite:///{home / 'x.sqlite'}"))
    return app.openapi()


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


def test_operation_ids_are_readable_and_unique(doc: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in operations(doc)]
    assert len(ids) == len(set(ids)) and len(ids) >= 20
    for op_id in ids:
        # FastAPI's generated ids look like create_job_v1_jobs_post.
        assert re.fullmatch(r"[a-z][A-Za-z]*", op_id), op_id
    assert {"listDatasets", "quote", "createJob", "getJob", "getModelCard", "getWeights"} <= set(
        ids
    )


def test_every_error_response_is_a_problem(doc: dict[str, Any]) -> None:
    for method, path, op in operations(doc):
        where = f"{method.upper()} {path}"
        errors = {int(code): r for code, r in op["responses"].items() if int(code) >= 400}
        for code, response in errors.items():
            assert set(response["content"]) == {PROBLEM_JSON}, (where, code)
            assert response["content"][PROBLEM_JSON]["schema"] == {"$ref": PROBLEM_REF}
            # The description names the problem types this status carries.
            assert "/problems/" in response["description"], (where, code)
        if op.get("parameters") or op.get("requestBody"):
            assert 422 in errors, where
        if op.get("requestBody"):
            assert {400, 413} <= set(errors), where
        if op.get("security"):
            assert {401, 429, 503} <= set(errors), where
        if path.startswith("/v1/admin"):
            assert 403 in errors, where
    text = json.dumps(doc)
    assert "HTTPValidationError" not in text and '"ValidationError"' not in text


def test_every_problem_type_status_is_documented_somewhere(doc: dict[str, Any]) -> None:
    documented = {int(c) for _, _, op in operations(doc) for c in op["responses"]}
    # 405 comes from routing itself, never from an operation.
    assert {t.status for t in PROBLEMS.values()} - documented == {405}


def test_problem_schema_has_the_rfc_9457_members(doc: dict[str, Any]) -> None:
    problem = doc["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "detail", "instance"} <= set(problem["properties"])
    assert set(problem["required"]) == {"type", "title", "status"}
    assert problem["properties"]["type"]["format"] == "uri-reference"
    assert problem["additionalProperties"] is True  # extension members


def test_success_responses_are_typed(doc: dict[str, Any]) -> None:
    for method, path, op in operations(doc):
        ok = {c: r for c, r in op["responses"].items() if c.startswith("2")}
        assert ok, f"{method} {path}"
        if set(ok) == {"204"}:
            assert "content" not in ok["204"]
            continue
        for code, response in ok.items():
            [(media, content)] = response["content"].items()
            schema = content["schema"]
            assert schema not in ({}, {"type": "object"}), (method, path, code)
            assert schema.get("additionalProperties") is not True, (method, path, code)
            if path.endswith("/weights"):
                assert media == "application/octet-stream"
                assert schema == {"type": "string", "format": "binary"}
    jobs = doc["paths"]["/v1/jobs"]["post"]["responses"]
    # Admitted (202) and the idempotent replay (200) both return the job.
    assert (
        jobs["202"]["content"]["application/json"]["schema"]
        == jobs["200"]["content"]["application/json"]["schema"]
        == {"$ref": "#/components/schemas/JobPublic"}
    )


def test_enums_examples_version_and_servers(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    assert schemas["JobStatus"]["enum"] == [s.value for s in JobStatus]
    assert schemas["JobPublic"]["properties"]["status"]["$ref"].endswith("/JobStatus")
    assert schemas["JobPublic"]["properties"]["method"]["enum"] == method_names()
    assert set(schemas["JobPublic"]["properties"]["guarantee"]["enum"]) == set(get_args(Guarantee))
    assert {"dpsgd", "expm", "expm_nf", "selection"} <= set(method_names())
    for method, path, op in operations(doc):
        if "requestBody" in op:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert schemas[Path(ref).name].get("examples"), f"{method} {path}"
    assert doc["info"]["version"] == __version__ != "0+unknown"
    assert doc["servers"] and doc["servers"][0]["url"] == "/"
