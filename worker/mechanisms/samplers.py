"""Samplers for an unnormalised log-density: one pluggable part of the ExpM mechanism.

A :class:`Sampler` draws k parameter vectors from (an approximation of) the density
exp(log_density(θ)) / Z of a :class:`LogDensityTarget` and says what guarantee its draws
carry:

- ``"nominal"``: the draws only approximate the target density and no proof covers the
  gap (the flow sampler). The mechanism's ε is nominal: it is the ε of the exact
  mechanism that the sampler imitates.
- ``"proven"``: the draws are exactly (or provably close enough) distributed as the
  target, so the ε (and δ, if any) holds (e.g. an exact rejection sampler).

All randomness comes from the ``generator`` passed in (seeded by the caller from a
CSPRNG). Samplers run a fixed amount of work, independent of the data, so neither the
progress calls nor the wall time reveal anything data-dependent beyond what the release
itself does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from worker.flows import Flow, FlowConfig, build_flow, importance_diagnostics
from worker.mechanisms.base import ProgressFn

Guarantee = Literal["nominal", "proven"]


@runtime_checkable
class LogDensityTarget(Protocol):
    """An unnormalised log-density on R^dim, evaluated for N points at once."""

    @property
    def dim(self) -> int: ...

    def log_density(self, theta: Tensor) -> Tensor:
        """Exact log p̃(θ) for θ (N, dim) → (N,) (all data; may be expensive)."""
        ...

    def minibatch_log_density(
        self, theta: Tensor, *, batch_size: int, generator: torch.Generator
    ) -> Tensor:
        """Unbiased estimate of log p̃(θ) from one shared data minibatch, (N, dim) → (N,)."""
        ...


@dataclass(frozen=True)
class SamplerResult:
    """k draws (k, P) on the CPU; diagnostics are enclave-only (derived from private rows)."""

    samples: Tensor
    guarantee: Guarantee
    label: str
    diagnostics: dict[str, float] = field(default_factory=dict)


class Sampler(Protocol):
    """Draws k points from exp(target.log_density) / Z (exactly or approximately)."""

    @property
    def label(self) -> str: ...

    @property
    def guarantee(self) -> Guarantee: ...

    def sample(
        self,
        target: LogDensityTarget,
        *,
        k: int,
        generator: torch.Generator,
        progress: ProgressFn,
    ) -> SamplerResult: ...


@dataclass(frozen=True)
class FlowSamplerConfig:
    """Knobs of :class:`FlowSampler`. ``steps`` is fixed: there is no early stopping, since
    when training stops would depend on the data and the wall time would leak it."""

    flow: FlowConfig = field(default_factory=FlowConfig)
    steps: int = 2000
    n_samples_per_step: int = 64
    batch_size: int = 1024
    lr: float = 1e-2
    lr_final_fraction: float = 0.05
    grad_clip: float = 1e4
    diagnostic_samples: int = 1024
    progress_every: int = 10

    def __post_init__(self) -> None:
        for name in ("steps", "n_samples_per_step", "batch_size", "progress_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1")
        if self.diagnostic_samples < 0:
            raise ValueError("diagnostic_samples must be ≥ 0")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError("lr must be a positive finite number")
        if not 0 < self.lr_final_fraction <= 1:
            raise ValueError("lr_final_fraction must be in (0, 1]")


class FlowSampler:
    """Variational approximation by a normalizing flow, trained by reverse KL.

    Loss (Rezende & Mohamed 2015, eq. 15; the ExpM+NF objective of Bridges et al. 2023):
    mean_j [log p_z(z_j) − log|det J_g(z_j)| − log p̃(g(z_j))], z_j ~ N(0, σ²I), i.e.
    KL(q‖p) − log Z estimated with N draws and a data minibatch. Adam with a cosine
    learning-rate decay, a fixed number of steps.

    Guarantee ``"nominal"``: the trained flow only approximates the target density.
    """

    label = "expm-nf/flow"
    guarantee: Guarantee = "nominal"

    def __init__(self, config: FlowSamplerConfig) -> None:
        self.config = config
        self.flow: Flow | None = None  # the trained flow, kept for enclave-side diagnostics

    def sample(
        self,
        target: LogDensityTarget,
        *,
        k: int,
        generator: torch.Generator,
        progress: ProgressFn,
    ) -> SamplerResult:
        if k < 1:
            raise ValueError("k must be ≥ 1")
        cfg = self.config
        # Initial flow parameters from a CPU generator seeded by the server generator, so no
        # global RNG state is involved.
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        init_gen = torch.Generator().manual_seed(seed)
        flow = build_flow(cfg.flow, target.dim, generator=init_gen)
        device = _target_device(target)
        flow.to(device)
        optimiser = torch.optim.Adam(flow.parameters(), lr=cfg.lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
            optimiser, T_max=cfg.steps, eta_min=cfg.lr * cfg.lr_final_fraction
        )
        skipped = 0
        loss_value = math.nan
        for step in range(cfg.steps):
            draw = flow.rsample(cfg.n_samples_per_step, generator=generator)
            log_p = target.minibatch_log_density(
                draw.x, batch_size=cfg.batch_size, generator=generator
            )
            loss = (draw.log_q - log_p).mean()
            optimiser.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(flow.parameters(), cfg.grad_clip)
            finite = all(
                p.grad is None or bool(torch.isfinite(p.grad).all()) for p in flow.parameters()
            )
            if finite:
                optimiser.step()
            else:
                # A non-finite step is skipped, not retried: the step count stays fixed.
                skipped += 1
            schedule.step()
            loss_value = float(loss.detach())
            if (step + 1) % cfg.progress_every == 0 or step + 1 == cfg.steps:
                progress(step + 1, cfg.steps)
        flow.eval()
        self.flow = flow
        diagnostics: dict[str, float] = {
            "final_minibatch_loss": loss_value,
            "skipped_steps": float(skipped),
            "invertibility_margin": float(flow.invertibility_margin().detach()),
        }
        with torch.no_grad():
            if cfg.diagnostic_samples > 0:
                diag = flow_diagnostics(flow, target, cfg.diagnostic_samples, generator)
                diagnostics.update(diag)
            samples = flow.rsample(k, generator=generator).x.detach().to("cpu")
        return SamplerResult(
            samples=samples, guarantee=self.guarantee, label=self.label, diagnostics=diagnostics
        )


def flow_diagnostics(
    flow: Flow, target: LogDensityTarget, n_draws: int, generator: torch.Generator
) -> dict[str, float]:
    """Full-data reverse KL, IS estimate of log Z and ESS from ``n_draws`` flow samples."""
    with torch.no_grad():
        draw = flow.rsample(n_draws, generator=generator)
        log_p = target.log_density(draw.x)
        diag = importance_diagnostics(log_p, draw.log_q)
    out = {k: float(v) for k, v in asdict(diag).items()}
    # The reverse-KL loss itself (= KL(q‖p) − log Z), on all data.
    out["final_loss"] = -diag.elbo
    return out


def _target_device(target: LogDensityTarget) -> torch.device:
    device = getattr(target, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")
