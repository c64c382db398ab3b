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


def test_auto_sends_to_cuda_only_the_jobs_measured_faster_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ENCLAVE_DEVICE=auto: with a CUDA device present, CNNs, ExpM+NF on MLPs and GRU-D and
    the exponential mechanism's samplers go to it, small tabular DP-SGD, selections of
    such models and ExpM+NF on logistic regression stay on the CPU
    (benchmarks/results/gpu_methods.md); without one, everything runs on the CPU; cpu and
    cuda force one device."""
    from worker.device import resolve_device

    cuda_jobs = [
        ("dpsgd", "cnn"),
        ("selection", "cnn"),
        ("expm_nf", "mlp"),
        ("expm_nf", "grud"),
        ("expm", "logistic"),
    ]
    cpu_jobs = [
        ("dpsgd", "logistic"),
        ("dpsgd", "mlp"),
        ("dpsgd", "grud"),
        ("selection", "logistic"),
        ("expm_nf", "logistic"),
        ("evaluation", "mlp"),
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for method, kind in cuda_jobs:
        assert resolve_device("auto", method=method, model={"kind": kind}).type == "cuda"
    for method, kind in cpu_jobs:
        assert resolve_device("auto", method=method, model={"kind": kind}).type == "cpu"
        assert resolve_device("cuda", method=method, model={"kind": kind}).type == "cuda"
    assert resolve_device("cpu", method="dpsgd", model={"kind": "cnn"}).type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for method, kind in cuda_jobs:
        assert resolve_device("auto", method=method, model={"kind": kind}).type == "cpu"
    with pytest.raises(RuntimeError, match="no CUDA device"):
        resolve_device("cuda", method="dpsgd", model={"kind": "cnn"})
