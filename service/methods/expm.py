"""The regularised exponential mechanism's plans (method ``expm``): the proven Langevin
sampler and the asymptotic HMC sampler, from the schema's public row-norm bound. The
worker's sides are worker/mechanisms/langevin.py and worker/mechanisms/mcmc.py. The
Both samplers' time estimates are here too.

Default settings of the Langevin sampler (issue 21, point 2), functions of public values
only: the public row count n̂, the schema's row-norm bound B (from its columns) and ε.
The sampler is noisy gradient descent from θ = 0 whose noise grows as √T at fixed
(ε, δ) (the Gaussian composition), so what a default must set is its reach, the product
lr·T of step and steps: far enough to fit where the data outweigh the noise, short
(early stopping) where they do not. A row moves the gradient sum by at most √B and the
noise's scale per unit of √T is ∝ √B/ε, so s = n̂·ε/√B is the sum's signal-to-noise
scale, and the rule is lr·T = s/10: T = ⌈s/10⌉ clamped to [10, 300] steps,
lr = min(2, (s/10)/T) to 3 significant digits, l2 = 1. The target's inverse temperature
k = 2n̂/(lr·σ²·B) follows (σ from T, ε and δ). On Adult at ε = 1 (n̂ ≈ 30,000, B = 14)
this is the previous default (T = 300, lr = 2). The previous fixed T = 300, lr = 2
(reach 600) lost 0.03-0.06 AUC to the grid's best on 3,000 and 700 Adult rows,
scikit-learn's breast cancer and digits (benchmarks/results/defaults_study.md), whose
best grid points reached 2.5-75; the rule's figures are in
benchmarks/results/defaults_study_rule.md (the study is at ε = 1; the ε in s is the
scaling argument above, spot-checked at ε = 0.1 in defaults_study_eps0.1_*.md). The
study's targets are binary; multinomial plans (K ≥ 3) take the same rule and B, unmeasured."""

from __future__ import annotations

import math
from typing import Any

from service.datasets.tabular import CategoricalColumn, TabularSchema
from service.methods.common import (
    MethodPlan,
    PlanError,
    PlanFacts,
    ResourceEstimate,
    ResourceFacts,
    calibrate_with_slack,
)
from service.privacy.calibrate import Accountant, calibrate_noise_multiplier
from service.privacy.events import ComposedEvent, DpEvent, PoissonSubsampledGaussianEvent
from service.privacy.lattice_langevin import LatticeLangevin
from service.privacy.sampling import noise_slack
from service.schemas import (
    LANGEVIN_ONLY_FIELDS,
    MCMC_ONLY_FIELDS,
    ExpmOptions,
    JobRequest,
    PrivacyPlan,
)

# Fixed-point grid of the Langevin sampler's exact gradient sum (worker/mechanisms/langevin.py):
# residuals p − y ∈ [−1, 1] and features x ∈ [0, 1] are truncated onto 2^-a and 2^-c with
# a + c ≤ 32, so a row's integer gradient r·x has entries ≤ 2^32 and every partial sum of
# ≤ 2^20 rows is an integer below 2^53, exact in float64. The grid is coarsened when the
# noise is large, so the integer noise's scale σ·2^(a+c)·√B stays ≤ 2^40 (the sampler's
# range, worker/noise.py); its resolution is then still far below the noise.
LANGEVIN_MAX_GRID_BITS = 32
LANGEVIN_MAX_NOISE_SCALE = 2.0**40


def langevin_grid_bits(*, noise_multiplier: float, norm_sq_bound: int) -> tuple[int, int]:
    """(a, c): residual and feature bits of the Langevin grid for this σ and B."""
    room = math.floor(
        math.log2(LANGEVIN_MAX_NOISE_SCALE / (noise_multiplier * math.sqrt(norm_sq_bound)))
    )
    total = min(LANGEVIN_MAX_GRID_BITS, room)
    if total < 2:
        raise PlanError(
            f"the Langevin noise (σ = {noise_multiplier:.3g}) is too large for the sampler's "
            "grid: use fewer steps or a larger ε"
        )
    return (total + 1) // 2, total // 2


