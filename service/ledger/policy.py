"""Which methods a dataset's budget and policy can admit at all (a registration warning).

A dataset registered with δ_total = 0 and nominal methods off admits no method: DP-SGD
needs δ > 0 and ExpM+NF carries a nominal ε. Nothing stops such a registration (the admin
may raise δ or allow nominal later), but it should not be silent. The check asks the
same code that admission asks (plan building, :func:`nominal_refusal`, the dataset's
filter) about a few probe requests per method, so it never disagrees with a real request
of the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from service.datasets.kinds import DEFAULT_KIND
from service.ledger.charges import charge_for
from service.ledger.errors import LedgerError
from service.ledger.filter_view import dataset_filter, evaluate
from service.ledger.nominal import nominal_refusal
from service.ledger.tables import Dataset
from service.params import EPSILON_FLOOR
from service.plans import PlanError, data_kind, plan_for_dataset
from service.schemas import TRAINING_METHODS, JobRequest

PROBE_EPSILON = 1.0
"""Largest ε (nats) of the probe requests (or the dataset's remaining ε where smaller)."""
PROBE_FRACTIONS = (1.0, 0.1, 0.01)
"""The probes ask for these fractions of that ε, largest first: a method is admitted when
any probe is (DP-SGD at ε close to a small ε_total can exhaust the Rényi filter while a
tenth of it fits)."""


@dataclass(frozen=True)
class _Probe:
    reason: str | None  # None: admitted
    planned: bool  # False: no plan could be built (PlanError), the filter was not asked


def _probe(ds: Dataset, method: str, *, epsilon: float, delta: float) -> _Probe:
    try:
        # The model that fits the dataset's kind (its DATA_KINDS entry's default model;
        # an unknown kind is plan_for_dataset's PlanError, "unknown dataset kind").
        kind = data_kind(str(ds.public_schema.get("kind", DEFAULT_KIND)))
        model = kind.default_model()
        request = JobRequest(
            dataset=ds.name, method=method, epsilon=epsilon, delta=delta, model=model
        )
        plan = plan_for_dataset(request, n_rows=ds.n_rows, public_schema=ds.public_schema)
        charge = charge_for(plan)
    except (PlanError, LedgerError) as exc:
        return _Probe(str(exc), planned=False)
    reason = nominal_refusal(ds, plan) or evaluate(dataset_filter(ds), None, charge).reason
    return _Probe(reason, planned=True)


def _method_refusal(ds: Dataset, method: str, *, epsilon: float) -> str | None:
    delta_total = float(Decimal(ds.delta_total))
    first: str | None = None
    for fraction in PROBE_FRACTIONS:
        eps = epsilon * fraction
        if eps < EPSILON_FLOOR:
            break
        pure = _probe(ds, method, epsilon=eps, delta=0.0)
        if pure.reason is None:
            return None
        why = pure.reason
        if delta_total > 0:
            approx = _probe(ds, method, epsilon=eps, delta=delta_total / 2)
            if approx.reason is None:
                return None
            # Report why the δ > 0 request failed only if no δ = 0 plan exists at all.
            why = why if pure.planned else approx.reason
        first = first or why
    return first or "the dataset's budget has no ε left"


def method_refusals(ds: Dataset) -> dict[str, str | None]:
    """For each method, why a request for it would be refused now (None: admitted).

    Probes: ε = min(1, remaining ε) × 1, 0.1, 0.01, each with δ = 0 and, on a dataset
    with δ_total > 0, δ = δ_total / 2. A method refused by every probe might still fit
    some other request, but the structural refusals this check exists for (δ_total = 0
    for DP-SGD, nominal methods off for ExpM+NF) hold at every ε and δ.
    """
    epsilon = min(PROBE_EPSILON, dataset_filter(ds).remaining_epsilon())
    return {m: _method_refusal(ds, m, epsilon=epsilon) for m in TRAINING_METHODS}


def no_method_warning(ds: Dataset) -> str | None:
    """One line when no method can be admitted on ``ds``; None otherwise."""
    refusals = method_refusals(ds)
    if any(why is None for why in refusals.values()):
        return None
    reasons = "; ".join(f"{method}: {why}" for method, why in refusals.items())
    return (
        f"dataset {ds.name!r} admits no method with this budget and policy ({reasons}). "
        "Raise δ_total (`enclave datasets budget`) or allow nominal methods "
        f"(PUT /v1/admin/datasets/{ds.name}/nominal)."
    )
