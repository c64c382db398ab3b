"""One validated type per privacy parameter at every door (issue 19): a single job, every
selection kind's lists and the admin routes refuse the same hostile values with a 422
problem+json that names the field, and charge nothing; a boolean is never a number."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from service.app import create_app
from service.db import engine_for, transaction
from service.ledger.tables import LedgerEntry
from service.params import InputModel, admits_bool
from tests.conftest import auth, flat_routes

HYPER = {
    "dataset": "toy",
    "kind": "hyperparameters",
    "epsilon": 3.0,
    "delta": 1e-6,
    "model": {"kind": "mlp", "hidden": [4]},
    "learning_rates": [0.5],
    "batch_sizes": [50],
    "epochs": [1],
    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.9},
}
ARCH = {
    "dataset": "toy",
    "kind": "architecture",
    "epsilon": 3.0,
    "delta": 1e-6,
    "space": {"depths": [1], "widths": [2, 4]},
    "search": {"algorithm": "rs", "trainings": 2},
    "training": {"epochs": 1, "batch_size": 50},
}
JOB = {"dataset": "toy", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-6}
HOSTILE_NUMBERS = [-1.0, -1e-4, 0.0, 1e300, True, False]


def _charges(settings: Any) -> list[LedgerEntry]:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        rows = s.scalars(select(LedgerEntry).where(LedgerEntry.kind == "charge")).all()
        s.expunge_all()
        return list(rows)


def _refused(r: Any, field: str) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert field in r.text, r.text


@pytest.mark.parametrize("value", HOSTILE_NUMBERS, ids=str)
@pytest.mark.parametrize(
    "field", ["max_grad_norms", "learning_rates", "epochs", "batch_sizes", "noise_decays"]
)
def test_every_tuning_list_item_is_bounded(
    client: Any, keys: Any, settings: Any, field: str, value: Any
) -> None:
    """Issue 19: `max_grad_norms: [-0.0001]` was released as proven; `epochs: [-1]`,
    `batch_sizes: [-5]` gave 500; `max_grad_norms: [1e300]` released inf weights."""
    body = {**HYPER, field: [value]}
    before = len(_charges(settings))
    for path in ("/v1/selections/quote", "/v1/selections"):
        _refused(client.post(path, json=body, headers=auth(keys.alice)), field)
    assert len(_charges(settings)) == before


@pytest.mark.parametrize("value", HOSTILE_NUMBERS, ids=str)
@pytest.mark.parametrize("field", ["max_grad_norm", "learning_rate", "epochs", "batch_size"])
def test_a_single_job_refuses_the_same_values(
    client: Any, keys: Any, settings: Any, field: str, value: Any
) -> None:
    body = {**JOB, "dpsgd": {field: value}}
    before = len(_charges(settings))
    for path in ("/v1/quote", "/v1/jobs"):
        _refused(client.post(path, json=body, headers=auth(keys.alice)), field)
    # The architecture space and its training options use the same types.
    arch = {**ARCH, "training": {**ARCH["training"], field: value}}
    _refused(client.post("/v1/selections/quote", json=arch, headers=auth(keys.alice)), field)
    assert len(_charges(settings)) == before


@pytest.mark.parametrize(
    "body",
    [
        {**JOB, "epsilon": True},
        {**JOB, "delta": False},
        {**JOB, "samples": True},
        {**ARCH, "space": {"depths": [True], "widths": [2]}},
        {**ARCH, "fitness_epsilon": True},
        {**HYPER, "model": {"kind": "mlp", "hidden": [True]}},
    ],
)
def test_a_boolean_is_not_a_number_in_requests(client: Any, keys: Any, body: Any) -> None:
    path = "/v1/selections/quote" if "kind" in body else "/v1/quote"
    r = client.post(path, json=body, headers=auth(keys.alice))
    assert r.status_code == 422, r.text
    assert "boolean" in r.text


@pytest.mark.parametrize(
    "body",
    [{"epsilon_total": 10.0, "delta_total": False}, {"epsilon_total": True, "delta_total": 0}],
)
def test_a_boolean_is_not_a_number_in_admin_budgets(
    client: Any, keys: Any, settings: Any, body: Any
) -> None:
    """`delta_total: false` once made a dataset pure-DP."""
    r = client.put("/v1/admin/datasets/toy/budget", json=body, headers=auth(keys.admin))
    assert r.status_code == 422, r.text
    assert "boolean" in r.text


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


def test_every_request_body_model_is_an_input_model() -> None:
    """Every door: each model an HTTP route reads (and every model nested in it) refuses
    booleans for numbers, NaN, infinities and unknown fields (service/params.py)."""
    seen: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = []
    for route in flat_routes(create_app().routes):
        if route.body_field is not None and route.path.startswith("/v1/"):
            todo.extend(_models_in(route.body_field.field_info.annotation))
    assert todo, "no request bodies found"
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        if model.__name__ == "RootModel" or "RootModel" in [c.__name__ for c in model.__mro__]:
            todo.extend(_models_in(model.model_fields["root"].annotation))
            continue
        assert issubclass(model, InputModel), f"{model.__name__} is not an InputModel"
        for field in model.model_fields.values():
            todo.extend(_models_in(field.annotation))
    assert len(seen) > 10


def test_admits_bool_reads_annotations() -> None:
    assert admits_bool(bool) and admits_bool(bool | None) and admits_bool(Any)
    assert not admits_bool(float) and not admits_bool(int | None)
    assert not admits_bool(typing.Literal["a", "b"])


def test_work_over_the_limit_is_refused_before_an_expensive_calibration(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 item 8: a PLD (or decaying-schedule) plan whose work is over the limit used
    to hold a planning slot for its whole calibration (~20 s) before the 422; its cheap
    twin (service/resources.py work_twin) is refused first, and the real plan never runs."""
    import service.api.routes.jobs as jobs

    planned: list[str] = []
    real = jobs.plan_for_dataset

    def recording(request: Any, **kw: Any) -> Any:
        planned.append(request.dpsgd.accountant if request.dpsgd else "-")
        return real(request, **kw)

    monkeypatch.setattr(jobs, "plan_for_dataset", recording)
    monkeypatch.setattr(settings, "job_time_limit_s", 1.0)
    body = {**JOB, "dpsgd": {"epochs": 100, "batch_size": 1, "accountant": "pld"}}
    r = client.post("/v1/quote", json=body, headers=auth(keys.alice))
    assert r.status_code == 422 and "worker time" in r.text, r.text
    assert planned == ["rdp"]  # only the twin was planned
    # Within the limits the real plan is still the one quoted.
    planned.clear()
    monkeypatch.setattr(settings, "job_time_limit_s", 3600.0)
    body = {**JOB, "dpsgd": {"epochs": 1, "batch_size": 50, "accountant": "pld"}}
    r = client.post("/v1/quote", json=body, headers=auth(keys.alice))
    assert r.status_code == 200, r.text
    assert planned == ["rdp", "pld"] and r.json()["plan"]["mechanism"]["accountant"] == "pld"


