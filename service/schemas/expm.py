"""The options of ExpM jobs, the regularised exponential mechanism for logistic
regression, Langevin or MCMC sampled (``JobRequest.expm``), and the mechanism parameters of
their plans, one model per sampler (``PrivacyPlan.mechanism``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.schemas.common import ApiInput


class ExpmOptions(ApiInput):
    """The regularised exponential mechanism for logistic regression.

    Target (Gopi, Lee & Liu 2022): π(θ) ∝ exp(−k·(Σᵢ ℓᵢ(θ) + l2·‖θ‖²/2)) with ℓᵢ the
    logistic loss of row i on the schema's encoding (features in [0, 1], one-hot levels),
    which is convex and Lipschitz, so π is strongly log-concave.

    Sampler ``"langevin"`` (**proven**): the unadjusted Langevin algorithm on π, started at
    θ = 0, for ``steps`` full-batch steps θ ← θ − (lr/n̂)·(Σᵢ∇ℓᵢ(θ) + N + l2·θ), N Gaussian.
    Each step is a Gaussian mechanism on the gradient sum (ℓ2 sensitivity bounded by the
    public schema), so the release (the last iterate) is (ε, δ)-DP by composition of the T
    steps that ran: the proof covers the finite run, not only its limit, and does not rely
    on the chain having mixed. The plan calibrates the noise multiplier σ for (ε, δ) and
    reports the inverse temperature k = 2n̂/(lr·σ²·B) of the target the chain approximates
    (B: the schema's bound on ‖x‖² with the bias).

    Sampler ``"mcmc"`` (**asymptotic**): Hamiltonian Monte Carlo with a Metropolis
    correction on π itself, ``chains`` chains in parallel for ``warmup`` + ``steps``
    iterations; the release is the final state of one chain per requested sample. π is
    μ-Gaussian-DP with μ = √(B·k/l2) (Gopi, Lee & Liu 2022), and the plan picks k for the
    request's (ε, δ); the chain's law tends to π as the steps grow, but no bound covers
    the finite run, hence the label. Its R̂, ESS and acceptance rate stay in the enclave.
    ``learning_rate`` is the Langevin sampler's only.
    """

    sampler: Literal["langevin", "mcmc"] = "langevin"
    steps: int | None = Field(
        default=None,
        ge=1,
        le=20_000,
        description=(
            "Langevin steps T, or MCMC iterations per chain after the warm-up. Default: "
            "langevin ⌈n̂·ε/(10·√B)⌉ in [10, 300] (n̂ the public row count, B the schema's "
            "bound on ‖(x, 1)‖²); mcmc 500 (service.methods.expm.resolve_expm_options)."
        ),
    )
    learning_rate: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description=(
            "Step on the mean gradient: θ moves by lr/n̂ times the noisy gradient sum. "
            "Default: (n̂·ε/(10·√B))/T, at most 2 (service.methods.expm.resolve_expm_options)."
        ),
    )
    l2: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        description=(
            "Regulariser weight (μ): the target's log-density has −k·l2·‖θ‖²/2. Default: 1 "
            "for langevin, 30 for mcmc (must be > 0 there)."
        ),
    )
    accounting: Literal["auto", "composition", "hidden"] | None = Field(
        default=None,
        description=(
            "Langevin only: how the chain is charged. 'composition': the T steps' Gaussian "
            "mechanisms composed (the ε grows with T). 'hidden': only the last iterate is "
            "released, and for l2 > 0 its privacy loss converges in T (privacy "
            "amplification by iteration on a strongly convex loss; the chain runs on a "
            "lattice with every rounding accounted: service/privacy/lattice_langevin.py); "
            "binary or K-class targets, datasets whose schema states max_rows only. Defaults: "
            "l2 30, the largest contracting step, and T from mixing (ln 100/(1 − c) steps, at "
            "most 20,000). 'auto' or absent: composition, or the hidden bound where it "
            "gives less noise for the same request."
        ),
    )
    chains: int | None = Field(
        default=None,
        ge=2,
        le=256,
        description="MCMC only: chains run in parallel (default 8); at least `samples`.",
    )
    warmup: int | None = Field(
        default=None,
        ge=0,
        le=20_000,
        description=(
            "MCMC only: warm-up iterations per chain, which adapt the step size and a "
            "diagonal metric and are discarded (default: as many as `steps`)."
        ),
    )
    leapfrog_steps: int | None = Field(
        default=None, ge=1, le=1024, description="MCMC only: leapfrog steps per iteration (16)."
    )
    step_size: float | None = Field(
        default=None,
        gt=0,
        le=10,
        description="MCMC only: the first leapfrog step size, adapted in the warm-up (0.05).",
    )

    @model_validator(mode="after")
    def _mcmc_fields_for_mcmc(self) -> ExpmOptions:
        if self.sampler != "mcmc":
            given = [n for n in MCMC_ONLY_FIELDS if getattr(self, n) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: options of the 'mcmc' sampler only")
        elif self.accounting is not None:
            raise ValueError("accounting: an option of the 'langevin' sampler only")
        return self


MCMC_ONLY_FIELDS = ("chains", "warmup", "leapfrog_steps", "step_size")
LANGEVIN_ONLY_FIELDS = ("accounting",)


class _ExpmMechanism(BaseModel):
    model_config = ConfigDict(extra="allow")

    steps: int = Field(description="Langevin steps T, or MCMC iterations per chain.")
    l2: float = Field(description="Regulariser weight of the target.")
    parameters: int = Field(description="Logistic regression's parameter count (width + 1).")
    row_norm_sq_bound: int = Field(description="B ≥ ‖(x, 1)‖², from the public schema.")
    inverse_temperature: float = Field(description="k of the target π ∝ exp(−k·(...)).")
    target: str = Field(description="The target density, in words.")
    proof: str = Field(description="What the guarantee rests on, in words.")


class ExpmLangevinMechanism(_ExpmMechanism):
    """An ``expm`` plan's mechanism with the Langevin sampler (proven), as
    service/methods/expm.py writes it. More keys may be added (never removed or changed in
    meaning)."""

    sampler: Literal["langevin"]
    learning_rate: float
    public_n_rows: int = Field(description="The dataset's public (DP noisy) row count n̂.")
    residual_bits: int
    feature_bits: int
    noise_multiplier: float = Field(description="σ of each step's Gaussian noise.")
    noise: str = Field(description="How the noise is drawn, in words.")


class ExpmMcmcMechanism(_ExpmMechanism):
    """An ``expm`` plan's mechanism with the HMC sampler (asymptotic), as
    service/methods/expm.py writes it. More keys may be added (never removed or changed in
    meaning)."""

    sampler: Literal["mcmc"]
    chains: int
    warmup: int
    leapfrog_steps: int
    step_size: float
    gdp_mu: float = Field(description="μ of the exact target's μ-GDP guarantee.")
    algorithm: str = Field(description="The sampler, in words.")
