"""Privacy audits as admin jobs (issue 22): what the service knows of them.

An audit is the one-run audit of Steinke, Nasr & Jagielski 2023 ("Privacy auditing with one
(1) training run", arXiv:2305.08846): the worker trains a configuration once on a PUBLIC
dataset bundled with the product, with m canaries each included with probability 1/2, and
reports the ε lower bound of their Theorem 3.1 (service/privacy/one_run_audit.py) with the
ceiling the same test could show. No ledger budget is charged and no private row is read;
the figures are shown to the admin only.

A LiRA audit (``attack: "lira"``; Carlini et al. 2022, arXiv:2112.03570) runs worker/lira.py
instead: M logistic-regression models by dpsgd, expm (its Langevin sampler) or expm_nf,
each on a random half of a pool of public Adult rows, every one in turn the target of the
other M − 1 as shadows (:func:`check_lira` says what it takes; :func:`lira_audit_plan` is
each training's plan). The stored result is then the one-run bound of one held-out target
(its pool rows as canaries, Thm 3.1 of Steinke et al.) with LiRA's own figures beside it
(TPR at 0.1 % and 1 % FPR, AUC, an ε lower bound and its ceiling). A LiRA audit never
opens a release gate (service/audit_gate.py reads one-run audits only).

Which (dataset, method, model) the one-run audit can run (:data:`AUDITABLE`): on public Adult
(tabular), logistic regression and MLPs by DP-SGD (any engine the job door takes for them),
logistic regression by ``expm`` (either sampler, as the request's ``expm`` options name it:
the proven Langevin one, the default, or the asymptotic HMC one, ``mcmc``), logistic
regression and MLPs by ``expm_nf`` (nominal; δ = 0 as for its jobs; the request names no
flow sizes, so the flow's defaults: for the default MLP on all of Adult that is ~1.7e4 s by
the service's estimate, past the worker's default 1 h task time limit, a 422 from
:func:`validated`); on the bundled synthetic ICU sample (time series), GRU-D by DP-SGD
(exact engine) and by ``expm_nf``; on the bundled handwritten digits (examples/digits: 1,797
8 × 8 images, 10 classes), a CNN by DP-SGD (the exact engine, the only one CNNs have; the
request's ``model`` is the CNN spec a job gives, its image shape and classes filled in from
the digits' public schema as a job's are from its dataset's), and multinomial logistic
regression (the default there) and MLPs by DP-SGD on the 64 flattened pixels, as a job on
an image dataset trains them (engines as for their K-class jobs: service/plans.py's
``MULTICLASS_MODELS``). ExpM is not audited on the digits' images (a K-class ExpM job
runs on a tabular dataset; its audit runs on the K-class tables below). On the bundled
tabular sets of K ≥ 3 classes (:data:`MULTICLASS_TABULAR`; both sources ship inside
scikit-learn): examples/wine (178 rows, 13 numeric columns, 3 classes),
examples/digits-table (the digits as 1,797 rows of 64 numeric columns, 10 classes) and its
views digits-table-k3 … -k9 (:data:`DIGITS_TABLE_VIEWS`: the rows of the first K digits,
the classes cut to those K), multinomial logistic regression (the default) and MLPs by
DP-SGD, as on the digits' pixels, and multinomial logistic regression by ``expm`` with its
Langevin sampler (the proven K-class ExpM job's: service/plans.py's ``MULTICLASS_MODELS``,
worker/mechanisms/langevin.py), its plan built by :func:`audit_plan` as for the binary
audit on Adult (the row-norm bound B from the set's public schema,
:func:`row_norm_sq_bound`; K from it too) and its canaries scored by their softmax
cross-entropy as DP-SGD's K-class ones are; ExpM's HMC sampler (``mcmc``) trains no K-class
target (a 422 from the plan), and the hidden-iterate accounting needs a schema stating
max_rows, which no bundled schema does (likewise a 422, as on Adult). A passing audit on
one opens the release gate of a registered tabular dataset of its K classes
(service/audit_gate.py compares K) for its method, so every K from 3 to 10 has a set.
Wine's 178 rows allow at most 17 canaries (ceiling ≈ 1.65 at 95%, δ = 1e-5), the
digits-table's 179 (≈ 4.08), its views 53 (K = 3) to 161 (K = 9). On examples/icu3 (the
ICU sample's 2,000 stays with a synthetic 3-class outcome, :data:`MULTICLASS_SERIES`),
K-logit GRU-D by DP-SGD (exact engine), whose pass opens the gate of a registered 3-class
time series.
The canaries' scores are minus their loss under the released model, so a model family the
worker cannot score, or a method whose release is not one model of that family, is
refused. A registered dataset is never
audited: its rows are private, and the audit's figure (right guesses on its rows, outside
any ledger charge) would be a statistic of them leaving the worker.

This module holds, without the worker's code: the public facts an audit request is checked
against (which methods can be audited, the bundled datasets and their row counts, the
largest share of canaries), the check itself, the ``audits`` table (migration 0009), the
operations on it (create, claim, finish, list) and the admin's view of a row. The worker
(worker/audit_job.py, Celery task :data:`service.queue.RUN_AUDIT_TASK`) claims a row, runs
worker/audits.py and writes the result back here.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Float, ForeignKey, Index, String, and_, func, or_, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from service.datasets.kinds import DATA_KINDS, DatasetSchema, load_schema_yaml
from service.datasets.tabular import TabularSchema
from service.jobs import as_utc
from service.ledger.tables import Analyst, Base, utcnow
from service.modelspec import GrudSpec, LogisticSpec, ModelSpec
from service.plans import PlanError, build_plan, with_image_shape
from service.privacy.one_run_audit import OneRunBound, ceiling
from service.resources import plan_resources
from service.schemas import JobRequest, PrivacyPlan
from service.schemas.audits import (
    AuditRequest,
    AuditResult,
    AuditStatus,
    AuditView,
    CanaryKind,
    LiraFigures,
)
from service.schemas.dpsgd import DpsgdOptions
from service.schemas.expm import ExpmOptions
from service.schemas.expm_nf import ExpmNfOptions

__all__ = [
    "AUDITABLE",
    "AUDITABLE_METHODS",
    "DIGITS_TABLE_VIEWS",
    "GRADIENT_CANARY_METHODS",
    "LIRA_DATASET",
    "LIRA_DEFAULT_MODELS",
    "LIRA_DEFAULT_POOL",
    "LIRA_METHODS",
    "MAX_CANARY_FRACTION",
    "MULTICLASS_SERIES",
    "MULTICLASS_TABULAR",
    "PUBLIC_DATASETS",
    "Audit",
    "AuditRefused",
    "PublicDataset",
    "audit_plan",
    "audit_view",
    "auditable",
    "check_gradient_canaries",
    "check_lira",
    "check_method_options",
    "check_request",
    "claim_audit",
    "count_audits",
    "create_audit",
    "default_guesses",
    "default_model",
    "finish_audit",
    "lira_audit_plan",
    "public_schema",
    "round_down",
    "round_up",
    "row_norm_sq_bound",
]

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = Path(os.environ.get("ENCLAVE_EXAMPLES_DIR") or REPO / "examples")
"""The bundled public datasets' folder: the repository's examples/, or ``ENCLAVE_EXAMPLES_DIR``
where the package is installed away from its repository (the Dockerfile copies examples/ to
/app/examples and sets it: an installed package's parent folder is site-packages)."""


@dataclass(frozen=True)
class PublicDataset:
    """A public dataset bundled with the product: its folder (schema.yaml and its data
    files), its kind (service.datasets.kinds) and its public shape, as the worker encodes it
    (the rows, or stays, its schema keeps and the encoded width: columns for a tabular
    dataset, variables for a time series; tests/integration/test_audits_api.py checks both
    against worker/audits.py's ``load_public``). The service reads no data file."""

    folder: Path
    rows: int
    features: int
    kind: str = "tabular"
    observations: str = "observations.csv.gz"
    """A time series' observations file, relative to ``folder`` (icu3 shares icu's)."""
    first_classes: int | None = None
    """K for a view of the tabular dataset in ``folder`` (None: the whole dataset): its
    schema's target cut to the first K of its classes (:func:`public_schema`) and the rows
    of those classes, the ones the cut schema's validation keeps (worker/audits.py's
    ``load_public``; a row of another class is an unknown target value there)."""


DIGITS_TABLE_VIEWS: dict[int, int] = {
    3: 537,
    4: 720,
    5: 901,
    6: 1_083,
    7: 1_264,
    8: 1_443,
    9: 1_617,
}
"""K → rows of ``digits-table-k{K}``, the bundled K-class tabular audit sets for K = 3 … 9
(K = 10 is the digits-table itself). The rule, public and fixed: the rows of
examples/digits-table whose digit is one of the first K classes (0 … K − 1), the schema's
classes cut to those K. The rows are the digits' per-class counts in scikit-learn's
``load_digits`` (178, 182, 177, 183, 181, 182, 181, 179, 174, 180 for 0 … 9), summed; a test
checks each against the worker's count. Each allows m ≤ 10% of its rows (53 canaries at
K = 3, 90 at K = 5, 161 at K = 9: ceilings ≈ 2.85, 3.39, 3.98 at 95%, δ = 1e-5, rounded up)."""

PUBLIC_DATASETS: dict[str, PublicDataset] = {
    "adult": PublicDataset(EXAMPLES / "adult", rows=30_162, features=104),
    "icu": PublicDataset(EXAMPLES / "icu", rows=2_000, features=8, kind="timeseries"),
    "digits": PublicDataset(EXAMPLES / "digits", rows=1_797, features=64, kind="images"),
    # Tabular with K ≥ 3 classes (both ship inside scikit-learn): the only bundled data
    # whose audits open the release gate of a K-class tabular dataset (service/audit_gate.py
    # compares K). Wine covers K = 3 (m ≤ 17); the digits as 64 columns K = 10 (m ≤ 179),
    # their views below K = 3 to 9.
    "wine": PublicDataset(EXAMPLES / "wine", rows=178, features=13),
    "digits-table": PublicDataset(EXAMPLES / "digits-table", rows=1_797, features=64),
    # digits-table-k3 … -k9 (:data:`DIGITS_TABLE_VIEWS`): views of the digits-table, no
    # file of their own, so every K from 3 to 10 has a bundled tabular audit set.
    **{
        f"digits-table-k{k}": PublicDataset(
            EXAMPLES / "digits-table", rows=rows, features=64, first_classes=k
        )
        for k, rows in DIGITS_TABLE_VIEWS.items()
    },
    # The ICU sample's stays with a 3-class outcome (examples/icu3/make.py): the only
    # bundled series whose audits open the gate of a K-class (K = 3) time series.
    "icu3": PublicDataset(
        EXAMPLES / "icu3",
        rows=2_000,
        features=8,
        kind="timeseries",
        observations="../icu/observations.csv.gz",
    ),
}
MULTICLASS_TABULAR = "tabular, K ≥ 3 classes"
"""The :data:`AUDITABLE` row of a bundled tabular dataset whose target has K ≥ 3 classes."""
MULTICLASS_SERIES = "timeseries, K ≥ 3 classes"
"""The :data:`AUDITABLE` row of a bundled time series whose outcome has K ≥ 3 classes."""
AUDITABLE: dict[str, dict[str, tuple[str, ...]]] = {
    "tabular": {
        "dpsgd": ("logistic", "mlp"),
        "expm": ("logistic",),
        # ExpM+NF's utility −Σ(ŷ − y)² takes ŷ = sigmoid of the model's one logit for any
        # binary model (worker/mechanisms/expm_nf.py), its release a state dict of the
        # model: an MLP's is scored as DP-SGD's is.
        "expm_nf": ("logistic", "mlp"),
    },
    # A tabular target of K ≥ 3 classes (wine, digits-table and its views): DP-SGD on
    # multinomial logistic regression and MLPs, and ExpM (its Langevin sampler, the one
    # that trains K classes: service/plans.py's MULTICLASS_MODELS) on multinomial logistic
    # regression, all scored by their softmax cross-entropy, as on the digits' images;
    # ExpM+NF's utility is binary.
    MULTICLASS_TABULAR: {"dpsgd": ("logistic", "mlp"), "expm": ("logistic",)},
    "timeseries": {"dpsgd": ("grud",), "expm_nf": ("grud",)},
    # A K-class outcome (icu3): K-logit GRU-D by DP-SGD (its exact engine, the only one
    # K-class GRU-D has: service/plans.py); ExpM+NF's utility is binary.
    MULTICLASS_SERIES: {"dpsgd": ("grud",)},
    # CNNs are trained by DP-SGD's exact engine only (service/plans.py); logistic
    # regression (multinomial) and MLPs on the flattened pixels, as a job on an image
    # dataset trains them (service/datasets/kinds.py's model kinds for images). All are
    # scored by their softmax cross-entropy over the digits' 10 classes (worker/audits.py).
    "images": {"dpsgd": ("cnn", "logistic", "mlp")},
}
"""Dataset kind (or :data:`MULTICLASS_TABULAR`, :data:`MULTICLASS_SERIES`) → method → the
model kinds the audit can run and score (module text; :func:`auditable`)."""
AUDITABLE_METHODS = ("dpsgd", "expm", "expm_nf")
"""Methods the one-run audit can run on some bundled dataset (:data:`AUDITABLE`)."""
AUDITABLE_MODELS = ("logistic", "mlp", "grud", "cnn")
"""Model kinds the audit's scoring covers (minus each canary's loss under the release)."""
GRADIENT_CANARY_METHODS = ("dpsgd",)
"""Methods whose run sums clipped per-row gradients, where a gradient canary is a row."""
NO_GRADIENT_CANARY_MODELS = ("mlp", "cnn")
"""Model kinds audited with input canaries only: the gradient canaries' score
(worker/gradient_canaries.py) takes every public row's per-example gradient at every step,
which for the default MLP on Adult did not finish in 5 minutes (2 shared cores); its
per-example loss is the binary one, which a 10-class CNN is not scored by (nor any model
on a K-class dataset: :func:`check_request` refuses gradient canaries there)."""
LIRA_METHODS = ("dpsgd", "expm", "expm_nf")
"""Methods a LiRA audit runs: worker/lira.py's configurations of the same names (expm with
its Langevin sampler; expm_nf nominal), logistic regression on public Adult."""
LIRA_DATASET = "adult"
"""The bundled dataset LiRA's pool is drawn from (worker.lira.adult_pool)."""
LIRA_DEFAULT_MODELS = 8
"""M when a LiRA request names none: seconds for dpsgd and expm, about a minute for
expm_nf (8.3 s per expm_nf model on a 500-row pool, 2 shared cores, load ~2.5)."""
LIRA_DEFAULT_POOL = 500
LIRA_MIN_POOL = 100
MAX_CANARY_FRACTION = 0.1
"""At most this fraction of the rows are canaries, so the audited run trains on essentially
the dataset its plan describes."""

REGISTERED_REFUSAL = (
    "registered datasets are not audited: their rows are private and the audit's figure "
    "would be a statistic of them released uncharged"
)


def default_model(dataset: str) -> ModelSpec:
    """The model audited when a request names none: GRU-D on a time series, else logistic
    (multinomial on the digits' 10 classes)."""
    public = PUBLIC_DATASETS.get(dataset)
    return GrudSpec() if public is not None and public.kind == "timeseries" else LogisticSpec()


@cache
def row_norm_sq_bound(dataset: str) -> int | None:
    """B ≥ ‖(x, 1)‖² of a bundled dataset's encoded rows, from its public schema.yaml (the
    ExpM plans need it), or None where its kind has none (time series)."""
    bound = DATA_KINDS[PUBLIC_DATASETS[dataset].kind].norm_sq_bound
    return None if bound is None else bound(public_schema(dataset))


def auditable(dataset: str) -> tuple[str, dict[str, tuple[str, ...]]]:
    """A bundled dataset's row of :data:`AUDITABLE` and its name: its kind's, or for a
    tabular dataset or time series of K ≥ 3 classes (public: its schema's)
    :data:`MULTICLASS_TABULAR`'s or :data:`MULTICLASS_SERIES`'s."""
    kind = PUBLIC_DATASETS[dataset].kind
    if int(getattr(public_schema(dataset), "n_classes", 2)) > 2:
        kind = {"tabular": MULTICLASS_TABULAR, "timeseries": MULTICLASS_SERIES}.get(kind, kind)
    return kind, AUDITABLE[kind]


class AuditRefused(ValueError):
    """The audit cannot run as asked (a method it cannot audit, m too large, ...): a 422.
    ``field`` names the request field at fault."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@cache
def public_schema(dataset: str) -> DatasetSchema:
    """A bundled dataset's public schema (its schema.yaml); for a view of its first K
    classes (:attr:`PublicDataset.first_classes`), that schema named after the view, its
    target's classes cut to the first K."""
    public = PUBLIC_DATASETS[dataset]
    schema = load_schema_yaml((public.folder / "schema.yaml").read_text())
    if public.first_classes is None:
        return schema
    k = public.first_classes
    if not isinstance(schema, TabularSchema) or not 3 <= k < schema.n_classes:
        raise ValueError(f"{dataset}: a view of K ≥ 3 classes needs a tabular source of > K")
    doc = schema.model_dump(mode="json")
    doc["name"] = dataset
    doc["target"]["classes"] = doc["target"]["classes"][:k]
    return TabularSchema.model_validate(doc)


def default_guesses(canaries: int) -> int:
    """r when the admin gives none: a fifth of the canaries, at least 2, at most m."""
    return min(canaries, max(2, canaries // 5))


def check_request(
    *,
    method: str,
    canaries: int,
    guesses: int,
    dataset: str,
    rows: int | None = None,
    model: str | None = None,
    canary_kind: CanaryKind = "input",
) -> None:
    """Refuse what the audit cannot run (raises :class:`AuditRefused`): an unknown public
    dataset (a registered one included), a method it cannot audit on that dataset's kind, a
    model kind it cannot run or score with that method (``model``: None skips this check),
    m outside [1, 10% of the rows], r outside [1, m], gradient canaries for a method
    other than DP-SGD, for a model in :data:`NO_GRADIENT_CANARY_MODELS` or on a dataset
    of K ≥ 3 classes (digits, wine, digits-table and its views). ``rows``: the
    rows counted (the worker's count); default the dataset's public count."""
    if dataset not in PUBLIC_DATASETS:
        raise AuditRefused(
            f"unknown public dataset {dataset!r}; bundled: {', '.join(PUBLIC_DATASETS)} "
            f"({REGISTERED_REFUSAL})",
            "dataset",
        )
    public = PUBLIC_DATASETS[dataset]
    if not (public.folder / "schema.yaml").is_file():  # an installation fault, said as such
        raise AuditRefused(
            f"the bundled dataset {dataset!r} is not installed with this service (no "
            f"{public.folder / 'schema.yaml'}; ENCLAVE_EXAMPLES_DIR names the examples folder)",
            "dataset",
        )
    kind, methods = auditable(dataset)
    if method not in methods:
        raise AuditRefused(
            f"method {method!r} cannot be audited by the one-run audit on {dataset} "
            f"({kind}); auditable there: {', '.join(methods)}",
            "method",
        )
    if model is not None and model not in methods[method]:
        raise AuditRefused(
            f"model {model!r} cannot be audited with {method} on {dataset}; auditable: "
            f"{', '.join(methods[method])}",
            "model",
        )
    n = public.rows if rows is None else rows
    limit = int(n * MAX_CANARY_FRACTION)
    if not 1 <= canaries <= limit:
        raise AuditRefused(
            f"{canaries} canaries is out of range for {dataset} ({n} rows): "
            f"between 1 and {limit} ({MAX_CANARY_FRACTION:.0%} of its rows)",
            "canaries",
        )
    if not 1 <= guesses <= canaries:
        raise AuditRefused(f"guesses must be between 1 and the {canaries} canaries", "guesses")
    if canary_kind == "gradient" and method not in GRADIENT_CANARY_METHODS:
        raise AuditRefused(
            f"gradient canaries need a method that sums clipped per-row gradients "
            f"({', '.join(GRADIENT_CANARY_METHODS)}); {method!r} takes input canaries only",
            "canary_kind",
        )
    if canary_kind == "gradient" and model in NO_GRADIENT_CANARY_MODELS:
        raise AuditRefused(
            f"model {model!r} is audited with input canaries only: the gradient canaries' "
            "score takes every public row's per-example gradient at every step, too slow "
            "for an MLP on the bundled data, and its binary loss does not score a CNN",
            "canary_kind",
        )
    classes = int(getattr(public_schema(dataset), "n_classes", 2))
    if canary_kind == "gradient" and classes > 2:
        raise AuditRefused(
            f"{dataset} has {classes} classes: gradient canaries are scored by the binary "
            "loss's per-example gradients (worker/gradient_canaries.py); use input canaries",
            "canary_kind",
        )


def check_lira(
    *,
    method: str,
    shadow_models: int,
    pool: int,
    dataset: str = LIRA_DATASET,
    model: str = "logistic",
    rows: int | None = None,
) -> None:
    """Refuse what a LiRA audit cannot run (raises :class:`AuditRefused`): a dataset other
    than public Adult, a method other than :data:`LIRA_METHODS`, a model other than
    logistic regression, M outside [4, 256], a pool outside [100, the rows]. ``rows``: the
    rows counted (the worker's count); default the public count."""
    if dataset != LIRA_DATASET:
        raise AuditRefused(
            f"LiRA audits run on a pool of public {LIRA_DATASET} rows, not {dataset!r}"
            + ("" if dataset in PUBLIC_DATASETS else f" ({REGISTERED_REFUSAL})"),
            "dataset",
        )
    if method not in LIRA_METHODS:
        raise AuditRefused(
            f"method {method!r} cannot be audited by LiRA; it runs {', '.join(LIRA_METHODS)}",
            "method",
        )
    if model != "logistic":
        raise AuditRefused(
            f"LiRA audits logistic regression only (worker/lira.py scores its logits), "
            f"not {model!r}",
            "model",
        )
    if not 4 <= shadow_models <= 256:
        raise AuditRefused(
            f"shadow_models must be between 4 (two targets on each side of the held-out "
            f"split) and 256, got {shadow_models}",
            "shadow_models",
        )
    n = PUBLIC_DATASETS[dataset].rows if rows is None else rows
    if not LIRA_MIN_POOL <= pool <= n:
        raise AuditRefused(
            f"a pool of {pool} rows is out of range for {dataset}: between {LIRA_MIN_POOL} "
            f"and its {n:,} rows",
            "pool",
        )


def lira_audit_plan(*, method: str, epsilon: float, delta: float, pool: int) -> PrivacyPlan:
    """The plan of each of a LiRA audit's trainings, as worker.lira.lira_plan builds it (a
    test pins them equal): a logistic-regression job of this method at (ε, δ), with the
    method's default options (expm: the Langevin sampler), on the pool's expected training
    half, pool // 2 rows. Raises PlanError (e.g. expm_nf asked with δ > 0)."""
    return audit_plan(
        method=method,
        epsilon=epsilon,
        delta=delta,
        canaries=0,  # no canary rows: n_rows is the rows given
        rows=pool // 2,
        features=PUBLIC_DATASETS[LIRA_DATASET].features,
        options=None,
        dataset=LIRA_DATASET,
        model=LogisticSpec(),
    )


def check_method_options(method: str, options: Mapping[str, object | None]) -> None:
    """Each method's options (the request fields ``dpsgd``, ``expm``, ``expm_nf``, named as
    the method they belong to) go with that method only (raises :class:`AuditRefused`)."""
    for name, value in options.items():
        if value is not None and method != name:
            raise AuditRefused(f"{name} options are for method {name!r} only", name)


def check_gradient_canaries(plan: PrivacyPlan, canaries: int) -> None:
    """Dirac gradient canaries sit on distinct parameters: m ≤ the plan's parameter count
    (raises :class:`AuditRefused`)."""
    parameters = int(plan.mechanism["parameters"])
    if canaries > parameters:
        raise AuditRefused(
            f"{canaries} gradient canaries is more than the model's {parameters} parameters "
            "(each canary has a parameter of its own)",
            "canaries",
        )


def audit_plan(
    *,
    method: str,
    epsilon: float,
    delta: float,
    canaries: int,
    rows: int,
    features: int,
    options: DpsgdOptions | None,
    dataset: str = "adult",
    model: ModelSpec | None = None,
    canary_kind: CanaryKind = "input",
    expm: ExpmOptions | None = None,
    expm_nf: ExpmNfOptions | None = None,
) -> PrivacyPlan:
    """The plan of the audited run, built as for a job from public values: the expected
    number of rows trained on (input canaries: n − m/2, the m canaries being rows each in
    with probability 1/2; gradient canaries: n + m/2, each an extra row w.p. 1/2), the
    encoded width, the dataset's kind and its schema's row-norm bound. DP-SGD's options
    apply to DP-SGD only, ExpM's (``expm``: its sampler and its options) to ExpM only,
    ExpM+NF's (``expm_nf``: the flow and its sizes) to ExpM+NF only; a method without options
    runs with its defaults. The dataset's public schema gives the model what it gives a
    job's (service.plans: a CNN its image shape, a K-class target its classes). Raises
    PlanError."""
    try:
        request = JobRequest(
            dataset="audit",
            model=model or default_model(dataset),
            method=method,
            epsilon=epsilon,
            delta=delta,
            dpsgd=(options or DpsgdOptions()) if method == "dpsgd" else None,
            expm=expm if method == "expm" else None,
            expm_nf=expm_nf if method == "expm_nf" else None,
        )
    except ValidationError as exc:  # a combination the job door refuses: a plan error
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PlanError(f"{where}: {first['msg']}") from exc
    schema = public_schema(dataset)
    return build_plan(
        with_image_shape(request, schema.model_dump(mode="json")),
        n_rows=rows - canaries // 2 if canary_kind == "input" else rows + canaries // 2,
        n_features=features,
        dataset_kind=PUBLIC_DATASETS[dataset].kind,
        norm_sq_bound=row_norm_sq_bound(dataset),
        n_classes=int(getattr(schema, "n_classes", 2)),
    )


PLANNED_KEYS = ("noise_multiplier", "steps", "sampling_rate")
"""The plan's public figures an audit records where its mechanism has them (DP-SGD all
three; ExpM's Langevin sampler σ; the NF sampler its steps)."""


def planned_figures(plan: PrivacyPlan) -> dict[str, Any]:
    mech = plan.mechanism
    kinds = {"noise_multiplier": float, "steps": int, "sampling_rate": float}
    return {k: kinds[k](mech[k]) for k in PLANNED_KEYS if mech.get(k) is not None}


ONE_RUN_ONLY = ("canaries", "guesses", "dpsgd", "expm", "expm_nf")
"""Request fields a LiRA audit refuses (its canaries are its pool rows, its guesses the
default for them, its plans the method's defaults)."""
LIRA_ONLY = ("shadow_models", "pool")


def validated(
    body: AuditRequest, *, time_limit_s: float | None = None
) -> tuple[AuditRequest, dict[str, Any]]:
    """The request with its defaults resolved (guesses; a LiRA audit's M and pool), and
    the plan's public figures (σ, steps, q where the mechanism has them), or
    :class:`AuditRefused` / PlanError (both 422s). ``time_limit_s``: the worker's task
    time limit, against which a one-run audit's training run and a LiRA audit's M
    trainings are estimated (None: not checked)."""
    if body.attack == "lira":
        return _validated_lira(body, time_limit_s)
    for name in LIRA_ONLY:
        if getattr(body, name) is not None:
            raise AuditRefused(f"{name} is for LiRA audits (attack 'lira') only", name)
    if body.canaries is None:
        raise AuditRefused("a one-run audit needs canaries (m)", "canaries")
    guesses = default_guesses(body.canaries) if body.guesses is None else body.guesses
    check_request(
        method=body.method,
        canaries=body.canaries,
        guesses=guesses,
        dataset=body.dataset,
        model=body.model.kind,
        canary_kind=body.canary_kind,
    )
    check_method_options(
        body.method, {"dpsgd": body.dpsgd, "expm": body.expm, "expm_nf": body.expm_nf}
    )
    public = PUBLIC_DATASETS[body.dataset]
    plan = audit_plan(
        method=body.method,
        epsilon=body.epsilon,
        delta=body.delta,
        canaries=body.canaries,
        rows=public.rows,
        features=public.features,
        options=body.dpsgd,
        dataset=body.dataset,
        model=body.model,
        canary_kind=body.canary_kind,
        expm=body.expm,
        expm_nf=body.expm_nf,
    )
    if body.canary_kind == "gradient":
        check_gradient_canaries(plan, body.canaries)
    if time_limit_s is not None:
        estimate = plan_resources(plan, schema=public_schema(body.dataset))
        if estimate.seconds is not None and estimate.seconds > time_limit_s:
            raise AuditRefused(
                f"the audited training run takes about {estimate.seconds:.3g} s (the "
                f"service's estimate for this plan), past the worker's {time_limit_s:g} s "
                f"task time limit: {estimate.time_hint}",
                body.method,
            )
    return body.model_copy(update={"guesses": guesses}), planned_figures(plan)


def _validated_lira(
    body: AuditRequest, time_limit_s: float | None
) -> tuple[AuditRequest, dict[str, Any]]:
    for name in ONE_RUN_ONLY:
        if getattr(body, name) is not None:
            raise AuditRefused(f"{name} is for one-run audits only, not for LiRA", name)
    if body.canary_kind != "input":
        raise AuditRefused("LiRA audits take no gradient canaries", "canary_kind")
    models = LIRA_DEFAULT_MODELS if body.shadow_models is None else body.shadow_models
    pool = LIRA_DEFAULT_POOL if body.pool is None else body.pool
    check_lira(
        method=body.method,
        shadow_models=models,
        pool=pool,
        dataset=body.dataset,
        model=body.model.kind,
    )
    plan = lira_audit_plan(method=body.method, epsilon=body.epsilon, delta=body.delta, pool=pool)
    if time_limit_s is not None:
        each = plan_resources(plan, schema=public_schema(LIRA_DATASET)).seconds
        if each is not None and models * each > time_limit_s:
            raise AuditRefused(
                f"{models} trainings of about {each:.3g} s each (the service's estimate for "
                f"this plan) exceed the worker's {time_limit_s:g} s task time limit: ask "
                "for fewer shadow_models or a smaller pool",
                "shadow_models",
            )
    resolved = body.model_copy(update={"shadow_models": models, "pool": pool})
    return resolved, planned_figures(plan)


def pre_run_ceiling(request: AuditRequest) -> float:
    """The most the audit's one-run bound can show, known before the run: m canaries (a
    LiRA audit: its pool rows), every guess right, at the request's confidence and δ."""
    m = request.pool if request.attack == "lira" else request.canaries
    assert m is not None  # resolved by validated()
    return ceiling(canaries=m, confidence=request.confidence, delta=request.delta)


# ------------------------------------------------------------------------------- storage


class Audit(Base):
    """One audit: the admin's request (as validated), its status and, when done, the bound
    and the run's public figures. Not a ledger entry: nothing here is charged."""

    __tablename__ = "audits"
    __table_args__ = (Index("ix_audits_created", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    requested_by: Mapped[int] = mapped_column(ForeignKey("analysts.id"))
    request: Mapped[dict[str, Any]]  # the AuditRequest, guesses resolved
    planned: Mapped[dict[str, Any]]  # the service's plan: noise_multiplier, steps, q
    ceiling: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True, default=None)
    result: Mapped[dict[str, Any] | None] = mapped_column(nullable=True, default=None)
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    failure: Mapped[str | None] = mapped_column(String(200), nullable=True, default=None)


def create_audit(
    s: Session, body: AuditRequest, *, requested_by: int, time_limit_s: float | None = None
) -> Audit:
    """Store a validated audit request as queued (raises :class:`AuditRefused` or
    PlanError before storing anything; ``time_limit_s`` as for :func:`validated`)."""
    request, planned = validated(body, time_limit_s=time_limit_s)
    audit = Audit(
        id=str(uuid.uuid4()),
        status="queued",
        requested_by=requested_by,
        request=request.model_dump(mode="json"),
        planned=planned,
        ceiling=pre_run_ceiling(request),
        created_at=datetime.now(UTC),
    )
    s.add(audit)
    s.flush()
    return audit


def claim_audit(s: Session, audit_id: str, *, time_limit_s: float) -> AuditRequest | None:
    """Mark a queued audit running (compare-and-set: a duplicate message finds it taken
    and gets None, as does an unknown id). A running audit started more than
    ``time_limit_s`` ago (the workers' task time limit) is taken again: its run is over,
    its worker died (the message comes back to a worker after that, late acks)."""
    now = datetime.now(UTC)
    stale = now - timedelta(seconds=time_limit_s)
    takeable = or_(
        Audit.status == "queued", and_(Audit.status == "running", Audit.started_at < stale)
    )
    taken = s.execute(
        update(Audit).where(Audit.id == audit_id, takeable).values(status="running", started_at=now)
    )
    if taken.rowcount != 1:  # type: ignore[attr-defined]
        return None
    return AuditRequest.model_validate(s.get_one(Audit, audit_id).request)


def finish_audit(
    s: Session,
    audit_id: str,
    *,
    bound: OneRunBound | None = None,
    run: dict[str, Any] | None = None,
    seconds: float | None = None,
    failure: str | None = None,
    lira: LiraFigures | None = None,
) -> None:
    """Record an audit's end: done with its bound and the run's public figures (rows,
    noise_multiplier, steps, sampling_rate; a LiRA audit's figures in ``lira``), or failed
    with a generic reason (a queued audit too: its message could not be sent). A finished
    audit stays as it is."""
    values: dict[str, Any] = {"finished_at": datetime.now(UTC), "seconds": seconds}
    if failure is not None:
        values.update(status="failed", failure=failure[:200])
    else:
        assert bound is not None and run is not None
        result = AuditResult(
            epsilon_lower_bound=bound.epsilon,
            ceiling=bound.ceiling,
            canaries=bound.canaries,
            guesses=bound.guesses,
            correct=bound.correct,
            confidence=bound.confidence,
            lira=lira,
            **run,
        )
        values.update(status="done", result=result.model_dump(mode="json"))
    unfinished = Audit.status.in_(("queued", "running"))
    s.execute(update(Audit).where(Audit.id == audit_id, unfinished).values(values))


def audit_view(audit: Audit, requested_by: str) -> AuditView:
    status: AuditStatus = audit.status  # type: ignore[assignment]
    created = as_utc(audit.created_at)
    assert created is not None
    return AuditView(
        id=audit.id,
        status=status,
        configuration=AuditRequest.model_validate(audit.request),
        ceiling=audit.ceiling,
        result=None if audit.result is None else AuditResult.model_validate(audit.result),
        failure=audit.failure,
        requested_by=requested_by,
        created_at=created,
        started_at=as_utc(audit.started_at),
        finished_at=as_utc(audit.finished_at),
        seconds=audit.seconds,
    )


def audits_newest_first(s: Session, *, limit: int, offset: int = 0) -> list[AuditView]:
    rows = s.execute(
        select(Audit, Analyst.name)
        .join(Analyst, Analyst.id == Audit.requested_by)
        .order_by(Audit.created_at.desc(), Audit.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return [audit_view(audit, name) for audit, name in rows]


def audit_by_id(s: Session, audit_id: str) -> AuditView | None:
    row = s.execute(
        select(Audit, Analyst.name)
        .join(Analyst, Analyst.id == Audit.requested_by)
        .where(Audit.id == audit_id)
    ).first()
    return None if row is None else audit_view(row[0], row[1])


def count_audits(s: Session) -> int:
    return int(s.scalar(select(func.count()).select_from(Audit)) or 0)


# ---------------------------------------------------------------------------- printing


def round_down(value: float, places: int) -> str:
    """Round down: a printed lower bound never exceeds what the test showed."""
    scale = 10**places
    return f"{math.floor(value * scale) / scale:.{places}f}"


def round_up(value: float, places: int) -> str:
    """Round up: "cannot show more than" stays true of a printed ceiling."""
    scale = 10**places
    return f"{math.ceil(value * scale) / scale:.{places}f}"
