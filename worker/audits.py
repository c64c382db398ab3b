"""Empirical audits the data owner's admin runs inside the enclave (issue 22).

:func:`run_one_run_audit`: the one-run audit of Steinke, Nasr & Jagielski 2023 ("Privacy
auditing with one (1) training run", arXiv:2305.08846), black-box, input-space canaries,
on a PUBLIC dataset bundled with the product (public Adult, the synthetic ICU sample of
examples/icu and its 3-class variant examples/icu3, the handwritten digits of
examples/digits, or the 3-class wine and 10-class digits-table of examples/wine and
examples/digits-table, tabular, and the digits-table's views digits-table-k3 … -k9 of its
first K digits), so nothing is charged to any dataset's budget and no private row is
read:

1. m canaries: m rows (stays, for the ICU sample; images, for the digits) of the public
   training set, drawn without replacement by the enclave's secure RNG
   (worker.noise.secure_rng), each with a WRONG label (mislabeled examples, the kind a
   model memorises): a binary label flipped, a label of K ≥ 3 classes replaced by one of
   the other K − 1 drawn uniformly (:func:`canary_labels`; the flip is that draw for
   K = 2); the other n − m rows are always trained on.
2. Each canary is included independently with probability 1/2 (S_i, secure RNG).
3. ONE training run, under the plan the service would build for that request (method,
   model, options, (ε, δ)) and the public row count, by the worker's own mechanism
   (worker.mechanisms.registry.run_mechanism, as a job runs it: DP-SGD with its engines on
   logistic regression, MLPs and GRU-D and with its exact engine on CNNs, ExpM's Langevin
   sampler (binary, or multinomial on the K-class tables), ExpM's HMC sampler (its first
   chain's final state is the release, as for a one-sample job), ExpM+NF);
   service/audits.py's ``AUDITABLE`` says which pairs.
4. Each canary is scored by minus its loss under the released model (a member is fitted
   better; the logistic loss, or the softmax cross-entropy for K ≥ 3 classes); ties broken
   by a secure random order. The auditor guesses "in" for the k₊ highest scores and "out"
   for the k₋ lowest, abstaining on the rest (the paper's top-k / bottom-k guesses, §6);
   r = k₊ + k₋ is fixed before the run.
5. v = the number of right guesses; ε_lb and the test's ceiling from
   service.privacy.one_run_audit (Theorem 3.1 of the paper).

With ``canary_kind="gradient"`` (DP-SGD only), steps 1, 3 and 4 are the white-box ones of
worker/gradient_canaries.py instead (Dirac gradient canaries in the real DP-SGD run,
scored by the summed noisy updates on their coordinates); steps 2 and 5 are the same.

The result stays in the admin's view: it holds counts and the bound, never the rows,
the memberships or the model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from service.audits import (
    AUDITABLE_METHODS,
    MAX_CANARY_FRACTION,
    PUBLIC_DATASETS,
    AuditRefused,
    audit_plan,
    check_gradient_canaries,
    check_method_options,
    check_request,
    default_guesses,
    default_model,
    public_schema,
)
from service.datasets.images import ImageSchema
from service.datasets.tabular import TabularSchema, encode, validate_frame
from service.datasets.timeseries import TimeSeriesSchema, encode_series
from service.modelspec import MODEL_SPEC, ModelSpec
from service.privacy.one_run_audit import OneRunBound, epsilon_lower_bound
from service.schemas import DpsgdOptions, PrivacyPlan
from service.schemas.audits import AuditRequest, CanaryKind
from service.schemas.expm import ExpmOptions
from service.schemas.expm_nf import ExpmNfOptions
from worker.data import image_training_set, prepare_series
from worker.gradient_canaries import CanaryScores, gradient_canary_run
from worker.images import check_images
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.registry import run_mechanism
from worker.models import build_module
from worker.noise import secure_rng

__all__ = [
    "AUDITABLE_METHODS",
    "MAX_CANARY_FRACTION",
    "PUBLIC_DATASETS",
    "AuditRefused",
    "OneRunAudit",
    "canary_labels",
    "correct_guesses",
    "load_public",
    "run_one_run_audit",
    "run_requested_audit",
]


@dataclass(frozen=True)
class OneRunAudit:
    method: str
    dataset: str
    epsilon: float  # the claimed ε of the audited plan
    delta: float
    bound: OneRunBound  # ε_lb, its ceiling, m, r, v, confidence
    rows: int  # public training rows (canaries included)
    noise_multiplier: float | None  # the plan's σ, steps and q where its mechanism has them
    steps: int | None
    sampling_rate: float | None
    seconds: float  # the whole audit: data, one training run, scoring
    model: str = "logistic"  # the audited model kind
    canary_kind: CanaryKind = "input"


def load_public(dataset: str) -> TabularTrainingSet:
    """A bundled public dataset's training part, encoded as the worker encodes rows (a time
    series as GRU-D's inputs, with the schema's public means; images read and validated by
    their schema and encoded as a registered image dataset's are). The schema is
    service.audits.public_schema's: a view of the first K classes (digits-table-k5) reads
    its folder's file under the cut schema, whose validation keeps the rows of those K
    classes (a row of another class is an unknown target value) and encodes them as the
    whole table's rows are."""
    if dataset not in PUBLIC_DATASETS:
        raise AuditRefused(
            f"unknown public dataset {dataset!r}; bundled: {', '.join(PUBLIC_DATASETS)}"
        )
    public = PUBLIC_DATASETS[dataset]
    folder = public.folder
    schema = public_schema(dataset)
    if isinstance(schema, TimeSeriesSchema):
        prepared = prepare_series(schema, folder / public.observations, folder / "outcomes.csv.gz")
        series = encode_series(schema, prepared.validated)
        return TabularTrainingSet(
            x=torch.from_numpy(series.x),
            y=torch.from_numpy(series.y),
            public_means=schema.scaled_means,
        )
    if isinstance(schema, ImageSchema):
        images = check_images(schema, folder / f"{dataset}.npz")
        return image_training_set(schema, images.pixels, images.y, torch.device("cpu"))
    if not isinstance(schema, TabularSchema):
        raise AuditRefused(f"public dataset {dataset!r} is neither tabular, images nor a series")
    # A table's file is named after its folder (a view shares its source's).
    raw = pd.read_csv(folder / f"{folder.name}.data.gz", **schema.read_csv_kwargs())
    table = encode(schema, validate_frame(schema, raw).frame)
    return TabularTrainingSet(x=torch.from_numpy(table.x), y=torch.from_numpy(table.y))


