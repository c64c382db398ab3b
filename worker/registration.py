"""Dataset registration by the admin, inside the enclave (it reads the private CSV)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, select

from service.config import Settings
from service.datasets.kinds import DatasetSchema
from service.datasets.tabular import ValidationReport
from service.datasets.timeseries import TimeSeriesReport
from service.db import transaction
from service.ledger.datasets import count_refusal, new_dataset
from service.ledger.policy import no_method_warning
from service.ledger.tables import Dataset
from service.params import DELTA_FLOOR, EPSILON_FLOOR
from service.privacy.filters import EPSILON_TOTAL_MAX
from service.privacy.sampling import default_count_epsilon
from worker.data import (
    WORKER_KINDS,
    CsvReadError,
    holdout_refusal,
    prepare_dataset,
    split_holdout,
    store_holdout,
    store_prepared,
)
from worker.image_types import ImageReport
from worker.noise import discrete_laplace, secure_rng


class RegistrationError(ValueError):
    """Registration refused; ``report`` is the validation report when the rows were read."""

    def __init__(
        self, message: str, report: ValidationReport | TimeSeriesReport | ImageReport | None = None
    ) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Registered:
    """What the admin is told inside the enclave. ``noisy_n_rows`` is the released count
    (public from now on); the exact counts are in ``report`` and go nowhere else."""

    name: str
    noisy_n_rows: int
    count_epsilon: float
    report: ValidationReport | TimeSeriesReport | ImageReport
    path: Path
    warning: str | None = None  # e.g. no method can be admitted (policy.no_method_warning)
    holdout_rows: int | None = None  # n_h, public; noisy_n_rows is then the training n̂ − n_h


def noisy_count(n: int, *, epsilon: float) -> int:
    """n + two-sided geometric noise of scale 1/ε, floored at 1 (post-processing): ε-DP for
    a count under add/remove-one (Ghosh, Roughgarden & Sundararajan 2009)."""
    noise = int(discrete_laplace(secure_rng(), scale=1.0 / epsilon, size=1)[0])
    return max(1, n + noise)


def register_dataset(
    engine: Engine,
    settings: Settings,
    *,
    schema: DatasetSchema,
    csv_path: Path,
    outcomes_path: Path | None = None,
    epsilon_total: float,
    delta_total: float,
    allow_nominal: bool = False,
    count_epsilon: float | None = None,
    holdout_fraction: float | None = None,
) -> Registered:
    """Validate the rows against the public schema (a time-series schema: the long-format
    observations in ``csv_path`` and the per-stay outcomes in ``outcomes_path``; its rows
    are the stays), store them on the private volume,
    create the dataset's budget in the ledger and release a DP noisy row count, charged to
    that budget (``count_epsilon``, default :func:`default_count_epsilon`). Plans use only
    the noisy count, so the accounting's add/remove-one relation holds with nothing
    about the row count published exactly. The admin is told how many rows were rejected
    or clipped (inside the enclave only), and warned when no method can be admitted.

    ``holdout_fraction`` F ∈ (0, ½] (every kind: a row is a tabular row, an image, or a
    time series' stay with all its observations and its outcome): after the noisy count n̂
    is drawn, n_h = ⌊F·n̂⌋ (public: a function of n̂ and F) of the kept rows become the
    private evaluation holdout (issue 21). The kept rows are put in a uniformly random
    order by the enclave's secure generator (worker/noise.py ``secure_rng``; the
    permutation is not kept; worker/data.py ``split_holdout``, one rule for every kind);
    the first n_h are stored beside the training rows in the kind's format
    (``holdout.csv.gz``, ``holdout.npz``, ``holdout_observations.csv.gz`` with
    ``holdout_outcomes.csv.gz``), the rest are the training rows, which every training
    loader reads as before and which never include a holdout row. The ledger records
    n_rows = n̂ − n_h (the training rows' public count: a noisy count of them with the
    same noise) and holdout_rows = n_h. Refused, to the admin inside the enclave only,
    when n_h < 1 or n_h ≥ the rows kept.

    Why this fits the ledger's add/remove-one relation (service/privacy/filters.py): a
    uniform permutation is the order of independent uniform random keys, one per row. Let
    D' = D + x and couple the two splits by giving D's rows the same keys in both. If x's
    key is not among the n_h smallest, the holdout is unchanged and the training part
    gains x (add-one). Otherwise x enters the holdout and pushes out the row that was
    n_h-th, which joins the training part: the holdout, of public size n_h, changes by the
    *replacement* of one row (the relation service/privacy/evaluation.py assumes) and the
    training part by the addition of one row. Removal is the same read backwards. So, on
    every coupled pair, each later job sees a neighbouring input in its own relation
    (training jobs add/remove-one on the training rows, evaluations replace-one on the
    holdout) and the charges compose by summing, as the ledger sums them; the released
    law under D (resp. D') is the mixture of the coupled laws with the same weights (the
    keys of D's rows and of x), and Rényi divergence is jointly quasi-convex (van Erven &
    Harremoës 2014, "Rényi divergence and Kullback-Leibler divergence", IEEE Trans. Inf.
    Theory 60(7), the joint quasi-convexity theorem), so the mixture's divergence is at most
    the largest coupled one (likewise the hockey-stick divergence, jointly convex, for
    (ε, δ)). n_h and n_rows depend on n̂ only, which was released by its own charged
    mechanism (the adaptive composition the ledger already counts).

    The argument needs of a kind only what its training jobs' relation already assumes:
    the kept rows of D + x are D's kept rows plus x, or D's (validation keeps or rejects a
    row on that row alone, as every training job's guarantee on the kind already takes),
    and a row's encoding reads that row alone, so an evaluation's per-row statistic (one
    prediction against one label) moves with one holdout row only.
    Images: each image is read, checked and encoded by itself (worker/images.py,
    service/datasets/images.py ``encode_pixels``). Time series: the permutation is over
    the kept stays (the outcomes, one line per stay); a stay goes to the holdout or to the
    training rows with all its observations, and GRU-D's inputs of a stay are binned from
    that stay's observations alone (service/datasets/timeseries.py ``encode_series``)."""
    if not (EPSILON_FLOOR <= epsilon_total <= EPSILON_TOTAL_MAX):
        raise RegistrationError(
            f"ε_total must be in [{EPSILON_FLOOR:g}, {EPSILON_TOTAL_MAX:g}] nats, "
            f"got {epsilon_total!r}"
        )
    if delta_total != 0 and not (DELTA_FLOOR <= delta_total < 1):
        raise RegistrationError(
            f"δ_total must be 0 or in [{DELTA_FLOOR:g}, 1), got {delta_total!r}"
        )
    eps_count = default_count_epsilon(epsilon_total) if count_epsilon is None else count_epsilon
    if not (math.isfinite(eps_count) and eps_count > 0):
        raise RegistrationError(f"the row count's ε must be > 0, got {eps_count!r}")
    refused = count_refusal(
        epsilon_total=epsilon_total, delta_total=delta_total, count_epsilon=eps_count
    )
    if refused:
        raise RegistrationError(f"the budget cannot pay for the noisy row count: {refused}")
    if holdout_fraction is not None:
        kind_cannot = holdout_refusal(schema.kind)
        if kind_cannot:
            raise RegistrationError(kind_cannot)
        if not (math.isfinite(holdout_fraction) and 0 < holdout_fraction <= 0.5):
            raise RegistrationError(
                f"the holdout fraction must be in (0, 0.5], got {holdout_fraction!r}"
            )
    with transaction(engine) as s:
        if s.scalars(select(Dataset).where(Dataset.name == schema.name)).first():
            raise RegistrationError(f"a dataset named {schema.name!r} is already registered")
    kind_refused = WORKER_KINDS[schema.kind].refusal(schema)
    if kind_refused:
        raise RegistrationError(kind_refused)
    try:
        prepared = prepare_dataset(schema, csv_path, outcomes_path)
    except CsvReadError as exc:
        raise RegistrationError(str(exc)) from None
    if prepared.report.rows_kept == 0:
        raise RegistrationError("no row passed validation", prepared.report)
    cap = getattr(schema, "max_rows", None)
    if cap is not None and prepared.report.rows_kept > cap:
        # The schema's public cap is a statement the proofs rely on (lattice_langevin.py).
        raise RegistrationError(
            f"{prepared.report.rows_kept} rows passed validation, above the schema's "
            f"max_rows {cap}: raise max_rows or register fewer rows",
            prepared.report,
        )
    released = noisy_count(prepared.report.rows_kept, epsilon=eps_count)
    holdout_rows: int | None = None
    if holdout_fraction is not None:
        holdout_rows = math.floor(holdout_fraction * released)
        if not (1 <= holdout_rows < prepared.report.rows_kept):
            raise RegistrationError(
                f"the holdout would have {holdout_rows} rows (⌊{holdout_fraction:g} × the noisy "
                f"count {released}⌋) of {prepared.report.rows_kept} kept: it needs at least one "
                "row and fewer than the rows kept",
                prepared.report,
            )
        prepared, holdout = split_holdout(
            schema, prepared, holdout_rows=holdout_rows, rng=secure_rng()
        )
        store_holdout(settings.resolved_data_dir, schema, holdout)
    path = store_prepared(settings.resolved_data_dir, schema, prepared)
    with transaction(engine) as s:
        ds = new_dataset(
            s,
            name=schema.name,
            public_schema=schema.model_dump(mode="json"),
            noisy_n_rows=released - (holdout_rows or 0),
            count_epsilon=eps_count,
            epsilon_total=epsilon_total,
            delta_total=delta_total,
            allow_nominal=allow_nominal,
            holdout_rows=holdout_rows,
        )
        warning = no_method_warning(ds)
    return Registered(
        schema.name,
        released - (holdout_rows or 0),
        eps_count,
        prepared.report,
        path,
        warning,
        holdout_rows,
    )
