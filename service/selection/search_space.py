"""Declared search spaces for architecture search, and how many trainings a search makes.

Everything here is public: the analyst declares the space and the algorithm's sizes, and
the number of trainings (hence the privacy charge) follows from them alone, before any
data is read. The searches themselves run in the worker
(:mod:`worker.mechanisms.search`) and only ever see *noisy* fitness values, so the
choices they make are post-processing of those private releases.

Algorithms (Bao, Bauer & Bindschaedler, privacy-aware architecture / feature selection
for DP ML; the names follow the issue):

* ``rs`` — random search: ``trainings`` candidates drawn uniformly from the space,
  the one with the best noisy fitness is selected;
* ``mgrs`` — multi-generation random search: ``generations`` rounds of
  ``per_generation`` candidates; after the first round, half of each round's
  candidates are mutations of the best candidate so far (by noisy fitness), half are
  drawn uniformly;
* ``paas`` — privacy-aware architecture search, a genetic algorithm: a population of
  ``population`` candidates, ``generations`` generations; each new generation is
  made by tournament selection on noisy fitness, uniform crossover and mutation.
  Every member of every generation is trained and scored once.

Spaces: MLPs (tabular datasets), GRU-D (time series) and CNNs (image datasets: conv layers
of ``depths``, channels per layer from ``widths``, one kernel size from ``kernels`` and
one pooling from ``pools`` per candidate; "same" padding, k // 2).
"""

from __future__ import annotations

from itertools import product
from typing import Literal

from pydantic import Field, model_validator

from service.modelspec import (
    MAX_CLASSES,
    MAX_CNN_CHANNELS,
    CnnSpec,
    ConvLayerSpec,
    GrudSpec,
    ImageShape,
    MlpSpec,
    ModelSpec,
    cnn_parameter_count,
)
from service.params import BatchSize, Depth, InputModel, LearningRate, Width

__all__ = ["ArchitectureCandidate", "ArchitectureSearch", "ArchitectureSpace", "planned_trainings"]


class _Frozen(InputModel):
    pass


CNN_ONLY = ("kernels", "pools", "image", "classes")
"""The space's fields that only a CNN space has, but ``classes``, which a GRU-D space on a
K-class time series has too (left out of every dump when absent, so MLP and binary GRU-D
requests, plans and digests are unchanged, byte for byte)."""


def _absent(value: object) -> bool:
    return value is None


