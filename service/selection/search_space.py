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
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from service.modelspec import GrudSpec, MlpSpec, ModelSpec
from service.params import BatchSize, Depth, InputModel, LearningRate, Width

__all__ = ["ArchitectureCandidate", "ArchitectureSearch", "ArchitectureSpace", "planned_trainings"]


class _Frozen(InputModel):
    pass


class ArchitectureSpace(_Frozen):
    """MLP architectures: depth × width per layer × activation (× learning rate × batch);
    or, with ``model: grud`` (time-series datasets), GRU-D's hidden sizes (``widths``;
    one recurrent layer, its own gates: depth 1, no activation choice)."""

    model: Literal["mlp", "grud"] = "mlp"
    depths: list[Depth] = Field(default=[1, 2], min_length=1)
    widths: list[Width] = Field(default=[8, 16, 32], min_length=1, max_length=16)
    activations: list[Literal["tanh", "relu"]] = Field(default=["tanh"], min_length=1)
    learning_rates: list[LearningRate] = Field(default=[], max_length=16)
    batch_sizes: list[BatchSize] = Field(default=[], max_length=16)

    @model_validator(mode="after")
    def _grud_shape(self) -> ArchitectureSpace:
        if self.model == "grud":
            if self.depths != [1] or self.activations != ["tanh"]:
                raise ValueError("a GRU-D space has depths [1] and no activations to choose")
            if max(self.widths) > 128:
                raise ValueError("GRU-D hidden sizes are at most 128")
        return self

    def spec_of(self, candidate: ArchitectureCandidate) -> ModelSpec:
        """The model a candidate of this space trains."""
        if self.model == "grud":
            return GrudSpec(hidden=candidate.hidden[0])
        return MlpSpec(hidden=list(candidate.hidden), activation=candidate.activation)

    def largest(self) -> ModelSpec:
        """The space's largest model (most parameters): its DP-SGD plan is the one charged
        for every candidate (a smaller model's σ and slack are covered by it)."""
        if self.model == "grud":
            return GrudSpec(hidden=max(self.widths))
        return MlpSpec(hidden=[max(self.widths)] * max(self.depths))


class ArchitectureCandidate(_Frozen):
    """One point of the space; ``None`` learning rate / batch size: the request's own."""

    hidden: tuple[int, ...]
    activation: Literal["tanh", "relu"]
    learning_rate: float | None = None
    batch_size: int | None = None


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
