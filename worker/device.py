"""Where training runs: CUDA when present (or required), else the CPU."""

from __future__ import annotations

import torch


def resolve_device(choice: str) -> torch.device:
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("ENCLAVE_DEVICE=cuda but no CUDA device is available")
        return torch.device("cuda")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