class ArchitectureSpace(_Frozen):
    """MLP architectures: depth × width per layer × activation (× learning rate × batch);
    or, with ``model: grud`` (time-series datasets), GRU-D's hidden sizes (``widths``;
    one recurrent layer, its own gates: depth 1, no activation choice); or, with
    ``model: cnn`` (image datasets), CNNs of :class:`~service.modelspec.CnnSpec`: ``depths``
    conv layers, each with channels from ``widths``, one kernel size from ``kernels`` and
    one pooling from ``pools`` per candidate (ReLU; padding k // 2, so a layer keeps its
    map's size before pooling). ``model`` left out: the dataset's kind decides (CNNs on
    an image dataset, MLPs otherwise; service.selection.architecture.fit_space).
    ``image`` and ``classes`` of a CNN space are the dataset's public image shape and
    class count, filled in by the service from its schema; a GRU-D space's ``classes``
    the time series' K ≥ 3 outcome classes, filled in the same way."""

    model: Literal["mlp", "grud", "cnn"] | None = Field(
        default=None,
        description=(
            "mlp (tabular), grud (time series) or cnn (images); left out: cnn on an image "
            "dataset, mlp otherwise"
        ),
    )
    depths: list[Depth] = Field(
        default=[1, 2], min_length=1, description="hidden layers (mlp) or conv layers (cnn)"
    )
    widths: list[Width] = Field(
        default=[8, 16, 32],
        min_length=1,
        max_length=16,
        description="units per hidden layer (mlp, grud) or channels per conv layer (cnn)",
    )
    activations: list[Literal["tanh", "relu"]] = Field(
        default=["tanh"], min_length=1, description="mlp only (a CNN's is ReLU)"
    )
    learning_rates: list[LearningRate] = Field(default=[], max_length=16)
    batch_sizes: list[BatchSize] = Field(default=[], max_length=16)
    kernels: list[Literal[1, 3, 5, 7]] | None = Field(
        default=None,
        min_length=1,
        exclude_if=_absent,
        description="cnn only: kernel sizes (odd; padding k // 2). Default [3]",
    )
    pools: list[Literal["none", "avg2"]] | None = Field(
        default=None,
        min_length=1,
        exclude_if=_absent,
        description="cnn only: pooling after each conv layer (2 × 2 average). Default ['avg2']",
    )
    image: ImageShape | None = Field(
        default=None, exclude_if=_absent, description="cnn: the dataset's (filled in)"
    )
    classes: int | None = Field(
        default=None,
        ge=3,
        le=MAX_CLASSES,
        exclude_if=_absent,
        description="cnn, grud: the dataset's class count when K ≥ 3 (filled in)",
    )

    @model_validator(mode="after")
    def _shape_of_kind(self) -> ArchitectureSpace:
        if self.model == "grud":
            if self.depths != [1] or self.activations != ["tanh"]:
                raise ValueError("a GRU-D space has depths [1] and no activations to choose")
            if max(self.widths) > 128:
                raise ValueError("GRU-D hidden sizes are at most 128")
        if self.model == "cnn":
            if "activations" in self.model_fields_set and set(self.activations) != {"relu"}:
                raise ValueError("a CNN space has no activations to choose (ReLU)")
            if max(self.widths) > MAX_CNN_CHANNELS:
                raise ValueError(f"a CNN space's channels (widths) are at most {MAX_CNN_CHANNELS}")
        elif self.model is not None:
            only = [n for n in CNN_ONLY if not (n == "classes" and self.model == "grud")]
            given = [name for name in only if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: for a CNN space (model 'cnn') only")
        return self

    @property
    def cnn_kernels(self) -> list[int]:
        return list(self.kernels or [3])

    @property
    def cnn_pools(self) -> list[Literal["none", "avg2"]]:
        return list(self.pools or ["avg2"])

    def activation_choices(self) -> list[Literal["tanh", "relu"]]:
        """The activations a candidate draws from (a CNN's is ReLU)."""
        return ["relu"] if self.model == "cnn" else list(self.activations)

    def spec_of(self, candidate: ArchitectureCandidate) -> ModelSpec:
        """The model a candidate of this space trains."""
        if self.model == "grud":
            return GrudSpec(hidden=candidate.hidden[0], classes=self.classes)
        if self.model == "cnn":
            return self._cnn(candidate.hidden, candidate.kernel or 3, candidate.pool or "avg2")
        return MlpSpec(hidden=list(candidate.hidden), activation=candidate.activation)

    def _cnn(self, channels: tuple[int, ...], kernel: int, pool: str) -> CnnSpec:
        layer = {"kernel": kernel, "padding": kernel // 2, "pool": pool}
        return CnnSpec(
            conv=[ConvLayerSpec.model_validate({**layer, "channels": c}) for c in channels],
            classes=self.classes,
            image=self.image,
        )

    def cnn_extremes(self) -> list[CnnSpec]:
        """One CNN per (depth, kernel, pooling), every layer at the most channels. A CNN's
        parameter count, multiply-adds and exact-engine floats per row
        (service/modelspec.py) are sums of products of channel counts with positive
        coefficients fixed by the geometry, which channels do not change: each grows with
        every layer's channels. So over the space each of them is largest at one of these
        models (tested by enumeration in tests/unit/test_cnn_architecture.py)."""
        return [
            self._cnn((max(self.widths),) * depth, kernel, pool)
            for depth, kernel, pool in product(
                sorted(set(self.depths)), sorted(set(self.cnn_kernels)), self.cnn_pools
            )
        ]

    def largest(self) -> ModelSpec:
        """The space's largest model (most parameters): its DP-SGD plan is the one charged
        for every candidate (a smaller model's σ and slack are covered by it). A CNN
        space's: the extreme (:meth:`cnn_extremes`) with the most parameters, the first of
        them in their order on a tie (a space without its image shape raises ValueError)."""
        if self.model == "grud":
            return GrudSpec(hidden=max(self.widths), classes=self.classes)
        if self.model == "cnn":
            return max(self.cnn_extremes(), key=cnn_parameter_count)
        return MlpSpec(hidden=[max(self.widths)] * max(self.depths))


class ArchitectureCandidate(_Frozen):
    """One point of the space; ``None`` learning rate / batch size: the request's own."""

    hidden: tuple[int, ...]  # units per layer (mlp, grud) or channels per conv layer (cnn)
    activation: Literal["tanh", "relu"]
    learning_rate: float | None = None
    batch_size: int | None = None
    # A CNN candidate's kernel size and pooling (left out of an MLP candidate's dump).
    kernel: int | None = Field(default=None, exclude_if=_absent)
    pool: Literal["none", "avg2"] | None = Field(default=None, exclude_if=_absent)


class ArchitectureSearch(_Frozen):
    """Which search and its sizes (all public; they fix the number of trainings)."""

    algorithm: Literal["rs", "mgrs", "paas"] = "paas"
    trainings: int = Field(default=8, ge=1, le=200, description="rs: candidates trained")
    generations: int = Field(default=3, ge=1, le=50, description="mgrs, paas")
    per_generation: int = Field(default=4, ge=1, le=50, description="mgrs")
    population: int = Field(default=4, ge=2, le=50, description="paas")
    mutation_rate: float = Field(default=0.3, ge=0.0, le=1.0, description="paas, mgrs")

    @model_validator(mode="after")
    def _bounded(self) -> ArchitectureSearch:
        if planned_trainings(self) > 200:
            raise ValueError("a search may train at most 200 candidates")
        return self


def planned_trainings(search: ArchitectureSearch) -> int:
    """Number of candidates the search trains and scores (each one charged)."""
    if search.algorithm == "rs":
        return search.trainings
    if search.algorithm == "mgrs":
        return search.generations * search.per_generation
    return search.generations * search.population