def _scores(
    spec: ModelSpec,
    state: dict[str, torch.Tensor],
    data: TabularTrainingSet,
    x: torch.Tensor,
    y: torch.Tensor,
) -> np.ndarray:
    """Minus the loss of each (x, y) under the released model (float64): the logistic loss,
    or for a model of K ≥ 3 classes (K logits) the softmax cross-entropy."""
    module = build_module(spec, data.n_features, public_means=data.public_means)
    module.load_state_dict(state)
    module = module.double().eval()
    with torch.no_grad():
        logits = module(x.double())
        if _classes(spec) > 2:
            loss = torch.nn.functional.cross_entropy(logits, y.long(), reduction="none")
        else:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, y.double(), reduction="none"
            )
    return (-loss).numpy()


def _classes(spec: ModelSpec) -> int:
    """K: the model's classes (filled in from the schema for K ≥ 3; absent: binary)."""
    return getattr(spec, "classes", None) or 2


def canary_labels(y: torch.Tensor, classes: int, rng: np.random.Generator) -> torch.Tensor:
    """The canaries' wrong labels (module text, step 1): 1 − y for a binary target; for K ≥ 3
    classes, y + U mod K with U uniform on {1, …, K − 1} (secure RNG), i.e. a label drawn
    uniformly from the other K − 1."""
    if classes <= 2:
        return 1.0 - y
    shift = torch.from_numpy(rng.integers(1, classes, size=len(y))).to(y.dtype)
    return torch.remainder(y + shift, classes)


def correct_guesses(
    *, scores: np.ndarray, included: np.ndarray, guesses: int, tie_break: np.ndarray
) -> int:
    """The paper's top-k / bottom-k guesser (§6): "in" for the ⌈r/2⌉ highest scores, "out"
    for the ⌊r/2⌋ lowest, abstain on the rest; ties ordered by ``tie_break`` (a secure
    random permutation, so the order never depends on membership). Returns v."""
    m = len(scores)
    order = np.lexsort((tie_break, scores))  # ascending score
    k_in, k_out = guesses - guesses // 2, guesses // 2
    guess_in, guess_out = order[m - k_in :], order[:k_out]
    return int(included[guess_in].sum() + (~included[guess_out]).sum())


