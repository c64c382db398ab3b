"""Where training runs: CUDA when present (or required), else the CPU."""

from __future__ import annotations

import torch


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU thread count for this worker process (None: leave torch's default).
    Public configuration only; it changes no result's privacy, only its speed."""
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def resolve_device(choice: str) -> torch.device:
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("ENCLAVE_DEVICE=cuda but no CUDA device is available")
        return torch.device("cuda")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
