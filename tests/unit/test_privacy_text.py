"""enclave.privacy_text: the one ε/δ formatter of the CLI, and a quote's remaining-ε notes."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from enclave.privacy_text import REMAINING_EXPLANATION, privacy_number, remaining_notes


@pytest.mark.parametrize(
    ("value", "nearest", "down"),
    [
        (1.9999999999836662, "2", "1.99999"),  # issue 26's ε
        (0.100001, "0.100001", "0.100001"),  # six significant digits stay
        (1e-5, "1e-05", "1e-05"),
        ("0.00001", "1e-05", "1e-05"),  # the ledger's δ strings
        (Decimal("0.5"), "0.5", "0.5"),
        (9.870414, "9.87041", "9.87041"),
        (9.8704159, "9.87042", "9.87041"),  # a remaining budget never rounds up
        (10, "10", "10"),
        (0.0, "0", "0"),
        (-0.0, "0", "0"),
        (123456789.0, "1.23457e+08", "1.23456e+08"),
        (None, "–", "–"),
        (float("inf"), "inf", "inf"),
        ("n/a", "n/a", "n/a"),
    ],
)
def test_privacy_number(value: Any, nearest: str, down: str) -> None:
    assert privacy_number(value) == nearest
    assert privacy_number(value, down=True) == down


def _view(rule: str, remaining: float, total: float = 10.0, spent: float = 0.0) -> dict[str, Any]:
    return {
        "scope": "dataset", "rule": rule, "epsilon_total": total, "delta_total": 0.0,
        "spent_epsilon_sum": spent, "epsilon_spent": spent, "remaining_epsilon": remaining,
    }  # fmt: skip


def _quote(view: dict[str, Any], *, admitted: bool, reason: str | None, delta: float) -> Any:
    return {
        "admitted": admitted, "reason": reason, "plan": {"epsilon": 3.0, "delta": delta},
        "charged_epsilon": None, "dataset_before": view, "analyst_before": None,
    }  # fmt: skip


def test_pure_rule_refusal_is_basic_composition() -> None:
    reason = "the dataset's budget is exceeded (basic composition Σε ≤ ε_total)"
    q = _quote(_view("pure", 2.5, spent=7.5), admitted=False, reason=reason, delta=0.0)
    notes = remaining_notes(q)
    assert len(notes) == 1 and REMAINING_EXPLANATION not in notes  # Σε rule: no RDP note
    assert "basic composition" in notes[0] and "2.5 (ε total 10 − Σε charged 7.5)" in notes[0]
    assert notes[0].endswith("this request's ε is 3.")
    assert remaining_notes({**q, "admitted": True, "reason": None}) == []


def test_rdp_rule_explains_remaining_and_a_cap_refusal() -> None:
    view = _view("rdp", 9.870414)
    q = _quote(view, admitted=True, reason=None, delta=0.0)
    assert remaining_notes(q) == [REMAINING_EXPLANATION]
    cap = {**view, "scope": "analyst", "remaining_epsilon": 0.5}
    reason = "your budget cap on this dataset is exceeded (Rényi-DP filter: …)"
    refused = {**q, "admitted": False, "reason": reason, "analyst_before": cap}
    notes = remaining_notes(refused)
    assert notes[0] == REMAINING_EXPLANATION
    assert "0.5 remaining on your cap on this dataset" in notes[1]
    assert "a pure ε = 3 request" in notes[1]
    # Refused for another reason (the nominal policy): no budget explanation.
    nominal = {**q, "admitted": False, "reason": "dataset 'toy' does not allow nominal methods"}
    assert remaining_notes(nominal) == [REMAINING_EXPLANATION]
