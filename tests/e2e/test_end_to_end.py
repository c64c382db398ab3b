"""End to end: the API and real Celery worker processes, driven over HTTP.

- embedded mode: SQLite ledger + SQLite broker (kombu's SQLAlchemy transport);
- production mode: PostgreSQL ledger + Redis broker.

The fault tests (a worker, Redis, PostgreSQL or the API killed) are in test_faults.py.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from service.config import Settings
from service.releases import encode_for, load_release, predict_proba
from tests.conftest import REDIS_TEST_DB, REDIS_URL
from tests.e2e.stack import Stack, check_ledger, running_stack

pytestmark = pytest.mark.slow

DPSGD_TOY = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 4.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 3, "batch_size": 40, "learning_rate": 2.0},
}


@pytest.fixture
def redis_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This test's Celery broker on the configured test Redis database, under a key prefix
    of its own (ENCLAVE_BROKER_KEY_PREFIX, kombu's global_keyprefix): afterwards it deletes
    only its own keys; it never flushes a database another process may be using."""
    url = f"{REDIS_URL}/{REDIS_TEST_DB}"
    prefix = f"enclave-test-{uuid.uuid4().hex}:"
    monkeypatch.setenv("ENCLAVE_BROKER_KEY_PREFIX", prefix)
    yield url
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)


def _train_and_download(stack: Stack, body: dict) -> tuple[dict, Any]:
    stack.add_worker("w1")
    with stack.client(stack.keys.alice) as c:
        job = c.post("/v1/jobs", json=body).raise_for_status().json()
        seen = set()
        deadline = time.monotonic() + 240
        while job["status"] not in ("released", "failed"):
            assert time.monotonic() < deadline
            job = c.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
            seen.add(job["status"])
            # Progress is step k of T and nothing else derived from the data.
            assert set(job) >= {"progress_step", "progress_total"}
            assert "loss" not in str(job).lower() and "auc" not in str(job).lower()
            time.sleep(0.2)
        assert job["status"] == "released", job
        assert job["progress_step"] == job["progress_total"] > 0
        card = c.get(f"/v1/jobs/{job['id']}/release").raise_for_status().json()
        weights = c.get(f"/v1/jobs/{job['id']}/release/weights").raise_for_status().content
    return card, load_release(weights, card)


def _auc(release: Any) -> float:
    import pandas as pd
    from sklearn.metrics import roc_auc_score

    from tests.conftest import write_toy_csv

    path = write_toy_csv(
        Path(os.environ.get("TMPDIR", "/tmp")) / f"holdout-{uuid.uuid4().hex}.csv", n=2000, seed=99
    )
    x, y = encode_for(release, pd.read_csv(path, **release.schema.read_csv_kwargs()))
    return float(roc_auc_score(y, predict_proba(release, x)))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_embedded_mode_dpsgd_end_to_end(settings: Settings, tmp_path: Path) -> None:
    with running_stack(settings, tmp_path, settings.resolved_broker_url) as stack:
        card, release = _train_and_download(
            stack,
            DPSGD_TOY,
        )
        assert card["privacy"]["guarantee"] == "proven"
        assert card["privacy"]["accountant"] == "rdp"
        assert card["privacy"]["epsilon"] == 4.0 and card["privacy"]["delta"] == 1e-5
        assert _auc(release) > 0.7
        check_ledger(settings, releases=1)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_production_mode_postgres_redis(
    settings: Settings, tmp_path: Path, redis_broker: str
) -> None:
    with running_stack(settings, tmp_path, redis_broker) as stack:
        card, release = _train_and_download(
            stack,
            DPSGD_TOY,
        )
        assert card["privacy"]["guarantee"] == "proven"
        assert _auc(release) > 0.7
        check_ledger(settings, releases=1)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_expm_nf_job_end_to_end_is_labelled_nominal(settings: Settings, tmp_path: Path) -> None:
    with running_stack(settings, tmp_path, settings.resolved_broker_url) as stack:
        card, release = _train_and_download(
            stack,
            {
                "dataset": "toy",
                "method": "expm_nf",
                "epsilon": 5.0,
                "delta": 0,
                "expm_nf": {"steps": 300, "batch_size": 400},
            },
        )
        privacy = card["privacy"]
        assert privacy["guarantee"] == "nominal"
        assert "NOMINAL" in privacy["statement"] and "no proof" in privacy["statement"]
        assert privacy["event"]["type"] == "exponential_mechanism"
        assert _auc(release) > 0.6
        with stack.client(stack.keys.alice) as c:
            jobs = c.get("/v1/jobs").json()
            assert jobs[0]["guarantee"] == "nominal"
        check_ledger(settings, releases=1)
