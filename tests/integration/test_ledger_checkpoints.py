"""Incremental verification of the ledger from stored checkpoints (issue 26): what it
catches, what only the full walk catches, the dashboard's status, and concurrent writers
of the same checkpoint. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import func, select, update

from service.db import engine_for, transaction
from service.ledger.audit import verify_all
from service.ledger.checkpoints import (
    LedgerCheckpoint,
    latest_checkpoint,
    save_checkpoint,
    verify_dataset,
    verify_incrementally,
)
from service.ledger.tables import Dataset, LedgerEntry
from tests.conftest import auth

DPSGD = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def admit(client: Any, keys: Any, n: int = 1) -> None:
    for _ in range(n):
        assert client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).status_code == 202


def checkpoints(engine: Any) -> int:
    with transaction(engine) as s:
        return int(s.scalar(select(func.count()).select_from(LedgerCheckpoint)) or 0)


def last_entry_id(engine: Any) -> int:
    with transaction(engine) as s:
        return int(s.scalar(select(func.max(LedgerEntry.id))) or 0)


def test_incremental_verification_walks_only_what_is_new(
    client: Any, keys: Any, settings: Any
) -> None:
    engine = engine_for(settings.resolved_database_url)
    admit(client, keys, 2)
    [first] = verify_incrementally(engine)
    assert first.ok and first.checkpoint_entry_id is None
    assert first.walked == first.chain.entries == 4  # budget, noisy count, 2 charges
    assert first.saved_entry_id == last_entry_id(engine)
    [again] = verify_incrementally(engine)
    assert again.ok and again.walked == 0 and again.chain.entries == 4
    assert again.checkpoint_entry_id == first.saved_entry_id and again.saved_entry_id is None
    admit(client, keys, 3)
    [after] = verify_incrementally(engine)
    assert after.ok and after.walked == 3 and after.chain.entries == 7
    assert after.saved_entry_id == last_entry_id(engine)
    assert checkpoints(engine) == 2
    with transaction(engine) as s:
        cp = latest_checkpoint(s, 1)
        assert cp is not None and cp.entries == 7
        ds = s.scalars(select(Dataset)).one()
        assert cp.spent_epsilon_micro == ds.spent_epsilon_micro
        assert cp.spent_rdp_micro == list(ds.spent_rdp_micro)
    # The full walk agrees.
    assert all(c.ok for c in verify_all_now(engine))


def verify_all_now(engine: Any) -> list[Any]:
    with transaction(engine) as s:
        return verify_all(s)


def test_tampering_after_the_checkpoint_is_caught_and_no_checkpoint_written(
    client: Any, keys: Any, settings: Any
) -> None:
    engine = engine_for(settings.resolved_database_url)
    admit(client, keys)
    verify_incrementally(engine)
    admit(client, keys, 2)
    new = last_entry_id(engine) - 1
    with transaction(engine) as s:
        s.execute(update(LedgerEntry).where(LedgerEntry.id == new).values(epsilon_micro=1))
    before = checkpoints(engine)
    [r] = verify_incrementally(engine)
    assert not r.ok and r.chain.problem == "digest mismatch"
    assert r.chain.first_bad_entry_id == new and r.saved_entry_id is None
    assert checkpoints(engine) == before  # never a checkpoint for a failed chain
    assert verify_incrementally(engine)[0].checkpoint_entry_id < new  # still the old one


def test_totals_after_the_checkpoint_are_checked(client: Any, keys: Any, settings: Any) -> None:
    engine = engine_for(settings.resolved_database_url)
    admit(client, keys)
    verify_incrementally(engine)
    admit(client, keys)
    before = checkpoints(engine)
    with transaction(engine) as s:
        s.execute(update(Dataset).values(spent_epsilon_micro=Dataset.spent_epsilon_micro - 1))
    [r] = verify_incrementally(engine)
    assert r.chain.ok and not r.ok
    assert [m.field for m in r.mismatches] == ["spent_epsilon_micro"]
    assert checkpoints(engine) == before


def test_tampering_before_the_checkpoint_needs_the_full_walk(
    client: Any, keys: Any, settings: Any
) -> None:
    engine = engine_for(settings.resolved_database_url)
    admit(client, keys, 2)
    [r] = verify_incrementally(engine)
    assert r.ok
    with transaction(engine) as s:
        first = s.scalars(select(LedgerEntry).order_by(LedgerEntry.id)).first()
        assert first is not None
        s.execute(update(LedgerEntry).where(LedgerEntry.id == first.id).values(reason="edited"))
    # The documented limit: the incremental verification does not read that entry...
    assert verify_incrementally(engine)[0].ok
    # ...the full walk does (API, CLI and the dashboard's "verify the whole chain").
    [full] = verify_all_now(engine)
    assert not full.ok and full.problem == "digest mismatch"
    assert full.first_bad_entry_id == first.id
    v = client.get("/v1/admin/ledger/verify", headers=auth(keys.admin)).json()
    assert v["ok"] is False and v["chains"][0]["first_bad_entry_id"] == first.id
    # Rewriting the checkpoint's own entry, or removing an entry before it, is caught.
    with transaction(engine) as s:
        cp = latest_checkpoint(s, first.dataset_id)
        assert cp is not None
        s.execute(update(LedgerEntry).where(LedgerEntry.id == cp.entry_id).values(reason="x"))
    [r] = verify_incrementally(engine)
    assert not r.ok and r.chain.problem == "digest mismatch"
    with transaction(engine) as s:
        s.execute(update(LedgerEntry).where(LedgerEntry.id == cp.entry_id).values(reason=None))
        assert verify_dataset(s, s.scalars(select(Dataset)).one())[0].ok
        s.delete(s.get(LedgerEntry, first.id + 1))
    [r] = verify_incrementally(engine)
    assert not r.ok and r.chain.problem == "entries before the checkpoint added or removed"


def sign_in(client: Any, key: str) -> None:
    r = client.post("/dashboard/login", data={"api_key": key}, follow_redirects=False)
    assert r.status_code == 303


def test_the_home_page_shows_the_incremental_status(client: Any, keys: Any, settings: Any) -> None:
    engine = engine_for(settings.resolved_database_url)
    admit(client, keys)
    sign_in(client, keys.admin)
    page = client.get("/dashboard").text
    assert "<strong>verified</strong>" in page and "intact" in page
    assert "none: walked from the first entry" in page
    assert "Verify the whole chain" in page and 'action="/dashboard/verify"' in page
    admit(client, keys)
    page = client.get("/dashboard").text
    assert "<strong>verified</strong>" in page
    assert "<td>toy</td><td>4</td><td>1</td>" in page  # 4 entries, 1 walked now
    new = last_entry_id(engine)
    with transaction(engine) as s:
        s.execute(update(LedgerEntry).where(LedgerEntry.id == new).values(reason="edited"))
    page = client.get("/dashboard").text
    assert "MISMATCH" in page and "digest mismatch" in page and f"<td>{new}</td>" in page
    full = client.get("/dashboard/verify")
    assert full.status_code == 200 and "MISMATCH" in full.text and "digest mismatch" in full.text


def test_two_writers_of_the_same_checkpoint_leave_one_row(settings: Any, keys: Any) -> None:
    """Two sessions save the same checkpoint at once: one row, neither fails. On
    PostgreSQL the second insert waits on the first's uncommitted row, then is ignored."""
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        report, values = verify_dataset(s, s.scalars(select(Dataset)).one())
    assert report.ok and values is not None
    results: list[bool] = []
    errors: list[BaseException] = []
    first_inserted = threading.Event()

    def second() -> None:
        try:
            first_inserted.wait(10)
            with transaction(engine) as s2:
                results.append(save_checkpoint(s2, dict(values)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=second)
    t.start()
    with transaction(engine) as s1:
        results.append(save_checkpoint(s1, dict(values)))
        first_inserted.set()
        t.join(0.5)  # PostgreSQL: the second blocks on our row; SQLite: on BEGIN IMMEDIATE
    t.join(30)
    assert not errors and not t.is_alive()
    assert sorted(results) == [False, True]
    assert checkpoints(engine) == 1
