"""Multinomial logistic regression (K ≥ 3 classes): one Linear layer to K logits,
softmax(logits) the class probabilities. Its forward returns the logits (batch, K)."""

from __future__ import annotations

import torch
from torch import nn


class Softmax(nn.Module):
    def __init__(self, n_features: int, classes: int) -> None:
        super().__init__()
        if classes < 3:
            raise ValueError("multinomial logistic regression needs at least 3 classes")
        self.classes = classes
        self.linear = nn.Linear(n_features, classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)
