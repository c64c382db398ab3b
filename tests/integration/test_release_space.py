"""A release that cannot be written must not burn the budget (issue 19 item 7): the worker
checks the release folder's room before any private row is read, so a full disk fails the
job untouched and its charge is refunded; a write that fails after training leaves no
partial release files."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

import worker.release as release
import worker.runner as runner
from service.db import engine_for, transaction
from service.ledger.refunds import AUTOMATIC_REFUND_REASON
from service.ledger.tables import EntryKind, Job, JobStatus, LedgerEntry
from tests.conftest import auth
from worker.release import RELEASE_SPACE_FAILURE
from worker.runner import Outcome, execute_job

BODY = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 2.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def _submit(client: Any, keys: Any) -> str:
    r = client.post("/v1/jobs", json=BODY, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_a_full_release_disk_fails_the_job_before_its_data_is_read_and_refunds_it(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _submit(client, keys)
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(
        shutil, "disk_usage", lambda _p: type(usage)(usage.total, usage.total - 4096, 4096)
    )

    def no_read(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the private rows were opened")

    monkeypatch.setattr(runner, "load_training_set", no_read)
    assert execute_job(job_id, settings) == Outcome.failed
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, job_id)
        assert job.status == JobStatus.failed and job.data_touched is False
        assert job.error == RELEASE_SPACE_FAILURE
        refunds = s.scalars(
            select(LedgerEntry).where(
                LedgerEntry.job_id == job_id, LedgerEntry.kind == EntryKind.refund
            )
        ).all()
        assert [r.reason for r in refunds] == [AUTOMATIC_REFUND_REASON]
    assert _files(settings.resolved_release_dir) == []


def test_a_write_failing_after_training_leaves_no_partial_release(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _submit(client, keys)
    real = release.tempfile.NamedTemporaryFile
    calls: list[int] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        f = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:  # the card, after the weights were written

            def full(data: bytes) -> int:
                f.file.write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")

            f.write = full
        return f

    monkeypatch.setattr(release.tempfile, "NamedTemporaryFile", factory)
    assert execute_job(job_id, settings) == Outcome.failed
    assert len(calls) == 2
    assert _files(settings.resolved_release_dir) == []
