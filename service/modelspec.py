"""Target-model specifications: public, validated, part of every request and model card."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, field_validator

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
    """A small MLP with tanh or ReLU hidden layers and a sigmoid output in [0, 1]; for a
    target of K ≥ 3 classes, a head of K logits and softmax. ``classes`` is filled in by
    the service from the dataset's schema, as for :class:`LogisticSpec`."""

    kind: Literal["mlp"] = "mlp"
    hidden: list[Width] = Field(default=[16], min_length=1, max_length=3)
    # Does not change the parameter count or any sensitivity (the clipping bounds them).
    activation: Literal["tanh", "relu"] = "tanh"
    # Left out of every dump when absent: binary MLP plans and cards unchanged, byte for byte.
    classes: int | None = Field(
        default=None, ge=3, le=MAX_CLASSES, exclude_if=lambda value: value is None
    )


class GrudSpec(_Spec):
    """GRU-D (Che et al. 2018) for irregular time series, sigmoid head in [0, 1]; for an
    outcome of K ≥ 3 classes, a head of K logits and softmax (``classes`` filled in by the
    service from the dataset's schema, as for :class:`MlpSpec`)."""

    kind: Literal["grud"] = "grud"
    hidden: int = Field(default=16, ge=1, le=128)
    # Left out of every dump when absent: binary GRU-D plans and cards unchanged.
    classes: int | None = Field(
        default=None, ge=3, le=MAX_CLASSES, exclude_if=lambda value: value is None
    )


MAX_CNN_PARAMETERS = 1 << 20
"""The most parameters a CNN may have (the exact engine materialises each row's gradient)."""
MAX_CNN_CHANNELS = 64


class ConvLayerSpec(InputModel):
    """One convolution: ``channels`` output channels, a ``kernel`` × ``kernel`` window moved
    by ``stride``, ``padding`` zeros on every side, then ReLU, then ``pool``: ``none`` or
    ``avg2`` (2 × 2 average pooling, stride 2, a trailing odd row or column dropped)."""

    channels: int = Field(ge=1, le=MAX_CNN_CHANNELS)
    kernel: int = Field(default=3, ge=1, le=7)
    stride: Literal[1, 2] = 1
    padding: int = Field(default=0, ge=0, le=3)
    pool: Literal["none", "avg2"] = "none"


class ImageShape(InputModel):
    """An image's axes (the dataset schema's channels, height and width)."""

    channels: int = Field(ge=1, le=3)
    height: int = Field(ge=1, le=4096)
    width: int = Field(ge=1, le=4096)


NORM_REFUSALS = {
    "batchnorm": (
        "batchnorm mixes rows: it normalises each activation by the mean and variance of "
        "the whole batch, so one row's gradient depends on every other row in it and no "
        "per-row clipping bounds its influence; use norm 'none'"
    ),
    "groupnorm": (
        "groupnorm is refused for now: the exact fixed-point DP-SGD engine "
        "(worker/mechanisms/exact_conv.py) has no exact per-row normalisation yet; "
        "use norm 'none'"
    ),
}
"""Why each normalisation other than ``none`` is refused (a 422 at validation)."""


class CnnSpec(_Spec):
    """A small CNN for image datasets: the ``conv`` layers in order (each convolution,
    ReLU, optional 2 × 2 average pooling), then one Linear head on the flattened maps to one
    logit (sigmoid, binary target) or to K logits (softmax, K ≥ 3 classes). ``classes`` and
    ``image`` are the dataset's public class count and image shape, filled in by the
    service from its schema (left out, or equal to it, in a request). Trained by DP-SGD
    with the exact engine (worker/mechanisms/exact_conv.py)."""

    kind: Literal["cnn"] = "cnn"
    conv: list[ConvLayerSpec] = Field(min_length=1, max_length=4)
    norm: Literal["none", "batchnorm", "groupnorm"] = Field(
        default="none",
        description="Only 'none' is accepted: batchnorm mixes rows, groupnorm is not built yet.",
    )
    classes: int | None = Field(
        default=None, ge=3, le=MAX_CLASSES, exclude_if=lambda value: value is None
    )
    image: ImageShape | None = Field(default=None, exclude_if=lambda value: value is None)

    @field_validator("norm")
    @classmethod
    def _no_norm(cls, value: str) -> str:
        if value in NORM_REFUSALS:
            raise ValueError(NORM_REFUSALS[value])
        return value


@dataclass(frozen=True)
class ConvGeometry:
    """One convolution's shapes: input (c_in, h_in, w_in), output maps (c_out, h, w)
    before pooling, ``positions`` = h·w, ``fan_in`` = c_in·kernel², and the maps' shape
    after pooling (``pooled``)."""

    c_in: int
    h_in: int
    w_in: int
    c_out: int
    h: int
    w: int
    kernel: int
    stride: int
    padding: int
    pool: bool
    pooled: tuple[int, int, int]

    @property
    def positions(self) -> int:
        return self.h * self.w

    @property
    def fan_in(self) -> int:
        return self.c_in * self.kernel * self.kernel


