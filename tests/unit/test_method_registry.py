"""The method tables (issue 23): a method registered in the request schema's
``TRAINING_METHODS``, the service's ``METHODS`` and the worker's ``MECHANISMS`` alone (a
dummy, monkeypatched in) is picked up by request validation, plan building, the quote-time
resource estimate and the worker's dispatch, without editing any other module; and the
resource estimate of every registered method is its entry's. A method with options adds
its options model and the ``JobRequest`` field named after the method.
tests/integration/test_method_contract.py runs the same dummy through the API and worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pydantic import ValidationError

import service.schemas.common as schemas_common
from service.datasets.kinds import parse_dataset_schema
from service.methods import METHODS, MethodEntry, method_key, plan_key
from service.methods.common import MethodPlan, PlanFacts, ResourceEstimate, ResourceFacts
from service.plans import build_plan, plan_for_dataset
from service.privacy.events import PoissonSubsampledGaussianEvent
from service.resources import ResourceLimits, plan_resources, resource_refusal
from service.schemas import TRAINING_METHODS, JobRequest, PrivacyPlan
from worker.mechanisms.base import MechanismOutput, TabularTrainingSet
from worker.mechanisms.registry import MECHANISMS, Mechanism, mechanism_key, run_mechanism

ADULT = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples" / "adult" / "schema.yaml").read_text()
)
DUMMY = ("dummy", None)
calls: list[tuple[str, Any]] = []


def _plan_dummy(request: JobRequest, facts: PlanFacts) -> MethodPlan:
    calls.append(("plan", facts))
    event = PoissonSubsampledGaussianEvent(sampling_rate=1.0, noise_multiplier=5.0, steps=1)
    return event, {"steps": 7, "parameters": facts.n_features + 1}, "rdp"


def _dummy_resources(plan: PrivacyPlan, facts: ResourceFacts) -> ResourceEstimate:
    calls.append(("resources", facts))
    steps = int(plan.mechanism["steps"])
    return ResourceEstimate(
        seconds=10.0 * steps, memory_bytes=1000 * steps, time_hint="dummy: fewer steps"
    )


def run_dummy(**kwargs: Any) -> MechanismOutput:
    """The dummy's worker side (resolved by name from MECHANISMS)."""
    calls.append(("run", kwargs["mechanism"]))
    return MechanismOutput(releases=[{"w": torch.zeros(kwargs["mechanism"]["parameters"])}])


@pytest.fixture
def dummy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls.clear()
    entry = MethodEntry(_plan_dummy, lambda _request: "nominal", _dummy_resources)
    monkeypatch.setattr(schemas_common, "TRAINING_METHODS", [*TRAINING_METHODS, "dummy"])
    monkeypatch.setitem(METHODS, DUMMY, entry)
    monkeypatch.setitem(MECHANISMS, DUMMY, Mechanism(__name__, "run_dummy"))


def _request(method: str, **options: Any) -> JobRequest:
    return JobRequest.model_validate(
        {
            "dataset": "adult",
            "method": method,
            "model": {"kind": "logistic"},
            "epsilon": 1.0,
            "delta": 0.0 if method == "expm_nf" else 1e-5,
            **options,
        }
    )


def _dummy_plan() -> PrivacyPlan:
    """The dummy's plan as build_plan makes it (the fixture must be active); the calls
    it made are forgotten."""
    plan = plan_for_dataset(_request("dummy"), n_rows=1000, public_schema=ADULT)
    calls.clear()
    return plan


def test_a_request_naming_an_unregistered_method_is_refused() -> None:
    with pytest.raises(
        ValidationError,
        match="Input should be 'dpsgd', 'expm_nf', 'expm', 'auto', 'selection' or 'evaluation'",
    ):
        _request("dummy")


def test_plan_building_calls_the_dummys_entry(dummy: None) -> None:
    request = _request("dummy")
    assert method_key(request) == DUMMY
    plan = build_plan(request, n_rows=1000, n_features=4)
    assert calls == [("plan", PlanFacts(n_rows=1000, n_features=4))]
    assert plan.method == "dummy" and plan.guarantee == "nominal"
    assert plan.mechanism == {"steps": 7, "parameters": 5}


def test_the_resource_estimate_and_its_refusal_come_from_the_dummys_entry(dummy: None) -> None:
    plan = _dummy_plan()
    schema = parse_dataset_schema(ADULT)
    assert plan_key(plan) == DUMMY
    estimate = plan_resources(plan, schema=schema)
    assert (estimate.seconds, estimate.memory_bytes) == (70.0, 7000)
    assert calls == [("resources", ResourceFacts(n_features=schema.n_features))]
    assert resource_refusal(plan, schema=schema, limits=ResourceLimits(100.0, 10_000)) is None
    slow = resource_refusal(plan, schema=schema, limits=ResourceLimits(60.0, 10_000))
    assert slow is not None and "about 70 s" in slow and slow.endswith("dummy: fewer steps")
    big = resource_refusal(plan, schema=schema, limits=ResourceLimits(100.0, 6_000))
    assert big is not None and big.endswith(ResourceEstimate().memory_hint)


def test_the_worker_runs_the_dummys_mechanism(dummy: None) -> None:
    plan = _dummy_plan()
    assert mechanism_key(plan) == DUMMY
    data = TabularTrainingSet(x=torch.zeros(3, 4), y=torch.zeros(3))
    out = run_mechanism(
        plan=plan,
        spec=None,  # type: ignore[arg-type]  # the dummy reads no model
        data=data,
        device=torch.device("cpu"),
        progress=lambda k, t: None,
    )
    parameters = plan.mechanism["parameters"]  # Adult's encoded width + 1
    assert calls == [("run", {"steps": 7, "parameters": parameters})]
    assert out.releases[0]["w"].shape == (parameters,)


def test_without_an_entry_a_plan_has_no_estimate(
    dummy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _dummy_plan()
    monkeypatch.delitem(METHODS, DUMMY)
    estimate = plan_resources(plan, schema=parse_dataset_schema(ADULT))
    assert estimate == ResourceEstimate()
    assert (
        resource_refusal(plan, schema=parse_dataset_schema(ADULT), limits=ResourceLimits(0.0, 0))
        is None
    )


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("dpsgd", {}),
        ("expm", {"expm": {}}),
        ("expm", {"expm": {"sampler": "mcmc"}}),
        ("expm_nf", {}),
    ],
)
def test_every_methods_estimate_is_its_entrys(method: str, options: dict[str, Any]) -> None:
    request = _request(method, **options)
    plan = plan_for_dataset(request, n_rows=1000, public_schema=ADULT)
    schema = parse_dataset_schema(ADULT)
    assert plan_key(plan) == method_key(request)
    entry = METHODS[plan_key(plan)]
    facts = ResourceFacts(n_features=schema.n_features)
    assert plan_resources(plan, schema=schema) == entry.resources(plan, facts)