def row_norm_sq_bound(schema: TabularSchema) -> int:
    """B with ‖(x, 1)‖² ≤ B for every encoded row x of this schema, from the schema alone:
    each numeric column contributes at most 1 (scaled to [0, 1]), each categorical column
    exactly one 1 (one-hot over declared levels), and the bias 1."""
    numeric = sum(1 for c in schema.columns if not isinstance(c, CategoricalColumn))
    categorical = len(schema.columns) - numeric
    return numeric + categorical + 1


# The previous default steps by ε (before issue 21; benchmarks/hidden_langevin_noise.py
# compares against them): 300 for ε ≥ 1, else 100, with lr = 2.
DEFAULT_LANGEVIN_STEPS = 300
DEFAULT_LANGEVIN_STEPS_SMALL_EPSILON = 100

# Default Langevin settings (see the module docstring): reach lr·T = n̂·ε/(10·√B), steps in
# [10, 300], lr at most 2 (the previous defaults' step, stable on the study's data).
LANGEVIN_REACH_DIVISOR = 10.0
LANGEVIN_STEPS_RANGE = (10, 300)
LANGEVIN_MAX_LEARNING_RATE = 2.0


def langevin_defaults(*, n_rows: int, norm_sq_bound: int, epsilon: float) -> tuple[int, float]:
    """(steps T, learning rate) of the Langevin sampler's default from public values: the
    public row count n̂, the schema's bound B ≥ ‖(x, 1)‖² and the request's ε."""
    reach = n_rows * epsilon / (LANGEVIN_REACH_DIVISOR * math.sqrt(norm_sq_bound))
    low, high = LANGEVIN_STEPS_RANGE
    steps = min(high, max(low, math.ceil(reach)))
    learning_rate = float(f"{min(LANGEVIN_MAX_LEARNING_RATE, reach / steps):.3g}")
    return steps, learning_rate


# Defaults of the MCMC sampler (asymptotic). l2 = 30 is the regulariser with which exact
# sampling of this target reached test AUC 0.892 at ε = 1 on Adult (issue 13's HMC
# measurement, tuned there without accounting: a public choice elsewhere).
DEFAULT_MCMC_STEPS = 500
DEFAULT_MCMC_CHAINS = 8
DEFAULT_MCMC_LEAPFROG_STEPS = 16
DEFAULT_MCMC_STEP_SIZE = 0.05
DEFAULT_MCMC_L2 = 30.0
DEFAULT_LANGEVIN_L2 = 1.0


# Defaults of the hidden-iterate accounting (ExpmOptions.accounting 'hidden'): l2 as the MCMC
# sampler's (the regulariser is what makes the loss strongly convex, so what bounds the
# mixing time), the largest step that contracts for max_rows rows, and the steps after
# which the contraction has shrunk any start's influence by 100 (c^T ≤ 0.01), capped at
# ExpmOptions' 20,000.
DEFAULT_HIDDEN_L2 = DEFAULT_MCMC_L2
HIDDEN_MIXING_FACTOR = math.log(100.0)
HIDDEN_MAX_STEPS = 20_000


