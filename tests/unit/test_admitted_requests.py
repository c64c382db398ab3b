"""A job's admitted request (service.plans.resolve_defaults): the request with every default
its plan fills in written out. The worker re-plans from it, so it must plan exactly as the
request as sent does, for every method (and sampler, engine, schedule, model family, data
kind, row count where the rules differ), keep every value the analyst wrote, be its own
resolution, and keep its plan when a default rule changes later (as an upgrade would)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.datasets.kinds import load_schema_yaml
from service.methods import METHODS
from service.plans import (
    PlanError,
    check_resolved,
    plan_for_dataset,
    replan_admitted,
    resolve_defaults,
)
from service.schemas import JobRequest
from tests.plan_cases import REQUESTS, adult_schema

ROOT = Path(__file__).resolve().parents[2]
DELTA = 1e-5

# name → (body without the dataset, dataset: "adult" | "digits" | "icu")
CASES: dict[str, tuple[dict[str, Any], str]] = {
    **{name: (body, "adult") for name, (endpoint, body) in REQUESTS.items() if endpoint == "quote"},
    "dpsgd defaults": ({"method": "dpsgd", "epsilon": 1.0, "delta": DELTA}, "adult"),
    "dpsgd batch only": (
        {"method": "dpsgd", "epsilon": 1.0, "delta": DELTA, "dpsgd": {"batch_size": 100}},
        "adult",
    ),
    "dpsgd mlp defaults": (
        {
            "method": "dpsgd",
            "epsilon": 1.0,
            "delta": DELTA,
            "model": {"kind": "mlp", "hidden": [8]},
        },
        "adult",
    ),
    "dpsgd ghost": (
        {"method": "dpsgd", "epsilon": 1.0, "delta": DELTA, "dpsgd": {"engine": "ghost"}},
        "adult",
    ),
    "dpsgd jl": (
        {
            "method": "dpsgd",
            "epsilon": 4.0,
            "delta": DELTA,
            "dpsgd": {"engine": "jl", "jl_projections": 8},
        },
        "adult",
    ),
    "dpsgd multiclass": ({"method": "dpsgd", "epsilon": 1.0, "delta": DELTA}, "digits"),
    "dpsgd grud": (
        {"method": "dpsgd", "epsilon": 1.0, "delta": DELTA, "model": {"kind": "grud"}},
        "icu",
    ),
    "langevin defaults": ({"method": "expm", "epsilon": 1.0, "delta": DELTA}, "adult"),
    "langevin steps only": (
        {"method": "expm", "epsilon": 0.5, "delta": DELTA, "expm": {"steps": 40}},
        "adult",
    ),
    "langevin multiclass": ({"method": "expm", "epsilon": 1.0, "delta": DELTA}, "digits"),
    "mcmc defaults": (
        {"method": "expm", "epsilon": 1.0, "delta": DELTA, "expm": {"sampler": "mcmc"}},
        "adult",
    ),
    "expm_nf defaults": ({"method": "expm_nf", "epsilon": 1.0, "samples": 2}, "adult"),
    "expm_nf grud": (
        {"method": "expm_nf", "epsilon": 1.0, "model": {"kind": "grud"}},
        "icu",
    ),
    # auto: the Langevin ExpM on all of Adult, DP-SGD on 700 rows, on the digits, on GRU-D
    "auto": ({"method": "auto", "epsilon": 1.0, "delta": DELTA}, "adult"),
    "auto multiclass": ({"method": "auto", "epsilon": 1.0, "delta": DELTA}, "digits"),
    "auto grud": (
        {"method": "auto", "epsilon": 1.0, "delta": DELTA, "model": {"kind": "grud"}},
        "icu",
    ),
}
# Public row counts on both sides of the rules' thresholds (DP-SGD logistic: 5,120 rows).
ROW_COUNTS = (700, 32_561)


def _schema(dataset: str) -> dict[str, Any]:
    if dataset == "adult":
        return adult_schema()
    text = (ROOT / "examples" / dataset / "schema.yaml").read_text()
    return load_schema_yaml(text).model_dump(mode="json")


def _request(body: dict[str, Any], schema: dict[str, Any]) -> JobRequest:
    return JobRequest.model_validate({"dataset": str(schema["name"]), **body})


def _replan(
    admitted: JobRequest, sent: JobRequest, stored: Any, n_rows: int, schema: dict[str, Any]
) -> Any:
    return replan_admitted(admitted, sent=sent, stored=stored, n_rows=n_rows, public_schema=schema)


def _stored(request: JobRequest) -> JobRequest:
    """The request as the worker reads it back from the ledger's JSON column."""
    return JobRequest.model_validate(request.model_dump(mode="json"))


