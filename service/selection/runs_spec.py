"""The declared law of the number of runs K (random stopping, Papernot & Steinke 2022) of
the ``hyperparameters`` kind and of ``architecture`` with ``runs``, and its
:class:`service.privacy.tuning.RunsDistribution`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from service.params import InputModel
from service.privacy.tuning import (
    MAX_RUNS_CAP,
    PoissonRuns,
    RunsDistribution,
    TruncatedNegativeBinomialRuns,
)

__all__ = ["PoissonRunsSpec", "TnbRunsSpec", "runs_distribution"]


class _In(InputModel):
    pass


_MAX_RUNS = Field(
    default=None,
    ge=1,
    le=MAX_RUNS_CAP,
    description=(
        "Cap on the number of runs K: K is drawn from the law conditioned on K ≤ max_runs, "
        "so the work is bounded; charged by Papernot & Steinke's generic bound (Lemma 7), "
        "which costs more than the uncapped law's. Without it the quote estimates the work "
        "at K's 99.9% quantile."
    ),
)


class TnbRunsSpec(_In):
    kind: Literal["truncated_negative_binomial"] = "truncated_negative_binomial"
    eta: float = Field(default=1.0, gt=-1, le=100)
    gamma: float = Field(default=0.2, gt=0, lt=1)
    max_runs: int | None = _MAX_RUNS


class PoissonRunsSpec(_In):
    kind: Literal["poisson"] = "poisson"
    mu: float = Field(default=5.0, gt=0, le=1000, description="at least 1 without max_runs")
    max_runs: int | None = _MAX_RUNS

    @model_validator(mode="after")
    def _small_mu_needs_a_cap(self) -> PoissonRunsSpec:
        if self.mu < 1 and self.max_runs is None:
            raise ValueError("a Poisson law with mu < 1 needs max_runs (service/privacy/tuning.py)")
        return self


def runs_distribution(spec: TnbRunsSpec | PoissonRunsSpec) -> RunsDistribution:
    if isinstance(spec, PoissonRunsSpec):
        return PoissonRuns(mu=spec.mu, max_runs=spec.max_runs)
    return TruncatedNegativeBinomialRuns(eta=spec.eta, gamma=spec.gamma, max_runs=spec.max_runs)
