"""The admin's accounting figures on real databases: which charges are in force, the valid
"ε spent", the information-only PLD figure, and the dataset's guarantee label."""

from __future__ import annotations

import dataclasses
import math
import typing
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select, update

from service.db import engine_for, transaction
from service.ledger.accounting import (
    AccountingSummary,
    accounting_summary,
    charged_events,
    dataset_guarantee,
)
from service.ledger.chain import append_entry
from service.ledger.locks import lock_dataset
from service.ledger.tables import Dataset, EntryKind, Job, JobStatus, LedgerEntry
from service.privacy.amounts import curve_to_micro_up, from_micro, to_micro_up
from service.privacy.calibrate import PldUnavailable, pld_epsilon
from service.privacy.events import (
    EVENT_TYPES,
    ComposedEvent,
    DpEvent,
    ExponentialMechanismEvent,
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
    RandomStoppingEvent,
    event_from_json,
)
from service.privacy.filters import epsilon_spent
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp
from service.privacy.tuning import PoissonRuns, RunsDistribution
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


# ------------------------------------------- every event type has every admin figure

# A hyperparameter selection (random stopping) as an analyst submits it (test_selections).
HYPER = {
    "dataset": "toy",
    "kind": "hyperparameters",
    "epsilon": 3.0,
    "delta": 1e-6,
    "model": {"kind": "mlp", "hidden": [4]},
    "learning_rates": [0.5, 2.0],
    "batch_sizes": [50],
    "epochs": [1],
    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.9},
}


def _figures_ok(summary: AccountingSummary) -> None:
    """Every figure is a finite float, or None where it is not available."""
    for name in ("epsilon_total", "delta_total", "naive_epsilon_sum", "epsilon_spent"):
        assert math.isfinite(getattr(summary, name)), name
    for name in ("pld_epsilon", "remaining_epsilon"):
        value = getattr(summary, name)
        assert value is None or math.isfinite(value), (name, value)


def _admin_views_answer(client: Any, keys: Any) -> dict[str, Any]:
    """The admin route and the dashboard's pages answer 200; the route's JSON."""
    api = client.get("/v1/admin/datasets/toy/accounting", headers=auth(keys.admin))
    assert api.status_code == 200, api.text
    r = client.post("/dashboard/login", data={"api_key": keys.admin}, follow_redirects=False)
    assert r.status_code == 303
    for page in ("/dashboard/datasets/toy", "/dashboard"):
        r = client.get(page)
        assert r.status_code == 200, (page, r.text[:500])
    body: dict[str, Any] = api.json()
    return body


def test_accounting_after_a_hyperparameter_selection(client: Any, keys: Any, settings: Any) -> None:
    """Bug: one random-stopping charge made the accounting 500 for good ('no PLD for
    RandomStoppingEvent'). The PLD figure is 'not available' (None, '–'); the valid
    figures are exactly what the filter holds."""
    r = client.post("/v1/selections", json=HYPER, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == "toy")).one()
        events = charged_events(s, ds)
        assert any(isinstance(e, RandomStoppingEvent) for e in events)
        summary = accounting_summary(s, ds)
        spent_rdp, delta = list(ds.spent_rdp_micro), float(Decimal(ds.delta_total))
    _figures_ok(summary)
    assert summary.pld_epsilon is None
    assert summary.charges_in_force == 2
    assert summary.epsilon_spent == epsilon_spent(spent_micro=spent_rdp, delta_total=delta)
    api = _admin_views_answer(client, keys)
    assert api["pld_epsilon"] is None and api["epsilon_spent"] == summary.epsilon_spent
    with pytest.raises(PldUnavailable, match="RandomStoppingEvent"):
        pld_epsilon(events=events, delta=delta)


def _example_value(cls: type[DpEvent], name: str, hint: Any) -> Any:
    """A small valid value for field ``name`` of ``cls``, chosen by the field's type."""
    gaussian = PoissonSubsampledGaussianEvent(sampling_rate=0.02, noise_multiplier=2.0, steps=5)
    per_name: dict[str, Any] = {
        "epsilon": 0.1,
        "sampling_rate": 0.02,
        "noise_multiplier": 2.0,
        "steps": 5,
        "tau": 1e-9,
        "count": 2,
    }
    if name in per_name:
        return per_name[name]
    if hint is DpEvent:  # as in the selection plans: a training and a noisy score
        return ComposedEvent(events=(gaussian, ExponentialMechanismEvent(epsilon=0.1)))
    if hint == tuple[DpEvent, ...]:
        return (gaussian, PureDpEvent(epsilon=0.1))
    if hint == RunsDistribution:
        return PoissonRuns(mu=2.0, max_runs=4)
    raise AssertionError(
        f"no example value for {cls.__name__}.{name} ({hint!r}): teach _example_value"
    )


def _example(cls: type[DpEvent]) -> DpEvent:
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _example_value(cls, f.name, hints[f.name]) for f in dataclasses.fields(cls)}
    return cls(**kwargs)


def _all_subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_all_subclasses(sub)}
    return out


def test_every_concrete_event_type_is_registered() -> None:
    """So the contract test below, which walks EVENT_TYPES, sees every event type."""
    concrete = {c for c in _all_subclasses(DpEvent) if "TYPE" in vars(c)}
    assert concrete == set(EVENT_TYPES.values())


def _charge_directly(settings: Any, event: DpEvent) -> None:
    """Append a charge of ``event`` (no job) to toy's ledger, as admission would write it."""
    rdp_micro = curve_to_micro_up(event.rdp(ORDERS))
    pure = event.pure_epsilon()
    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == "toy")).one()
        ds = lock_dataset(s, ds.id)
        eps_micro = to_micro_up(pure if pure is not None else 0.5)
        append_entry(
            s,
            ds,
            LedgerEntry(
                analyst_id=None,
                job_id=None,
                kind=EntryKind.charge,
                event=event.to_json(),
                epsilon_micro=eps_micro,
                rdp_micro=rdp_micro,
                delta="0",
                reason="contract test",
            ),
        )
        ds.spent_epsilon_micro += eps_micro
        ds.spent_rdp_micro = [a + b for a, b in zip(ds.spent_rdp_micro, rdp_micro, strict=True)]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("type_name", sorted(EVENT_TYPES))
def test_every_event_type_has_every_admin_figure(
    client: Any, keys: Any, settings: Any, type_name: str
) -> None:
    """Contract over the registry: a charge of any event type leaves every figure of the
    admin views a finite number or 'not available' (None), and the admin route and the
    dashboard pages answer 200. The RDP-based figures stay exact."""
    event = _example(EVENT_TYPES[type_name])
    assert event_from_json(event.to_json()) == event
    _charge_directly(settings, event)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == "toy")).one()
        events = charged_events(s, ds)
        assert events[-1] == event
        summary = accounting_summary(s, ds)
        spent_rdp, delta = list(ds.spent_rdp_micro), float(Decimal(ds.delta_total))
    _figures_ok(summary)
    assert summary.epsilon_spent == epsilon_spent(spent_micro=spent_rdp, delta_total=delta)
    try:
        expected: float | None = pld_epsilon(events=events, delta=delta)
    except PldUnavailable:
        expected = None
    assert summary.pld_epsilon == (None if expected is None else pytest.approx(expected))
    api = _admin_views_answer(client, keys)
    assert api["epsilon_spent"] == summary.epsilon_spent
    assert api["pld_epsilon"] == summary.pld_epsilon