def test_the_last_planning_slot_is_kept_for_a_key_that_holds_none() -> None:
    """Issue 19 item 8: a few analysts must not hold every planning slot."""
    from service.api.errors import ProblemError
    from service.limits import Limiter

    limiter = Limiter(rate_per_s=1.0, burst=1, planning_per_key=3, planning_global=3)
    with limiter.planning(1), limiter.planning(1):
        with pytest.raises(ProblemError) as exc, limiter.planning(1):
            pass  # key 1 already plans twice: the last slot is not for it
        assert exc.value.status == 429
        with limiter.planning(2):  # a key without a slot still gets in
            pass


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_planning_past_its_deadline_is_a_422_and_frees_the_slot(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request's calibration is bounded (service/privacy/deadline.py); the worker
    re-plans without a deadline, so an admitted plan is never refused for time."""
    before = len(_charges(settings))
    monkeypatch.setattr(settings, "planning_time_limit_s", 1e-9)
    body = {**JOB, "dpsgd": {"epochs": 2, "batch_size": 40, "accountant": "pld"}}
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=body, headers=auth(keys.alice))
        assert r.status_code == 422 and "longer than" in r.text, r.text
    sel = {**HYPER, "max_grad_norms": [1.0]}
    r = client.post("/v1/selections/quote", json=sel, headers=auth(keys.alice))
    assert r.status_code == 422 and "longer than" in r.text, r.text
    assert len(_charges(settings)) == before
    monkeypatch.setattr(settings, "planning_time_limit_s", 600.0)
    for _ in range(3):  # the slots came back (planning_per_key is 1000 in tests)
        assert client.post("/v1/quote", json=body, headers=auth(keys.alice)).status_code == 200


def test_the_guarantee_follows_the_proof_at_every_door(
    client: Any, keys: Any, settings: Any
) -> None:
    """A request parameter must not void a "proven" card (issue 25): ReLU MLPs are proven
    now that their sums are exact (worker/mechanisms/exact_net.py), in jobs and every
    selection kind, and in the jl engine (its projections are exact too)."""
    before = len(_charges(settings))
    relu = {"kind": "mlp", "hidden": [4], "activation": "relu"}
    r = client.post("/v1/quote", json={**JOB, "model": relu}, headers=auth(keys.alice))
    assert r.status_code == 200 and r.json()["plan"]["guarantee"] == "proven", r.text
    for body in (
        {**HYPER, "model": relu},
        {**ARCH, "space": {**ARCH["space"], "activations": ["relu"]}},
    ):
        r = client.post("/v1/selections/quote", json=body, headers=auth(keys.alice))
        assert r.status_code == 200 and r.json()["plan"]["guarantee"] == "proven", r.text
    jl = {**JOB, "dpsgd": {"engine": "jl", "jl_projections": 5}}
    r = client.post("/v1/quote", json=jl, headers=auth(keys.alice))
    assert r.status_code == 200 and r.json()["plan"]["guarantee"] == "proven", r.text
    assert len(_charges(settings)) == before
