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

from service.methods import METHODS, method_key
from service.schemas import JobRequest
from tests.conftest import auth
from worker.mechanisms.registry import MECHANISMS
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
