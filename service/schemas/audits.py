"""Privacy audits the admin runs (issue 22): the request and what the API answers.

An audit is, by default (``attack: "one_run"``), the one-run audit of Steinke, Nasr &
Jagielski 2023 ("Privacy auditing with one (1) training run", arXiv:2305.08846;
service/privacy/one_run_audit.py): one training run of a configuration on a public dataset
bundled with the product, with m canaries each included with probability 1/2, and an ε
lower bound from the guesses. With ``attack: "lira"`` it is LiRA membership inference
(Carlini et al. 2022, arXiv:2112.03570; worker/lira.py, service/privacy/lira_stats.py):
M models on random halves of a public Adult pool, each in turn the target of the others
as shadows, reported as TPR at 0.1 % and 1 % FPR, AUC and an ε lower bound beside its
ceiling, with the one-run bound of one held-out target (its pool rows as canaries). Every
field of the request is a privacy parameter of the door's own types
(:mod:`service.params`); what depends on the public dataset (m against its rows, which
methods can be audited, which fields belong to which attack) is checked by
:func:`service.audits.check_request` and :func:`service.audits.check_lira`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.modelspec import LogisticSpec, ModelSpec
from service.params import Delta, Epsilon, Probability, not_bool
from service.schemas.common import ApiInput, TrainingMethod
from service.schemas.dpsgd import DpsgdOptions
from service.schemas.expm import ExpmOptions
from service.schemas.expm_nf import ExpmNfOptions

AuditStatus = Literal["queued", "running", "done", "failed"]
"""queued: sent to the worker; running: a worker took it; done: the bound is in; failed:
it did not finish (the reason, generic, in ``failure``)."""

CanaryKind = Literal["input", "gradient"]
"""input: m mislabeled rows of the dataset, scored by their loss under the release (black
box; every auditable method). gradient: m white-box Dirac gradient canaries (DP-SGD only;
worker/gradient_canaries.py), each a clipped per-row gradient of norm C on its own
parameter, scored by the run's summed noisy updates there; m ≤ the model's parameters."""

AuditAttack = Literal["one_run", "lira"]
"""one_run: Steinke, Nasr & Jagielski 2023, one training run with m canaries. lira:
Carlini et al. 2022's likelihood-ratio membership inference with M shadow models on a
public Adult pool (dpsgd, expm with its Langevin sampler, expm_nf; logistic regression)."""

Canaries = Annotated[int, BeforeValidator(not_bool), Field(ge=1, le=1_000_000)]
"""m (canaries) or r (guesses) of a one-run audit: [1, 10⁶]; m is at most 10% of the
audited dataset's rows and r at most m (:func:`service.audits.check_request`)."""

ShadowModels = Annotated[int, BeforeValidator(not_bool), Field(ge=4, le=256)]
"""M, the models a LiRA audit trains: [4, 256] (4: two targets on each side of the
held-out split); the service also refuses M trainings its time estimate puts past the
worker's task time limit (:func:`service.audits.check_lira`)."""

PoolRows = Annotated[int, BeforeValidator(not_bool), Field(ge=100, le=1_000_000)]
"""Rows of public Adult in a LiRA audit's pool: at least 100 (each model trains on about
half), at most the bundled file's rows (:func:`service.audits.check_lira`)."""

READING = (
    "A lower bound, not a proof: ε ≥ the bound holds with the stated confidence, and the "
    "test cannot show more than its ceiling however leaky the mechanism is. A small bound "
    "does not show that the configuration is private."
)
"""What every audit's figure means, said next to it in the API and the dashboard."""


