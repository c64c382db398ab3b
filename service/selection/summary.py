"""What a selection plan costs and states: the whole workflow's ε and the JSON summary a
quote, the ledger and the model card carry."""

from __future__ import annotations

from typing import Any

from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp
from service.selection.plan_core import SelectionPlan

__all__ = ["plan_summary", "workflow_epsilon"]


def workflow_epsilon(plan: SelectionPlan, *, delta: float) -> float:
    """ε (nats) of the whole workflow at ``delta``, from the plan's RDP curve on the
    ledger's orders (Canonne, Kamath & Steinke 2020 conversion, as for every job)."""
    return epsilon_from_rdp(rdp=plan.event.rdp(ORDERS), orders=ORDERS, delta=delta)


def plan_summary(plan: SelectionPlan, *, delta: float) -> dict[str, Any]:
    """What a quote, the ledger and the model card state about the whole workflow: the
    event (what is charged), its RDP curve on the ledger's orders, (ε, δ) at ``delta``,
    and the public schedule (trainings, or the law of K: never K itself)."""
    curve = plan.event.rdp(ORDERS)
    extra: dict[str, Any] = {}
    if plan.features is not None and plan.features.noise_multiplier is not None:
        extra = {  # DP-CFS: the public noise of the histograms (no trainings)
            "histograms": plan.features.histograms,
            "noise_multiplier": plan.features.noise_multiplier,
            "cell_noise_std": plan.features.cell_scale,
        }
    return {
        **extra,
        "event": plan.event.to_json(),
        "rdp_orders": list(ORDERS),
        "rdp_curve": [float(v) for v in curve],
        "epsilon": epsilon_from_rdp(rdp=curve, orders=ORDERS, delta=delta),
        "delta": delta,
        "guarantee": plan.guarantee,
        "accountant": "rdp",
        "trainings": plan.trainings,
        "runs": None if plan.runs is None else plan.runs.to_json(),
        "n_train_public": plan.n_train,
        "n_val_public": plan.n_val,
    }
