"""LiRA membership inference against the product's releases (issue 22, point 3).

Carlini, Chien, Nasr, Song, Terzis & Tramèr 2022, "Membership inference attacks from first
principles" (arXiv:2112.03570), run on a PUBLIC pool (a subsample of the bundled Adult
training file), never on private rows, never charged to any budget:

1. M models are trained, model k on the pool rows with membership[k, i] = 1, each an
   independent Bernoulli(1/2) (drawn once, before any training), through the product's
   own mechanism (worker.mechanisms.registry.run_mechanism) under the plan the API would
   build for that request and the pool's expected training size n/2 (service.plans.build_plan,
   as benchmarks/defaults_study.py does).
2. Each model's statistic on every pool row: φ = (2y − 1)·logit, the logit-scaled
   confidence on the true label (service.privacy.lira_stats).
3. Leave-one-out: each model in turn is the target, the other M − 1 are its shadows;
   per-example IN/OUT Gaussians are fitted on the shadows (global variance below 64
   shadows) and the target's rows scored by the online likelihood ratio (or the offline
   one-sided score).
4. Over all (target, row) pairs: TPR at 0.1 % and 1 % FPR (thresholds taken on the same
   scores, as the paper reports them) and the AUC. For the ε lower bound the targets are
   split: even-numbered targets choose each threshold, odd-numbered ones count TP and FP;
   ε ≥ log((TPR_lo − δ)/FPR_hi) with Clopper–Pearson bounds, Bonferroni over the two
   FPR levels (service.privacy.lira_stats.low_fpr_bound), with the ceiling of that test.
   These counts treat the pairs of one target model as independent (they are not: see
   lira_stats); the proven figure is the one-run bound (Steinke, Nasr & Jagielski 2023,
   Thm 3.1) of the first held-out target alone: its rows are m = n canaries each in with
   probability 1/2, the guesses "in" for the top r/2 LiRA scores and "out" for the bottom
   r/2, r = service.audits.default_guesses(n), fixed in advance.

The result holds rates, counts and bounds; nothing else leaves.

The admin runs it as an audit (``POST /v1/admin/audits`` with ``attack: "lira"``,
``enclave admin audit --attack lira``): :func:`run_lira_audit` checks the request as the
service does (service.audits.check_lira), draws the pool from public Adult and runs
:func:`run_lira_configuration`; :func:`audit_figures` is what the audit stores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from service.audits import AuditRefused, check_lira, default_guesses
from service.datasets.kinds import load_schema_yaml
from service.datasets.tabular import TabularSchema
from service.methods.expm import row_norm_sq_bound
from service.modelspec import LogisticSpec
from service.plans import build_plan
from service.privacy.audit import EpsilonLowerBound, ProportionInterval, clopper_pearson_interval
from service.privacy.lira_stats import (
    auc,
    fit_gaussians,
    lira_ceiling,
    logit_confidence,
    low_fpr_bound,
    offline_scores,
    online_scores,
    tpr_at_fpr,
)
from service.privacy.one_run_audit import OneRunBound
from service.privacy.one_run_audit import epsilon_lower_bound as one_run_bound
from service.schemas import JobRequest, PrivacyPlan
from service.schemas.audits import AuditRequest, LiraFigures, LiraRate
from worker.audits import PUBLIC_DATASETS, correct_guesses, load_public
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.registry import run_mechanism
from worker.noise import secure_rng

__all__ = [
    "CONFIGURATIONS",
    "FPR_LEVELS",
    "PURE_METHODS",
    "LiraResult",
    "LowFprPoint",
    "Pool",
    "Trainer",
    "adult_pool",
    "audit_figures",
    "lira_plan",
    "nonprivate_trainer",
    "product_trainer",
    "run_lira",
    "run_lira_audit",
    "run_lira_configuration",
]

PURE_METHODS = ("expm_nf",)
"""Methods whose requests must send δ = 0 (pure ε-DP claims): their plans are built with δ = 0."""
CONFIGURATIONS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "dpsgd": ("dpsgd", None),
    "expm": ("expm", {"sampler": "langevin"}),  # proven
    "expm_mcmc": ("expm", {"sampler": "mcmc"}),  # the exact mechanism, asymptotic sampler
    "expm_nf": ("expm_nf", None),  # nominal
}
"""Configuration name → (method, method options) of the JobRequest the API would get."""
FPR_LEVELS = (0.001, 0.01)

Trainer = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]
"""Trains on (x, y) and returns a binary logistic release (linear.weight, linear.bias)."""


@dataclass(frozen=True)
class Pool:
    x: torch.Tensor  # float32 (n, d), encoded as the worker encodes rows
    y: torch.Tensor  # float32 (n,) in {0, 1}
    norm_sq_bound: int  # B ≥ ‖(x, 1)‖², from the public schema
    source: str

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def d(self) -> int:
        return int(self.x.shape[1])


def adult_pool(size: int, seed: int = 0) -> Pool:
    """``size`` rows of the bundled Adult training file (public), chosen by ``seed``."""
    data = load_public("adult")
    if not 2 <= size <= data.n:
        raise ValueError(f"pool size must be in [2, {data.n}], got {size}")
    idx = torch.from_numpy(np.random.default_rng(seed).choice(data.n, size, replace=False))
    schema = load_schema_yaml((PUBLIC_DATASETS["adult"].folder / "schema.yaml").read_text())
    assert isinstance(schema, TabularSchema)
    return Pool(
        x=data.x[idx].float(),
        y=data.y[idx].float(),
        norm_sq_bound=row_norm_sq_bound(schema),
        source=f"{size} rows of examples/adult/adult.data.gz (seed {seed})",
    )


def lira_plan(configuration: str, *, epsilon: float, delta: float, pool: Pool) -> PrivacyPlan:
    """The plan the API builds for this configuration's logistic-regression request on a
    dataset of the pool's expected training size n/2 (raises PlanError). A pure method
    (PURE_METHODS) is asked with δ = 0, as the API requires of it."""
    if configuration not in CONFIGURATIONS:
        raise ValueError(
            f"unknown configuration {configuration!r}; known: {', '.join(CONFIGURATIONS)}"
        )
    method, options = CONFIGURATIONS[configuration]
    body: dict[str, Any] = {
        "dataset": "lira",
        "method": method,
        "epsilon": epsilon,
        "delta": 0.0 if method in PURE_METHODS else delta,
        "model": {"kind": "logistic"},
    }
    if options is not None:
        body[method] = options
    return build_plan(
        JobRequest.model_validate(body),
        n_rows=pool.n // 2,
        n_features=pool.d,
        norm_sq_bound=pool.norm_sq_bound,
    )


@contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny models: one torch thread (see tests/privacy/harness.py; on a busy machine a
    thread pool makes each step many times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def product_trainer(plan: PrivacyPlan) -> Trainer:
    """One release of ``plan`` by the worker's own mechanism, on the CPU, one thread."""

    def train(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        with _one_thread():
            out = run_mechanism(
                plan=plan,
                spec=LogisticSpec.model_validate(plan.model),
                data=TabularTrainingSet(x=x, y=y),
                device=torch.device("cpu"),
                progress=lambda step, total: None,
            )
        return out.releases[0]

    return train


def nonprivate_trainer(l2: float = 1e-3, iterations: int = 30) -> Trainer:
    """The ANCHOR: a non-private fit (Newton's method on the mean logistic loss plus
    l2·‖w‖²/2, bias unpenalised; float64, one thread), to show what LiRA finds in a release
    with no noise. For benchmarks and tests only: no API route or command reaches it."""

    def train(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        a = torch.cat([x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64)], dim=1)
        t = y.double()
        ridge = torch.full((a.shape[1],), l2, dtype=torch.float64)
        ridge[-1] = 0.0
        w = torch.zeros(a.shape[1], dtype=torch.float64)
        with _one_thread():
            for _ in range(iterations):
                p = torch.sigmoid(a @ w)
                grad = a.T @ (p - t) / len(t) + ridge * w
                hess = (a.T * (p * (1.0 - p))) @ a / len(t) + torch.diag(ridge + 1e-10)
                w = w - torch.linalg.solve(hess, grad)
        return {"linear.weight": w[None, :-1].float(), "linear.bias": w[-1:].float()}

    return train


def _logits(state: dict[str, torch.Tensor], x: torch.Tensor) -> np.ndarray:
    w = state["linear.weight"].double().reshape(-1)
    b = state["linear.bias"].double().reshape(())
    return (x.double() @ w + b).numpy()


@dataclass(frozen=True)
class LowFprPoint:
    """One FPR level: the paper's empirical ROC point over all pairs, and the held-out
    test (threshold from the selection targets) with its CP intervals and ε bound."""

    target_fpr: float
    tpr: float  # all pairs, threshold on the same scores
    fpr: float  # achieved
    held_out_tpr: ProportionInterval  # two-sided CP at the result's confidence
    held_out_fpr: ProportionInterval
    bound: EpsilonLowerBound  # ε ≥ log((TPR_lo − δ)/FPR_hi), Bonferroni over the levels


@dataclass(frozen=True)
class LiraResult:
    configuration: str
    epsilon: float  # claimed
    delta: float
    pool: int
    models: int  # M; each target has M − 1 shadows
    online: bool
    fixed_variance: bool
    auc: float
    points: list[LowFprPoint]
    ceiling: float  # the held-out test's largest possible ε_lb
    one_run: OneRunBound  # proven bound of one held-out target (module text)
    confidence: float
    train_seconds: float  # all M trainings
    seconds: float  # the whole attack
    plan: dict[str, Any] = field(default_factory=dict)  # σ, steps, ... of the plan

    @property
    def epsilon_lower_bound(self) -> float:
        return max(p.bound.epsilon for p in self.points)


def run_lira(
    *,
    pool: Pool,
    train: Trainer,
    models: int,
    delta: float,
    configuration: str = "custom",
    epsilon: float = float("nan"),
    confidence: float = 0.95,
    online: bool = True,
    fpr_levels: Sequence[float] = FPR_LEVELS,
    seed: int | None = None,
) -> LiraResult:
    """The attack of the module text. ``seed`` fixes the memberships and tie-breaks (the
    mechanisms' own noise stays the enclave's secure randomness); None draws them securely."""
    if models < 4:
        raise ValueError(f"LiRA needs at least 4 models (2 targets a side), got {models}")
    start = time.perf_counter()
    rng = secure_rng() if seed is None else np.random.default_rng(seed)
    n = pool.n
    member = rng.random((models, n)) < 0.5
    phi = np.empty((models, n))
    t0 = time.perf_counter()
    for k in range(models):
        inside = torch.from_numpy(np.flatnonzero(member[k]))
        state = train(pool.x[inside], pool.y[inside])
        phi[k] = logit_confidence(_logits(state, pool.x), pool.y.numpy())
    train_seconds = time.perf_counter() - t0
    if not np.isfinite(phi).all():
        raise ValueError("a release gave non-finite logits on the pool")

    scores = np.empty((models, n))
    fixed = False
    for t in range(models):
        others = np.arange(models) != t
        fit = fit_gaussians(phi[others], member[others])
        fixed = fit.fixed_variance
        scores[t] = online_scores(fit, phi[t]) if online else offline_scores(fit, phi[t])

    select, held = slice(0, None, 2), slice(1, None, 2)
    points = []
    for level in fpr_levels:
        tpr, fpr = tpr_at_fpr(scores, member, level)
        bound = low_fpr_bound(
            select_scores=scores[select],
            select_members=member[select],
            scores=scores[held],
            members=member[held],
            fpr=level,
            delta=delta,
            confidence=confidence,
            comparisons=len(fpr_levels),
        )
        points.append(
            LowFprPoint(
                target_fpr=level,
                tpr=tpr,
                fpr=fpr,
                held_out_tpr=clopper_pearson_interval(
                    successes=bound.hits_world1, trials=bound.runs_world1, confidence=confidence
                ),
                held_out_fpr=clopper_pearson_interval(
                    successes=bound.hits_world0, trials=bound.runs_world0, confidence=confidence
                ),
                bound=bound,
            )
        )
    held_members = member[held]
    ceiling = lira_ceiling(
        members=int(held_members.sum()),
        non_members=int((~held_members).sum()),
        delta=delta,
        confidence=confidence,
        comparisons=len(fpr_levels),
    )
    r = default_guesses(n)
    v = correct_guesses(
        scores=scores[1], included=member[1], guesses=r, tie_break=rng.permutation(n)
    )
    return LiraResult(
        configuration=configuration,
        epsilon=epsilon,
        delta=delta,
        pool=n,
        models=models,
        online=online,
        fixed_variance=fixed,
        auc=auc(scores, member),
        points=points,
        ceiling=ceiling,
        one_run=one_run_bound(canaries=n, guesses=r, correct=v, confidence=confidence, delta=delta),
        confidence=confidence,
        train_seconds=train_seconds,
        seconds=time.perf_counter() - start,
    )


def _plan_figures(plan: PrivacyPlan) -> dict[str, Any]:
    keys = ("noise_multiplier", "steps", "sampling_rate", "sampler", "temperature", "k")
    return {k: plan.mechanism[k] for k in keys if k in plan.mechanism}


def run_lira_configuration(
    configuration: str,
    *,
    epsilon: float,
    delta: float,
    models: int,
    pool: Pool,
    confidence: float = 0.95,
    online: bool = True,
    seed: int | None = None,
) -> LiraResult:
    """LiRA against one product configuration (CONFIGURATIONS) at (ε, δ) on ``pool``; the
    bounds use the plan's δ (0 for a pure method)."""
    plan = lira_plan(configuration, epsilon=epsilon, delta=delta, pool=pool)
    result = run_lira(
        pool=pool,
        train=product_trainer(plan),
        models=models,
        delta=plan.delta,
        configuration=configuration,
        epsilon=epsilon,
        confidence=confidence,
        online=online,
        seed=seed,
    )
    return replace(result, plan=_plan_figures(plan))


def run_lira_audit(request: AuditRequest) -> LiraResult:
    """An admin's LiRA audit (module text), as the service validated it (attack 'lira',
    its M and pool resolved): ``request.method`` one of service.audits.LIRA_METHODS (each
    the configuration of that name), M = ``shadow_models`` models, a pool of ``pool``
    public Adult rows (the rows :func:`adult_pool` picks with its fixed seed, the
    benchmark's; memberships and tie-breaks come from the secure RNG). Raises
    service.audits.AuditRefused for what the service refuses, PlanError for a plan the API
    would not build."""
    models, pool = request.shadow_models, request.pool
    if request.attack != "lira" or models is None or pool is None:
        raise AuditRefused("not a LiRA audit with shadow_models and pool resolved", "attack")
    check_lira(method=request.method, shadow_models=models, pool=pool, dataset=request.dataset)
    return run_lira_configuration(
        request.method,
        epsilon=request.epsilon,
        delta=request.delta,
        models=models,
        pool=adult_pool(pool),
        confidence=request.confidence,
    )


def audit_figures(result: LiraResult) -> LiraFigures:
    """What an audit stores of a LiRA run: rates, counts and bounds (no row, membership or
    model)."""
    return LiraFigures(
        models=result.models,
        pool=result.pool,
        online=result.online,
        fixed_variance=result.fixed_variance,
        auc=result.auc,
        rates=[
            LiraRate(
                target_fpr=p.target_fpr,
                tpr=p.tpr,
                fpr=p.fpr,
                held_out_true_positives=p.bound.hits_world1,
                held_out_members=p.bound.runs_world1,
                held_out_false_positives=p.bound.hits_world0,
                held_out_non_members=p.bound.runs_world0,
                epsilon_lower_bound=p.bound.epsilon,
            )
            for p in result.points
        ],
        epsilon_lower_bound=result.epsilon_lower_bound,
        ceiling=result.ceiling,
        train_seconds=result.train_seconds,
    )