class AuditRequest(ApiInput):
    """An audit of a configuration: the method, model and options a job would give, the
    claimed (ε, δ), the attack (one-run with m canaries on a public dataset, or LiRA with
    M models on a public Adult pool). Nothing is charged to any budget; the result is
    shown to the admin only."""

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
                },
                {
                    "method": "expm_nf",
                    "epsilon": 1.0,
                    "delta": 0.0,
                    "attack": "lira",
                    "shadow_models": 8,
                    "pool": 500,
                },
            ]
        }
    )

    method: TrainingMethod
    model: ModelSpec = Field(default_factory=LogisticSpec)
    epsilon: Epsilon = Field(description="The claimed ε (nats) of the audited configuration.")
    delta: Delta = Field(description="The claimed δ of the audited configuration.")
    canaries: Canaries | None = Field(
        default=None,
        description="m: canaries, each included w.p. 1/2. Required by a one-run audit; "
        "left out of a LiRA audit (its one-run bound takes the pool's rows as canaries).",
    )
    dataset: str = Field(
        default="adult",
        min_length=1,
        max_length=64,
        description="A public dataset bundled with the product (no budget is charged): "
        "adult (logistic regression by dpsgd, expm with either sampler or expm_nf; an MLP "
        "by dpsgd or expm_nf), icu, the synthetic ICU sample (GRU-D by dpsgd or expm_nf), "
        "icu3, its stays with a 3-class outcome (GRU-D by dpsgd, exact engine), or "
        "digits, 1,797 8 × 8 handwritten digits of 10 classes (a CNN by dpsgd, exact engine, "
        "model: the CNN spec a job gives, its image shape and classes filled in; or "
        "multinomial logistic regression, the default there, or an MLP, by dpsgd on the "
        "flattened pixels), or a tabular target of K ≥ 3 classes: wine, 178 rows of 13 "
        "columns, 3 classes, digits-table, the digits as 1,797 rows of 64 columns, 10 "
        "classes, or digits-table-k3 … digits-table-k9, its rows of the first K digits "
        "(0 … K − 1), K classes (multinomial logistic regression, the default, or an MLP, "
        "by dpsgd; multinomial logistic regression by expm, its Langevin sampler). "
        "Registered datasets are not audited.",
    )
    guesses: Canaries | None = Field(
        default=None,
        description=(
            "r: guesses made (the ⌈r/2⌉ best-fitted canaries guessed in, the ⌊r/2⌋ worst "
            "out), at most m; fixed before the run. Default: max(2, m/5), at most m. "
            "A LiRA audit takes the default for its pool (left out of its request)."
        ),
    )
    confidence: Probability = Field(default=0.95, description="Confidence of the bound.")
    dpsgd: DpsgdOptions | None = None
    expm: ExpmOptions | None = Field(
        default=None,
        description=(
            "Method expm only, one-run audits only: its options as a job gives them; "
            "sampler 'langevin' (the default, proven) or 'mcmc' (HMC on the exact target, "
            "asymptotic: worker/mechanisms/mcmc.py, the job's code, run once with its "
            "chains; the release audited is the final state of its first chain)."
        ),
    )
    expm_nf: ExpmNfOptions | None = Field(
        default=None,
        description=(
            "Method expm_nf only, one-run audits only: its options as a job gives them (the "
            "flow, steps, samples per step, batch size...): smaller flow sizes bring an "
            "audit the service estimates past the worker's time limit within it."
        ),
    )
    canary_kind: CanaryKind = Field(
        default="input",
        description=(
            "'input' (default): m mislabeled rows of the dataset, scored by their loss "
            "under the release (black box; every auditable method). 'gradient': m white-box "
            "Dirac gradient canaries (Steinke, Nasr & Jagielski 2023, white box; Nasr et "
            "al. 2023), each a clipped per-row gradient of norm C on its own parameter, "
            "sampled like a row, scored by the run's summed noisy updates on that parameter "
            "less the public data's expected share; method dpsgd "
            "only (422 otherwise), m at most the model's parameter count. One-run audits only."
        ),
    )
    attack: AuditAttack = Field(
        default="one_run",
        description=(
            "'one_run' (default): the one-run audit (Steinke, Nasr & Jagielski 2023) with m "
            "canaries. 'lira': LiRA membership inference (Carlini et al. 2022) with "
            "shadow_models models trained on random halves of a pool of public Adult rows "
            "(methods dpsgd, expm with its Langevin sampler, expm_nf; logistic regression; "
            "no dpsgd, expm or expm_nf options, canaries, guesses or gradient canaries: 422 "
            "otherwise); "
            "reported as TPR at 0.1% and 1% FPR, AUC and an ε lower bound beside its ceiling, "
            "with the one-run bound of one held-out target."
        ),
    )
    shadow_models: ShadowModels | None = Field(
        default=None,
        description=(
            "LiRA only: M, the models trained, each on a random half of the pool; each in "
            "turn is the target and the other M − 1 its shadows. 4 to 256, default 8; M "
            "trainings past the worker's time limit (the service's estimate) are a 422."
        ),
    )
    pool: PoolRows | None = Field(
        default=None,
        description=(
            "LiRA only: rows of public Adult in the pool (each a member of about half the "
            "models), from 100 to the bundled file's 30,162; default 500."
        ),
    )


