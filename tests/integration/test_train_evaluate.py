"""Train then evaluate (issue 21): a training request (POST /v1/jobs) with an ``evaluate``
block is one plan whose cost composes the training and the evaluation of its released
model, admitted with one ledger charge; the in-process worker trains, scores the model on
the holdout and releases both; the card holds the evaluation and lists it. Every refusal
is a 422 problem that charges nothing. Requests without ``evaluate`` keep their request
and plan as before (tests/unit/test_plan_digests.py pins the plans).

Runs on SQLite and PostgreSQL (the ``settings`` fixture's parametrisation)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from service.db import engine_for, transaction
from service.ledger.audit import check_totals, verify_all
from service.ledger.charges import charge_for
from service.ledger.tables import Dataset, EntryKind, Job, LedgerEntry
from service.privacy.amounts import to_micro_up
from service.privacy.events import event_from_json
from service.privacy.orders import ORDERS
from service.schemas import PrivacyPlan
from tests.conftest import Keys, auth
from tests.integration.test_evaluations import HELD, TRAIN, _register_held
from worker.runner import Outcome, execute_job

EVALUATE = {"epsilon": 1.0, "metrics": ["accuracy", "log_loss", "confusion"]}


@pytest.fixture
def held(settings: Any, keys: Keys) -> Any:
    """The toy dataset (no holdout, from ``keys``) and ``held``, with a holdout."""
    return _register_held(settings)


def _ledger(settings: Any) -> dict[str, tuple[int, int, list[int] | None]]:
    """Each dataset's (ledger entries, Σ ε micro spent, RDP micro spent)."""
    with transaction(engine_for(settings.resolved_database_url)) as s:
        out = {}
        for ds in s.scalars(select(Dataset)):
            count = s.scalar(select(func.count()).where(LedgerEntry.dataset_id == ds.id))
            out[ds.name] = (int(count or 0), int(ds.spent_epsilon_micro), ds.spent_rdp_micro)
        return out


def test_train_then_evaluate_is_one_plan_one_charge_one_release(
    client: Any, keys: Keys, settings: Any, held: Any
) -> None:
    alice = auth(keys.alice)
    body = {"dataset": HELD, **TRAIN, "evaluate": EVALUATE}
    trained_only = client.post("/v1/quote", json={"dataset": HELD, **TRAIN}, headers=alice)
    assert trained_only.status_code == 200, trained_only.text
    before = _ledger(settings)
    q = client.post("/v1/quote", json=body, headers=alice)
    assert q.status_code == 200, q.text
    assert _ledger(settings) == before  # a quote charges nothing
    quote = q.json()
    assert quote["admitted"] is True
    plan, training = quote["plan"], trained_only.json()["plan"]
    # One plan: the training's, with the evaluation composed in.
    assert plan["method"] == "dpsgd" and plan["mechanism"] == training["mechanism"]
    assert plan["event"] == {
        "type": "composed",
        "version": 1,
        "events": [training["event"], plan["event"]["events"][1]],
    }
    evaluation = plan["evaluation"]
    assert evaluation["holdout_rows"] == held.holdout_rows and evaluation["sample"] == 0
    assert [m["metric"] for m in evaluation["metrics"]] == EVALUATE["metrics"]
    assert evaluation["epsilon"] == pytest.approx(1.0) and evaluation["delta"] == 0.0
    assert evaluation["training_epsilon"] == training["epsilon"]
    assert plan["epsilon"] == pytest.approx(training["epsilon"] + 1.0)
    assert plan["delta"] == training["delta"]
    # Laplace: each metric a pure leaf; the curve is the training's plus theirs (RDP adds).
    assert all(e["type"] == "pure_dp" for e in plan["event"]["events"][1]["events"])
    evaluation_curve = event_from_json(plan["event"]["events"][1]).rdp(ORDERS)
    assert plan["rdp_curve"] == pytest.approx(
        [t + e for t, e in zip(training["rdp_curve"], evaluation_curve, strict=True)], rel=1e-12
    )
    combined = charge_for(PrivacyPlan.model_validate(plan))
    alone = charge_for(PrivacyPlan.model_validate(training))
    assert all(c > a for c, a in zip(combined.rdp_micro, alone.rdp_micro, strict=True))
    # The quote shows the combined cost: the budget after is the budget less the composition.
    spent_before = quote["dataset_before"]["spent_epsilon_sum"]
    assert quote["dataset_after"]["spent_epsilon_sum"] == pytest.approx(
        spent_before + plan["epsilon"], abs=2e-6
    )

    r = client.post("/v1/jobs", json=body, headers=alice)
    assert r.status_code == 202, r.text
    job_id = str(r.json()["id"])
    assert r.json()["plan"] == plan
    after = _ledger(settings)
    assert after["toy"] == before["toy"]
    count, spent, rdp = after[HELD]
    assert count == before[HELD][0] + 1  # one charge, for training and evaluation together
    assert spent - before[HELD][1] == to_micro_up(plan["epsilon"])
    assert rdp is not None and before[HELD][2] is not None
    assert [a - b for a, b in zip(rdp, before[HELD][2], strict=True)] == combined.rdp_micro
    with transaction(engine_for(settings.resolved_database_url)) as s:
        entry = s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job_id)).one()
        assert entry.kind == EntryKind.charge and entry.event == plan["event"]
        assert entry.epsilon_micro == to_micro_up(plan["epsilon"])
        assert entry.rdp_micro == combined.rdp_micro
        assert check_totals(s) == []
        assert all(v.ok for v in verify_all(s))

    assert execute_job(job_id, settings) == Outcome.released
    with transaction(engine_for(settings.resolved_database_url)) as s:
        charges = s.scalars(
            select(LedgerEntry).where(
                LedgerEntry.job_id == job_id, LedgerEntry.kind == EntryKind.charge
            )
        ).all()
        assert len(charges) == 1  # running and releasing charged nothing more
    card = client.get(f"/v1/jobs/{job_id}/release", headers=alice).json()
    assert card["samples"] == 1 and card["mechanism"]["method"] == "dpsgd"
    assert card["privacy"]["epsilon"] == plan["epsilon"]
    assert card["privacy"]["event"] == plan["event"]
    assert "evaluation of sample 0" in card["privacy"]["statement"]
    assert card["privacy"]["public_values"]["holdout_row_count"].startswith(f"{held.holdout_rows}:")
    ev = card["evaluation"]
    assert ev["job_id"] == job_id and ev["holdout_rows"] == held.holdout_rows
    assert set(ev["metrics"]) == set(EVALUATE["metrics"])
    acc = ev["metrics"]["accuracy"]
    assert acc["interval"]["lower"] <= acc["interval"]["upper"]
    assert acc["noise"] == "laplace" and acc["epsilon"] == pytest.approx(1.0 / 3)
    # The card lists the evaluation made with the release (its own job).
    assert [e["evaluation_job"] for e in card["evaluations"]] == [job_id]
    assert card["evaluations"][0]["metrics"]["accuracy"] == acc
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=alice)
    assert weights.status_code == 200 and len(weights.content) > 64  # the model is released


