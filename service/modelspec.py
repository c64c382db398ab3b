"""Target-model specifications: public, validated, part of every request and model card."""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter

from service.params import InputModel, Width


def _kind_required(schema: dict[str, Any]) -> None:
    # `kind` has a default, but it is the union's discriminator: a model object without it
    # is refused, so the document says it is required (generated clients send it).
    schema["required"] = ["kind", *(r for r in schema.get("required", []) if r != "kind")]


class _Spec(InputModel):
    model_config = ConfigDict(json_schema_extra=_kind_required)


MAX_CLASSES = 4096
"""The most classes a target may declare (the exact softmax engine's bound)."""


class LogisticSpec(_Spec):
    """Logistic regression: sigmoid(w·x + b), output in [0, 1]; for a target of K ≥ 3
    classes, multinomial: softmax(W·x + b) over the K classes. ``classes`` is the
    dataset's public class count, filled in by the service from its schema (left out, or
    equal to it, in a request); absent for a binary target."""

    kind: Literal["logistic"] = "logistic"
    # Left out of every dump when absent, so binary plans and cards are unchanged, byte for
    # byte (the worker compares stored and re-derived plans; plan digests are pinned).
    classes: int | None = Field(
        default=None, ge=3, le=MAX_CLASSES, exclude_if=lambda value: value is None
    )


class MlpSpec(_Spec):
    """A small MLP with tanh or ReLU hidden layers and a sigmoid output in [0, 1]."""

    kind: Literal["mlp"] = "mlp"
    hidden: list[Width] = Field(default=[16], min_length=1, max_length=3)
    # Does not change the parameter count or any sensitivity (the head is a sigmoid).
    activation: Literal["tanh", "relu"] = "tanh"


class GrudSpec(_Spec):
    """GRU-D (Che et al. 2018) for irregular time series, sigmoid head in [0, 1]."""

    kind: Literal["grud"] = "grud"
    hidden: int = Field(default=16, ge=1, le=128)


ModelSpec = Annotated[LogisticSpec | MlpSpec | GrudSpec, Field(discriminator="kind")]
MODEL_SPEC: TypeAdapter[ModelSpec] = TypeAdapter(ModelSpec)
"""Validates a stored plan's model dict; built once (a TypeAdapter costs ~0.5 ms to build,
twice per DP-SGD plan before: benchmarks/results/submission_e2e.md)."""


def parameter_count(spec: ModelSpec, n_features: int) -> int:
    """Number of trainable parameters of the target model (public: spec and schema only).

    Logistic: n_features + 1, or K·(n_features + 1) with K ≥ 3 classes. MLP:
    Σ (fan_in + 1)·fan_out over its layers, sigmoid head of width 1. GRU-D with
    V = n_features variables and H hidden units (worker/models/grud.py): input decay 2V
    (diagonal weight, bias), hidden decay V·H + H, input gates on [x̂, m] 2V·3H + 3H,
    recurrent gates 2H·H + H·H (no bias), head H + 1.
    """
    if n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    if isinstance(spec, LogisticSpec):
        return (spec.classes or 1) * (n_features + 1)
    if isinstance(spec, MlpSpec):
        widths = [n_features, *spec.hidden, 1]
        return sum((a + 1) * b for a, b in pairwise(widths))
    v, h = n_features, spec.hidden
    return 2 * v + (v * h + h) + (2 * v * 3 * h + 3 * h) + 3 * h * h + (h + 1)