class LiraRate(BaseModel):
    """One low-FPR level of a LiRA audit."""

    target_fpr: float = Field(description="The FPR level: 0.001 or 0.01.")
    tpr: float = Field(
        description="TPR over all (target model, pool row) pairs at the threshold whose FPR "
        "on the same scores is the level (as Carlini et al. report it)."
    )
    fpr: float = Field(description="The FPR that threshold achieved (ties can move it).")
    held_out_true_positives: int = Field(
        description="Members flagged among the held-out targets' pairs, at the threshold "
        "chosen on the other targets."
    )
    held_out_members: int
    held_out_false_positives: int
    held_out_non_members: int
    epsilon_lower_bound: float = Field(
        description="log((TPR_lo − δ)/FPR_hi) of the held-out counts, Clopper–Pearson, "
        "Bonferroni over the two levels (Jagielski, Ullman & Oprea 2020)."
    )


class LiraFigures(BaseModel):
    """What a LiRA audit found (service/privacy/lira_stats.py states each formula and
    what it assumes). Rates and counts only: no row, membership or model leaves."""

    models: int = Field(description="M: models trained (each target has M − 1 shadows).")
    pool: int = Field(description="Public Adult rows in the pool.")
    online: bool = Field(description="The online likelihood ratio (IN and OUT Gaussians).")
    fixed_variance: bool = Field(
        description="One variance per side, not per row (fewer than 64 shadows, §VI-B)."
    )
    auc: float = Field(description="Area under the ROC curve over all pairs (0.5: chance).")
    rates: list[LiraRate] = Field(description="TPR at 0.1% and 1% FPR.")
    epsilon_lower_bound: float = Field(
        description="The larger of the two levels' held-out bounds (nats). Its coverage "
        "treats the pairs of one target model as independent (they share its training): "
        "the figure LiRA papers report, not a certificate; the proven figure is the "
        "result's one-run bound."
    )
    ceiling: float = Field(
        description="The most that held-out test could show (every member flagged, no "
        "non-member) with these counts."
    )
    train_seconds: float = Field(description="The M trainings' duration.")


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
    lira: LiraFigures | None = Field(
        default=None,
        description="A LiRA audit's figures (attack 'lira'); its epsilon_lower_bound, "
        "ceiling, canaries, guesses and correct above are then the one-run bound of one "
        "held-out target, its pool rows the canaries.",
    )


class AuditView(BaseModel):
    """An audit as the admin sees it: its configuration, status, and when done the bound,
    its ceiling and how long the audit took inside the worker."""

    id: str
    status: AuditStatus
    configuration: AuditRequest
    ceiling: float = Field(
        description="The most this test can show with these m, δ and confidence (known "
        "before it runs; a LiRA audit: its one-run bound's, m = the pool's rows)."
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
