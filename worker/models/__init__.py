"""Target models. Every binary module's forward returns logits of shape (batch,);
sigmoid(logits) is the bounded output in [0, 1] that sensitivity analyses rely on. A
logistic spec with K ≥ 3 classes builds :class:`Softmax`, an MLP, CNN or GRU-D spec with
K ≥ 3 classes its K-logit head: their logits are (batch, K).

``build_module`` makes the nn.Module (what a release's state dict loads into);
``build_batched`` wraps it with its batched functional form (N parameter vectors at once).

``n_features`` is the number of input columns for logistic/MLP and the number of
time-series variables V for GRU-D (whose inputs are (B, 3, T, V), see
:mod:`worker.models.grud`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from service.modelspec import CnnSpec, GrudSpec, LogisticSpec, MlpSpec, ModelSpec
from worker.models.cnn import Cnn
from worker.models.functional import BatchedModel, LinearBatchedModel, ParamLayout
from worker.models.grud import Grud, pack_inputs, pack_inputs_np
from worker.models.logistic import Logistic
from worker.models.mlp import Mlp
from worker.models.softmax import Softmax

__all__ = [
    "BatchedModel",
    "Cnn",
    "Grud",
    "LinearBatchedModel",
    "Logistic",
    "Mlp",
    "ParamLayout",
    "Softmax",
    "build_batched",
    "build_module",
    "pack_inputs",
    "pack_inputs_np",
]


def build_module(
    spec: ModelSpec, n_features: int, *, public_means: Sequence[float] | None = None
) -> nn.Module:
    """The target model for ``spec``.

    ``public_means`` (GRU-D only) is the public per-variable mean x̄ used for imputation;
    it is a buffer in the state dict, so a released state dict restores it on load.
    """
    if isinstance(spec, LogisticSpec):
        return Logistic(n_features) if spec.classes is None else Softmax(n_features, spec.classes)
    if isinstance(spec, MlpSpec):
        return Mlp(n_features, spec.hidden, spec.activation, spec.classes)
    if isinstance(spec, GrudSpec):
        means = None if public_means is None else torch.tensor(list(public_means))
        return Grud(n_features, spec.hidden, means, spec.classes)
    if isinstance(spec, CnnSpec):
        return Cnn(spec)
    raise ValueError(f"unknown model kind {getattr(spec, 'kind', spec)!r}")


def build_batched(
    spec: ModelSpec, n_features: int, *, public_means: Sequence[float] | None = None
) -> BatchedModel:
    """``build_module`` plus its batched functional form (matmul for logistic regression)."""
    module = build_module(spec, n_features, public_means=public_means)
    if isinstance(spec, LogisticSpec) and spec.classes is None:
        return LinearBatchedModel(module)
    return BatchedModel(module)
