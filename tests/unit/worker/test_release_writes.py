"""Releases are written atomically and checked for room before any private row is read
(issue 19 item 7): the size bound covers real releases, a full or unwritable release
folder is refused up front, a failed write leaves no partial file, and a transient write
error is retried."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter

import worker.release as release
from service.datasets.kinds import parse_dataset_schema
from service.modelspec import ModelSpec
from service.plans import plan_for_dataset
from service.schemas import JobRequest
from tests.conftest import SMALL_SCHEMA
from tests.unit.test_timeseries import TINY
from worker.models import build_module
from worker.release import (
    ReleaseSpaceError,
    check_release_space,
    model_card,
    release_size_bound,
    sha256_bytes,
    weights_bytes,
    write_release,
)


def _plan(model: dict[str, Any], samples: int, schema: dict[str, Any] = SMALL_SCHEMA) -> Any:
    request = JobRequest.model_validate(
        {
            "dataset": "toy",
            "method": "dpsgd",
            "epsilon": 2.0,
            "delta": 1e-5,
            "samples": samples,
            "model": model,
            "dpsgd": {"epochs": 1, "batch_size": 50},
        }
    )
    return plan_for_dataset(request, n_rows=400, public_schema=schema)


def _release(plan: Any, schema: dict[str, Any] = SMALL_SCHEMA) -> tuple[bytes, dict[str, Any]]:
    width = parse_dataset_schema(schema).n_features
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(plan.model)
    models = [build_module(spec, width, public_means=[0.5] * width) for _ in range(plan.samples)]
    payload = weights_bytes([m.state_dict() for m in models])
    card = model_card(
        job_id="job",
        run_token="token",
        plan=plan,
        public_schema=schema,
        count_epsilon=0.1,
        weights_sha256=sha256_bytes(payload),
        samples=plan.samples,
    )
    return payload, card


@pytest.mark.parametrize(
    ("model", "samples", "schema"),
    [
        ({"kind": "logistic"}, 1, SMALL_SCHEMA),
        ({"kind": "mlp", "hidden": [256, 256, 256]}, 3, SMALL_SCHEMA),
        ({"kind": "grud", "hidden": 32}, 2, TINY),
    ],
)
def test_the_size_bound_covers_a_real_release(
    model: dict[str, Any], samples: int, schema: dict[str, Any]
) -> None:
    plan = _plan(model, samples, schema)
    payload, card = _release(plan, schema)
    written = len(payload) + len(json.dumps(card, indent=2, sort_keys=True).encode())
    bound = release_size_bound(plan, schema)
    assert written <= bound < 64 * 2**20


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(
        shutil, "disk_usage", lambda _p: type(usage)(usage.total, usage.total - free, free)
    )


def test_a_full_disk_is_refused_and_enough_room_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "releases"
    _free(monkeypatch, 10 * 2**20)
    with pytest.raises(ReleaseSpaceError, match="bytes free"):
        check_release_space(target, 1 << 20)
    _free(monkeypatch, 10 * 2**30)
    check_release_space(target, 1 << 20)
    assert target.is_dir() and list(target.iterdir()) == []  # the probe file is gone


def test_an_unusable_release_folder_is_refused(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ReleaseSpaceError, match="not writable"):
        check_release_space(not_a_dir, 1)


def _failing_writes(
    monkeypatch: pytest.MonkeyPatch, code: int, *, times: int, on_call: int = 1
) -> list[int]:
    """Make the ``on_call``-th temporary file write (1-based) and the ``times - 1`` after
    it write half their data and raise OSError(code). Returns the list of calls."""
    real = release.tempfile.NamedTemporaryFile
    calls: list[int] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        f = real(*args, **kwargs)
        calls.append(1)
        n = len(calls)
        if on_call <= n < on_call + times:
            inner = f.file.write

            def half(data: bytes) -> int:
                inner(data[: len(data) // 2])
                f.file.flush()
                raise OSError(code, "injected")

            f.write = half
        return f

    monkeypatch.setattr(release.tempfile, "NamedTemporaryFile", factory)
    monkeypatch.setattr(release, "WRITE_RETRY_DELAYS_S", (0.0, 0.0, 0.0))
    return calls


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("on_call", [1, 2])  # the weights, or the card after the weights
def test_enospc_midway_fails_at_once_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_call: int
) -> None:
    payload, card = _release(_plan({"kind": "logistic"}, 1))
    calls = _failing_writes(monkeypatch, errno.ENOSPC, times=1, on_call=on_call)
    with pytest.raises(OSError) as info:
        write_release(tmp_path, "job", "token", payload, card)
    assert info.value.errno == errno.ENOSPC
    assert len(calls) == on_call  # not retried
    assert _files(tmp_path) == []
    assert not (tmp_path / "job" / "token").exists()


def test_a_transient_eintr_is_retried_and_the_release_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload, card = _release(_plan({"kind": "logistic"}, 1))
    calls = _failing_writes(monkeypatch, errno.EINTR, times=1)
    paths = write_release(tmp_path, "job", "token", payload, card)
    assert len(calls) == 3  # weights twice, card once
    assert paths.weights.read_bytes() == payload
    assert json.loads(paths.card.read_text()) == card
    assert _files(tmp_path) == sorted([paths.weights, paths.card])  # no temporary file


def test_a_transient_error_that_persists_fails_after_a_few_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload, card = _release(_plan({"kind": "logistic"}, 1))
    calls = _failing_writes(monkeypatch, errno.EAGAIN, times=100)
    with pytest.raises(OSError):
        write_release(tmp_path, "job", "token", payload, card)
    assert len(calls) == 4  # one try and three retries
    assert _files(tmp_path) == []


def test_the_weights_are_written_before_the_card(tmp_path: Path) -> None:
    payload, card = _release(_plan({"kind": "logistic"}, 1))
    paths = write_release(tmp_path, "job", "token", payload, card)
    assert paths.weights.stat().st_mtime_ns <= paths.card.stat().st_mtime_ns
    assert torch.is_tensor(release.load_state_dicts(payload, 1)[0]["linear.weight"])
