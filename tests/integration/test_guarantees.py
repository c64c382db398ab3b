"""The audit's ledger and worker defects, each pinned on real databases (SQLite and
PostgreSQL): the noisy row count, refunds, when data counts as touched, the ExpM
regulariser, and what a model card may say."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from service.db import engine_for, transaction
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import Dataset, Job, LedgerEntry
from service.privacy.events import event_from_json
from service.privacy.sampling import count_event
from tests.conftest import auth
from worker.data import ROWS_FILE, dataset_dir
from worker.registration import noisy_count
from worker.runner import GENERIC_FAILURE, Outcome, execute_job

DPSGD = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}


def test_registration_charges_and_publishes_only_a_noisy_count(
    client: Any, keys: Any, settings: Any
) -> None:
    """Audit defect 2: the count is a DP release charged to the budget before anything else,
    and plans use it (the quote's n_rows and q = B/n̂)."""
    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.scalars(select(Dataset)).one()
        entries = list(s.scalars(select(LedgerEntry).order_by(LedgerEntry.id)))
        assert [e.kind for e in entries] == ["budget", "charge"]
        charge = entries[1]
        assert charge.job_id is None and charge.analyst_id is None
        assert event_from_json(charge.event) == count_event(epsilon=0.1)
        assert ds.spent_epsilon_micro == charge.epsilon_micro > 0
        noisy = ds.n_rows
    plan = client.post("/v1/quote", json=DPSGD, headers=auth(keys.alice)).json()["plan"]
    assert plan["n_rows"] == noisy
    assert plan["mechanism"]["sampling_rate"] == 50 / noisy
    assert plan["mechanism"]["expected_batch_size"] == pytest.approx(50.0)


def test_noisy_count_is_two_sided_geometric_around_the_count() -> None:
    """2,000 releases of a count of 400 at ε = 0.5: mean 400, variance 2e^{-ε}/(1−e^{-ε})²
    (= 15.9), floored at 1. Bounds at ≥ 6 standard errors."""
    eps = 0.5
    draws = np.array([noisy_count(400, epsilon=eps) for _ in range(2000)])
    var = 2 * np.exp(-eps) / (1 - np.exp(-eps)) ** 2
    assert abs(draws.mean() - 400) < 6 * np.sqrt(var / 2000)
    assert 0.7 * var < draws.var() < 1.3 * var
    assert min(noisy_count(1, epsilon=0.01) for _ in range(200)) >= 1


def test_failure_before_the_first_read_keeps_data_untouched_and_is_refundable(
    client: Any, keys: Any, settings: Any
) -> None:
    """Audit defect 4: a missing data file fails the job before any row is read; its
    charge goes back to the filter without an override (automatically, when it fails)."""
    before = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    job_id = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    (dataset_dir(settings.resolved_data_dir, "toy") / ROWS_FILE).unlink()
    assert execute_job(job_id, settings) == Outcome.failed
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, job_id)
        assert job.data_touched is False and job.error == GENERIC_FAILURE
    assert client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"] == before
    r = client.post(
        f"/v1/admin/jobs/{job_id}/refund",
        json={"reason": "the data volume was not mounted"},
        headers=auth(keys.admin),
    )
    assert r.status_code == 409 and "already refunded" in r.text, r.text
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert check_totals(s) == []
        assert all(v.ok for v in verify_all(s))


def test_a_job_that_read_rows_is_marked_before_the_read(
    client: Any, keys: Any, settings: Any
) -> None:
    job_id = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    assert execute_job(job_id, settings) == Outcome.released
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.get_one(Job, job_id).data_touched is True


@pytest.mark.parametrize("path", ["/v1/quote", "/v1/jobs"])
def test_expm_without_regulariser_is_refused_and_charges_nothing(
    client: Any, keys: Any, path: str
) -> None:
    """Audit defect 7: l2 = 0 leaves the ExpM density unnormalisable over unbounded θ."""
    before = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    body = {"dataset": "toy", "method": "expm_nf", "epsilon": 1.0, "expm_nf": {"l2": 0}}
    r = client.post(path, json=body, headers=auth(keys.alice))
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "domain_radius" in r.text  # the error names the way out
    assert client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"] == before


def test_expm_on_a_public_box_needs_no_regulariser(client: Any, keys: Any) -> None:
    """Issue 13: with a public domain (−R, R)^P the ExpM density normalises at l2 = 0; the
    plan names the domain; a plan without one keeps its old keys."""
    body = {
        "dataset": "toy",
        "method": "expm_nf",
        "epsilon": 1.0,
        "expm_nf": {"l2": 0, "domain_radius": 5},
    }
    r = client.post("/v1/quote", json=body, headers=auth(keys.alice))
    assert r.status_code == 200, r.text
    assert r.json()["plan"]["mechanism"]["domain_radius"] == 5.0
    plain = {**body, "expm_nf": {"l2": 1.0}}
    r = client.post("/v1/quote", json=plain, headers=auth(keys.alice))
    assert r.status_code == 200 and "domain_radius" not in r.json()["plan"]["mechanism"]


def test_model_card_states_relation_and_public_values_and_no_ledger_ids(
    client: Any, keys: Any, settings: Any
) -> None:
    job_id = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()["id"]
    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    privacy = card["privacy"]
    assert "add/remove one row" in privacy["neighbouring_relation"]
    assert "DP noisy count" in privacy["public_values"]["row_count"]
    assert privacy["guarantee"] == "proven"
    text = str(card)
    assert "entry_id" not in text and "ledger_charge" not in text
