"""ENCLAVE_WORKER_THREADS reaches torch (issue 25: the worker had no thread setting)."""

from __future__ import annotations

import pytest
import torch

from service.config import Settings
from worker.device import apply_threads


def test_the_setting_is_read_and_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENCLAVE_WORKER_THREADS", "1")
    assert Settings().worker_threads == 1
    monkeypatch.delenv("ENCLAVE_WORKER_THREADS")
    assert Settings().worker_threads is None  # torch's default
    before = torch.get_num_threads()
    try:
        apply_threads(1)
        assert torch.get_num_threads() == 1
        apply_threads(None)  # leaves it as it is
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
