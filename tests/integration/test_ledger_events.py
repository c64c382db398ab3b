"""A ledger entry's ``event`` is typed (issue 26) without changing a byte of what is
stored: service/schemas/ledger_events.py, by the entry's kind.

Entries of every kind and every budget action are written by the real code (the API's
admin routes, admission, a cancel, an override refund, the worker's release); served by
GET /v1/admin/ledger, each event is the stored JSON byte for byte, validates against its
kind's model and, parsed into that model and written back, gives the same JSON, so the
models describe what is stored. Rows written by older code still validate; malformed events
and events of the wrong kind are refused; /openapi.json documents the union.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select, update

from service.db import engine_for, transaction
from service.ledger.tables import EntryKind, Job, JobStatus, LedgerEntry
from service.schemas import LedgerEntryPublic
from service.schemas.ledger_events import LEDGER_EVENTS
from tests.conftest import auth
from worker.runner import Outcome, execute_job

DPSGD = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def _job(client: Any, keys: Any) -> str:
    r = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _write_every_kind(client: Any, keys: Any, settings: Any) -> None:
    admin = auth(keys.admin)
    for path, body in (
        ("/v1/admin/datasets/toy/budget", {"epsilon_total": 50.0, "delta_total": 1e-4}),
        ("/v1/admin/datasets/toy/caps/alice", {"epsilon": 20.0, "delta": 1e-5}),
        ("/v1/admin/datasets/toy/nominal", {"allow_nominal": True}),
        ("/v1/admin/datasets/toy/audit-gate", {"max_age_days": 30}),
        ("/v1/admin/datasets/toy/audit-gate", {"max_age_days": None}),
    ):
        r = client.put(path, json=body, headers=admin)
        assert r.status_code == 200, r.text
    released = _job(client, keys)
    assert execute_job(released, settings) == Outcome.released
    cancelled = _job(client, keys)
    r = client.post(f"/v1/jobs/{cancelled}/cancel", headers=auth(keys.alice))
    assert r.status_code == 200, r.text
    failed = _job(client, keys)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(
            update(Job).where(Job.id == failed).values(status=JobStatus.failed, data_touched=True)
        )
    r = client.post(
        f"/v1/admin/jobs/{failed}/refund",
        json={"reason": "worker bug", "override": True},
        headers=admin,
    )
    assert r.status_code == 200, r.text


def test_every_entry_kind_is_served_as_stored_and_validates(
    client: Any, keys: Any, settings: Any
) -> None:
    _write_every_kind(client, keys, settings)
    r = client.get("/v1/admin/ledger", headers=auth(keys.admin))
    assert r.status_code == 200
    served = r.json()
    with transaction(engine_for(settings.resolved_database_url)) as s:
        stored = {e.id: e.event for e in s.scalars(select(LedgerEntry))}
    assert [e["id"] for e in served] == sorted(stored)
    shapes = set()
    for entry in served:
        event = stored[entry["id"]]
        assert isinstance(event, dict)
        # Byte for byte: same keys in the same order, same int/float/str types.
        assert json.dumps(entry["event"]) == json.dumps(event)
        again = LedgerEntryPublic.model_validate(entry)
        assert json.dumps(again.model_dump(mode="json")["event"]) == json.dumps(event)
        from_json = LedgerEntryPublic.model_validate_json(json.dumps(entry))
        assert json.dumps(from_json.model_dump(mode="json")["event"]) == json.dumps(event)
        adapter = LEDGER_EVENTS[EntryKind(entry["kind"])]
        parsed = adapter.validate_python(event)
        back = adapter.dump_python(parsed, exclude_unset=True)
        assert json.dumps(back, sort_keys=True) == json.dumps(event, sort_keys=True)
        shapes.add((entry["kind"], type(parsed).__name__))
    assert {kind for kind, _ in shapes} == {k.value for k in EntryKind}
    assert shapes >= {
        ("budget", "RegisterEventJson"),
        ("budget", "SetBudgetEventJson"),
        ("budget", "SetCapEventJson"),
        ("budget", "SetNominalEventJson"),
        ("charge", "PureDpEventJson"),  # the registration's noisy row count
        ("refund", "ReturnedRefundEventJson"),
        ("refund", "InformationOnlyRefundEventJson"),
        ("release", "ReleaseEventJson"),
    }
    assert any(kind == "charge" and name != "PureDpEventJson" for kind, name in shapes)


def _entry(kind: str, event: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": 1,
        "dataset": "toy",
        "analyst_id": None,
        "job_id": None,
        "kind": kind,
        "event": event,
        "epsilon": 0.0,
        "delta": 0.0,
        "reason": None,
        "created_at": "2026-01-01T00:00:00",
        "prev_hash": "0" * 64,
        "hash": "1" * 64,
    }


OLD_ROWS = [
    # Registration before the noisy row count (the exact count, no count_epsilon).
    (
        "budget",
        {"action": "register", "epsilon_total": 10.0, "delta_total": "0.00001", "n_rows": 500},
    ),
    # Refunds before information-only refunds existed.
    ("refund", {"refund_of": 3, "data_touched": False}),
    ("refund", {"refund_of": 3, "data_touched": True}),
    ("refund", {"refund_of": 3, "data_touched": True, "outside_guarantee": True}),
]


@pytest.mark.parametrize(("kind", "event"), OLD_ROWS)
def test_rows_written_by_older_code_still_validate(kind: str, event: dict[str, Any]) -> None:
    entry = LedgerEntryPublic.model_validate(_entry(kind, event))
    assert json.dumps(entry.model_dump(mode="json")["event"]) == json.dumps(event)


RELEASE = {"weights_sha256": "a" * 64}
BROKEN = [
    ("release", {**RELEASE, "extra": 1}),  # an unknown key
    ("charge", RELEASE),  # another kind's event
    ("release", {"type": "pure_dp", "version": 1, "epsilon": 1.0}),
    ("budget", {"action": "set_budget", "epsilon_total": 1.0, "delta_total": "1e-05"}),
    ("budget", {"action": "resize"}),
    ("refund", {"refund_of": 3, "data_touched": False, "information_only": True}),
    ("charge", {"type": "pure_dp", "version": 1, "epsilon": -1.0}),
]


@pytest.mark.parametrize(("kind", "event"), BROKEN)
def test_a_malformed_event_or_one_of_another_kind_is_refused(
    kind: str, event: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError):
        LedgerEntryPublic.model_validate(_entry(kind, event))


def test_the_openapi_document_types_the_ledger_event(tmp_path: Path) -> None:
    from service.app import create_app
    from service.config import Settings

    app = create_app(Settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'x.sqlite'}"))
    schemas = app.openapi()["components"]["schemas"]
    field = schemas["LedgerEntryPublic"]["properties"]["event"]
    objects, null = field["anyOf"]
    assert null == {"type": "null"}
    members = objects["oneOf"]
    by_discriminator = {
        m["discriminator"]["propertyName"]: m for m in members if "discriminator" in m
    }
    assert set(by_discriminator["type"]["discriminator"]["mapping"]) >= {"pure_dp", "composed"}
    assert set(by_discriminator["action"]["discriminator"]["mapping"]) == {
        "register",
        "set_budget",
        "set_cap",
        "set_nominal",
        "set_audit_gate",
    }
    refs = {m["$ref"].rsplit("/", 1)[1] for m in members if "$ref" in m}
    assert refs == {
        "ReturnedRefundEventJson",
        "InformationOnlyRefundEventJson",
        "ReleaseEventJson",
    }
    for name in refs:
        assert schemas[name]["additionalProperties"] is False
