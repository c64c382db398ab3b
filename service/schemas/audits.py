"""Privacy audits the admin runs (issue 22): the request and what the API answers.

An audit is the one-run audit of Steinke, Nasr & Jagielski 2023 ("Privacy auditing with one
(1) training run", arXiv:2305.08846; service/privacy/one_run_audit.py): one training run
of a configuration on a public dataset bundled with the product, with m canaries each
included with probability 1/2, and an ε lower bound from the guesses. Every field of the
request is a privacy parameter of the door's own types (:mod:`service.params`); what
depends on the public dataset (m against its rows, which methods can be audited) is
checked by :func:`service.audits.check_request`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.modelspec import LogisticSpec, ModelSpec
from service.params import Delta, Epsilon, Probability, not_bool
from service.schemas.common import ApiInput, TrainingMethod
from service.schemas.dpsgd import DpsgdOptions

AuditStatus = Literal["queued", "running", "done", "failed"]
"""queued: sent to the worker; running: a worker took it; done: the bound is in; failed:
it did not finish (the reason, generic, in ``failure``)."""

CanaryKind = Literal["input", "gradient"]
"""input: m mislabeled rows of the dataset, scored by their loss under the release (black
box; every auditable method). gradient: m white-box Dirac gradient canaries (DP-SGD only;
worker/gradient_canaries.py), each a clipped per-row gradient of norm C on its own
parameter, scored by the run's summed noisy updates there; m ≤ the model's parameters."""

Canaries = Annotated[int, BeforeValidator(not_bool), Field(ge=1, le=1_000_000)]
"""m (canaries) or r (guesses) of a one-run audit: [1, 10⁶]; m is at most 10% of the
audited dataset's rows and r at most m (:func:`service.audits.check_request`)."""

READING = (
    "A lower bound, not a proof: ε ≥ the bound holds with the stated confidence, and the "
    "test cannot show more than its ceiling however leaky the mechanism is. A small bound "
    "does not show that the configuration is private."
)
"""What every audit's figure means, said next to it in the API and the dashboard."""


class AuditRequest(ApiInput):
    """A one-run audit of a configuration: the method, model and options a job would
    give, the claimed (ε, δ), the number m of canaries and the public dataset it runs on.
    Nothing is charged to any budget; the result is shown to the admin only."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "method": "dpsgd",
                    "model": {"kind": "logistic"},
                    "epsilon": 1.0,
                    "delta": 1e-5,
                    "canaries": 1000,
                    "dataset": "adult",
                    "dpsgd": {"epochs": 3},
                }
            ]
        }
    )

    method: TrainingMethod
    model: ModelSpec = Field(default_factory=LogisticSpec)
    epsilon: Epsilon = Field(description="The claimed ε (nats) of the audited configuration.")
    delta: Delta = Field(description="The claimed δ of the audited configuration.")
    canaries: Canaries = Field(description="m: canaries, each included w.p. 1/2.")
    dataset: str = Field(
        default="adult",
        min_length=1,
        max_length=64,
        description="A public dataset bundled with the product (no budget is charged): "
        "adult (logistic regression by dpsgd, expm or expm_nf) or icu, the synthetic ICU "
        "sample (GRU-D by dpsgd or expm_nf). Registered datasets are not audited.",
    )
    guesses: Canaries | None = Field(
        default=None,
        description=(
            "r: guesses made (the ⌈r/2⌉ best-fitted canaries guessed in, the ⌊r/2⌋ worst "
            "out), at most m; fixed before the run. Default: max(2, m/5), at most m."
        ),
    )
    confidence: Probability = Field(default=0.95, description="Confidence of the bound.")
    dpsgd: DpsgdOptions | None = None
    canary_kind: CanaryKind = Field(
        default="input",
        description=(
            "'input' (default): m mislabeled rows of the dataset, scored by their loss "
            "under the release (black box; every auditable method). 'gradient': m white-box "
            "Dirac gradient canaries (Steinke, Nasr & Jagielski 2023, white box; Nasr et "
            "al. 2023), each a clipped per-row gradient of norm C on its own parameter, "
            "sampled like a row, scored by the run's summed noisy updates on that parameter "
            "less the public data's expected share; method dpsgd "
            "only (422 otherwise), m at most the model's parameter count."
        ),
    )


class AuditResult(BaseModel):
    """The audit's figure with the largest figure the same test could show beside it, and
    what the run was (public values: no row, membership or model leaves the worker)."""

    epsilon_lower_bound: float = Field(description="ε_lb (nats), Theorem 3.1 of the paper.")
    ceiling: float = Field(description="The most ε_lb this test could show (every guess right).")
    canaries: int
    guesses: int
    correct: int = Field(description="v: right guesses of the r made.")
    confidence: float
    rows: int = Field(description="Rows of the public dataset (canaries included).")
    noise_multiplier: float | None = Field(
        default=None, description="σ of the run's Gaussian noise (DP-SGD, ExpM's Langevin)."
    )
    steps: int | None = Field(default=None, description="Training steps (DP-SGD, ExpM+NF).")
    sampling_rate: float | None = Field(default=None, description="DP-SGD's sampling rate q.")


class AuditView(BaseModel):
    """An audit as the admin sees it: its configuration, status, and when done the bound,
    its ceiling and how long the audit took inside the worker."""

    id: str
    status: AuditStatus
    configuration: AuditRequest
    ceiling: float = Field(
        description="The most this test can show with these m, δ and confidence (known "
        "before it runs)."
    )
    result: AuditResult | None = None
    failure: str | None = None
    requested_by: str
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    seconds: float | None = Field(
        default=None, description="The audit's duration inside the worker (data, run, scoring)."
    )
    reading: str = Field(default=READING, description="What the figure means.")
