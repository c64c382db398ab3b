"""DP-SGD (Abadi et al. 2016) with Opacus: Poisson sampling, per-sample clipping, Gaussian
noise with the plan's calibrated noise multiplier.

The plan fixes q = 1/ceil(n/B) and T = epochs·ceil(n/B); Opacus's Poisson data loader
uses exactly that rate and that many batches per epoch, so the run is the mechanism the
ledger charged; the loader's length and the number of steps taken are checked against the
plan, and a mismatch fails the job rather than release a differently-accounted model.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from service.modelspec import ModelSpec
from worker.mechanisms.base import MechanismOutput, ProgressFn, TabularTrainingSet
from worker.models import build_module
from worker.rng import secure_generator


@dataclass(frozen=True)
class DpsgdParams:
    noise_multiplier: float
    sampling_rate: float
    steps_per_epoch: int
    epochs: int
    batch_size: int
    max_grad_norm: float
    learning_rate: float
    accountant: str

    @classmethod
    def from_plan(cls, mechanism: dict[str, Any]) -> DpsgdParams:
        return cls(
            noise_multiplier=float(mechanism["noise_multiplier"]),
            sampling_rate=float(mechanism["sampling_rate"]),
            steps_per_epoch=int(mechanism["steps_per_epoch"]),
            epochs=int(mechanism["epochs"]),
            batch_size=int(mechanism["batch_size"]),
            max_grad_norm=float(mechanism["max_grad_norm"]),
            learning_rate=float(mechanism["learning_rate"]),
            accountant=str(mechanism["accountant"]),
        )


class PlanMismatch(RuntimeError):
    """The run would not be the mechanism the ledger charged."""


def _train_one(
    *,
    spec: ModelSpec,
    params: DpsgdParams,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
    done: int,
    total: int,
) -> dict[str, torch.Tensor]:
    module = build_module(spec, int(data.x.shape[1])).to(device)
    # Sum-reduced loss with lr / E[batch]: the standard DP-SGD average over the *expected*
    # batch size (Abadi et al. 2016), which stays well defined for empty Poisson batches.
    expected_batch = params.sampling_rate * data.n
    optimizer = torch.optim.SGD(module.parameters(), lr=params.learning_rate / expected_batch)
    loader = DataLoader(
        TensorDataset(data.x, data.y),
        batch_size=params.batch_size,
        generator=secure_generator("cpu"),
    )
    if len(loader) != params.steps_per_epoch:
        raise PlanMismatch("the data loader's length differs from the plan's steps per epoch")
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module, optimizer, loader = engine.make_private(
            module=module,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=params.noise_multiplier,
            max_grad_norm=params.max_grad_norm,
            loss_reduction="sum",
            poisson_sampling=True,
            noise_generator=secure_generator(device),
        )
    if not math.isclose(1 / len(loader), params.sampling_rate, rel_tol=1e-12):
        raise PlanMismatch("Opacus's sampling rate differs from the plan's")
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")
    step = 0
    for _ in range(params.epochs):
        for xb, yb in loader:
            optimizer.zero_grad(set_to_none=True)
            # An empty Poisson batch still takes a (pure-noise) step, as the analysis assumes.
            loss_fn(module(xb), yb).backward()
            optimizer.step()
            step += 1
            progress(done + step, total)
    planned = params.epochs * params.steps_per_epoch
    if step != planned:
        raise PlanMismatch(f"ran {step} steps, the plan charged {planned}")
    inner = module._module if hasattr(module, "_module") else module
    return {k: v.detach().cpu().clone() for k, v in inner.state_dict().items()}


def run_dpsgd(
    *,
    spec: ModelSpec,
    mechanism: dict[str, Any],
    samples: int,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    """Train `samples` independent DP-SGD models (each charged by the plan)."""
    params = DpsgdParams.from_plan(mechanism)
    per = params.epochs * params.steps_per_epoch
    total = per * samples
    releases = [
        _train_one(
            spec=spec,
            params=params,
            data=data,
            device=device,
            progress=progress,
            done=i * per,
            total=total,
        )
        for i in range(samples)
    ]
    return MechanismOutput(releases=releases)


def total_steps(mechanism: dict[str, Any], samples: int) -> int:
    return int(mechanism["epochs"]) * int(mechanism["steps_per_epoch"]) * samples
