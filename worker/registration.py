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
from worker.data import WORKER_KINDS, CsvReadError, prepare_dataset, store_prepared
from worker.images import ImageReport
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
) -> Registered:
    """Validate the rows against the public schema (a time-series schema: the long-format
    observations in ``csv_path`` and the per-stay outcomes in ``outcomes_path``; its rows
    are the stays), store them on the private volume,
    create the dataset's budget in the ledger and release a DP noisy row count, charged to
    that budget (``count_epsilon``, default :func:`default_count_epsilon`). Plans use only
    the noisy count, so the accounting's add/remove-one relation holds with nothing
    about the row count published exactly. The admin is told how many rows were rejected
    or clipped (inside the enclave only), and warned when no method can be admitted."""
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
    path = store_prepared(settings.resolved_data_dir, schema, prepared)
    released = noisy_count(prepared.report.rows_kept, epsilon=eps_count)
    with transaction(engine) as s:
        ds = new_dataset(
            s,
            name=schema.name,
            public_schema=schema.model_dump(mode="json"),
            noisy_n_rows=released,
            count_epsilon=eps_count,
            epsilon_total=epsilon_total,
            delta_total=delta_total,
            allow_nominal=allow_nominal,
        )
        warning = no_method_warning(ds)
    return Registered(schema.name, released, eps_count, prepared.report, path, warning)
