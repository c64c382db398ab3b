"""Plan of the ``features`` selection kind: one charge for the whole workflow, a pure
function of the request and the dataset's public schema.

DP-CFS (``cfs_greedy``, ``cfs_ga``). Every schema column is discretised by the public
schema only: a categorical column into its declared levels, a numeric column into
``numeric_bins`` equal-width bins of its declared (transformed) range; the binary target
into 2 cells. The worker counts H = F + F(F−1)/2 histograms: each feature with the
target (joint) and each feature pair (joint); marginals are sums of a joint's cells
(post-processing). Under add/remove-one a row adds 1 to exactly one cell of each
histogram, so the vector of all counts has ℓ2 sensitivity √H. Every cell gets integer
noise ⌊σ_cell·Z + ½⌋ (worker/noise.py rounded_gaussian), σ_cell = z·√H: the Gaussian
mechanism with noise multiplier z, charged once as
PoissonSubsampledGaussian(q = 1, z, 1 step) (RDP α/(2z²)) plus the sampler's pmf gap over
all cells (:func:`service.privacy.sampling.noise_slack`). z is the smallest noise
multiplier for which that Gaussian is (ε, δ)-DP by RDP (the product's calibration). The
entropies, symmetrical uncertainties, merits and the search (greedy or GA, server-side
randomness) are post-processing of the noisy counts: the charge does not depend on how
many subsets are scored.

Optional final model (``final``, cfs_* only): a DP-SGD model trained on all rows'
selected columns, charged in the same plan (composed after the histograms), its σ
calibrated for the model on all features (the largest).

PAFS (``pafs``). A genetic search over feature subsets whose fitness is the noisy
validation accuracy of a DP-SGD model trained on the subset (worker's train-and-score of
the architecture kind). Planned trainings N = population × generations (elitism keeps the
best without retraining); the charge is N × (training + noisy score), as for the
architecture kind (:mod:`service.selection.plans`), with every training's σ calibrated for
the model on *all* features (the largest; a smaller model's integer-noise slack is
smaller, so the charged event covers it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from service.datasets.tabular import CategoricalColumn, TabularSchema
from service.modelspec import LogisticSpec, MlpSpec
from service.params import Epsilon, InputModel, PositiveDelta
from service.plans import PlanError
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    PoissonSubsampledGaussianEvent,
    SelfComposedEvent,
)
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp
from service.privacy.sampling import count_event, noise_slack
from service.schemas import DpsgdOptions
from service.selection.budget import SelectionBudget

__all__ = [
    "MAX_CELLS",
    "MAX_FEATURE_COLUMNS",
    "ColumnBins",
    "FeatureCandidate",
    "FeatureGa",
    "FeatureLayout",
    "FeatureRequest",
    "FinalTraining",
    "cfs_event",
    "column_layout",
    "feature_plan_parts",
    "histogram_count",
    "pafs_event",
]

MAX_FEATURE_COLUMNS = 32
"""Public cap on the schema columns DP-CFS / PAFS consider (pair histograms are O(F²))."""

MAX_CELLS = 2_000_000
"""Public cap on the total number of noisy cells (time and memory of the worker)."""


class _In(InputModel):
    pass


class FeatureGa(_In):
    """Genetic search over subsets (bit masks): tournament selection, uniform crossover,
    bit-flip mutation, elitism."""

    population: int = Field(default=12, ge=2, le=64)
    generations: int = Field(default=10, ge=1, le=100)
    mutation_rate: float = Field(default=0.1, gt=0, le=1)


class FinalTraining(_In):
    """cfs_*: also train a DP-SGD model on the selected columns (on all rows), charged in
    the same plan (its σ calibrated for the model on all features, the largest)."""

    epsilon: Epsilon
    delta: PositiveDelta
    model: LogisticSpec | MlpSpec = Field(
        default_factory=lambda: MlpSpec(hidden=[16]), discriminator="kind"
    )
    training: DpsgdOptions = Field(default_factory=DpsgdOptions)


class FeatureRequest(_In):
    method: Literal["cfs_greedy", "cfs_ga", "pafs"] = "cfs_greedy"
    epsilon: Epsilon | None = Field(default=None, description="cfs_*: ε of the noisy histograms")
    delta: PositiveDelta | None = Field(default=None, description="cfs_*: δ")
    numeric_bins: int = Field(default=8, ge=2, le=32)
    max_selected: int | None = Field(default=None, ge=1, le=MAX_FEATURE_COLUMNS)
    ga: FeatureGa = Field(default_factory=FeatureGa)
    # pafs only
    model: MlpSpec = Field(default_factory=lambda: MlpSpec(hidden=[16]))
    training: DpsgdOptions = Field(default_factory=DpsgdOptions)
    budget: SelectionBudget | None = Field(
        default=None, description="pafs: per-training ε, δ and the noisy fitness' ε"
    )
    final: FinalTraining | None = Field(
        default=None, description="cfs_*: a final DP-SGD model on the selected columns"
    )

    @model_validator(mode="after")
    def _fields_for_method(self) -> FeatureRequest:
        if self.method == "pafs":
            if self.budget is None:
                raise ValueError("pafs needs budget (training_epsilon, training_delta)")
            if self.epsilon is not None or self.delta is not None:
                raise ValueError("pafs is charged by budget; epsilon/delta are for cfs_*")
            if self.final is not None:
                raise ValueError("pafs releases the selected subset's model; final is for cfs_*")
        else:
            if self.epsilon is None or self.delta is None:
                raise ValueError(f"{self.method} needs epsilon and delta")
            if self.budget is not None:
                raise ValueError("budget applies to pafs only")
        return self


class FeatureCandidate(_In):
    """A selected subset (schema column names, schema order) and how it was chosen."""

    method: str
    features: tuple[str, ...]


@dataclass(frozen=True)
class ColumnBins:
    """One schema column in the encoded matrix: columns [start, start + width) and its
    public number of cells (levels, or numeric bins)."""

    name: str
    start: int
    width: int
    bins: int
    categorical: bool


@dataclass(frozen=True)
class FeatureLayout:
    """The public values the worker needs for the ``features`` kind."""

    columns: tuple[ColumnBins, ...]
    target_bins: int
    histograms: int  # H; 0 for pafs
    cells: int
    noise_multiplier: float | None  # z; None for pafs
    cell_scale: float | None  # σ_cell = max(1, z·√H) in counts; None for pafs
    # privacy key of the DP-SGD trainings (PAFS candidates, or the final model)
    training_key: tuple[int, int, float | None] | None = None


def column_layout(schema: TabularSchema, *, numeric_bins: int) -> tuple[ColumnBins, ...]:
    out: list[ColumnBins] = []
    start = 0
    for col in schema.columns:
        if isinstance(col, CategoricalColumn):
            out.append(ColumnBins(col.name, start, len(col.levels), len(col.levels), True))
            start += len(col.levels)
        else:
            out.append(ColumnBins(col.name, start, 1, numeric_bins, False))
            start += 1
    if len(out) > MAX_FEATURE_COLUMNS:
        raise PlanError(
            f"feature selection considers at most {MAX_FEATURE_COLUMNS} columns, "
            f"the schema has {len(out)}"
        )
    return tuple(out)


def histogram_count(n_columns: int) -> int:
    """H = F feature–target joints + F(F−1)/2 feature-pair joints."""
    return n_columns + n_columns * (n_columns - 1) // 2


def _cells(columns: tuple[ColumnBins, ...], target_bins: int) -> int:
    fy = sum(c.bins * target_bins for c in columns)
    ff = sum(a.bins * b.bins for i, a in enumerate(columns) for b in columns[i + 1 :])
    return fy + ff


def cfs_event(*, noise_multiplier: float, cells: int) -> DpEvent:
    """The one charge of DP-CFS: the Gaussian mechanism on all counts (q = 1, one step,
    noise multiplier z relative to the ℓ2 sensitivity √H) and the pmf gap of ``cells``
    integer noise draws."""
    return ComposedEvent(
        events=(
            PoissonSubsampledGaussianEvent(
                sampling_rate=1.0, noise_multiplier=noise_multiplier, steps=1
            ),
            noise_slack(draws=cells),
        )
    )


def _calibrate(*, epsilon: float, delta: float, cells: int) -> float:
    """Smallest z (to a relative 1e-6, rounded up) with the whole :func:`cfs_event` within
    (ε, δ) on the ledger's orders (the ε the ledger records, CKS conversion)."""

    def eps(z: float) -> float:
        event = cfs_event(noise_multiplier=z, cells=cells)
        return epsilon_from_rdp(rdp=event.rdp(ORDERS), orders=ORDERS, delta=delta)

    lo, hi = 1e-3, 1e6
    if eps(hi) > epsilon:
        raise PlanError(f"no noise level reaches ε = {epsilon:g} at δ = {delta:g}")
    while hi / lo > 1.0 + 1e-6:
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if eps(mid) <= epsilon else (mid, hi)
    return hi