def hidden_langevin_defaults(
    *,
    n_rows: int,
    max_rows: int,
    norm_sq_bound: int,
    l2: float,
    learning_rate: float | None,
    classes: int = 1,
) -> tuple[int, float]:
    """(steps T, learning rate) of the hidden-iterate accounting from public values:
    lr = 4n̂/(max_rows·B) (2n̂/(max_rows·B) for K classes, whose curvature bound is B/2) to 3
    significant digits, rounded down (then h ≤ 1, so the contraction factor is
    ρ = 1 − lr·l2/n̂), and T = ⌈ln 100/(1 − c)⌉ ≤ 20,000."""
    lr = learning_rate
    if lr is None:
        raw = (4.0 if classes == 1 else 2.0) * n_rows / (max_rows * norm_sq_bound)
        digits = 10.0 ** (math.floor(math.log10(raw)) - 2)
        lr = math.floor(raw / digits * (1 - 1e-12)) * digits
        lr = float(f"{lr:.3g}")
    try:  # the contraction depends on neither the width nor the grid: one input per class
        chain = LatticeLangevin(
            public_n_rows=n_rows,
            max_rows=max_rows,
            row_norm_sq_bound=norm_sq_bound,
            parameters=classes,
            learning_rate=lr,
            l2=l2,
            classes=classes,
        )
    except ValueError as exc:
        raise PlanError(f"the hidden-iterate Langevin accounting does not apply: {exc}") from None
    steps = min(HIDDEN_MAX_STEPS, math.ceil(HIDDEN_MIXING_FACTOR / chain.contraction_gap))
    return steps, lr


def resolve_expm_options(
    options: ExpmOptions,
    *,
    epsilon: float,
    n_rows: int,
    norm_sq_bound: int,
    max_rows: int | None = None,
    classes: int = 1,
) -> ExpmOptions:
    """Fill the values the request left out, from public values: its ε and sampler, the
    public row count n̂, the schema's row-norm bound B and row cap (Langevin only)."""
    update: dict[str, Any] = {}
    if options.sampler == "langevin" and options.accounting == "hidden":
        if max_rows is None:
            return options  # the plan refuses: no public row cap
        l2 = DEFAULT_HIDDEN_L2 if options.l2 is None else options.l2
        steps, learning_rate = hidden_langevin_defaults(
            n_rows=n_rows,
            max_rows=max_rows,
            norm_sq_bound=norm_sq_bound,
            l2=l2,
            learning_rate=options.learning_rate,
            classes=classes,
        )
        update = {"l2": l2, "learning_rate": learning_rate}
        if options.steps is None:
            update["steps"] = steps
        return options.model_copy(update=update)
    if options.sampler == "langevin":
        steps, learning_rate = langevin_defaults(
            n_rows=n_rows, norm_sq_bound=norm_sq_bound, epsilon=epsilon
        )
        if options.steps is None:
            update["steps"] = steps
        if options.learning_rate is None:
            update["learning_rate"] = learning_rate
        if options.l2 is None:
            update["l2"] = DEFAULT_LANGEVIN_L2
        return options.model_copy(update=update)
    steps = options.steps if options.steps is not None else DEFAULT_MCMC_STEPS
    defaults = {
        "steps": steps,
        "l2": DEFAULT_MCMC_L2,
        "chains": DEFAULT_MCMC_CHAINS,
        "warmup": steps,
        "leapfrog_steps": DEFAULT_MCMC_LEAPFROG_STEPS,
        "step_size": DEFAULT_MCMC_STEP_SIZE,
    }
    update = {k: v for k, v in defaults.items() if getattr(options, k) is None}
    return options.model_copy(update=update)


def resolve_expm_request(request: JobRequest, facts: PlanFacts) -> JobRequest:
    """``request`` with its ExpM options as its plan uses them (:func:`resolve_expm_options`,
    either sampler): it plans identically, under these rules or any later ones (the job's
    admitted request, service.plans.resolve_defaults)."""
    if facts.norm_sq_bound is None:
        return request  # no plan: _norm_sq_bound refuses
    options = resolve_expm_options(
        request.expm or ExpmOptions(),
        epsilon=request.epsilon,
        n_rows=facts.n_rows,
        norm_sq_bound=facts.norm_sq_bound,
        max_rows=facts.max_rows,
        classes=getattr(request.model, "classes", None) or 1,
    )
    return request.model_copy(update={"expm": options})


