"""A dataset's policy on guarantees that are not proven (``allow_nominal``)."""

from __future__ import annotations

from service.ledger.tables import Dataset
from service.schemas import PrivacyPlan


def nominal_refusal(ds: Dataset, plan: PrivacyPlan) -> str | None:
    """The dataset's policy on guarantees that are not proven (nominal and asymptotic:
    neither covers the run that executes); shared by quotes and admission."""
    if plan.guarantee != "proven" and not ds.allow_nominal:
        return _nominal_reason(ds.name, plan)
    return None


def _nominal_reason(dataset_name: str, plan: PrivacyPlan) -> str:
    return (
        f"dataset {dataset_name!r} does not allow methods with a {plan.guarantee} guarantee "
        "(not proven; the admin decides this per dataset: allow_nominal)"
    )
