"""A small MLP: tanh (or ReLU) hidden layers, then one output logit (sigmoid(logit) ∈ [0, 1],
a binary target) or K logits (softmax over K ≥ 3 classes: its forward returns (batch, K))."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(
        self,
        n_features: int,
        hidden: Sequence[int],
        activation: Literal["tanh", "relu"] = "tanh",
        classes: int | None = None,
    ) -> None:
        super().__init__()
        if not hidden:
            raise ValueError("an MLP needs at least one hidden layer")
        if classes is not None and classes < 3:
            raise ValueError("a K-class MLP needs at least 3 classes (binary: classes None)")
        self.classes = classes
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.Tanh() if activation == "tanh" else nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, classes or 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out if self.classes is not None else out.squeeze(-1)
