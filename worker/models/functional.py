"""Target models in batched functional form: N parameter vectors, one computation.

A parameter vector θ ∈ R^P is the concatenation of a module's parameters in
``named_parameters()`` order, each flattened row-major (:class:`ParamLayout`). Buffers
(e.g. GRU-D's public means) are fixed, not part of θ, and travel with every release.

:meth:`BatchedModel.logits` maps θ of shape (N, P) and a data batch of B rows to logits
of shape (N, B). The generic implementation is ``torch.func.vmap`` over
``torch.func.functional_call``; linear models override it with a single matmul.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap


@dataclass(frozen=True)
class ParamLayout:
    """Where each named parameter lives in the flat vector θ."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, module: nn.Module) -> ParamLayout:
        named = list(module.named_parameters())
        return cls(tuple(n for n, _ in named), tuple(tuple(p.shape) for _, p in named))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        """θ of shape (..., P) → {name: (..., *shape)} (views, differentiable)."""
        if theta.shape[-1] != self.size:
            raise ValueError(f"θ has {theta.shape[-1]} entries, the model needs {self.size}")
        lead = theta.shape[:-1]
        parts = theta.split(self.sizes, dim=-1)
        return {
            n: p.reshape(*lead, *s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)
        }

    def flatten(self, params: Mapping[str, Tensor]) -> Tensor:
        """{name: tensor} → θ of shape (P,)."""
        return torch.cat([params[n].reshape(-1) for n in self.names])


class BatchedModel:
    """A module together with its batched functional forward."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.layout = ParamLayout.of(module)

    @property
    def n_params(self) -> int:
        return self.layout.size

    def buffers(self) -> dict[str, Tensor]:
        return dict(self.module.named_buffers())

    def logits(self, theta: Tensor, x: Tensor) -> Tensor:
        """Logits for every (parameter vector, row) pair: θ (N, P), x (B, ...) → (N, B)."""
        params = self.layout.unflatten(theta)
        buffers = self.buffers()

        def one(p: dict[str, Tensor]) -> Tensor:
            return functional_call(self.module, (p, buffers), (x,))

        out: Tensor = vmap(one)(params)
        return out

    def logits_loop(self, theta: Tensor, x: Tensor) -> Tensor:
        """Reference implementation, one functional_call per parameter vector (tests)."""
        buffers = self.buffers()
        rows = [
            functional_call(self.module, (self.layout.unflatten(t), buffers), (x,)) for t in theta
        ]
        return torch.stack(rows)

    def state_dict(self, theta: Tensor) -> dict[str, Tensor]:
        """θ (P,) → a state dict that ``module.load_state_dict`` accepts (CPU float32)."""
        if theta.dim() != 1:
            raise ValueError("state_dict takes one parameter vector of shape (P,)")
        params = self.layout.unflatten(theta.detach())
        out = {k: v.to("cpu", torch.float32).contiguous().clone() for k, v in params.items()}
        for k, b in self.module.state_dict().items():
            if k not in out:
                out[k] = b.detach().to("cpu").clone()
        return out


class LinearBatchedModel(BatchedModel):
    """For a module whose forward is ``linear(x).squeeze(-1)`` with ``linear = nn.Linear(d, 1)``:
    logits = θ_w Xᵀ + b, one (N, d) × (d, B) matmul."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        if self.layout.names != ("linear.weight", "linear.bias"):
            raise ValueError("LinearBatchedModel needs a module with a single `linear` layer")
        self.n_features = self.layout.shapes[0][1]

    def logits(self, theta: Tensor, x: Tensor) -> Tensor:
        d = self.n_features
        return torch.addmm(theta[:, d : d + 1], theta[:, :d], x.T)