def _expm_langevin_plan(
    request: JobRequest,
    *,
    n_rows: int,
    n_features: int,
    norm_sq_bound: int,
    max_rows: int | None = None,
) -> tuple[DpEvent, dict[str, Any], str]:
    """The regularised ExpM for logistic regression, sampled by unadjusted Langevin steps
    whose privacy is proven by composition (see :class:`ExpmOptions` and
    worker/mechanisms/langevin.py).

    Step t releases (to the next step only) G_t + N_t, the exact sum over the rows of the
    fixed-point per-row gradients of the logistic loss (entries r·x on the grid) plus
    integer noise round(σ·Δ·Z): add/remove-one changes G_t by one row's vector, whose ℓ2
    norm is at most Δ = 2^(a+c)·√B (|r| ≤ 1, ‖(x, 1)‖² ≤ B from the public schema, checked
    exactly in the worker). So each step is the Gaussian mechanism with noise multiplier σ
    post-processed, the T steps are their adaptive composition (the full-batch, q = 1 case
    of the subsampled Gaussian event), and the last iterate is a post-processing of the
    whole history: (ε, δ)-DP by the accountant, whatever the chain's mixing.

    **K ≥ 3 classes** (multinomial logistic regression, ``model.classes = K``, set from the
    public schema by service.plans.with_classes): θ has K·(d + 1) parameters (a weight row
    and a bias per class) and row i's gradient of the cross-entropy is (p − e_y) ⊗ (x, 1),
    p the softmax of the K logits. Its norm is ‖p − e_y‖·‖(x, 1)‖, and for any p in the
    probability simplex ‖p − e_y‖² = Σ_k p_k² − 2p_y + 1 ≤ Σ_k p_k − 2p_y + 1 = 2 − 2p_y ≤ 2
    (p_k² ≤ p_k on [0, 1], Σ_k p_k = 1). So the per-row gradient norm is at most √2·√B,
    and on the grid Δ = 2^(a+c)·√(2B): the worker's integer residual vector r_int satisfies
    ‖r_int‖² ≤ 2·2^(2a) for the floats it computes, not only for exact ones
    (worker/mechanisms/langevin.py, "K classes", proves it from IEEE-754 correct rounding
    and checks it exactly on every row, failing closed). The grid bits are chosen for
    the noise scale σ·2^(a+c)·√(2B); the charge is the binary one (T full-batch Gaussian
    steps at noise multiplier σ, the sampler's slack for K·(d + 1)·T draws), since σ is
    relative to Δ. A binary plan has neither ``classes`` nor ``residual_norm_sq_bound``
    and is unchanged, key for key.
    """
    options = resolve_expm_options(
        request.expm or ExpmOptions(),
        epsilon=request.epsilon,
        n_rows=n_rows,
        norm_sq_bound=norm_sq_bound,
        max_rows=max_rows,
        classes=getattr(request.model, "classes", None) or 1,
    )
    if options.accounting == "hidden" and max_rows is None:
        raise PlanError(
            "the hidden-iterate Langevin accounting does not apply: the dataset's schema "
            "states no max_rows (a public cap on its rows)"
        )
    steps = options.steps
    assert steps is not None and options.learning_rate is not None
    if request.model.kind != "logistic":
        raise PlanError(
            "the proven ExpM sampler (expm, sampler 'langevin') is for logistic regression "
            "(binary or multinomial): its sensitivity bound needs the convex, Lipschitz loss"
        )
    if request.delta <= 0:
        raise PlanError(
            "expm with the 'langevin' sampler is (ε, δ)-DP by Gaussian composition: send delta > 0"
        )
    classes = getattr(request.model, "classes", None)  # K ≥ 3, or None for binary
    residual_norm_sq = 1 if classes is None else 2  # ‖p − e_y‖² ≤ 2 (K classes)
    parameters = (n_features + 1) * (1 if classes is None else classes)
    slack = noise_slack(draws=parameters * steps)
    accounting = options.accounting or "auto"
    hidden = None
    if accounting != "composition":
        hidden = _hidden_langevin_plan(
            request,
            options,
            n_rows=n_rows,
            parameters=parameters,
            norm_sq_bound=norm_sq_bound,
            max_rows=max_rows,
            classes=classes or 1,
            required=accounting == "hidden",
        )
    if accounting == "hidden":
        assert hidden is not None
        return hidden
    accountant: Accountant = "pld"  # exact for q = 1 up to its proven discretisation
    try:
        sigma = calibrate_with_slack(
            request,
            sampling_rate=1.0,
            steps=steps,
            slack=slack,
            accountant=accountant,
            what="Langevin",
        )
    except PlanError:
        if hidden is None:
            raise
        return hidden
    if hidden is not None and hidden[1]["noise_multiplier"] < sigma:
        return hidden
    gaussian = PoissonSubsampledGaussianEvent(
        sampling_rate=1.0, noise_multiplier=sigma, steps=steps
    )
    # ULA θ' = θ − η·k·∇F + √(2η)·ξ with η·k = lr/n̂ and noise σ·√B on the gradient sum:
    # √(2η) = (lr/n̂)·σ·√B, so k = 2n̂ / (lr·σ²·B) (descriptive: the proof does not use it;
    # K classes: the noise is σ·√(2B), so B becomes 2B).
    inverse_temperature = (
        2.0 * n_rows / (options.learning_rate * sigma**2 * (residual_norm_sq * norm_sq_bound))
    )
    residual_bits, feature_bits = langevin_grid_bits(
        noise_multiplier=sigma, norm_sq_bound=residual_norm_sq * norm_sq_bound
    )
    multiclass = (
        {}
        if classes is None
        else {
            "classes": classes,
            "residual_norm_sq_bound": residual_norm_sq,
        }
    )
    mechanism = {
        **options.model_dump(exclude={*MCMC_ONLY_FIELDS, *LANGEVIN_ONLY_FIELDS}),
        "public_n_rows": n_rows,
        "parameters": parameters,
        "row_norm_sq_bound": norm_sq_bound,
        "residual_bits": residual_bits,
        "feature_bits": feature_bits,
        "noise_multiplier": sigma,
        "inverse_temperature": inverse_temperature,
        "target": "π(θ) ∝ exp(−k·(Σ logistic loss + l2·‖θ‖²/2)), k = inverse_temperature",
        "proof": "Gaussian mechanism composed over the T full-batch steps that ran (q = 1)",
        "noise": "rounded Gaussian on the fixed-point grid, exact integer sum",
        **multiclass,
    }
    return ComposedEvent(events=(gaussian, slack)), mechanism, accountant


