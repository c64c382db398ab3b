"""Where training runs: CUDA when present (or required), else the CPU.

``ENCLAVE_DEVICE=auto`` (the default) sends a job to CUDA only where one was measured to
pay: benchmarks/results/gpu_methods.md (an H100 against its 16-core CPU, every method's
worker entry point on the bundled data) found CNNs, ExpM+NF on MLPs and GRU-D, and the
exponential mechanism's samplers (MCMC; Langevin) 1.2–4× faster on CUDA, and small tabular
DP-SGD (logistic, MLP, GRU-D), selections and ExpM+NF on logistic regression 2–10× slower
there (per-step launch and transfer costs dominate models of a few thousand parameters).
The choice reads the job's plan (public: method, model kind), never its data, so the
device, and with it the job's duration, depends on no private row. ``cuda`` and ``cpu``
force one device for every job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

CUDA_PAYS: frozenset[tuple[str, str]] = frozenset(
    {
        ("dpsgd", "cnn"),
        ("expm_nf", "mlp"),
        ("expm_nf", "grud"),
        ("expm", "logistic"),
    }
)
"""(method, model kind) of the jobs that ``auto`` runs on CUDA when one is present: those
measured faster there (benchmarks/results/gpu_methods.md); every other job runs on the
CPU. An evaluation scores on the CPU whatever the setting (worker/runner.py)."""


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU thread count for this worker process (None: leave torch's default).
    Public configuration only; it changes no result's privacy, only its speed."""
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def resolve_device(
    choice: str, *, method: str = "", model: Mapping[str, Any] | None = None
) -> torch.device:
    """The device of a job of ``method`` on ``model`` (a plan's, public) under the
    ``ENCLAVE_DEVICE`` setting ``choice``."""
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("ENCLAVE_DEVICE=cuda but no CUDA device is available")
        return torch.device("cuda")
    kind = str((model or {}).get("kind", ""))
    # A selection trains its candidates by DP-SGD on its model (architecture selection's
    # candidates share its kind): as a DP-SGD job on that model.
    trains = "dpsgd" if method == "selection" else method
    pays = (trains, kind) in CUDA_PAYS
    return torch.device("cuda" if pays and torch.cuda.is_available() else "cpu")