def feature_plan_parts(
    request: FeatureRequest, *, schema: TabularSchema
) -> tuple[DpEvent, FeatureLayout]:
    """DP-CFS: the event and layout. (PAFS is planned in service.selection.plans, which
    owns the training events.)"""
    if request.method == "pafs":
        raise PlanError("pafs is planned with its trainings (service.selection.plans)")
    assert request.epsilon is not None and request.delta is not None
    columns = column_layout(schema, numeric_bins=request.numeric_bins)
    h = histogram_count(len(columns))
    cells = _cells(columns, 2)
    if cells > MAX_CELLS:
        raise PlanError(f"{cells} histogram cells exceed the cap of {MAX_CELLS}")
    z = _calibrate(epsilon=request.epsilon, delta=request.delta, cells=cells)
    layout = FeatureLayout(
        columns=columns,
        target_bins=2,
        histograms=h,
        cells=cells,
        noise_multiplier=z,
        cell_scale=max(1.0, z * h**0.5),
    )
    return cfs_event(noise_multiplier=z, cells=cells), layout


def pafs_event(*, training: DpEvent, fitness_epsilon: float, trainings: int) -> DpEvent:
    per = ComposedEvent(events=(training, count_event(epsilon=fitness_epsilon)))
    return per if trainings == 1 else SelfComposedEvent(event=per, count=trainings)