def _hidden_langevin_plan(
    request: JobRequest,
    options: ExpmOptions,
    *,
    n_rows: int,
    parameters: int,
    norm_sq_bound: int,
    max_rows: int | None,
    classes: int,
    required: bool,
) -> MethodPlan | None:
    """The Langevin chain charged by the hidden-iterate bound (issue 24), or None where it
    does not apply and ``required`` is false (a :class:`PlanError` naming why where it is).

    Only the last iterate leaves, so for l2 > 0 (a strongly convex loss) the privacy loss
    of T steps is that of ONE Gaussian mechanism with noise multiplier σ_eff = σ/Φ(T),
    Φ(T) ≤ 1.02·√(2/(1 − c)) + (small): it converges in T instead of growing like √T
    (service/privacy/lattice_langevin.py states the chain, the constants and the proof,
    which assumes only IEEE-754 correct rounding; the worker runs exactly that chain,
    worker/mechanisms/langevin_hidden.py). The bound holds as Gaussian DP: the last
    iterate is μ-GDP with μ = Φ(T)/σ = 1/σ_eff (lattice_langevin.py, "Theorem (lattice
    version, Gaussian DP)": the lattice proof redone with trade-off functions, the f-DP
    form of amplification by iteration of Bok, Su & Altschuler 2024, arXiv:2403.00278).
    So σ_eff is calibrated by the exact Gaussian profile, i.e. the PLD of one q = 1
    Gaussian step (accountant 'pld', as the exact mechanism's μ-GDP in
    :func:`_expm_mcmc_plan`), with the integer sampler's slack over the P·T draws beside it;
    the event's RDP curve α/(2σ_eff²) is also a valid bound (μ-GDP implies it, and the
    lattice RDP theorem proves it directly). The contraction constant needs a public cap
    on the rows: the schema's ``max_rows``, checked at registration and by the worker.
    """

    def refuse(why: str) -> MethodPlan | None:
        if required:
            raise PlanError(f"the hidden-iterate Langevin accounting does not apply: {why}")
        return None

    steps = options.steps
    assert steps is not None and options.learning_rate is not None and options.l2 is not None
    if max_rows is None:
        return refuse("the dataset's schema states no max_rows (a public cap on its rows)")
    if request.delta <= 0:
        return refuse("it is (ε, δ)-DP: send delta > 0")
    try:
        chain = LatticeLangevin(
            public_n_rows=n_rows,
            max_rows=max_rows,
            row_norm_sq_bound=norm_sq_bound,
            parameters=parameters,
            learning_rate=options.learning_rate,
            l2=options.l2,
            classes=classes,
        )
    except ValueError as exc:
        return refuse(str(exc))
    slack = noise_slack(draws=parameters * steps)
    # μ-GDP with μ = 1/σ_eff: the PLD of one q = 1 Gaussian step is its exact profile
    # (up to the PLD's pessimistic discretisation).
    accountant: Accountant = "pld"
    try:
        sigma_eff = calibrate_with_slack(
            request,
            sampling_rate=1.0,
            steps=1,
            slack=slack,
            accountant=accountant,
            what="hidden-iterate Langevin",
        )
    except PlanError as exc:
        return refuse(str(exc))
    inflation = chain.inflation(steps)
    sigma = sigma_eff * inflation
    try:
        chain.noise_scale(sigma)
    except ValueError as exc:
        return refuse(str(exc))
    a, c, b, m = chain.bits
    mechanism = {
        **options.model_dump(exclude=set(MCMC_ONLY_FIELDS)),
        "accounting": "hidden",
        "public_n_rows": n_rows,
        "max_rows": max_rows,
        "parameters": parameters,
        "row_norm_sq_bound": norm_sq_bound,
        "residual_bits": a,
        "feature_bits": c,
        "theta_bits": b,
        "range_bits": m,
        "noise_multiplier": sigma,
        "effective_noise_multiplier": sigma_eff,
        "contraction": chain.contraction,
        "inflation": inflation,
        "inverse_temperature": 2.0
        * n_rows
        / (options.learning_rate * sigma**2 * chain.residual_norm_sq * norm_sq_bound),
        "target": "π(θ) ∝ exp(−k·(Σ logistic loss + l2·‖θ‖²/2)), k = inverse_temperature",
        "proof": (
            "hidden iterates: the last of T contracting noisy steps is μ-GDP with "
            "μ = 1/effective_noise_multiplier = inflation/σ, one Gaussian mechanism "
            "(service/privacy/lattice_langevin.py, Gaussian-DP theorem)"
        ),
        "noise": "rounded Gaussian on θ's lattice 2^-theta_bits, exact integer gradient sum",
        **({} if classes == 1 else {"classes": classes, "residual_norm_sq_bound": 2}),
    }
    gaussian = PoissonSubsampledGaussianEvent(
        sampling_rate=1.0, noise_multiplier=sigma_eff, steps=1
    )
    return ComposedEvent(events=(gaussian, slack)), mechanism, accountant


