"""Synthetic ICU-like multivariate time series with missing values (no real clinical data).

Hourly series (default 48 h) of 8 vital signs and lab values, observed irregularly (each
variable has its own measurement rate, higher for sicker patients: informative
missingness, as in MIMIC-III), ≈ 80% of entries missing overall. The binary outcome
depends on a few variables' *full* (partly unobserved) trajectories: late lactate level,
lowest systolic blood pressure and the heart-rate trend.

The per-variable means and bounds in :data:`PUBLIC_SCHEMA` are fixed constants of the
generator (typical adult reference values), never computed from generated rows, so they
can play the dataset's public schema: GRU-D's imputation mean x̄ comes from here.

Arrays follow GRU-D's inputs (Che et al. 2018): values x, masks m (1 = observed) and
deltas δ (hours since the variable was last observed; δ₀ = 0, δ_t = 1 + δ_{t−1} if
m_{t−1} = 0 else 1, Che et al. eq. 2). Unobserved values are stored as 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.datasets.timeseries import deltas_from_masks
from worker.models.grud import pack_inputs_np

__all__ = ["PUBLIC_SCHEMA", "IcuPublicSchema", "IcuSeries", "deltas_from_masks", "generate_icu"]


@dataclass(frozen=True)
class IcuPublicSchema:
    """Public per-variable metadata: names, units, reference means and declared bounds."""

    names: tuple[str, ...]
    units: tuple[str, ...]
    means: tuple[float, ...]
    lows: tuple[float, ...]
    highs: tuple[float, ...]

    @property
    def n_vars(self) -> int:
        return len(self.names)

    def scale(self, values: np.ndarray) -> np.ndarray:
        """Map values to [0, 1] by the declared bounds (clipped), last axis = variables."""
        lo = np.asarray(self.lows, dtype=np.float64)
        hi = np.asarray(self.highs, dtype=np.float64)
        return np.clip((values - lo) / (hi - lo), 0.0, 1.0).astype(np.float32)

    @property
    def scaled_means(self) -> tuple[float, ...]:
        """The public means on the [0, 1] scale that :meth:`scale` produces."""
        return tuple(float(v) for v in self.scale(np.asarray(self.means)))


# Typical adult ICU reference values (textbook normal ranges), chosen once; plus each
# variable's typical spread, hourly measurement probability and how it reacts to severity.
PUBLIC_SCHEMA = IcuPublicSchema(
    names=(
        "heart_rate",
        "sys_bp",
        "resp_rate",
        "temperature",
        "spo2",
        "glucose",
        "lactate",
        "creatinine",
    ),
    units=("bpm", "mmHg", "1/min", "degC", "%", "mg/dL", "mmol/L", "mg/dL"),
    means=(85.0, 120.0, 18.0, 37.0, 96.0, 130.0, 2.0, 1.2),
    lows=(20.0, 40.0, 4.0, 32.0, 50.0, 20.0, 0.2, 0.1),
    highs=(250.0, 250.0, 60.0, 43.0, 100.0, 800.0, 20.0, 15.0),
)
_SPREAD = np.array([15.0, 18.0, 4.0, 0.7, 2.5, 40.0, 1.2, 0.6])
_OBS_RATE = np.array([0.35, 0.30, 0.30, 0.15, 0.30, 0.08, 0.05, 0.04])
# Drift over the stay per unit of latent severity, in spreads: sicker → faster HR, lower
# BP and SpO2, higher RR, temperature, lactate and creatinine.
_SEVERITY_DRIFT = np.array([1.2, -1.2, 1.0, 0.5, -0.8, 0.4, 1.5, 0.8])


@dataclass(frozen=True)
class IcuSeries:
    """n patients × T hours × V variables; labels are 0/1."""

    values: np.ndarray  # float32 (n, T, V), physical units, 0 where unobserved
    masks: np.ndarray  # float32 (n, T, V), 1 = observed
    deltas: np.ndarray  # float32 (n, T, V), hours since last observation
    labels: np.ndarray  # float32 (n,)
    schema: IcuPublicSchema

    @property
    def missing_rate(self) -> float:
        return float(1.0 - self.masks.mean())

    def scaled_values(self) -> np.ndarray:
        """Values on [0, 1] by the public bounds, 0 where unobserved."""
        return np.where(self.masks > 0, self.schema.scale(self.values), 0.0).astype(np.float32)

    def packed(self) -> np.ndarray:
        """GRU-D input (n, 3, T, V): scaled values, masks, deltas (see worker.models.grud)."""
        return pack_inputs_np(self.scaled_values(), self.masks, self.deltas)


def generate_icu(n: int, *, hours: int = 48, rng: np.random.Generator | None = None) -> IcuSeries:
    """Generate ``n`` synthetic stays of ``hours`` hourly steps (seed via ``rng``)."""
    if n < 1 or hours < 2:
        raise ValueError("need n ≥ 1 and hours ≥ 2")
    rng = rng if rng is not None else np.random.default_rng(0)
    schema = PUBLIC_SCHEMA
    v = schema.n_vars
    means = np.asarray(schema.means)
    severity = rng.standard_normal(n)
    baseline = means + _SPREAD * 0.6 * rng.standard_normal((n, v))
    ramp = np.linspace(0.0, 1.0, hours)[None, :, None]
    drift = (severity[:, None] * _SEVERITY_DRIFT * _SPREAD)[:, None, :] * ramp
    # AR(1) fluctuations around the drifting baseline.
    noise = np.empty((n, hours, v))
    noise[:, 0] = rng.standard_normal((n, v))
    for t in range(1, hours):
        noise[:, t] = 0.85 * noise[:, t - 1] + np.sqrt(1 - 0.85**2) * rng.standard_normal((n, v))
    full = baseline[:, None, :] + drift + 0.4 * _SPREAD * noise
    full = np.clip(full, schema.lows, schema.highs)

    # Outcome from the full trajectories (standardised by the public constants).
    z = (full - means) / _SPREAD
    late_lactate = z[:, -12:, 6].mean(axis=1)
    min_bp = z[:, :, 1].min(axis=1)
    hr_trend = z[:, -12:, 0].mean(axis=1) - z[:, :12, 0].mean(axis=1)
    logit = -1.0 + 1.3 * late_lactate - 0.8 * min_bp + 0.6 * hr_trend - 1.3
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)

    # Irregular observation: sicker patients are measured more often.
    rate = np.clip(_OBS_RATE * np.exp(0.3 * severity)[:, None], 0.01, 0.95)[:, None, :]
    masks = (rng.random((n, hours, v)) < rate).astype(np.float32)
    values = np.where(masks > 0, full, 0.0).astype(np.float32)
    return IcuSeries(
        values=values,
        masks=masks,
        deltas=deltas_from_masks(masks),
        labels=labels,
        schema=schema,
    )
