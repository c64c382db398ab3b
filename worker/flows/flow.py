"""A normalizing flow: Gaussian base N(0, σ²I) pushed through a stack of transforms.

Variants are configured (:class:`FlowConfig`), not copy-pasted: one :func:`build_flow`
assembles planar or Householder-Sylvester stacks, with or without a final elementwise
affine layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor, nn

from worker.flows.transforms import (
    BoxTanh,
    ElementwiseAffine,
    HouseholderSylvester,
    Planar,
    Transform,
)

FlowKind = Literal["planar", "sylvester"]


@dataclass(frozen=True)
class FlowConfig:
    """What a flow looks like. ``reflections`` is the number of Householder reflections per
    Sylvester layer (None: one per dimension, so Q can be any rotation).
    ``affine_init_scale`` is the final affine layer's initial per-coordinate scale."""

    kind: FlowKind = "planar"
    layers: int = 8
    affine: bool = True
    base_std: float = 1.0
    reflections: int | None = None
    affine_init_scale: float = 1.0
    # A public box (−R, R)^D the flow maps onto (a final BoxTanh), or None: all of R^D.
    domain_radius: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("planar", "sylvester"):
            raise ValueError(f"unknown flow kind {self.kind!r}")
        if self.layers < 0:
            raise ValueError("layers must be ≥ 0")
        if not (self.base_std > 0 and math.isfinite(self.base_std)):
            raise ValueError("base_std must be a positive finite number")
        if self.reflections is not None and self.reflections < 1:
            raise ValueError("reflections must be ≥ 1")
        if not (self.affine_init_scale > 0 and math.isfinite(self.affine_init_scale)):
            raise ValueError("affine_init_scale must be a positive finite number")
        if self.domain_radius is not None and not (
            self.domain_radius > 0 and math.isfinite(self.domain_radius)
        ):
            raise ValueError("domain_radius must be a positive finite number or None")


@dataclass(frozen=True)
class FlowSample:
    """x = g(z) with its log-density under the flow; shapes (N, D), (N,), (N, D)."""

    x: Tensor
    log_q: Tensor
    z: Tensor


class Flow(nn.Module):
    """q(x) = N(g⁻¹(x); 0, σ²I) · |det ∂g⁻¹/∂x| with g the composition of ``transforms``."""

    def __init__(self, dim: int, transforms: Sequence[Transform], *, base_std: float) -> None:
        super().__init__()
        for t in transforms:
            if t.dim != dim:
                raise ValueError("every transform must act on the flow's dimension")
        self.dim = dim
        self.base_std = float(base_std)
        self.transforms = nn.ModuleList(transforms)

    def layers(self) -> list[Transform]:
        return [cast(Transform, t) for t in self.transforms]

    def base_log_prob(self, z: Tensor) -> Tensor:
        var = self.base_std**2
        return -0.5 * (z.square().sum(-1) / var + self.dim * math.log(2.0 * math.pi * var))

    def sample_base(self, n: int, *, generator: torch.Generator) -> Tensor:
        """n base draws from ``generator`` (the caller's CSPRNG-seeded server generator)."""
        p = next(self.parameters(), None)
        dtype = p.dtype if p is not None else torch.get_default_dtype()
        z = torch.randn(n, self.dim, generator=generator, device=generator.device, dtype=dtype)
        device = p.device if p is not None else z.device
        return z.to(device) * self.base_std

    def push(self, z: Tensor) -> FlowSample:
        """x = g(z) and log q(x) = log p_z(z) − Σ log|det J_k|."""
        log_q = self.base_log_prob(z)
        x = z
        for t in self.layers():
            x, ladj = t(x)
            log_q = log_q - ladj
        return FlowSample(x=x, log_q=log_q, z=z)

    def rsample(self, n: int, *, generator: torch.Generator) -> FlowSample:
        """Reparameterised samples: differentiable in the flow's parameters."""
        return self.push(self.sample_base(n, generator=generator))

    def inverse(self, x: Tensor) -> Tensor:
        z = x
        for t in reversed(self.layers()):
            z = t.inverse(z)
        return z

    def log_prob(self, x: Tensor) -> Tensor:
        """log q(x), through the (numerical where needed) inverse; −∞ outside the flow's
        image (a public domain, :class:`BoxTanh`)."""
        inside = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        z = x
        for t in reversed(self.layers()):
            ok = t.contains(z)
            inside = inside & ok
            z = t.inverse(torch.where(ok[:, None], z, torch.zeros_like(z)))
        log_q = self.push(z).log_q
        return torch.where(inside, log_q, torch.full_like(log_q, -math.inf))

    def invertibility_margin(self) -> Tensor:
        # A layer without parameters (BoxTanh) states its margin on the CPU: the margins
        # meet on the device of the flow's parameters (CUDA when the job runs there).
        device = next((p.device for p in self.parameters()), torch.device("cpu"))
        margins = [t.invertibility_margin().to(device) for t in self.layers()]
        return torch.stack(margins).min() if margins else torch.tensor(1.0, device=device)


def build_transforms(
    config: FlowConfig, dim: int, *, generator: torch.Generator | None = None
) -> list[Transform]:
    layers: list[Transform] = []
    for _ in range(config.layers):
        if config.kind == "planar":
            layers.append(Planar(dim, generator=generator))
        else:
            layers.append(
                HouseholderSylvester(dim, reflections=config.reflections, generator=generator)
            )
    if config.affine:
        # Last, so the shaping layers act at the base's unit scale and this one maps to the
        # target's location and per-coordinate scale.
        layers.append(ElementwiseAffine(dim, init_scale=config.affine_init_scale))
    if config.domain_radius is not None:
        # Last of all: every draw lands inside the public domain.
        layers.append(BoxTanh(dim, radius=config.domain_radius))
    return layers


def build_flow(config: FlowConfig, dim: int, *, generator: torch.Generator | None = None) -> Flow:
    """Build a flow on R^dim. Initial parameters come from ``generator`` (CPU) if given."""
    return Flow(dim, build_transforms(config, dim, generator=generator), base_std=config.base_std)
