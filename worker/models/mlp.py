"""A small MLP: tanh (or ReLU) hidden layers, one output logit (sigmoid(logit) ∈ [0, 1])."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(
        self, n_features: int, hidden: Sequence[int], activation: Literal["tanh", "relu"] = "tanh"
    ) -> None:
        super().__init__()
        if not hidden:
            raise ValueError("an MLP needs at least one hidden layer")
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.Tanh() if activation == "tanh" else nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)
