"""Privacy budgets as the caller sees them, and a dataset with its budgets."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from service.schemas.common import ApiOutput, Guarantee


class BudgetView(BaseModel):
    """One privacy filter (the dataset's, or the analyst's cap) as the caller may see it.

    ε in nats, δ a probability. The figures and why they differ from ε_total are argued
    in :mod:`service.privacy.filters` (module docstring: "spent", "remaining").
    """

    scope: Literal["dataset", "analyst"]
    rule: Literal["pure", "rdp"] = Field(
        description="pure: basic composition Σε ≤ ε_total. rdp: Rényi filter over a fixed grid."
    )
    epsilon_total: float = Field(description="The budget's ε (nats): the guarantee it enforces.")
    delta_total: float = Field(description="The budget's δ.")
    spent_epsilon_sum: float = Field(
        description=(
            "Naive sum of the ε of the charges in force. For rule 'pure' it is what admission "
            "compares with epsilon_total; for rule 'rdp' it is information only (usually far "
            "above what the Rényi filter counts)."
        )
    )
    epsilon_spent: float = Field(
        description=(
            "The smallest budget ε (at delta_total) whose filter would have admitted every "
            "charge in force: rule 'pure': Σε; rule 'rdp': min over the orders α of the RDP "
            "→ (ε, δ) conversion of the spent RDP at δ_total/|orders|, the split admission "
            "uses. Valid under adaptive choice in the sense that a ledger given this budget "
            "from the start would have run the same jobs; the guarantee stays epsilon_total."
        )
    )
    remaining_epsilon: float = Field(
        description=(
            "The largest ε of ONE further pure ε-DP request this filter would still admit "
            "(rule 'rdp': charged with the randomized-response RDP curve). Several smaller "
            "requests may add up to more. Under rule 'rdp' it is below epsilon_total even "
            "before any charge (about 0.032 below at δ_total = 1e-5: δ_total is split over "
            "the grid of orders, and the RDP → (ε, δ) conversion has its own cost)."
        )
    )
    guarantee: Guarantee | None = Field(
        default=None,
        description=(
            "Dataset scope: the weakest guarantee of the jobs that have read the dataset's "
            "rows. 'nominal' once a nominal job (ExpM sampled through a normalizing flow) "
            "ran, else 'asymptotic' once an asymptotic one (ExpM sampled by MCMC) ran: from "
            "then on no proof covers the dataset's releases as a whole, whatever the budget "
            "says; 'proven' otherwise. Null where not computed (analyst caps, quotes, budget "
            "updates)."
        ),
    )


class DatasetPublic(ApiOutput):
    name: str
    n_rows: int = Field(
        description=(
            "The public row count: a DP noisy count released at registration (two-sided "
            "geometric noise with ε = count_epsilon, charged to the dataset's budget). Plans "
            "use only this value; the exact count is never published."
        )
    )
    count_epsilon: float | None = Field(
        default=None,
        description=(
            "ε (nats) spent on the noisy row count; null for a dataset registered before "
            "noisy counts, whose n_rows is exact and treated as public."
        ),
    )
    holdout_rows: int | None = Field(
        default=None,
        description=(
            "The public size of the private evaluation holdout (issue 21): floor(F·n̂) of "
            "the noisy count n̂ for the admin's fraction F, kept apart from the training rows "
            "and read only by evaluations (POST /v1/evaluations); n_rows then counts the "
            "training rows (n̂ − holdout_rows). Null: no holdout."
        ),
    )
    public_schema: dict[str, Any]
    allow_nominal: bool
    budget: BudgetView
    analyst_budget: BudgetView | None = None
