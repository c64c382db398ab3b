"""What every mechanism takes and returns inside the enclave."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# Called with (step, total_steps). Data-independent by construction: mechanisms run a
# fixed number of steps fixed by the plan, so progress reveals nothing about the rows.
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class TabularTrainingSet:
    """Encoded private rows on the training device, y in {0, 1}. Tabular: x in [0, 1]^d,
    shape (n, d). Time series: GRU-D's inputs (n, 3, T, V) (worker/models/grud.py) and
    ``public_means``, the schema's imputation means x̄ on the values' scale."""

    x: torch.Tensor  # float32 (n, d) or (n, 3, T, V)
    y: torch.Tensor  # float32 (n,)
    public_means: tuple[float, ...] | None = None
    one_hot_blocks: tuple[tuple[int, int], ...] | None = None
    """Tabular: the public schema's one-hot blocks of x's columns, (start, length) per
    categorical column (service.datasets.tabular.TabularSchema.one_hot_blocks); None where
    unknown (then every column is treated as dense)."""

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_features(self) -> int:
        """The width the target model is built with: d, or V for GRU-D's inputs."""
        return int(self.x.shape[-1])


@dataclass
class MechanismOutput:
    """The release candidates and diagnostics that never leave the enclave.

    `releases` holds one state dict per released model (k > 1 for ensembles / k samples).
    `enclave_diagnostics` is for the admin's enclave log only: it is derived from private
    rows and must never reach an API response, a progress message or an analyst's log.
    """

    releases: list[dict[str, torch.Tensor]]
    enclave_diagnostics: dict[str, float] = field(default_factory=dict)


class PlanMismatch(RuntimeError):
    """The run would not be the mechanism the ledger charged."""