def _expm_mcmc_plan(
    request: JobRequest, *, n_rows: int, n_features: int, norm_sq_bound: int
) -> tuple[DpEvent, dict[str, Any], str]:
    """The regularised ExpM for logistic regression, sampled by MCMC (asymptotic label).

    Accounting of the exact target (Gopi, Lee & Liu 2022, "Private Convex Optimization via
    Exponential Mechanism", COLT; their Gaussian-DP bound for strongly log-concave
    densities): if π_D ∝ exp(−k·(F_D + l2·‖θ‖²/2)) with F_D a sum of convex per-row losses,
    the log-densities of neighbours differ by k·ℓᵢ, a (k·G)-Lipschitz function, and both
    are (k·l2)-strongly log-concave; then one draw from π_D is μ-GDP with
    μ = k·G/√(k·l2) = G·√(k/l2). Here ℓᵢ is the logistic loss of row (xᵢ, 1), whose
    gradient (σ(θ·x) − y)·(x, 1) has norm ≤ G = √B (B: the public schema's bound on
    ‖(x, 1)‖², checked in the worker), under add/remove one row.

    μ-GDP is the Gaussian mechanism with noise multiplier 1/μ, i.e. the q = 1, one-step
    subsampled Gaussian event: its RDP is α·μ²/2 (exact), and the plan picks the largest μ
    whose (ε, δ) meets the request by calibrating that event (PLD, an upper bound on the
    exact conversion δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) of Dong, Roth & Su 2022,
    Cor. 2.13), then k = l2·μ²/B.

    Caveat: this is exact for an exact draw from π only. The finite MCMC run is not proven
    close to π (no total-variation or Rényi bound for the steps the plan fixes), so the
    release is labelled asymptotic, not proven.
    """
    options = resolve_expm_options(
        request.expm or ExpmOptions(),
        epsilon=request.epsilon,
        n_rows=n_rows,
        norm_sq_bound=norm_sq_bound,
    )
    assert options.chains is not None and options.l2 is not None
    if request.model.kind != "logistic":
        raise PlanError(
            "ExpM with the 'mcmc' sampler is for logistic regression: its Gaussian-DP bound "
            "needs the convex, Lipschitz logistic loss"
        )
    if request.delta <= 0:
        raise PlanError(
            "expm with the 'mcmc' sampler is Gaussian-DP, (ε, δ)-DP only for delta > 0: "
            "send delta > 0"
        )
    if options.l2 <= 0:
        raise PlanError(
            "expm with the 'mcmc' sampler needs l2 > 0 (its Gaussian-DP bound needs a "
            "strongly log-concave target)"
        )
    if request.samples > options.chains:
        raise PlanError(
            f"samples = {request.samples} needs at least as many chains (chains = "
            f"{options.chains}): each release is the final state of its own chain"
        )
    accountant: Accountant = "pld"
    try:
        sigma = calibrate_noise_multiplier(
            sampling_rate=1.0,
            steps=1,
            epsilon=request.epsilon,
            delta=request.delta,
            accountant=accountant,
        )
    except ValueError as exc:
        raise PlanError(f"cannot calibrate the Gaussian-DP parameter: {exc}") from exc
    gdp_mu = 1.0 / sigma
    inverse_temperature = options.l2 * gdp_mu**2 / norm_sq_bound
    mechanism = {
        **options.model_dump(exclude={"learning_rate", *LANGEVIN_ONLY_FIELDS}),
        "parameters": n_features + 1,
        "row_norm_sq_bound": norm_sq_bound,
        "gdp_mu": gdp_mu,
        "inverse_temperature": inverse_temperature,
        "target": "π(θ) ∝ exp(−k·(Σ logistic loss + l2·‖θ‖²/2)), k = inverse_temperature",
        "proof": (
            "an exact draw from π is μ-GDP, μ = √(B·k/l2) (Gopi, Lee & Liu 2022); the finite "
            "MCMC run is not proven close to π (asymptotic)"
        ),
        "algorithm": (
            "HMC; in the warm-up a dense metric (the inverse of the target's Hessian at the "
            "chains' states) and the step size (dual averaging) are adapted, then frozen; "
            "the release is the final state of one chain per sample"
        ),
    }
    return (
        PoissonSubsampledGaussianEvent(sampling_rate=1.0, noise_multiplier=sigma, steps=1),
        mechanism,
        accountant,
    )


