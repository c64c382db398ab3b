"""The options of DP-SGD jobs (``JobRequest.dpsgd``) and the mechanism parameters of
their plans (``PrivacyPlan.mechanism``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.params import (
    BatchSize,
    ClipNorm,
    Epochs,
    JlProjections,
    LearningRate,
    NoiseDecay,
)
from service.schemas.common import ApiInput


class DpsgdOptions(ApiInput):
    """DP-SGD (Abadi et al. 2016) with Poisson sampling, per-example clipping and Gaussian
    noise, run by the enclave's own sampler and integer-noise stage.

    With n̂ the dataset's public row count (a DP noisy count), each row is included in a
    step independently with probability q = batch_size/n̂ (batch_size is the *expected*
    batch), for T = epochs·⌈n̂/batch_size⌉ steps; the noise multiplier is calibrated so the
    whole run is (ε, δ)-DP under add/remove-one neighbours with the chosen accountant.
    Every batch size up to n̂ runs exactly as planned.

    Noise schedule. ``"constant"`` (default): one σ for all T steps. ``"exponential"``:
    decaying noise after Zhang, Ding, Wu, Wong, Nguyen & Pan 2021 (σ_t² = σ₀²·Rᵗ), with
    the time index t = the **epoch**: σ_e = σ₀·R^{e/2} for e = 0 … epochs − 1, constant
    within an epoch, R = ``noise_decay`` in (0, 1) (noise decreases over training). The
    plan calibrates σ₀ on the step-by-step composition of that history and charges its
    RDP curve; per epoch rather than per step because every distinct σ costs one curve in
    the accounting (see service/privacy/schedules.py for the measurements). A per-step
    decay r is R = r^{steps per epoch}.
    """

    epochs: Epochs | None = Field(
        default=None,
        description=(
            "Passes over the data. Default: from the public row count n̂, enough epochs for "
            "about 300 steps, at least 3, at most 20 for logistic regression and MLPs and "
            "100 for other models (service.methods.dpsgd.resolve_dpsgd_options)."
        ),
    )
    batch_size: BatchSize | None = Field(
        default=None,
        description=(
            "Expected batch size. Default: n̂/4 for logistic regression and MLPs, n̂/20 for "
            "other models, clamped to [16, 256]."
        ),
    )
    max_grad_norm: ClipNorm = 1.0
    learning_rate: LearningRate = 1.0
    accountant: Literal["rdp", "pld"] = "rdp"
    noise_schedule: Literal["constant", "exponential"] = Field(
        default="constant",
        description="constant σ, or σ_e² = σ₀²·R^e per epoch e (needs noise_decay).",
    )
    noise_decay: NoiseDecay | None = Field(
        default=None,
        description="R in (0, 1), per epoch: required iff noise_schedule is 'exponential'.",
    )

    engine: Literal["exact", "ghost", "jl"] = Field(
        default="exact",
        description=(
            "Per-example gradient engine (worker/mechanisms/grad_engines.py). 'exact': "
            "per-example gradients (Linear hooks or torch.func), any model. 'ghost': exact "
            "per-example norms without materialising per-example gradients (Li et al. 2021), "
            "same privacy cost as 'exact'; logistic and MLP only. 'jl': norms estimated from "
            "jl_projections random projections (Bu et al. 2021), each example also capped at "
            "κ·C with its exact norm; charged as sensitivity κ·C, i.e. κ times the noise of "
            "'exact' at the same (ε, δ) (service/privacy/jl.py); logistic and MLP only, "
            "constant noise only."
        ),
    )
    jl_projections: JlProjections | None = Field(
        default=None,
        description="r, the number of random projections of the 'jl' engine (required for it).",
    )

    @model_validator(mode="after")
    def _decay_iff_exponential(self) -> DpsgdOptions:
        if self.noise_schedule == "exponential" and self.noise_decay is None:
            raise ValueError("noise_schedule 'exponential' needs noise_decay R in (0, 1)")
        if self.noise_schedule == "constant" and self.noise_decay is not None:
            raise ValueError("noise_decay is only meaningful with noise_schedule 'exponential'")
        if (self.engine == "jl") != (self.jl_projections is not None):
            raise ValueError("jl_projections is required with engine 'jl' and only with it")
        return self


class DpsgdMechanism(BaseModel):
    """A DP-SGD plan's resolved mechanism parameters (``PrivacyPlan.mechanism`` of a
    ``dpsgd`` plan, each candidate of a selection plan), as service/methods/dpsgd.py writes
    them: the resolved options, the public schedule from the public row count, and σ.

    Keys a plan leaves out: the schedule keys in a constant-noise plan, the engine keys for
    the default ``exact`` engine (plans stay identical to those stored before these
    options existed); the JL keys outside the ``jl`` engine; the decaying-schedule keys
    outside it. Fields marked optional are also missing from plans stored before they were
    added. More keys may be added (never removed or changed in meaning)."""

    model_config = ConfigDict(extra="allow")

    epochs: int
    batch_size: int = Field(description="Expected batch size (rows per step, on average).")
    max_grad_norm: float = Field(description="Clip norm C.")
    learning_rate: float
    accountant: Literal["rdp", "pld"]
    noise_schedule: Literal["constant", "exponential"] | None = Field(
        default=None, description="Present in decaying-noise plans only."
    )
    noise_decay: float | None = Field(
        default=None, description="R of σ_e = σ₀·R^{e/2} (decaying plans; null otherwise)."
    )
    engine: Literal["exact", "ghost", "jl"] | None = Field(
        default=None, description="Per-example gradient engine; absent means 'exact'."
    )
    jl_projections: int | None = None
    public_n_rows: int | None = Field(
        default=None, description="The dataset's public (DP noisy) row count n̂."
    )
    expected_batch_size: float | None = Field(default=None, description="q·n̂.")
    sampling_rate: float = Field(description="q, each row's inclusion probability per step.")
    steps_per_epoch: int
    steps: int = Field(description="T, the number of noisy steps.")
    parameters: int | None = Field(default=None, description="The model's parameter count.")
    grid_bits: int | None = Field(
        default=None, description="The integer-noise grid is C·2^-grid_bits."
    )
    noise: str | None = Field(default=None, description="How the noise is drawn, in words.")
    noise_multiplier: float = Field(
        description="σ the worker adds (σ₀, the first epoch's, for a decaying schedule)."
    )
    noise_multipliers: list[float] | None = Field(
        default=None, description="σ of each epoch (decaying plans)."
    )
    tcdp_estimate_epsilon: float | None = Field(
        default=None,
        description="Closed-form tCDP estimate of ε (decaying plans), display only: never charged.",
    )
    tcdp_estimate_conditions_hold: bool | None = None
    charged_noise_multiplier: float | None = Field(
        default=None, description="σ/κ, the noise multiplier charged (jl engine)."
    )
    jl_kappa: float | None = None
    jl_tail_probability: float | None = None
    jl_cap_active_probability: float | None = None
    jl_proof: str | None = None