@pytest.mark.parametrize("n_rows", ROW_COUNTS)
@pytest.mark.parametrize("name", list(CASES))
def test_admitted_request_plans_as_sent(name: str, n_rows: int) -> None:
    body, dataset = CASES[name]
    schema = _schema(dataset)
    sent = _request(body, schema)
    try:
        plan = plan_for_dataset(sent, n_rows=n_rows, public_schema=schema)
    except PlanError:
        pytest.skip("refused at this row count: never admitted")
    admitted = _stored(resolve_defaults(sent, n_rows=n_rows, public_schema=schema))
    assert _replan(admitted, sent, plan, n_rows, schema) == plan
    check_resolved(sent, admitted)  # only what the analyst left empty is filled in
    if sent.method == "auto":  # the method chosen at admission is pinned
        assert plan.method_choice is not None and admitted.method == plan.method
        assert plan_for_dataset(admitted, n_rows=n_rows, public_schema=schema) == (
            plan.model_copy(update={"method_choice": None})
        )
    # Its own resolution: nothing is left for a later rule to fill in.
    assert resolve_defaults(admitted, n_rows=n_rows, public_schema=schema) == admitted
    options = admitted.model_dump()[admitted.method]
    if admitted.expm is None or admitted.expm.sampler == "langevin":
        # (MCMC's options dump its Langevin-only learning rate: None, unused.)
        assert all(v is not None for k, v in options.items() if k in ("steps", "epochs"))


def test_every_method_is_covered() -> None:
    covered = {
        (body["method"], (body.get("expm") or {}).get("sampler", "langevin"))
        if body["method"] == "expm"
        else (body["method"], None)
        for body, _ in CASES.values()
    }
    assert set(METHODS) <= covered


def test_admitted_request_keeps_its_plan_when_the_rules_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What an upgrade between admission and run does: each default rule changes; the
    request as sent then plans differently, its admitted request as it did."""
    import service.methods.auto as auto
    import service.methods.dpsgd as dpsgd
    import service.methods.expm as expm
    import service.methods.expm_nf as expm_nf

    schema = adult_schema()
    names = ("dpsgd defaults", "langevin defaults", "expm_nf defaults", "auto")
    bodies = [CASES[name][0] for name in names]
    before = []
    for body in bodies:
        sent = _request(body, schema)
        plan = plan_for_dataset(sent, n_rows=700, public_schema=schema)
        admitted = _stored(resolve_defaults(sent, n_rows=700, public_schema=schema))
        before.append((sent, admitted, plan))
    monkeypatch.setattr(dpsgd, "LOGISTIC_DEFAULTS", (8, 6))
    monkeypatch.setattr(expm, "LANGEVIN_REACH_DIVISOR", 20.0)
    monkeypatch.setattr(expm_nf, "EXPM_NF_DEFAULTS", {"tabular": (100, 8, 64), "grud": (1, 1, 1)})
    monkeypatch.setattr(auto, "LANGEVIN_MIN_SCALE", 1.0)  # auto now chooses expm at 700 rows
    for sent, admitted, plan in before:
        assert plan_for_dataset(sent, n_rows=700, public_schema=schema) != plan
        assert _replan(admitted, sent, plan, 700, schema) == plan


@pytest.mark.parametrize(
    "change",
    [
        {"epsilon": 2.0},
        {"dpsgd": {"batch_size": 51}},  # the analyst's value
        {"dpsgd": {"learning_rate": 0.5}},  # a field at its schema default
        {"model": {"kind": "mlp", "hidden": [8]}},
        {"method": "expm"},  # only a rule's choice (auto) may be filled in
    ],
    ids=["epsilon", "batch_size", "learning_rate", "model", "method"],
)
def test_a_resolved_request_that_rewrites_the_sent_one_is_refused(change: dict[str, Any]) -> None:
    schema = adult_schema()
    sent = _request(
        {"method": "dpsgd", "epsilon": 1.0, "delta": DELTA, "dpsgd": {"batch_size": 50}}, schema
    )
    admitted = resolve_defaults(sent, n_rows=700, public_schema=schema).model_dump(mode="json")
    check_resolved(sent, JobRequest.model_validate(admitted))  # as resolved: accepted
    for key, value in change.items():
        admitted[key] = {**admitted[key], **value} if isinstance(value, dict) else value
    with pytest.raises(PlanError, match="differs from the request as sent"):
        check_resolved(sent, JobRequest.model_validate(admitted))


def test_selection_and_evaluation_requests_are_admitted_as_sent() -> None:
    """Their endpoints store them resolved (the selection request, the evaluation spec):
    the method table has no entry for them and nothing is filled in."""
    schema = adult_schema()
    for method, field in (("selection", "selection"), ("evaluation", "evaluation")):
        sent = _request({"method": method, "epsilon": 1.0, field: {"kind": "x"}}, schema)
        assert resolve_defaults(sent, n_rows=700, public_schema=schema) is sent
