"""The release hold's D for the job kinds that had no time estimate (ExpM+NF, evaluations,
train then evaluate) with the worker in-process on real databases: two datasets with the
same public facts (schema, noisy row count, the holdout: its size is public) but
different private training rows (400 and 4000 rows registered) get
the same plan, the same D, and the same public release time after the start, and D is the
plan's estimate rounded up (service/release_hold.py), not the one quantum a plan without
an estimate got."""

from __future__ import annotations

import math
import shutil
from typing import Any

import pytest
from sqlalchemy import select, update

from service.config import Settings
from service.datasets.tabular import parse_schema
from service.db import engine_for, transaction
from service.jobs import as_utc
from service.ledger.tables import Dataset, Job
from service.release_hold import HoldPolicy, hold_seconds, plan_hold_seconds
from tests.conftest import SMALL_SCHEMA, auth, write_toy_csv
from tests.integration.test_release_hold import _held, _job
from worker.data import HOLDOUT_FILE
from worker.registration import register_dataset
from worker.runner import Outcome, execute_job, hold_policy

QUANTUM_S = 1e-4
# D = q·2^k ≥ factor × estimate: a small factor keeps the held runs short in the test,
# and D is still the estimate's (k ≥ 1), not one quantum.
FACTOR = 0.002
TRAIN = {"method": "dpsgd", "epsilon": 2.0, "delta": 1e-5, "dpsgd": {"epochs": 1, "batch_size": 50}}
EXPM_NF = {
    "method": "expm_nf",
    "epsilon": 1.0,
    "delta": 0.0,
    "expm_nf": {"steps": 20, "n_samples_per_step": 8, "batch_size": 64, "domain_radius": 5.0},
}
EVALUATE = {"epsilon": 1.0, "metrics": ["accuracy", "log_loss"]}


def _register(settings: Settings, name: str, n: int) -> None:
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=parse_schema({**SMALL_SCHEMA, "name": name}),
        csv_path=write_toy_csv(settings.home / f"{name}.csv", n=n, seed=n),
        epsilon_total=20.0,
        delta_total=1e-5,
        allow_nominal=True,
        holdout_fraction=0.25,
    )


def _submit(client: Any, key: str, path: str, body: dict[str, Any]) -> str:
    r = client.post(path, json=body, headers=auth(key))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _hold_of(job: Job) -> float:
    started, release_at = as_utc(job.started_at), as_utc(job.release_at)
    assert started is not None and release_at is not None
    return (release_at - started).total_seconds()  # type: ignore[operator]


@pytest.mark.parametrize("kind", ["expm_nf", "train then evaluate", "evaluation"])
def test_same_public_facts_same_hold_for_every_kind(
    client: Any, keys: Any, settings: Settings, kind: str
) -> None:
    engine = engine_for(settings.resolved_database_url)
    _register(settings, "few", 400)
    _register(settings, "many", 4000)
    # The public facts the plans read, the same for both: the noisy count, and the holdout
    # (its size is public and it holds exactly that many rows: "many" gets "few"'s).
    with transaction(engine) as s:
        few = s.scalars(select(Dataset).where(Dataset.name == "few")).one()
        s.execute(
            update(Dataset)
            .where(Dataset.name.in_(["few", "many"]))
            .values(n_rows=1000, holdout_rows=few.holdout_rows)
        )
    data = settings.resolved_data_dir
    shutil.copyfile(data / "few" / HOLDOUT_FILE, data / "many" / HOLDOUT_FILE)
    jobs = []
    for name in ("few", "many"):
        if kind == "expm_nf":
            jobs.append(_submit(client, keys.alice, "/v1/jobs", {"dataset": name, **EXPM_NF}))
        elif kind == "train then evaluate":
            body = {"dataset": name, **TRAIN, "evaluate": EVALUATE}
            jobs.append(_submit(client, keys.alice, "/v1/jobs", body))
        else:
            trained = _submit(client, keys.alice, "/v1/jobs", {"dataset": name, **TRAIN})
            assert execute_job(trained, settings) == Outcome.released  # hold off: quick
            body = {"job_id": trained, "epsilon": 1.0, "metrics": ["accuracy", "log_loss"]}
            jobs.append(_submit(client, keys.alice, "/v1/evaluations", body))
    plans = [_job(settings, j).plan for j in jobs]
    strip = {"dataset", "evaluated_job"}

    def public(plan: dict[str, Any]) -> dict[str, Any]:
        mechanism = {k: v for k, v in plan["mechanism"].items() if k not in strip}
        return {**{k: v for k, v in plan.items() if k not in strip}, "mechanism": mechanism}

    assert public(plans[0]) == public(plans[1])  # but for the names
    held = _held(settings, quantum_s=QUANTUM_S, factor=FACTOR)
    policy: HoldPolicy = hold_policy(held)
    expected = plan_hold_seconds(plans[0], dict(SMALL_SCHEMA, name="few"), policy)
    assert expected > QUANTUM_S  # the estimate's D, not the one quantum of no estimate
    assert expected == hold_seconds(None, policy) * 2 ** round(math.log2(expected / QUANTUM_S))
    for job_id in jobs:
        assert execute_job(job_id, held) == Outcome.released
        job = _job(settings, job_id)
        assert _hold_of(job) == expected
        finished = as_utc(job.finished_at)
        started = as_utc(job.started_at)
        assert finished is not None and started is not None
        since = (finished - started).total_seconds()  # type: ignore[operator]
        ratio = since / expected
        assert ratio == 2 ** round(math.log2(ratio))  # on the grid
