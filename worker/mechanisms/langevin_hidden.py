"""The proven Langevin sampler charged by the hidden-iterate bound (method ``expm``, sampler
``"langevin"``, plan key ``accounting: "hidden"``; issue 24): the same target and the same
exact per-row arithmetic as worker/mechanisms/langevin.py, on a lattice-valued state, so
that the privacy loss converges in the number of steps instead of growing with it.

The chain, its constants and the proof are in service/privacy/lattice_langevin.py; this
module runs exactly that chain and nothing else:

* θ is the integer vector x (θ = x·2^-b), |x_j| ≤ 2^m; x₀ = 0;
* each step G = the exact integer gradient sum at x (:class:`~worker.mechanisms.langevin.
  ExactRowSums`: features on 2^-c, exact logit numerators, residuals trunc(2^a·(σ̃ − y)),
  integer sums below 2^53), then v = fl(fl(ρ·x) − fl(g·G)) elementwise in numpy (three
  correctly rounded float64 operations per coordinate, the constants ρ and g the plan's
  floats), x ← clamp(round(v) + N, −2^m, 2^m) with N the integer noise round(ς·Z)
  (:func:`worker.noise.rounded_gaussian`, ς = σ·s);
* K = the plan's steps, fixed before the run; only x_K leaves;
* before any step: the loaded rows are at most the plan's ``max_rows`` (the contraction
  constant covers no more; the schema's public cap, checked at registration), the rows'
  norms and labels as for the composition sampler (:func:`~worker.mechanisms.langevin.
  checked_rows`); the plan's grid and constants are recomputed from its public values
  and must be the ones the proof's were (:class:`PlanMismatch` otherwise).

K ≥ 3 classes: x is the (d + 1) × K matrix, G the exact (d + 1) × K sum of the softmax
residuals (with langevin.py's exact per-row residual check), the same elementwise update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from service.modelspec import ModelSpec
from service.privacy.lattice_langevin import LatticeLangevin
from worker.mechanisms.base import MechanismOutput, PlanMismatch, ProgressFn, TabularTrainingSet
from worker.mechanisms.dpsgd import NoiseStream
from worker.mechanisms.guards import GuardFailed
from worker.mechanisms.langevin import (
    logistic_releases,
    run_expm_langevin,
    threaded_row_sums,
)
from worker.noise import secure_rng


@dataclass(frozen=True)
class HiddenLangevinParams:
    """The plan's public values for the lattice chain, checked against the proof's."""

    chain: LatticeLangevin
    steps: int
    noise_multiplier: float

    @classmethod
    def from_plan(cls, mechanism: dict[str, Any]) -> HiddenLangevinParams:
        if mechanism.get("sampler") != "langevin" or mechanism.get("accounting") != "hidden":
            raise PlanMismatch("not a hidden-iterate Langevin plan")
        try:
            chain = LatticeLangevin(
                public_n_rows=int(mechanism["public_n_rows"]),
                max_rows=int(mechanism["max_rows"]),
                row_norm_sq_bound=int(mechanism["row_norm_sq_bound"]),
                parameters=int(mechanism["parameters"]),
                learning_rate=float(mechanism["learning_rate"]),
                l2=float(mechanism["l2"]),
                classes=int(mechanism.get("classes", 1)),
            )
        except (KeyError, ValueError) as exc:
            raise PlanMismatch(f"hidden-iterate Langevin plan: {exc}") from exc
        a, c, b, m = chain.bits
        stated = tuple(
            int(mechanism[k]) for k in ("residual_bits", "feature_bits", "theta_bits", "range_bits")
        )
        if stated != (a, c, b, m):
            raise PlanMismatch("the plan's lattice is not the proof's")
        params = cls(
            chain=chain,
            steps=int(mechanism["steps"]),
            noise_multiplier=float(mechanism["noise_multiplier"]),
        )
        if params.steps < 1:
            raise PlanMismatch("the plan has no steps")
        chain.noise_scale(params.noise_multiplier)  # in the sampler's range, or ValueError
        return params


def sample_hidden_langevin(
    *,
    params: HiddenLangevinParams,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
    done: int = 0,
    total: int | None = None,
) -> torch.Tensor:
    """One release: θ_K = x_K·2^-b, (d + 1,) float64 on the CPU, weights then bias; for K
    classes (d + 1, K), column k class k's weights then bias."""
    chain = params.chain
    total = params.steps if total is None else total
    a, c, b, m = chain.bits
    if int(data.x.shape[0]) > chain.max_rows:
        # The plan's contraction constant covers at most max_rows rows (the schema's
        # public cap, which registration checked): refuse before any step.
        raise GuardFailed("expm langevin (hidden): more rows than the schema's max_rows")
    scale = chain.noise_scale(params.noise_multiplier)
    noise = NoiseStream(rng=secure_rng(), size=chain.parameters, steps=params.steps)
    rho, g, limit = chain.rho, chain.g, float(2**m)
    shape = (chain.parameters,) if chain.classes == 1 else (chain.inputs, chain.classes)
    x = np.zeros(shape, dtype=np.float64)  # integers, |x_j| ≤ 2^m < 2^53
    v = np.empty_like(x)
    gg = np.empty_like(x)
    with threaded_row_sums(
        data,
        device=torch.device("cpu"),
        feature_bits=c,
        residual_bits=a,
        theta_bits=b,
        norm_sq_bound=chain.row_norm_sq_bound,
        parameters=chain.parameters,
        classes=chain.classes,
    ) as (sums, pool):
        for step in range(1, params.steps + 1):
            summed = sums.gradient_sum(torch.from_numpy(x), pool=pool).numpy()
            # v = fl(fl(ρ·x) − fl(g·G)): G's int64 entries are below 2^53 (exact as floats).
            np.multiply(x, rho, out=v)
            np.multiply(summed.astype(np.float64), g, out=gg)
            np.subtract(v, gg, out=v)
            np.round(v, out=v)  # to the nearest integer (ties to even): the lattice
            step_noise = noise.draw(scale=scale, same_scale_ahead=params.steps - step + 1)
            np.add(v, step_noise.numpy().reshape(shape), out=v)  # integers below 2^53
            np.clip(v, -limit, limit, out=x)
            progress(done + step, total)
    return torch.from_numpy(np.ldexp(x, -b))


def run_langevin_plan(
    *,
    spec: ModelSpec,
    mechanism: dict[str, Any],
    samples: int,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    """The registry's entry for ``expm`` with the Langevin sampler: for a plan charged by
    the hidden-iterate bound (``accounting: "hidden"``), `samples` independent lattice
    chains (each charged by the plan; on the CPU: the update is numpy's) as logistic state
    dicts, binary or K-class; else the composition-charged chains of
    worker/mechanisms/langevin.py."""
    if mechanism.get("accounting") != "hidden":
        return run_expm_langevin(
            spec=spec,
            mechanism=mechanism,
            samples=samples,
            data=data,
            device=device,
            progress=progress,
        )
    params = HiddenLangevinParams.from_plan(mechanism)

    def chain(done: int, total: int) -> torch.Tensor:
        return sample_hidden_langevin(
            params=params, data=data, device=device, progress=progress, done=done, total=total
        )

    return logistic_releases(
        spec=spec,
        data=data,
        classes=params.chain.classes,
        samples=samples,
        steps=params.steps,
        chain=chain,
    )
