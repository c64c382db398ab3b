"""Ledger behaviour on real databases: caps, budgets, refunds, pure datasets, tamper
evidence, and hypothesis state-machine runs that keep every invariant."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sqlalchemy import select, update

from service.db import engine_for, make_engine, transaction
from service.ledger.admission import BudgetExceeded, admit_job
from service.ledger.audit import check_totals, verify_all
from service.ledger.budgets import set_analyst_cap, set_dataset_budget
from service.ledger.charges import charge_for
from service.ledger.datasets import new_dataset
from service.ledger.errors import InvalidLedgerOperation
from service.ledger.filter_view import cap_filter, dataset_filter, evaluate
from service.ledger.locks import lock_job
from service.ledger.refunds import cancel_job, refund_job
from service.ledger.tables import (
    Analyst,
    AnalystCap,
    Dataset,
    Job,
    JobStatus,
    LedgerEntry,
    Role,
)
from service.migrate import upgrade
from service.plans import build_plan
from service.schemas import JobRequest
from tests.conftest import auth

DPSGD = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}
EXPM = {"dataset": "toy", "method": "expm_nf", "epsilon": 0.5, "delta": 0}


def test_analyst_cap_is_enforced_and_cannot_be_lowered_below_spent(client: Any, keys: Any) -> None:
    admin = auth(keys.admin)
    r = client.put(
        "/v1/admin/datasets/toy/caps/alice", json={"epsilon": 2.0, "delta": 1e-5}, headers=admin
    )
    assert r.status_code == 200 and r.json()["scope"] == "analyst"
    assert client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).status_code == 202
    r = client.post("/v1/jobs", json={**DPSGD, "epsilon": 1.5}, headers=auth(keys.alice))
    assert r.status_code == 409 and "cap" in r.json()["detail"]
    # Bob has no cap: the dataset budget alone decides.
    assert (
        client.post("/v1/jobs", json={**DPSGD, "epsilon": 1.5}, headers=auth(keys.bob)).status_code
        == 202
    )
    r = client.put(
        "/v1/admin/datasets/toy/caps/alice", json={"epsilon": 0.5, "delta": 1e-5}, headers=admin
    )
    assert r.status_code == 409
    r = client.put(
        "/v1/admin/datasets/toy/caps/alice", json={"epsilon": 5.0, "delta": 1e-5}, headers=admin
    )
    assert r.status_code == 200
    assert (
        client.post(
            "/v1/jobs", json={**DPSGD, "epsilon": 1.5}, headers=auth(keys.alice)
        ).status_code
        == 202
    )
    view = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()
    assert view["analyst_budget"]["epsilon_total"] == 5.0


def test_cap_created_after_spending_counts_earlier_charges(client: Any, keys: Any) -> None:
    assert (
        client.post(
            "/v1/jobs", json={**DPSGD, "epsilon": 2.0}, headers=auth(keys.alice)
        ).status_code
        == 202
    )
    r = client.put(
        "/v1/admin/datasets/toy/caps/alice",
        json={"epsilon": 1.0, "delta": 1e-5},
        headers=auth(keys.admin),
    )
    assert r.status_code == 409  # alice already spent more than that


def test_budget_raise_and_lowering(client: Any, keys: Any) -> None:
    admin = auth(keys.admin)
    assert (
        client.post(
            "/v1/jobs", json={**DPSGD, "epsilon": 5.0}, headers=auth(keys.alice)
        ).status_code
        == 202
    )
    assert (
        client.put(
            "/v1/admin/datasets/toy/budget",
            json={"epsilon_total": 1.0, "delta_total": 1e-5},
            headers=admin,
        ).status_code
        == 409
    )
    r = client.put(
        "/v1/admin/datasets/toy/budget",
        json={"epsilon_total": 50.0, "delta_total": 1e-5},
        headers=admin,
    )
    assert r.status_code == 200 and r.json()["epsilon_total"] == 50.0
    # Budgets and caps below the ledger's unit (they rounded to 0 micro-nats and answered
    # 500) and δ below 1e-20 (a 500 on PostgreSQL) are 422s now.
    for path, body in (
        ("/v1/admin/datasets/toy/budget", {"epsilon_total": 1e-7, "delta_total": 1e-5}),
        ("/v1/admin/datasets/toy/budget", {"epsilon_total": 50.0, "delta_total": 1e-39}),
        ("/v1/admin/datasets/toy/caps/alice", {"epsilon": 1e-7, "delta": 1e-6}),
    ):
        r = client.put(path, json=body, headers=admin)
        assert r.status_code == 422, (path, body, r.text)
    # A dataset that has charged an approximate-DP job cannot become pure.
    assert (
        client.put(
            "/v1/admin/datasets/toy/budget",
            json={"epsilon_total": 50.0, "delta_total": 0},
            headers=admin,
        ).status_code
        == 409
    )


def test_pure_dataset_refuses_approximate_mechanisms(client: Any, keys: Any) -> None:
    admin = auth(keys.admin)
    assert (
        client.put(
            "/v1/admin/datasets/toy/budget",
            json={"epsilon_total": 1.2, "delta_total": 0},
            headers=admin,
        ).status_code
        == 200
    )
    r = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice))
    assert r.status_code == 409 and "pure" in r.json()["detail"]
    assert client.post("/v1/jobs", json=EXPM, headers=auth(keys.alice)).status_code == 202
    assert client.post("/v1/jobs", json=EXPM, headers=auth(keys.alice)).status_code == 202
    # Basic composition: the noisy count's 0.1 (+ its rounding to 1e-6) + 0.5 + 0.5 leaves
    # just under 0.1 of 1.2.
    r = client.post("/v1/jobs", json={**EXPM, "epsilon": 0.1}, headers=auth(keys.alice))
    assert r.status_code == 409
    view = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    assert view["rule"] == "pure" and view["remaining_epsilon"] == pytest.approx(0.1, abs=2e-6)
    assert view["remaining_epsilon"] < 0.1


def test_nominal_methods_need_the_admins_permission(client: Any, keys: Any) -> None:
    admin = auth(keys.admin)
    client.put("/v1/admin/datasets/toy/nominal", json={"allow_nominal": False}, headers=admin)
    r = client.post("/v1/jobs", json=EXPM, headers=auth(keys.alice))
    assert r.status_code == 403 and r.json()["type"] == "/problems/nominal-not-allowed"
    q = client.post("/v1/quote", json=EXPM, headers=auth(keys.alice)).json()
    assert q["admitted"] is False and "nominal" in q["reason"]
    client.put("/v1/admin/datasets/toy/nominal", json={"allow_nominal": True}, headers=admin)
    job = client.post("/v1/jobs", json=EXPM, headers=auth(keys.alice)).json()
    assert job["guarantee"] == "nominal"


def test_samples_are_charged_as_k_releases(client: Any, keys: Any) -> None:
    one = client.post("/v1/quote", json=DPSGD, headers=auth(keys.alice)).json()["plan"]
    three = client.post("/v1/quote", json={**DPSGD, "samples": 3}, headers=auth(keys.alice)).json()[
        "plan"
    ]
    assert three["epsilon"] == pytest.approx(3 * one["epsilon"])
    for a, b in zip(one["rdp_curve"], three["rdp_curve"], strict=True):
        assert b == pytest.approx(3 * a, rel=1e-12)


def test_admin_refund_of_failed_job_only(client: Any, keys: Any, settings: Any) -> None:
    job = client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).json()
    r = client.post(
        f"/v1/admin/jobs/{job['id']}/refund",
        json={"reason": "worker bug"},
        headers=auth(keys.admin),
    )
    assert r.status_code == 409  # queued, not failed
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        s.execute(
            update(Job)
            .where(Job.id == job["id"])
            .values(status=JobStatus.failed, data_touched=True)
        )
    assert (
        client.post(
            f"/v1/admin/jobs/{job['id']}/refund",
            json={"reason": "worker bug"},
            headers=auth(keys.alice),
        ).status_code
        == 403
    )
    before = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    r = client.post(
        f"/v1/admin/jobs/{job['id']}/refund",
        json={"reason": "worker bug"},
        headers=auth(keys.admin),
    )
    assert r.status_code == 409 and "override" in r.json()["detail"]  # it read private rows
    r = client.post(
        f"/v1/admin/jobs/{job['id']}/refund",
        json={"reason": "worker bug", "override": True},
        headers=auth(keys.admin),
    )
    assert r.status_code == 200
    # Audit defect 3: the job read private rows, so the refund is information only: the
    # filter state (and so every later admission) is exactly as before.
    after = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    assert after == before
    assert (
        client.post(
            f"/v1/admin/jobs/{job['id']}/refund",
            json={"reason": "again", "override": True},
            headers=auth(keys.admin),
        ).status_code
        == 409
    )
    entries = client.get("/v1/admin/ledger", headers=auth(keys.admin)).json()
    refund = entries[-1]
    assert refund["kind"] == "refund" and refund["reason"] == "worker bug"
    assert refund["event"]["data_touched"] is True
    assert refund["event"]["information_only"] is True
    assert refund["epsilon"] == 0.0
    assert client.get("/v1/admin/ledger/verify", headers=auth(keys.admin)).json()["ok"] is True


def test_accounting_shows_each_rule(client: Any, keys: Any) -> None:
    for _ in range(3):
        assert client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice)).status_code == 202
    a = client.get("/v1/admin/datasets/toy/accounting", headers=auth(keys.admin)).json()
    assert a["rule"] == "rdp" and a["charges_in_force"] == 4  # the noisy count and 3 jobs
    assert a["naive_epsilon_sum"] == pytest.approx(3.1, abs=1e-5)  # with the count's 0.1
    assert a["epsilon_spent"] < a["naive_epsilon_sum"] + 2


def test_tampering_is_detected(client: Any, keys: Any, settings: Any) -> None:
    client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice))
    client.post("/v1/jobs", json=DPSGD, headers=auth(keys.alice))
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        first_charge = s.scalars(
            select(LedgerEntry).where(LedgerEntry.kind == "charge").order_by(LedgerEntry.id)
        ).first()
        assert first_charge is not None
        s.execute(
            update(LedgerEntry).where(LedgerEntry.id == first_charge.id).values(epsilon_micro=1)
        )
    v = client.get("/v1/admin/ledger/verify", headers=auth(keys.admin)).json()
    assert v["ok"] is False
    assert v["chains"][0]["first_bad_entry_id"] == first_charge.id
    assert v["mismatches"]  # the running total no longer matches the entries either


# ------------------------------------------------------------------ state machine


class LedgerMachine(RuleBasedStateMachine):
    """Random requests, cancellations, failures, refunds and budget raises on a real
    SQLite ledger; after every step nothing is overspent, totals equal the recomputation
    and the chain verifies."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(f"/tmp/enclave-hyp-{uuid.uuid4().hex}")
        self.dir.mkdir()
        url = f"sqlite:///{self.dir / 'l.sqlite'}"
        upgrade(url)
        self.engine = make_engine(url)
        with transaction(self.engine) as s:
            self.ds_id = new_dataset(
                s,
                name="toy",
                public_schema={},
                noisy_n_rows=1000,
                count_epsilon=0.01,
                epsilon_total=3.0,
                delta_total=1e-5,
                allow_nominal=True,
            ).id
            a = Analyst(name="a", key_hash="x" * 64, role=Role.analyst)
            s.add(a)
            s.flush()
            self.analyst_id = a.id
        self.jobs: list[str] = []

    def teardown(self) -> None:
        self.engine.dispose()

    @rule(
        eps=st.floats(0.05, 2.0), method=st.sampled_from(["dpsgd", "expm_nf"]), k=st.integers(1, 3)
    )
    def request(self, eps: float, method: str, k: int) -> None:
        body = {
            "dataset": "toy",
            "method": method,
            "epsilon": eps,
            "samples": k,
            "delta": 1e-5 if method == "dpsgd" else 0.0,
        }
        if method == "dpsgd":
            body["dpsgd"] = {"epochs": 1, "batch_size": 100}
        req = JobRequest.model_validate(body)
        plan = build_plan(req, n_rows=1000, n_features=3)
        with transaction(self.engine) as s:
            before = dataset_filter(s.get_one(Dataset, self.ds_id))
            cap = s.get(AnalystCap, (self.analyst_id, self.ds_id))
            cap_before = cap_filter(cap) if cap else None
        try:
            with transaction(self.engine) as s:
                job = admit_job(
                    s,
                    analyst_id=self.analyst_id,
                    dataset_id=self.ds_id,
                    request=req,
                    plan=plan,
                    idempotency_key=None,
                ).job
                self.jobs.append(job.id)
        except BudgetExceeded:
            # Justified: the filter really refuses this charge on the state it saw.
            assert not evaluate(before, cap_before, charge_for(plan)).admitted

    @precondition(lambda self: bool(self.jobs))
    @rule(i=st.integers(0, 1000))
    def cancel(self, i: int) -> None:
        with transaction(self.engine) as s:
            job = lock_job(s, self.jobs[i % len(self.jobs)])
            assert job is not None
            try:
                cancel_job(s, job=job)
            except InvalidLedgerOperation:
                assert job.status != JobStatus.queued

    @precondition(lambda self: bool(self.jobs))
    @rule(i=st.integers(0, 1000))
    def fail_and_refund(self, i: int) -> None:
        with transaction(self.engine) as s:
            job = lock_job(s, self.jobs[i % len(self.jobs)])
            assert job is not None
            if job.status in (JobStatus.queued, JobStatus.running):
                job.status = JobStatus.failed
            if job.status == JobStatus.failed:
                with contextlib.suppress(InvalidLedgerOperation):
                    refund_job(s, job=job, reason="test", override=True)

    @rule(extra=st.floats(0.0, 2.0))
    def raise_budget(self, extra: float) -> None:
        with transaction(self.engine) as s:
            ds = s.get_one(Dataset, self.ds_id)
            set_dataset_budget(
                s, dataset=ds, epsilon_total=ds.epsilon_total_micro / 1e6 + extra, delta_total=1e-5
            )

    @rule(eps=st.floats(0.1, 3.0))
    def set_cap(self, eps: float) -> None:
        with transaction(self.engine) as s, contextlib.suppress(InvalidLedgerOperation):
            set_analyst_cap(
                s,
                analyst=s.get_one(Analyst, self.analyst_id),
                dataset=s.get_one(Dataset, self.ds_id),
                epsilon=eps,
                delta=1e-5,
            )

    @invariant()
    def never_overspent_and_consistent(self) -> None:
        with transaction(self.engine) as s:
            ds = s.get_one(Dataset, self.ds_id)
            f = dataset_filter(ds)
            budget = f.budget_rdp_micro()
            assert not any(ds.spent_rdp_micro) or any(
                sp <= b for sp, b in zip(ds.spent_rdp_micro, budget, strict=True)
            )
            assert check_totals(s) == []
            assert all(r.ok for r in verify_all(s))


LedgerMachine.TestCase.settings = hsettings(
    max_examples=15,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerMachine = LedgerMachine.TestCase
