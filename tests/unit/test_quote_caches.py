"""Planning's speed-only caches (issue 26) change no plan. Pinned plans of
tests/plan_cases.py are computed with every cache of the RDP series, the conversion, the
noise calibration and the selection search emptied (a fresh process's state), then again
from the caches those runs filled (the search's memo emptied, so every plan is built
anew from remembered curves, tables and ε(σ)), then with the start-up's tables
(rdp.warm_tables) built before anything else: the golden digest each time."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

from service.privacy import rdp
from service.privacy.calibrate import noise, rdp_epsilon, search
from service.privacy.orders import CALIBRATION_ORDERS, ORDERS
from service.selection import kinds
from tests.plan_cases import REQUESTS, plan_digest
from tests.unit.test_plan_digests import GOLDEN

CASES = ["architecture rs", "architecture paas", "hyperparameters tnb", "features pafs"]
CASES += ["dpsgd rdp", "architecture mgrs batches"]


def _cached_functions() -> list[Callable[..., Any]]:
    """Every lru_cache'd function of the modules planning's numbers go through."""
    modules: list[types.ModuleType] = [rdp, noise, rdp_epsilon, search]
    found = [
        value
        for module in modules
        for value in vars(module).values()
        if callable(value) and hasattr(value, "cache_clear")
    ]
    assert rdp._subsampled_gaussian_curve in found and rdp._small_table in found
    return found


def _forget_everything() -> None:
    for f in _cached_functions():
        f.cache_clear()  # type: ignore[attr-defined]
    kinds._COSTS.clear()


@pytest.mark.parametrize("name", CASES)
def test_plans_are_the_same_from_empty_and_from_filled_caches(name: str) -> None:
    endpoint, body = REQUESTS[name]
    _forget_everything()
    assert plan_digest(endpoint, body) == GOLDEN[name]  # nothing remembered
    kinds._COSTS.clear()
    assert plan_digest(endpoint, body) == GOLDEN[name]  # from the filled caches
    _forget_everything()
    rdp.warm_tables(ORDERS, CALIBRATION_ORDERS)
    assert plan_digest(endpoint, body) == GOLDEN[name]  # with the start-up's tables


def test_warm_tables_builds_what_planning_reads() -> None:
    """The start-up's tables are the ones planning looks up (cache hits afterwards)."""
    _forget_everything()
    rdp.warm_tables(ORDERS, CALIBRATION_ORDERS)
    built = {f: f.cache_info().currsize for f in (rdp._small_table, rdp._cached_stack)}  # type: ignore[attr-defined]
    rdp.subsampled_gaussian_rdp(sampling_rate=0.01, noise_multiplier=1.3, orders=ORDERS)
    assert rdp._cached_stack.cache_info().currsize == built[rdp._cached_stack]
    assert rdp._flat_integer_terms.cache_info().currsize == 1
    assert (
        rdp._small_table.cache_info().currsize
        == built[rdp._small_table]
        == len({a for a in (*ORDERS, *CALIBRATION_ORDERS) if not float(a).is_integer()})
    )
