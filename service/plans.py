"""Requests become privacy plans: a pure function of the request and public metadata.

The worker calls :func:`build_plan` again with the stored request (its defaults resolved
at admission, :func:`resolve_defaults`) and refuses to run a job whose stored plan differs
from the recomputed one ("a plan it cannot reproduce").
Each method's own plan builder lives in :mod:`service.methods` (one module per method,
one table); this module holds what every plan shares.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from service.datasets.images import ImageSchema
from service.datasets.kinds import DATA_KINDS, DEFAULT_KIND, DataKind
from service.methods import CHOOSERS, METHODS, choose_method, method_key, plan_key
from service.methods.common import PlanError as PlanError
from service.methods.common import PlanFacts
from service.modelspec import CnnSpec, ModelSpec, fitted_cnn
from service.privacy.events import DpEvent, SelfComposedEvent
from service.privacy.orders import ORDERS
from service.schemas import JobRequest, PrivacyPlan

__all__ = [
    "PlanError",
    "build_plan",
    "check_resolved",
    "data_kind",
    "plan_for_dataset",
    "progress_total",
    "replan_admitted",
    "resolve_defaults",
    "with_classes",
]


def data_kind(kind: str) -> DataKind:
    """The entry of :data:`service.datasets.kinds.DATA_KINDS` for ``kind``, or
    :class:`PlanError` for a kind no entry names."""
    entry = DATA_KINDS.get(kind)
    if entry is None:
        raise PlanError(f"unknown dataset kind {kind!r}")
    return entry


def _repeat(event: DpEvent, k: int) -> DpEvent:
    return event if k == 1 else SelfComposedEvent(event=event, count=k)


def _model_json(model: ModelSpec) -> dict[str, Any]:
    """The plan's model field. The default tanh activation is left out so that an MLP plan
    stays identical, key for key, to the plans stored before activations existed (the
    worker compares stored and re-derived plans)."""
    out = model.model_dump()
    if out.get("activation") == "tanh":
        del out["activation"]
    return out


MULTICLASS_SUPPORT = (
    "DP-SGD (method 'dpsgd', engine 'exact') on models 'logistic', 'mlp', 'cnn' and 'grud', DP-SGD "
    "with engine 'ghost' on model 'mlp', and the proven ExpM (method 'expm', sampler "
    "'langevin') on model 'logistic'"
)
"""What trains a target of K ≥ 3 classes today, in words (:data:`MULTICLASS_MODELS`)."""

MULTICLASS_MODELS: dict[tuple[str, str], tuple[str, ...]] = {
    ("dpsgd", "exact"): ("logistic", "mlp", "cnn", "grud"),
    ("dpsgd", "ghost"): ("mlp",),
    ("expm", "langevin"): ("logistic",),
}
"""(method, engine or sampler) → the model kinds it trains on a target of K ≥ 3 classes,
each with a proven guarantee: multinomial logistic regression
(worker/mechanisms/exact_softmax.py, worker/mechanisms/langevin.py), K-logit MLPs
(worker/mechanisms/exact_net.py, whose exact and ghost engines are one sum), CNNs
(worker/mechanisms/exact_conv.py) and K-logit GRU-D (worker/mechanisms/exact_grud.py;
its ghost and JL engines are not that sum and stay refused)."""


def with_classes(request: JobRequest, n_classes: int) -> JobRequest:
    """``request`` with its model fitted to a target of ``n_classes`` classes (public: the
    schema's): unchanged for a binary target; for K ≥ 3 classes, the model gets
    ``classes: K`` where :data:`MULTICLASS_MODELS` lists its method, engine (or sampler)
    and model kind, and anything else is a :class:`PlanError` naming what is supported
    (:data:`MULTICLASS_SUPPORT`). A ``classes`` given in the request must equal the
    dataset's."""
    given = getattr(request.model, "classes", None)
    if n_classes < 3:
        if given is not None:
            raise PlanError(f"the dataset's target is binary; model.classes {given} does not fit")
        return request
    engine = request.dpsgd.engine if request.dpsgd is not None else "exact"
    sampler = request.expm.sampler if request.expm is not None else "langevin"
    variant = engine if request.method == "dpsgd" else sampler
    if request.model.kind not in MULTICLASS_MODELS.get((request.method, variant), ()):
        what = f"method {request.method!r}, model {request.model.kind!r}"
        if request.method == "dpsgd":
            what += f", engine {engine!r}"
        if request.method == "expm":
            what += f", sampler {sampler!r}"
        raise PlanError(
            f"the dataset's target has {n_classes} classes; multi-class targets are trained by "
            f"{MULTICLASS_SUPPORT} only for now, not by {what}"
        )
    if given is not None and given != n_classes:
        raise PlanError(f"model.classes {given} differs from the dataset's {n_classes} classes")
    try:  # validated (model_copy would not be): 3 ≤ K ≤ MAX_CLASSES
        fitted = {**request.model.model_dump(), "classes": n_classes}
        model = type(request.model).model_validate(fitted)
    except ValidationError as exc:
        raise PlanError(f"model.classes: {exc.errors()[0]['msg']}") from None
    return request.model_copy(update={"model": model})


def with_image_shape(request: JobRequest, public_schema: dict[str, Any]) -> JobRequest:
    """``request`` with a CNN model given the image dataset's public shape (C, H, W), as
    :func:`with_classes` gives it the classes; any other request unchanged. A shape the
    request states must equal the dataset's; a network that does not fit the images is a
    :class:`PlanError` (the parameter cap is modelspec.parameter_count's)."""
    if not isinstance(request.model, CnnSpec) or public_schema.get("kind") != "images":
        return request
    try:
        schema = ImageSchema.model_validate(public_schema)
        return request.model_copy(update={"model": fitted_cnn(request.model, schema.shape)})
    except (ValueError, ValidationError) as exc:
        raise PlanError(str(exc).splitlines()[0]) from None


def build_plan(
    request: JobRequest,
    *,
    n_rows: int,
    n_features: int,
    dataset_kind: str = "tabular",
    norm_sq_bound: int | None = None,
    n_classes: int = 2,
    max_rows: int | None = None,
) -> PrivacyPlan:
    """Turn a validated request into its privacy plan (raises :class:`PlanError`).

    Public inputs only: ``n_rows`` is the dataset's public (DP noisy) row count,
    ``n_features`` the encoded width its public schema implies (for a time-series
    dataset the number of variables V, GRU-D's width), ``dataset_kind`` its kind,
    ``norm_sq_bound`` its bound on ‖(x, 1)‖² (its kind's ``norm_sq_bound``; tabular only).
    A ``dataset_kind`` that :data:`~service.datasets.kinds.DATA_KINDS` does not name is a
    :class:`PlanError` ("unknown dataset kind"). ``n_classes`` is the target's public number
    of classes (:func:`with_classes`). A request whose method is ``auto`` is planned as the
    method service/methods/auto.py chooses, and the plan records the choice.
    """
    facts = PlanFacts(
        n_rows=n_rows, n_features=n_features, norm_sq_bound=norm_sq_bound, max_rows=max_rows
    )
    request, choice = choose_method(request, facts, n_classes=n_classes)
    request = with_classes(request, n_classes)
    if n_rows < 1:
        raise PlanError("the dataset has no rows")
    if request.samples * request.delta >= 1:
        raise PlanError(
            f"samples × delta = {request.samples * request.delta:g}: the job's δ must be below 1"
        )
    if request.model.kind not in data_kind(dataset_kind).model_kinds:
        raise PlanError(
            f"model {request.model.kind!r} does not fit a {dataset_kind} dataset "
            "(GRU-D is for time-series datasets, CNNs for image datasets, the others for "
            "tabular and image ones)"
        )
    if request.model.kind == "cnn" and request.method != "dpsgd":
        raise PlanError("model 'cnn' is trained by DP-SGD (method 'dpsgd') only for now")
    if request.method == "selection":
        raise PlanError("selection jobs are submitted through POST /v1/selections")
    if request.method == "evaluation":
        raise PlanError("evaluations are submitted through POST /v1/evaluations")
    given = {
        name
        for name in ("dpsgd", "expm_nf", "expm")
        if getattr(request, name) is not None and name != request.method
    }
    if given:
        raise PlanError(f"{', '.join(sorted(given))} options given for method {request.method}")
    entry = METHODS.get(method_key(request))
    if entry is None:
        raise PlanError(f"unknown method {request.method!r}")
    one, mechanism, accountant = entry.plan(request, facts)
    guarantee = entry.guarantee(request)
    k = request.samples
    event = _repeat(one, k)
    curve = event.rdp(ORDERS)
    return PrivacyPlan(
        method=request.method,
        dataset=request.dataset,
        n_rows=n_rows,
        model=_model_json(request.model),
        # k releases: basic composition of k (ε, δ) guarantees (Dwork & Roth 2014, Thm 3.16).
        epsilon=k * request.epsilon,
        delta=k * request.delta,
        guarantee=guarantee,
        accountant=accountant,
        samples=k,
        event=event.to_json(),
        rdp_orders=list(ORDERS),
        rdp_curve=[float(v) for v in curve],
        mechanism=mechanism,
        method_choice=choice,
    )


def plan_for_dataset(
    request: JobRequest, *, n_rows: int, public_schema: dict[str, Any]
) -> PrivacyPlan:
    """:func:`build_plan` with the public facts read off a registered dataset: its public
    row count and its public schema (kind, encoded width). The API (quote, admission) and
    the worker (re-derivation before it reads data) both call this. The kind's entry in
    :data:`~service.datasets.kinds.DATA_KINDS` parses the schema and gives its bound."""
    request = with_image_shape(request, public_schema)
    kind, facts, n_classes = _dataset_facts(public_schema, n_rows=n_rows)
    return build_plan(
        request,
        n_rows=n_rows,
        n_features=facts.n_features,
        dataset_kind=kind,
        norm_sq_bound=facts.norm_sq_bound,
        n_classes=n_classes,
        max_rows=facts.max_rows,
    )


def _dataset_facts(public_schema: dict[str, Any], *, n_rows: int) -> tuple[str, PlanFacts, int]:
    """A registered dataset's kind, plan facts and number of classes, from its public
    schema (parsed by its kind's entry in :data:`~service.datasets.kinds.DATA_KINDS`)."""
    kind = str(public_schema.get("kind", DEFAULT_KIND))
    entry = data_kind(kind)
    schema = entry.parse(public_schema)
    bound = entry.norm_sq_bound
    facts = PlanFacts(
        n_rows=n_rows,
        n_features=schema.n_features,
        norm_sq_bound=None if bound is None else bound(schema),
        max_rows=getattr(schema, "max_rows", None),
    )
    # A kind whose schema declares no classes (one added by its table entry alone) is binary.
    return kind, facts, int(getattr(schema, "n_classes", 2))


def resolve_defaults(
    request: JobRequest, *, n_rows: int, public_schema: dict[str, Any]
) -> JobRequest:
    """``request`` with every default its plan fills in written out, for the same public
    facts as :func:`plan_for_dataset`: the method a rule of
    :data:`~service.methods.CHOOSERS` (``auto``) chose, then that method's options as its
    ``MethodEntry.resolve`` fills them. It plans identically (:func:`replan_admitted`).
    Admission stores it beside the request as sent (``Job.resolved_request``) and the worker
    re-plans from it, so a default rule changed between admission and run (an upgrade)
    leaves a queued job's plan reproducible. A request no entry of :data:`METHODS` plans
    (selection, evaluation) is returned as it is: the selection endpoint stores it with its
    budget resolved and its trainings' defaults written out
    (:func:`service.selection.api_bodies.resolve_training_defaults`)."""
    _, facts, n_classes = _dataset_facts(public_schema, n_rows=n_rows)
    if request.method in CHOOSERS:
        request, _ = choose_method(request, facts, n_classes=n_classes)
    entry = METHODS.get(method_key(request))
    return request if entry is None else entry.resolve(request, facts)


def replan_admitted(
    admitted: JobRequest,
    *,
    sent: JobRequest,
    stored: PrivacyPlan,
    n_rows: int,
    public_schema: dict[str, Any],
) -> PrivacyPlan:
    """The worker's re-derivation of a stored plan from the admitted request
    (:func:`resolve_defaults` of ``sent``; :func:`check_resolved` first). Where ``sent`` let
    a rule choose the method (``auto``), the admitted request names the method chosen at
    admission and the plan carries the stored choice when it names that method (its reason
    is the admission's rule's, which a later rule may word otherwise)."""
    plan = plan_for_dataset(admitted, n_rows=n_rows, public_schema=public_schema)
    choice = stored.method_choice
    if sent.method in CHOOSERS and choice is not None and choice.method == admitted.method:
        plan = plan.model_copy(update={"method_choice": choice})
    return plan


def check_resolved(sent: JobRequest, resolved: JobRequest) -> None:
    """Refuse (:class:`PlanError`) a resolved request that is not ``sent`` with only values
    ``sent`` left empty (None) filled in, and the method where ``sent`` left it to a rule
    (``auto``): whatever the analyst wrote is what runs."""
    given = sent.model_dump(mode="json")
    if sent.method in CHOOSERS:
        given["method"] = None
    if not _fills_only(given, resolved.model_dump(mode="json")):
        raise PlanError("the admitted request differs from the request as sent")


def _fills_only(sent: Any, resolved: Any) -> bool:
    if sent is None:
        return True
    if isinstance(sent, dict):
        return (
            isinstance(resolved, dict)
            and sent.keys() == resolved.keys()
            and all(_fills_only(v, resolved[k]) for k, v in sent.items())
        )
    return bool(sent == resolved) and type(sent) is type(resolved)


def progress_total(plan: PrivacyPlan) -> int:
    """T of a job's progress "step k of T", from its plan alone (data-independent): the
    steps the worker's mechanism counts, as the method's METHODS entry says (DP-SGD and
    the Langevin sampler count each released sample's steps, ``expm_nf`` trains one flow
    for all its samples). Set on the job at admission, so it reads "0 of T" while queued."""
    if plan.method == "selection":
        # Trainings of a fixed-size search; 1 when their number is random (random
        # stopping: K is never shown, so progress is 0 of 1 until the release).
        return int(plan.mechanism.get("trainings") or 1)
    if plan.method == "evaluation":
        return 1  # one pass over the holdout
    return METHODS[plan_key(plan)].progress_total(plan)
