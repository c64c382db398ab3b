"""The API's start-up warm-up (issue 26): it runs before the first request, sends every
quote family through the app below its middleware, and leaves the ledger as it was (its
speed is measured by benchmarks/quote_latency.py, not asserted here)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.app import _WARM_UP_QUOTES, create_app
from service.config import Settings
from service.db import engine_for, transaction
from service.ledger.tables import Dataset, Job, LedgerEntry
from service.selection import kinds
from tests.conftest import Keys, auth


def _ledger_state(settings: Settings) -> tuple[Any, ...]:
    """Everything a quote must not change: entries, jobs, each dataset's spending."""
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        return (
            s.scalar(select(func.count()).select_from(LedgerEntry)),
            s.scalar(select(func.count()).select_from(Job)),
            tuple(
                (d.name, d.spent_epsilon_micro, tuple(d.spent_rdp_micro))
                for d in s.scalars(select(Dataset).order_by(Dataset.id))
            ),
        )


def test_warm_up_quotes_every_family_and_changes_nothing(settings: Settings, keys: Keys) -> None:
    before = _ledger_state(settings)
    kinds._COSTS.clear()
    app = create_app(settings, run_sweeper=False)
    assert not hasattr(app.state, "warm_up")  # at start-up, not at creation
    with TestClient(app, raise_server_exceptions=False) as c:
        done = app.state.warm_up
        # the calibrated selections ran their per-training ε's search: its memo is filled
        assert kinds._COSTS._items
        # every family was quoted on the toy dataset, through routing and planning
        assert done["ledger"] == done["tables"] == "ok"
        assert len(done) == 2 + len(_WARM_UP_QUOTES)
        assert all(v == "ok" for v in done.values()), str(done)
        assert _ledger_state(settings) == before
        # nothing was counted as a request, and the caller override is gone
        metrics = c.get("/metrics").text
        assert "/v1/quote" not in metrics
        assert c.post("/v1/quote", json={"dataset": "toy", "method": "dpsgd"}).status_code == 401
        r = c.post(
            "/v1/quote",
            json={"dataset": "toy", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-6},
            headers=auth(keys.alice),
        )
        assert r.status_code == 200, r.text
    assert _ledger_state(settings) == before


def test_warm_up_without_datasets_still_starts(settings: Settings) -> None:
    app = create_app(settings, run_sweeper=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        done = app.state.warm_up
        assert done["ledger"] == done["tables"] == "ok"
        # no dataset to quote on: each quote is refused (422), none fails the start-up
        quotes = {k: v for k, v in done.items() if k not in ("ledger", "tables")}
        assert quotes == dict.fromkeys(quotes, "status 422")
        assert c.get("/healthz").status_code == 200


def test_warm_up_is_left_out_when_asked(settings: Settings) -> None:
    app = create_app(settings, run_sweeper=False, warm=False)
    with TestClient(app, raise_server_exceptions=False):
        assert not hasattr(app.state, "warm_up")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_warm_up_survives_a_ledger_that_is_down(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = settings.model_copy(
        update={"database_url": f"sqlite:///{settings.home / 'missing' / 'ledger.db'}"}
    )
    app = create_app(broken, run_sweeper=False)
    with TestClient(app, raise_server_exceptions=False):
        assert app.state.warm_up["ledger"].startswith("failed")