def _norm_sq_bound(facts: PlanFacts) -> int:
    if facts.norm_sq_bound is None:
        raise PlanError("expm needs a tabular dataset (its sensitivity bound is the schema's)")
    return facts.norm_sq_bound


def plan_langevin(request: JobRequest, facts: PlanFacts) -> MethodPlan:
    """The registry's entry for ``expm`` with the Langevin sampler (proven)."""
    bound = _norm_sq_bound(facts)
    return _expm_langevin_plan(
        request,
        n_rows=facts.n_rows,
        n_features=facts.n_features,
        norm_sq_bound=bound,
        max_rows=facts.max_rows,
    )


def plan_mcmc(request: JobRequest, facts: PlanFacts) -> MethodPlan:
    """The registry's entry for ``expm`` with the HMC sampler (asymptotic)."""
    bound = _norm_sq_bound(facts)
    return _expm_mcmc_plan(
        request, n_rows=facts.n_rows, n_features=facts.n_features, norm_sq_bound=bound
    )


# Worst-case rate of the Langevin sampler's work, in (row × parameter) elements per second:
# measured ≈ 2.3e9 on Adult (30,162 rows × 105 parameters × 300 steps in 0.41 s, 2 CPU
# threads, benchmarks/results/expm_proven.md); 2e8 leaves a 10× margin for slower or
# busier machines.
LANGEVIN_ELEMENTS_PER_S = 2e8


