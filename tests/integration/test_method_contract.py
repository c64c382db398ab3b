"""A contract over the method tables (issue 23): every method the service registers
(service.methods.METHODS, whose keys the worker's MECHANISMS names too) runs end to end on
the toy dataset (quote, submit, the worker's run, the release card), and its card carries
the guarantee the registry gives that request and names the method.

:data:`TINY` holds each method's small options. A method registered without an entry
here fails this test: a new method cannot be registered without its end-to-end check.
Runs on SQLite and PostgreSQL (the ``settings`` fixture's parametrisation).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import service.schemas.common as schemas_common
from service.methods import METHODS, MethodEntry, method_key
from service.methods.common import MethodPlan, PlanFacts, no_estimate
from service.privacy.events import PoissonSubsampledGaussianEvent
from service.schemas import TRAINING_METHODS, JobRequest
from tests.conftest import auth
from worker.mechanisms.base import MechanismOutput
from worker.mechanisms.registry import MECHANISMS, Mechanism
from worker.runner import Outcome, execute_job

# A METHODS key -> the request body's method options, tiny so each runs in seconds.
TINY: dict[tuple[str, str | None], dict[str, Any]] = {
    ("dpsgd", None): {
        "method": "dpsgd",
        "epsilon": 2.0,
        "delta": 1e-5,
        "dpsgd": {"epochs": 1, "batch_size": 50},
    },
    ("expm", "langevin"): {
        "method": "expm",
        "epsilon": 1.0,
        "delta": 1e-5,
        "expm": {"steps": 10},
    },
    ("expm", "mcmc"): {
        "method": "expm",
        "epsilon": 1.0,
        "delta": 1e-5,
        "expm": {"sampler": "mcmc", "chains": 2, "steps": 10, "warmup": 10},
    },
    ("expm_nf", None): {
        "method": "expm_nf",
        "epsilon": 0.5,
        "delta": 0,
        "expm_nf": {"layers": 1, "steps": 20, "n_samples_per_step": 16},
    },
}


def _id(key: tuple[str, str | None]) -> str:
    return key[0] if key[1] is None else f"{key[0]}-{key[1]}"


def test_every_registered_method_has_tiny_options() -> None:
    missing = [k for k in METHODS if k not in TINY]
    assert not missing, (
        f"methods registered in service.methods.METHODS without an end-to-end check: "
        f"{missing}; add their tiny options to TINY in {__file__}"
    )
    assert set(TINY) <= set(METHODS), f"TINY names unregistered methods: {set(TINY) - set(METHODS)}"
    assert set(METHODS) == set(MECHANISMS)


@pytest.mark.parametrize("key", list(METHODS), ids=_id)
def test_method_runs_end_to_end_with_its_registered_guarantee(
    client: Any, keys: Any, settings: Any, key: tuple[str, str | None]
) -> None:
    if key not in TINY:
        pytest.fail(
            f"method {key} is registered in service.methods.METHODS but has no tiny options "
            f"in TINY ({__file__}): add them so it is checked end to end"
        )
    body = {"dataset": "toy", **TINY[key]}
    request = JobRequest.model_validate(body)
    assert method_key(request) == key, "TINY's body must select the method it is keyed by"
    guarantee = METHODS[key].guarantee(request)
    admin = auth(keys.admin)
    if guarantee != "proven":  # nominal and asymptotic methods need the admin's permission
        r = client.put(
            "/v1/admin/datasets/toy/nominal", json={"allow_nominal": True}, headers=admin
        )
        assert r.status_code == 200, r.text

    quote = client.post("/v1/quote", json=body, headers=auth(keys.alice))
    assert quote.status_code == 200, quote.text
    assert quote.json()["admitted"] is True, quote.json()
    assert quote.json()["plan"]["guarantee"] == guarantee
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job_id = str(r.json()["id"])

    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "released", job
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["privacy"]["guarantee"] == guarantee
    method, sampler = key
    assert card["mechanism"]["method"] == method
    if sampler is not None:
        assert card["mechanism"]["sampler"] == sampler


# A method registered in the three tables alone — its name in TRAINING_METHODS, its entry
# in METHODS, its mechanism in MECHANISMS — goes through quote, admission, the worker and
# the card with no other module edited (issue 23: "adding a dummy method in a test touches
# only its own two files and the registries"; here its two "files" are this module's
# functions).
DUMMY = ("dummy", None)


def _plan_dummy(request: JobRequest, facts: PlanFacts) -> MethodPlan:
    # A pure Gaussian mechanism on a sum of sensitivity 1, calibrated by RDP like the others.
    event = PoissonSubsampledGaussianEvent(sampling_rate=1.0, noise_multiplier=8.0, steps=1)
    return event, {"steps": 3, "parameters": facts.n_features + 1}, "rdp"


def run_dummy(**kwargs: Any) -> MechanismOutput:
    """The dummy's worker side: a zero model of the plan's size, once per sample."""
    size = int(kwargs["mechanism"]["parameters"])
    kwargs["progress"](3, 3)
    return MechanismOutput(
        releases=[{"weight": torch.zeros(1, size - 1), "bias": torch.zeros(1)}] * kwargs["samples"]
    )


@pytest.fixture
def dummy_method(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas_common, "TRAINING_METHODS", [*TRAINING_METHODS, "dummy"])
    entry = MethodEntry(_plan_dummy, lambda _request: "proven", no_estimate)
    monkeypatch.setitem(METHODS, DUMMY, entry)
    monkeypatch.setitem(MECHANISMS, DUMMY, Mechanism(__name__, "run_dummy"))


def test_a_method_in_the_registries_alone_runs_end_to_end(
    client: Any, keys: Any, settings: Any, dummy_method: None
) -> None:
    body = {"dataset": "toy", "method": "dummy", "epsilon": 1.0, "delta": 1e-5}
    quote = client.post("/v1/quote", json=body, headers=auth(keys.alice))
    assert quote.status_code == 200, quote.text
    plan = quote.json()["plan"]
    assert quote.json()["admitted"] is True and plan["method"] == "dummy"
    assert plan["mechanism"]["steps"] == 3 and plan["guarantee"] == "proven"
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job_id = str(r.json()["id"])
    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "released" and job["method"] == "dummy", job
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["mechanism"]["method"] == "dummy"
    assert card["privacy"]["guarantee"] == "proven"


def test_a_method_outside_the_name_table_is_a_4xx(client: Any, keys: Any) -> None:
    body = {"dataset": "toy", "method": "dummy", "epsilon": 1.0, "delta": 1e-5}
    r = client.post("/v1/quote", json=body, headers=auth(keys.alice))
    assert r.status_code == 422, r.text
    assert "dpsgd" in r.text  # the error names the methods there are