def run_one_run_audit(
    *,
    method: str,
    epsilon: float,
    delta: float,
    canaries: int,
    dataset: str = "adult",
    guesses: int | None = None,
    confidence: float = 0.95,
    options: DpsgdOptions | None = None,
    model: ModelSpec | None = None,
    canary_kind: CanaryKind = "input",
    expm: ExpmOptions | None = None,
    expm_nf: ExpmNfOptions | None = None,
) -> OneRunAudit:
    """One training run, m canaries, the bound and its ceiling (module text). ``model``:
    default the dataset's (logistic regression; GRU-D on a time series). ``canary_kind``:
    input rows (black box) or white-box gradient canaries (DP-SGD only). ``expm``: ExpM's
    options as a job gives them (its sampler: Langevin by default, or ``mcmc``); ``expm_nf``:
    ExpM+NF's (the flow and its sizes), likewise."""
    start = time.perf_counter()
    r = default_guesses(canaries) if guesses is None else guesses
    spec = model or default_model(dataset)
    # Before loading anything, against the public row count; again against the rows read.
    check_request(
        method=method,
        canaries=canaries,
        guesses=r,
        dataset=dataset,
        model=spec.kind,
        canary_kind=canary_kind,
    )
    check_method_options(method, {"expm": expm, "expm_nf": expm_nf})
    data = load_public(dataset)
    n = data.n
    check_request(method=method, canaries=canaries, guesses=r, dataset=dataset, rows=n)

    # The plan the service builds from public values: the expected row count.
    plan = audit_plan(
        method=method,
        epsilon=epsilon,
        delta=delta,
        canaries=canaries,
        rows=n,
        features=data.n_features,
        options=options,
        dataset=dataset,
        model=spec,
        canary_kind=canary_kind,
        expm=expm,
        expm_nf=expm_nf,
    )
    rng = secure_rng()
    planned_spec = MODEL_SPEC.validate_python(plan.model)
    if canary_kind == "gradient":
        check_gradient_canaries(plan, canaries)
        with _one_thread():
            run = gradient_canary_run(
                plan=plan, spec=planned_spec, data=data, canaries=canaries, rng=rng
            )
    else:
        run = _input_canary_run(plan=plan, spec=planned_spec, data=data, canaries=canaries, rng=rng)
    correct = correct_guesses(
        scores=run.scores, included=run.included, guesses=r, tie_break=rng.permutation(canaries)
    )
    bound = epsilon_lower_bound(
        canaries=canaries, guesses=r, correct=correct, confidence=confidence, delta=delta
    )
    mech = plan.mechanism
    return OneRunAudit(
        method=method,
        dataset=dataset,
        epsilon=epsilon,
        delta=delta,
        bound=bound,
        rows=n,
        noise_multiplier=_maybe(float, mech.get("noise_multiplier")),
        steps=_maybe(int, mech.get("steps")),
        sampling_rate=_maybe(float, mech.get("sampling_rate")),
        seconds=time.perf_counter() - start,
        model=spec.kind,
        canary_kind=canary_kind,
    )


def run_requested_audit(request: AuditRequest) -> OneRunAudit:
    """:func:`run_one_run_audit` of a one-run audit request, its fields mapped once for the
    worker's task (worker/audit_job.py) and the CLI's in-process run (enclave/audit_cli.py).
    Raises :class:`AuditRefused` for a request without canaries (m)."""
    if request.canaries is None:
        raise AuditRefused("a one-run audit needs canaries (m)")
    return run_one_run_audit(
        method=request.method,
        epsilon=request.epsilon,
        delta=request.delta,
        canaries=request.canaries,
        dataset=request.dataset,
        guesses=request.guesses,
        confidence=request.confidence,
        options=request.dpsgd,
        model=request.model,
        canary_kind=request.canary_kind,
        expm=request.expm,
        expm_nf=request.expm_nf,
    )


@contextmanager
def _one_thread() -> Iterator[None]:
    """Small models: one torch thread (see tests/privacy/harness.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _input_canary_run(
    *,
    plan: PrivacyPlan,
    spec: ModelSpec,
    data: TabularTrainingSet,
    canaries: int,
    rng: np.random.Generator,
) -> CanaryScores:
    """Steps 1-4 of the module text (black box): the canaries' scores and S."""
    n = data.n
    canary_rows = rng.choice(n, size=canaries, replace=False)
    base = np.setdiff1d(np.arange(n), canary_rows)
    included = rng.random(canaries) < 0.5  # S_i: each canary in with probability 1/2
    cx = data.x[torch.from_numpy(canary_rows)]
    cy = canary_labels(data.y[torch.from_numpy(canary_rows)], _classes(spec), rng)
    inc = torch.from_numpy(np.flatnonzero(included))
    train = TabularTrainingSet(
        x=torch.cat([data.x[torch.from_numpy(base)], cx[inc]]),
        y=torch.cat([data.y[torch.from_numpy(base)], cy[inc]]),
        public_means=data.public_means,
    )
    with _one_thread():
        out = run_mechanism(
            plan=plan,
            spec=spec,
            data=train,
            device=torch.device("cpu"),
            progress=lambda step, total: None,
        )
    return CanaryScores(scores=_scores(spec, out.releases[0], data, cx, cy), included=included)


def _maybe(kind: type, value: object) -> Any:
    return None if value is None else kind(value)