def expm_langevin_seconds(plan: PrivacyPlan) -> float:
    """Estimated worker time of an ``expm`` (Langevin) plan: each of the T steps of each
    released chain touches every (row, parameter) element a few times (two matrix-vector
    products and the fixed-point quantisation), at :data:`LANGEVIN_ELEMENTS_PER_S`."""
    m = plan.mechanism
    elements = int(m["public_n_rows"]) * int(m["parameters"]) * int(m["steps"]) * plan.samples
    return elements / LANGEVIN_ELEMENTS_PER_S


# HMC (the ``mcmc`` sampler): every leapfrog step of every chain is a gradient over the
# n̂ public rows × P parameters; the warm-up also forms the Hessian (n̂ × P² per chain, a
# few times). Measured by benchmarks/job_estimates.py (benchmarks/results/
# job_estimates.md): ~1.6e8 elements/s at load 4-12 on 2 cores (the default Adult job,
# 4e11 elements, ran in 233-435 s at load 3-5: benchmarks/results/expm_proven_speed.md).
# Set at the heavy-load figure, not below it: lower, the default Adult job (and ExpM+NF's
# fidelity check, which runs this sampler) would be refused at quote time under the
# default 1 h limit although it ran in 4-7 min. A hold at factor 1 may then overshoot
# once (released at 2D) on a machine as loaded.
MCMC_ELEMENTS_PER_S = 1.5e8


def expm_mcmc_seconds(plan: PrivacyPlan) -> float:
    """Estimated worker time of an ``expm`` (MCMC) plan from public values: chains ×
    (warm-up + iterations) × leapfrog steps passes over n̂ rows × P parameters, plus the
    warm-up's Hessians (chains × n̂ × P²)."""
    m = plan.mechanism
    p, n = int(m["parameters"]), plan.n_rows
    passes = int(m["chains"]) * (int(m["warmup"]) + int(m["steps"])) * int(m["leapfrog_steps"])
    return (passes * n * p + int(m["chains"]) * n * p * p) / MCMC_ELEMENTS_PER_S


def mcmc_resources(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    """The registry's estimate for ``expm`` with the MCMC sampler: its time only."""
    return ResourceEstimate(
        seconds=expm_mcmc_seconds(plan), time_hint="use fewer chains, iterations or leapfrog steps"
    )


def langevin_resources(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    """The registry's estimate for ``expm`` with the Langevin sampler: its time only (no
    memory estimate)."""
    return ResourceEstimate(
        seconds=expm_langevin_seconds(plan), time_hint="use fewer steps or samples"
    )
