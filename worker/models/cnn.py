"""A small CNN (``kind: cnn``, issue 20): convolutions, each followed by ReLU and optional
2 × 2 average pooling, then one Linear head on the flattened maps. Its forward takes the
flattened encoded pixels (batch, C·H·W) in channel-major order (the image kind's
encoding, service/datasets/images.py) and returns one logit (batch,) for a binary target
or K logits (batch, K) for K ≥ 3 classes. The exact DP-SGD engine computes the same
network on fixed-point grids (worker/mechanisms/exact_conv.py)."""

from __future__ import annotations

import torch
from torch import nn

from service.modelspec import CnnSpec, cnn_geometry, cnn_row_floats


class Cnn(nn.Module):
    def __init__(self, spec: CnnSpec) -> None:
        super().__init__()
        geometry = cnn_geometry(spec)
        self.geometry = tuple(geometry)
        image = spec.image
        assert image is not None  # cnn_geometry raised otherwise
        self.shape = (image.channels, image.height, image.width)
        self.classes = spec.classes
        self.row_floats = cnn_row_floats(spec)  # the exact engine's memory per row
        self.pools = tuple(g.pool for g in geometry)
        self.convs = nn.ModuleList(
            nn.Conv2d(g.c_in, g.c_out, g.kernel, stride=g.stride, padding=g.padding)
            for g in geometry
        )
        c, h, w = geometry[-1].pooled
        self.head = nn.Linear(c * h * w, spec.classes or 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(x.shape[0], *self.shape)
        for conv, pool in zip(self.convs, self.pools, strict=True):
            a = torch.relu(conv(a))
            if pool:
                a = nn.functional.avg_pool2d(a, 2)
        out = self.head(a.flatten(1))
        return out if self.classes is not None else out.squeeze(-1)
