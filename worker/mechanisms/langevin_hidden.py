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

A binary target with one-hot blocks runs its steps in compiled calls of up to 64 steps
(:func:`~worker.mechanisms.langevin.lattice_steps_kernel`: the same exact sums and the same
three IEEE operations, rounding, noise addition and clamp per coordinate, so the same bits;
the noise rows those of the per-step draws,
:meth:`~worker.mechanisms.dpsgd.NoiseStream.draw_steps`), on one thread and the rows in one
part whatever the worker's threads (``one_part_binary_cells``: each part's sum is an exact
integer, so one part gives the parts' total). That was faster than the per-step loop over two
parts on two threads (benchmarks/results/expm_hidden.md); every other case steps in numpy.

K ≥ 3 classes: x is the (d + 1) × K matrix, G the exact (d + 1) × K sum of the softmax
residuals (with langevin.py's exact per-row residual check), the same elementwise update.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
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
    ExactRowSums,
    lattice_steps_kernel,
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
        one_part_binary_cells=True,
    ) as (sums, pool):
        fused = sums.binary_cells_inputs() if chain.classes == 1 and pool is None else None
        step = 1
        while fused is not None and step <= params.steps:
            # Up to _FUSED_STEPS steps in one compiled call (lattice_steps_kernel: the same
            # operations as the loop below, so the same bits), their noise the rows the
            # per-step draws would have returned.
            block = noise.draw_steps(
                scale=scale, same_scale_ahead=params.steps - step + 1, most=_FUSED_STEPS
            ).numpy()
            start = 0
            while start < len(block):
                done_now = lattice_steps_kernel(x, block[start:], rho, g, limit, *fused)
                for _ in range(done_now):
                    progress(done + step, total)
                    step += 1
                start += done_now
                if start < len(block):  # a NaN numerator: this step by the numpy path
                    _numpy_step(sums, x, v, gg, rho, g, limit, block[start], pool)
                    progress(done + step, total)
                    step, start = step + 1, start + 1
        for later in range(step, params.steps + 1):
            step_noise = noise.draw(scale=scale, same_scale_ahead=params.steps - later + 1)
            _numpy_step(sums, x, v, gg, rho, g, limit, step_noise.numpy(), pool)
            progress(done + later, total)
    return torch.from_numpy(np.ldexp(x, -b))


_FUSED_STEPS = 64
"""Steps per compiled call of :func:`~worker.mechanisms.langevin.lattice_steps_kernel`
(progress is reported after each call, for each of its steps)."""


def _numpy_step(
    sums: ExactRowSums,
    x: np.ndarray,
    v: np.ndarray,
    gg: np.ndarray,
    rho: float,
    g: float,
    limit: float,
    step_noise: np.ndarray,
    pool: ThreadPoolExecutor | None,
) -> None:
    """One step of the chain (module docstring) by numpy, x updated in place: G, then
    x ← clamp(round(fl(fl(ρ·x) − fl(g·G))) + N, −limit, limit)."""
    summed = sums.gradient_sum(torch.from_numpy(x), pool=pool).numpy()
    # v = fl(fl(ρ·x) − fl(g·G)): G's int64 entries are below 2^53 (exact as floats).
    np.multiply(x, rho, out=v)
    np.multiply(summed.astype(np.float64), g, out=gg)
    np.subtract(v, gg, out=v)
    np.round(v, out=v)  # to the nearest integer (ties to even): the lattice
    np.add(v, step_noise.reshape(x.shape), out=v)  # integers below 2^53
    np.clip(v, -limit, limit, out=x)


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
