"""The options of ExpM+NF jobs, the exponential mechanism sampled through a normalizing
flow (``JobRequest.expm_nf``), and the mechanism parameters of their plans
(``PrivacyPlan.mechanism``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.schemas.common import ApiInput


class ExpmNfOptions(ApiInput):
    """The exponential mechanism sampled through a normalizing flow (nominal ε).

    These knobs shape only the sampler, not the mechanism's ε: the target density is
    exp(ε·u(θ)) with u = −Σ(ŷ − y)² − l2·‖θ‖² (sensitivity 1; the utility is monotone in
    the data set, so the McSherry–Talwar calibration without the factor 1/2 is ε-DP under
    add/remove-one). The parameters range over R^P, where l2 must be > 0 (without it the
    density does not normalise and the ε would describe no mechanism), or over a public box
    (−R, R)^P when ``domain_radius`` R is given: the mechanism is then ExpM restricted to
    the box, which normalises for any l2 ≥ 0, and the flow ends in a bijection onto it.
    """

    flow: Literal["planar", "sylvester"] = "planar"
    layers: int = Field(default=4, ge=1, le=64)
    # Left out: 1500, 64 and 1024 for tabular models, 300, 32 and 64 for GRU-D (whose
    # evaluation keeps T hidden states per (θ, row) pair), filled in by the plan.
    steps: int | None = Field(default=None, ge=1, le=100_000)
    n_samples_per_step: int | None = Field(default=None, ge=1, le=4096)
    batch_size: int | None = Field(default=None, ge=1, le=1_000_000)
    learning_rate: float = Field(default=0.02, gt=0, le=10)
    base_std: float = Field(default=1.0, gt=0, le=100)
    l2: float = Field(
        default=1.0,
        ge=0,
        le=1e6,
        description=(
            "Regulariser weight λ: > 0 on R^P (the target must normalise over unbounded θ); "
            "≥ 0 with a domain_radius."
        ),
    )
    domain_radius: float | None = Field(
        default=None,
        gt=0,
        le=1e4,
        description="R: restrict θ to the public box (−R, R)^P (default: all of R^P).",
    )

    @model_validator(mode="after")
    def _normalises(self) -> ExpmNfOptions:
        if self.l2 == 0 and self.domain_radius is None:
            raise ValueError(
                "l2 = 0 needs a domain_radius: over unbounded parameters the ExpM density "
                "does not normalise"
            )
        return self


class ExpmNfMechanism(BaseModel):
    """An ``expm_nf`` plan's mechanism (nominal), as service/methods/expm_nf.py writes it:
    the resolved sampler options, ε and the utility's sensitivity. ``domain_radius`` is
    present only when the request gave one; ``calibration`` is missing from plans stored
    before it was added. More keys may be added (never removed or changed in meaning)."""

    model_config = ConfigDict(extra="allow")

    flow: Literal["planar", "sylvester"]
    layers: int
    steps: int
    n_samples_per_step: int
    batch_size: int
    learning_rate: float
    base_std: float
    l2: float
    domain_radius: float | None = None
    epsilon: float = Field(description="ε (nats) of one release.")
    sensitivity: float = Field(description="Sensitivity of the utility.")
    calibration: Literal["monotone"] | None = Field(
        default=None, description="McSherry–Talwar calibration for a monotone utility."
    )
