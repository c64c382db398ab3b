"""How every `enclave` printout writes ε and δ, and what a quote's "remaining ε" means.

:func:`privacy_number` is the one formatter of ε and δ for the analyst's and the admin's
commands: at most 6 significant digits, so ``1.9999999999836662`` prints ``2`` and
``0.100001`` stays. A remaining budget is rounded *down* (``down=True``): the CLI never
shows more budget than the ledger would admit.

:func:`remaining_notes` explains a quote's remaining ε in the words of the dashboard
(service/dashboard/templates/index.html, "Remaining ε"): under the RDP rule it is an
ε-equivalent for one pure request, so a request with δ > 0 and a smaller stated ε may
still be refused. The notes go to stdout under the quote; the error stays one line.
"""

from __future__ import annotations

from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

__all__ = ["REMAINING_EXPLANATION", "privacy_number", "remaining_notes"]

SIGNIFICANT = 6

# The dashboard's explanation of "Remaining ε" (index.html), word for word.
REMAINING_EXPLANATION = (
    "Remaining ε: the largest ε of one further pure ε-DP request the filter would still "
    "admit (several smaller requests may add up to more). Under the RDP rule it is below "
    "ε total even before any charge (about 0.03 below at δ total = 1e-5) because δ total "
    "is split over the grid of orders and the RDP → (ε, δ) conversion has its own cost."
)


def privacy_number(value: float | str | Decimal | None, *, down: bool = False) -> str:
    """ε or δ with at most 6 significant digits (``:g`` style: ``2``, ``0.100001``,
    ``1e-05``). ``down``: round toward −∞ instead of to nearest (remaining budgets).
    None prints ``–``; a value that is not a number prints as it is."""
    if value is None:
        return "–"
    try:
        number = Decimal(str(value)) if isinstance(value, str) else Decimal(value)
    except (InvalidOperation, TypeError, ValueError):
        return str(value)
    if not number.is_finite():
        return f"{float(number):g}"
    if down and number != 0:
        step = Decimal(1).scaleb(number.adjusted() - (SIGNIFICANT - 1))
        number = number.quantize(step, rounding=ROUND_FLOOR)
    text = f"{float(number):.{SIGNIFICANT}g}"
    return "0" if float(number) == 0 else text  # never "-0"


def _refusing_scope(reason: str | None) -> str | None:
    """Which filter refused, from the ledger's reason (service.ledger.filter_view)."""
    if not reason:
        return None
    if reason.startswith("the dataset's budget"):
        return "dataset"
    if reason.startswith("your budget cap"):
        return "analyst"
    return None


def remaining_notes(quote: dict[str, Any]) -> list[str]:
    """Lines that explain the quote's remaining ε: the dashboard's explanation when a
    shown budget uses the RDP rule (its remaining ε is then an ε-equivalent that a request
    with δ > 0 may exceed whatever its stated ε), and why the budget refused the request."""
    plan = quote["plan"]
    views = {"dataset": quote.get("dataset_before"), "analyst": quote.get("analyst_before")}
    refused_by = None if quote.get("admitted") else _refusing_scope(quote.get("reason"))
    notes: list[str] = []
    if any(v and v.get("rule") == "rdp" for v in views.values()):
        notes.append(REMAINING_EXPLANATION)
    view = views.get(refused_by) if refused_by else None
    if not view:
        return notes
    who = "the dataset's budget" if refused_by == "dataset" else "your cap on this dataset"
    remaining = privacy_number(view["remaining_epsilon"], down=True)
    stated = privacy_number(plan["epsilon"])
    if view.get("rule") == "pure":
        notes.append(
            f"Why refused: {who} uses basic composition (Σε ≤ ε total): a request fits iff "
            f"its ε is at most the remaining ε, {remaining} (ε total "
            f"{privacy_number(view['epsilon_total'])} − Σε charged "
            f"{privacy_number(view['spent_epsilon_sum'])}); this request's ε is {stated}"
            + (" and it needs δ > 0, which a pure budget never admits." if plan["delta"] else ".")
        )
        return notes
    charged = quote.get("charged_epsilon")
    if plan["delta"] > 0 and charged is not None:
        curve = (
            f"its Rényi-DP curve (the charge the ledger adds up, order by order), not its "
            f"stated ε {stated}: that curve converts to ε = {privacy_number(charged)} at "
            f"δ = {privacy_number(plan['delta'])} (charged_epsilon)"
        )
    else:
        curve = f"the Rényi-DP curve of a pure ε = {stated} request"
    notes.append(
        f"Why refused: {remaining} remaining on {who} is the ε of one further PURE request. "
        f"This request is charged {curve}, and the RDP filter admits it only if at some order "
        f"α the RDP already spent plus this curve stays within that order's budget (ε total "
        f"{privacy_number(view['epsilon_total'])}, δ total "
        f"{privacy_number(view['delta_total'])} split over the grid of orders): no order has "
        f"room. A request with δ > 0 has a different curve from a pure one, so a stated ε "
        f"below the remaining ε can be refused; quote a smaller ε to find what fits."
    )
    return notes
