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
    """Encoded private rows on the training device: x in [0, 1]^d, y in {0, 1}."""

    x: torch.Tensor  # float32 (n, d)
    y: torch.Tensor  # float32 (n,)

    @property
    def n(self) -> int:
        return int(self.x.shape[0])


@dataclass
class MechanismOutput:
    """The release candidates and diagnostics that never leave the enclave.

    `releases` holds one state dict per released model (k > 1 for ensembles / k samples).
    `enclave_diagnostics` is for the admin's enclave log only: it is derived from private
    rows and must never reach an API response, a progress message or an analyst's log.
    """

    releases: list[dict[str, torch.Tensor]]
    enclave_diagnostics: dict[str, float] = field(default_factory=dict)