def test_train_then_evaluate_with_gaussian_noise_composes_the_rdp_curves(
    client: Any, keys: Keys, settings: Any, held: Any
) -> None:
    alice = auth(keys.alice)
    gauss = {"epsilon": 1.0, "delta": 1e-7, "noise": "gaussian", "metrics": ["accuracy"]}
    body = {"dataset": HELD, **TRAIN, "evaluate": gauss}
    q = client.post("/v1/quote", json=body, headers=alice)
    assert q.status_code == 200, q.text
    plan = q.json()["plan"]
    training = client.post("/v1/quote", json={"dataset": HELD, **TRAIN}, headers=alice).json()
    leaf = plan["event"]["events"][1]["events"][0]["events"][0]
    assert leaf["type"] == "poisson_subsampled_gaussian"
    assert plan["delta"] == pytest.approx(training["plan"]["delta"] + 1e-7)
    assert plan["evaluation"]["accountant"] == "rdp"
    assert all(c > t for c, t in zip(plan["rdp_curve"], training["plan"]["rdp_curve"], strict=True))


def test_refusals_are_422_and_charge_nothing(
    client: Any, keys: Keys, settings: Any, held: Any
) -> None:
    alice = auth(keys.alice)
    ok = {"dataset": HELD, **TRAIN, "evaluate": EVALUATE}
    cases: list[dict[str, Any]] = [
        {**ok, "dataset": "toy"},  # a dataset without a holdout
        {**ok, "evaluate": {**EVALUATE, "noise": "gaussian"}},  # Gaussian needs δ > 0
        {**ok, "evaluate": {**EVALUATE, "metrics": ["accuracy", "accuracy"]}},
        {**ok, "evaluate": {**EVALUATE, "metrics": []}},
        {**ok, "evaluate": {**EVALUATE, "metrics": ["precision"]}},
        {**ok, "evaluate": {**EVALUATE, "sample": 1}},  # the job releases one sample
        {**ok, "evaluate": {**EVALUATE, "epsilon": -1}},
        {**ok, "evaluate": {**EVALUATE, "confidence": 1.5}},
        {**ok, "evaluate": {**EVALUATE, "job_id": "x"}},  # not a field of this block
        {**ok, "evaluate": {"metrics": ["accuracy"]}},  # no ε
    ]
    before = _ledger(settings)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        jobs = s.scalar(select(func.count()).select_from(Job))
    for body in cases:
        for path in ("/v1/quote", "/v1/jobs"):
            r = client.post(path, json=body, headers=alice)
            assert r.status_code == 422, (path, body, r.text)
            assert r.headers["content-type"].startswith("application/problem+json"), r.text
    r = client.post("/v1/jobs", json={**ok, "dataset": "toy"}, headers=alice)
    assert "holdout" in r.json()["detail"]
    assert _ledger(settings) == before
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == jobs


def test_without_evaluate_the_request_and_plan_are_as_before(
    client: Any, keys: Keys, settings: Any, held: Any
) -> None:
    alice = auth(keys.alice)
    r = client.post("/v1/jobs", json={"dataset": HELD, **TRAIN}, headers=alice)
    assert r.status_code == 202, r.text
    assert "evaluate" not in r.json()["request"] and "evaluation" not in r.json()["plan"]
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, r.json()["id"])
        assert "evaluate" not in job.request and "evaluation" not in job.plan
