"""The admin's accounting figures on real databases: which charges are in force, the valid
"ε spent", the information-only PLD figure, and the dataset's guarantee label."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select, update

from service.db import engine_for, transaction
from service.ledger.accounting import accounting_summary, charged_events, dataset_guarantee
from service.ledger.tables import Dataset, EntryKind, Job, JobStatus, LedgerEntry
from service.privacy.amounts import from_micro
from service.privacy.calibrate import pld_epsilon
from service.privacy.events import event_from_json
from service.privacy.filters import epsilon_spent
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp
from tests.conftest import auth

DPSGD = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}
EXPM = {"dataset": "toy", "method": "expm_nf", "epsilon": 0.5, "delta": 0}


def _submit(client: Any, keys: Any, body: dict[str, Any]) -> str:
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _touch(settings: Any, job_id: str, *, status: JobStatus | None = None) -> None:
    """What the worker records just before its first read of private rows."""
    values: dict[str, Any] = {"data_touched": True}
    if status is not None:
        values["status"] = status
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(update(Job).where(Job.id == job_id).values(**values))


def test_charges_in_force_and_the_valid_spent_figure(client: Any, keys: Any, settings: Any) -> None:
    cancelled = _submit(client, keys, DPSGD)
    touched = _submit(client, keys, DPSGD)
    queued = _submit(client, keys, DPSGD)
    r = client.post(f"/v1/jobs/{cancelled}/cancel", headers=auth(keys.alice))
    assert r.status_code == 200  # never read a row: refunded for real
    _touch(settings, touched, status=JobStatus.failed)
    r = client.post(
        f"/v1/admin/jobs/{touched}/refund",
        json={"reason": "worker bug", "override": True},
        headers=auth(keys.admin),
    )
    assert r.status_code == 200  # read rows: an information-only refund

    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == "toy")).one()
        charges = {
            e.job_id: e
            for e in s.scalars(
                select(LedgerEntry).where(
                    LedgerEntry.dataset_id == ds.id, LedgerEntry.kind == EntryKind.charge
                )
            )
        }
        # Audit defect 9: the registration's noisy-count charge (job_id NULL) and the charge
        # kept by the information-only refund are in force; the cancelled job's is not.
        assert set(charges) == {None, cancelled, touched, queued}
        expected = [charges[k] for k in (None, touched, queued)]
        events = charged_events(s, ds)
        assert events == [event_from_json(e.event or {}) for e in expected]
        summary = accounting_summary(s, ds)
        spent_rdp, delta = list(ds.spent_rdp_micro), float(Decimal(ds.delta_total))
        # the running total the filter admits against is exactly those charges
        assert spent_rdp == [sum(e.rdp_micro[i] for e in expected) for i in range(len(ORDERS))]

    assert summary.charges_in_force == 3
    assert summary.naive_epsilon_sum == pytest.approx(
        from_micro(sum(e.epsilon_micro for e in expected))
    )
    assert summary.pld_epsilon == pytest.approx(pld_epsilon(events=events, delta=delta))
    # The valid figure pays the union bound over the grid, as admission does; the old
    # "RDP-implied ε" (full δ_total, best order picked afterwards) was smaller.
    valid = epsilon_spent(spent_micro=spent_rdp, delta_total=delta)
    assert summary.epsilon_spent == valid
    unjustified = epsilon_from_rdp(
        rdp=[from_micro(v) for v in spent_rdp], orders=ORDERS, delta=delta
    )
    assert unjustified < valid <= summary.epsilon_total
    api = client.get("/v1/admin/datasets/toy/accounting", headers=auth(keys.admin)).json()
    assert api["epsilon_spent"] == valid and "rdp_epsilon" not in api
    listed = client.get("/v1/datasets", headers=auth(keys.alice)).json()[0]["budget"]
    assert listed["epsilon_spent"] == valid


def test_dataset_guarantee_turns_nominal_once_a_nominal_job_read_rows(
    client: Any, keys: Any, settings: Any
) -> None:
    def labels() -> tuple[str, str]:
        listed = client.get("/v1/datasets", headers=auth(keys.alice)).json()[0]["budget"]
        acc = client.get("/v1/admin/datasets/toy/accounting", headers=auth(keys.admin)).json()
        return listed["guarantee"], acc["guarantee"]

    assert labels() == ("proven", "proven")
    dpsgd = _submit(client, keys, DPSGD)
    _touch(settings, dpsgd)
    expm = _submit(client, keys, EXPM)
    assert labels() == ("proven", "proven")  # queued: the nominal job read nothing yet
    _touch(settings, expm)
    assert labels() == ("nominal", "nominal")
    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == "toy")).one()
        assert dataset_guarantee(s, ds.id) == "nominal"