def cnn_geometry(spec: CnnSpec) -> list[ConvGeometry]:
    """Each convolution's shapes (torch's: h = ⌊(h_in + 2p − k)/s⌋ + 1; pooling halves with
    the floor). ValueError where the spec has no image shape or a map becomes empty."""
    if spec.image is None:
        raise ValueError(
            "model 'cnn' takes its image shape from a registered image dataset's schema: "
            "DP-SGD jobs, architecture searches and hyperparameter tuning on such a "
            "dataset only"
        )
    c, h, w = spec.image.channels, spec.image.height, spec.image.width
    out = []
    for index, layer in enumerate(spec.conv):
        k, s, p = layer.kernel, layer.stride, layer.padding
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        if ho < 1 or wo < 1 or h + 2 * p < k or w + 2 * p < k:
            raise ValueError(f"model.conv[{index}]: a {k}×{k} kernel does not fit a {h}×{w} map")
        pool = layer.pool == "avg2"
        ph, pw = (ho // 2, wo // 2) if pool else (ho, wo)
        if ph < 1 or pw < 1:
            raise ValueError(f"model.conv[{index}]: 2×2 pooling of a {ho}×{wo} map is empty")
        g = ConvGeometry(c, h, w, layer.channels, ho, wo, k, s, p, pool, (layer.channels, ph, pw))
        out.append(g)
        c, h, w = g.pooled
    return out


def cnn_parameter_count(spec: CnnSpec) -> int:
    """Σ (c_in·k² + 1)·c_out over the convolutions plus (c·h·w + 1)·K_out for the head
    (K_out = 1 for a binary target, K with K ≥ 3 classes)."""
    layers = cnn_geometry(spec)
    c, h, w = layers[-1].pooled
    return sum((g.fan_in + 1) * g.c_out for g in layers) + (c * h * w + 1) * (spec.classes or 1)


def cnn_row_floats(spec: CnnSpec) -> int:
    """Float64 values the exact engine holds per row at once (worker/mechanisms/
    exact_conv.py): per convolution its patches (positions × (fan_in + 1)), pre-activations,
    activations and output gradients (3 × positions × c_out) and the gradient of its
    patches; the head's inputs; and the row's gradient and contribution (2P)."""
    layers = cnn_geometry(spec)
    per = sum(g.positions * (2 * g.fan_in + 1 + 3 * g.c_out) for g in layers)
    c, h, w = layers[-1].pooled
    return per + c * h * w + 2 * cnn_parameter_count(spec)


def cnn_row_macs(spec: CnnSpec) -> int:
    """Multiply-adds per row of one exact-engine pass: forward (positions·fan_in·c_out per
    convolution, the head), the backward to each input and the per-row weight gradients
    (the same count each)."""
    layers = cnn_geometry(spec)
    conv = sum(g.positions * (g.fan_in + 1) * g.c_out for g in layers)
    c, h, w = layers[-1].pooled
    return 3 * (conv + (c * h * w + 1) * (spec.classes or 1))


def fitted_cnn(spec: CnnSpec, shape: tuple[int, int, int]) -> CnnSpec:
    """``spec`` with the dataset's image shape (C, H, W); ValueError if the request gave
    another or the network does not fit it."""
    image = ImageShape(channels=shape[0], height=shape[1], width=shape[2])
    if spec.image is not None and spec.image != image:
        raise ValueError(f"model.image {spec.image.model_dump()} differs from the dataset's")
    fitted = spec.model_copy(update={"image": image})
    cnn_parameter_count(fitted)  # the geometry fits (the cap is parameter_count's)
    return fitted


ModelSpec = Annotated[LogisticSpec | MlpSpec | GrudSpec | CnnSpec, Field(discriminator="kind")]
MODEL_SPEC: TypeAdapter[ModelSpec] = TypeAdapter(ModelSpec)
"""Validates a stored plan's model dict; built once (a TypeAdapter costs ~0.5 ms to build,
twice per DP-SGD plan before: benchmarks/results/submission_e2e.md)."""


def parameter_count(spec: ModelSpec, n_features: int) -> int:
    """Number of trainable parameters of the target model (public: spec and schema only).

    Logistic: n_features + 1, or K·(n_features + 1) with K ≥ 3 classes. MLP:
    Σ (fan_in + 1)·fan_out over its layers, a head of width 1 (sigmoid) or K (softmax,
    K ≥ 3 classes). GRU-D with
    V = n_features variables and H hidden units (worker/models/grud.py): input decay 2V
    (diagonal weight, bias), hidden decay V·H + H, input gates on [x̂, m] 2V·3H + 3H,
    recurrent gates 2H·H + H·H (no bias), head H + 1 (K·(H + 1) with K ≥ 3 classes).
    CNN: :func:`cnn_parameter_count`
    (its image shape must give ``n_features`` = C·H·W; at most MAX_CNN_PARAMETERS).
    """
    if n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    if isinstance(spec, LogisticSpec):
        return (spec.classes or 1) * (n_features + 1)
    if isinstance(spec, MlpSpec):
        widths = [n_features, *spec.hidden, spec.classes or 1]
        return sum((a + 1) * b for a, b in pairwise(widths))
    if isinstance(spec, CnnSpec):
        count = cnn_parameter_count(spec)
        image = spec.image
        assert image is not None  # cnn_parameter_count raised otherwise
        if image.channels * image.height * image.width != n_features:
            raise ValueError("model.image does not match the dataset's encoded width")
        if count > MAX_CNN_PARAMETERS:
            raise ValueError(f"the CNN has {count} parameters, more than {MAX_CNN_PARAMETERS}")
        return count
    v, h = n_features, spec.hidden
    return 2 * v + (v * h + h) + (2 * v * 3 * h + 3 * h) + 3 * h * h + (spec.classes or 1) * (h + 1)
