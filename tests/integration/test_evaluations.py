"""Private evaluation end to end (issue 21): a holdout reserved at registration, an
evaluation quoted, admitted and charged through POST /v1/evaluations, run by the
in-process worker, its noisy results released on its card and listed on the evaluated
job's card; every refusal a 4xx that charges nothing; `enclave jobs evaluate`.

Runs on SQLite and PostgreSQL (the ``settings`` fixture's parametrisation), except the CLI
test (a live API in a child process, SQLite)."""

from __future__ import annotations

import gzip
import io
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from sqlalchemy import func, select
from typer.testing import CliRunner

from enclave.cli import app
from service.datasets.tabular import parse_schema
from service.db import engine_for, transaction
from service.ledger.audit import check_totals, verify_all
from service.ledger.tables import Dataset, EntryKind, Job, JobStatus, LedgerEntry
from service.privacy.amounts import to_micro_up
from tests.conftest import SMALL_SCHEMA, Keys, auth, write_toy_csv
from worker.data import HOLDOUT_FILE, ROWS_FILE, dataset_dir, load_holdout, load_training_set
from worker.registration import RegistrationError, register_dataset
from worker.runner import Outcome, execute_job

HELD = "held"
TRAIN = {"method": "dpsgd", "epsilon": 2.0, "delta": 1e-5, "dpsgd": {"epochs": 1, "batch_size": 50}}


def _register_held(settings: Any, *, n: int = 600, fraction: float = 0.25) -> Any:
    engine = engine_for(settings.resolved_database_url)
    csv = write_toy_csv(settings.home / "held.csv", n=n, seed=3)
    return register_dataset(
        engine,
        settings,
        schema=parse_schema({**SMALL_SCHEMA, "name": HELD}),
        csv_path=csv,
        epsilon_total=10.0,
        delta_total=1e-5,
        holdout_fraction=fraction,
    )


@pytest.fixture
def held(settings: Any, keys: Keys) -> Any:
    """The toy dataset (no holdout, from ``keys``) and ``held``, the same kind of rows with
    a quarter kept as the holdout."""
    return _register_held(settings)


def _rows(path: Path) -> pd.DataFrame:
    with gzip.open(path, "rb") as fh:
        return pd.read_csv(io.BytesIO(fh.read()), dtype=str)


def _charges(settings: Any) -> tuple[int, int]:
    """(number of ledger entries, Σ ε micro charged) of the held dataset."""
    with transaction(engine_for(settings.resolved_database_url)) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == HELD)).one()
        count = s.scalar(select(func.count()).where(LedgerEntry.dataset_id == ds.id))
        return int(count or 0), int(ds.spent_epsilon_micro)


def _train(client: Any, settings: Any, key: str, dataset: str = HELD) -> str:
    r = client.post("/v1/jobs", json={"dataset": dataset, **TRAIN}, headers=auth(key))
    assert r.status_code == 202, r.text
    job_id = str(r.json()["id"])
    assert execute_job(job_id, settings) == Outcome.released
    return job_id


def test_registration_keeps_a_holdout_no_training_load_reads(settings: Any, held: Any) -> None:
    engine = engine_for(settings.resolved_database_url)
    kept = held.report.rows_kept
    n_h = held.holdout_rows
    assert n_h is not None and n_h >= 1
    # n_h = floor(0.25 n̂) of the noisy count n̂ = n_rows + n_h; n_rows counts training rows.
    assert n_h == int(0.25 * (held.noisy_n_rows + n_h))
    with transaction(engine) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == HELD)).one()
        assert (ds.n_rows, ds.holdout_rows) == (held.noisy_n_rows, n_h)
        public_schema = ds.public_schema
    folder = dataset_dir(settings.resolved_data_dir, HELD)
    holdout_path, rows_path = folder / HOLDOUT_FILE, folder / ROWS_FILE
    assert stat.S_IMODE(holdout_path.stat().st_mode) == 0o600
    holdout, training = _rows(holdout_path), _rows(rows_path)
    assert len(holdout) == n_h and len(training) == kept - n_h
    key = ["a", "b", "c", "label"]
    held_rows = set(map(tuple, holdout[key].to_numpy()))
    train_rows = set(map(tuple, training[key].to_numpy()))
    assert not held_rows & train_rows  # continuous features: rows are distinct
    # What a training job loads is exactly the training file, none of the holdout.
    loaded = load_training_set(
        settings.resolved_data_dir,
        public_schema,
        torch.device("cpu"),
        before_first_read=lambda: None,
    )
    evaluation = load_holdout(
        settings.resolved_data_dir,
        public_schema,
        torch.device("cpu"),
        before_first_read=lambda: None,
    )
    assert loaded.n == kept - n_h and evaluation.n == n_h
    train_x = {tuple(r) for r in loaded.x.numpy().round(6).tolist()}
    held_x = {tuple(r) for r in evaluation.x.numpy().round(6).tolist()}
    assert not train_x & held_x


def test_holdout_refusals_at_registration(settings: Any, keys: Keys) -> None:
    engine = engine_for(settings.resolved_database_url)
    csv = write_toy_csv(settings.home / "r.csv", n=50, seed=1)
    schema = parse_schema({**SMALL_SCHEMA, "name": "r"})
    common = {"csv_path": csv, "epsilon_total": 10.0, "delta_total": 1e-5}
    for bad in (0.0, 0.6, float("nan")):
        with pytest.raises(RegistrationError, match="fraction must be in"):
            register_dataset(engine, settings, schema=schema, holdout_fraction=bad, **common)
    # floor(0.001 × n̂) = 0 rows unless the noisy count of ~50 rows reached 1,000 (noise of
    # scale 1/ε_count ≈ 10: probability ~e^-95): refused (to the admin), nothing registered.
    # (0.01 failed once in CI: the noisy count reached 100.)
    with pytest.raises(RegistrationError, match="at least one"):
        register_dataset(engine, settings, schema=schema, holdout_fraction=0.001, **common)
    with transaction(engine) as s:
        assert s.scalars(select(Dataset).where(Dataset.name == "r")).first() is None
        toy = s.scalars(select(Dataset).where(Dataset.name == "toy")).one()
        assert toy.holdout_rows is None


def test_evaluation_is_charged_run_and_released(
    client: Any, keys: Keys, settings: Any, held: Any
) -> None:
    alice = auth(keys.alice)
    datasets = {d["name"]: d for d in client.get("/v1/datasets", headers=alice).json()}
    assert datasets[HELD]["holdout_rows"] == held.holdout_rows
    assert datasets["toy"]["holdout_rows"] is None
    trained = _train(client, settings, keys.alice)

    body = {"job_id": trained, "epsilon": 1.0, "metrics": ["accuracy", "log_loss", "confusion"]}
    before = _charges(settings)
    q = client.post("/v1/evaluations/quote", json=body, headers=alice)
    assert q.status_code == 200, q.text
    quote = q.json()
    assert quote["admitted"] is True
    plan = quote["plan"]
    assert plan["method"] == "evaluation" and plan["n_rows"] == held.holdout_rows
    assert plan["epsilon"] == pytest.approx(1.0) and plan["delta"] == 0.0
    assert plan["event"]["type"] == "composed" and len(plan["event"]["events"]) == 3
    assert all(e["type"] == "pure_dp" for e in plan["event"]["events"])
    assert _charges(settings) == before  # a quote charges nothing

    r = client.post("/v1/evaluations", json=body, headers=alice)
    assert r.status_code == 202, r.text
    evaluation = str(r.json()["id"])
    assert r.json()["method"] == "evaluation"
    count, spent = _charges(settings)
    assert count == before[0] + 1 and spent - before[1] == to_micro_up(1.0)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        entry = s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == evaluation)).one()
        assert entry.kind == EntryKind.charge and entry.event == plan["event"]
        # The ledger's own audit: every charge re-derived from its event, chains intact.
        assert check_totals(s) == []
        assert all(v.ok for v in verify_all(s))

    assert execute_job(evaluation, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{evaluation}/release", headers=alice).json()
    assert card["samples"] == 0 and card["mechanism"]["method"] == "evaluation"
    ev = card["evaluation"]
    assert ev["job_id"] == trained and ev["holdout_rows"] == held.holdout_rows
    assert set(ev["metrics"]) == {"accuracy", "log_loss", "confusion"}
    acc = ev["metrics"]["accuracy"]
    assert acc["interval"]["lower"] <= acc["value"] <= acc["interval"]["upper"]
    assert acc["interval"]["lower"] >= 0.0 and acc["interval"]["upper"] <= 1.0
    assert acc["noise"] == "laplace" and acc["epsilon"] == pytest.approx(1.0 / 3)
    assert len(ev["metrics"]["confusion"]["counts"]) == 2
    # The training job's card lists the evaluation made with it (a read-time join).
    trained_card = client.get(f"/v1/jobs/{trained}/release", headers=alice).json()
    assert [e["evaluation_job"] for e in trained_card["evaluations"]] == [evaluation]
    assert trained_card["evaluations"][0]["metrics"]["accuracy"] == acc
    # No weights leave with an evaluation: its weights file holds no tensor.
    weights = client.get(f"/v1/jobs/{evaluation}/release/weights", headers=alice)
    assert weights.status_code == 200 and len(weights.content) < 64

    # Gaussian noise: charged as a Gaussian mechanism's RDP curve plus the sampler's slack.
    gauss = {"job_id": trained, "epsilon": 1.0, "delta": 1e-6, "noise": "gaussian"}
    q = client.post("/v1/evaluations/quote", json=gauss, headers=alice).json()
    leaves = [e["events"][0]["type"] for e in q["plan"]["event"]["events"]]
    assert leaves == ["poisson_subsampled_gaussian"] * 2 and q["admitted"] is True


def _check_auc(auc: dict[str, Any], *, n: int, classes: int, epsilon: float) -> None:
    """An AUC release: its two noisy integer releases, the AUC as their function (clipped
    to [0, 1]), its interval within [0, 1], the share of ε."""
    assert (
        len(auc["noisy_twice_u"])
        == len(auc["noisy_class_counts"])
        == (1 if classes == 2 else classes)
    )
    values = [
        u / (2.0 * min(max(c, 1), n - 1) * (n - min(max(c, 1), n - 1)))
        for u, c in zip(auc["noisy_twice_u"], auc["noisy_class_counts"], strict=True)
    ]
    assert auc["value"] == pytest.approx(min(max(sum(values) / len(values), 0.0), 1.0))
    assert 0.0 <= auc["interval"]["lower"] <= auc["interval"]["upper"] <= 1.0
    assert auc["epsilon"] == pytest.approx(epsilon)


def test_auc_is_charged_and_released(client: Any, keys: Keys, settings: Any, held: Any) -> None:
    """AUC (issue 21): accepted, charged as two pure leaves (2U and the positive count) at
    admission, released by the worker; with Gaussian noise, charged by its RDP curve."""
    alice = auth(keys.alice)
    trained = _train(client, settings, keys.alice)
    body = {"job_id": trained, "epsilon": 1.0, "metrics": ["auc", "accuracy"]}
    q = client.post("/v1/evaluations/quote", json=body, headers=alice)
    assert q.status_code == 200, q.text
    plan = q.json()["plan"]
    assert q.json()["admitted"] is True and plan["delta"] == 0.0
    auc_event = plan["event"]["events"][0]
    assert [e["type"] for e in auc_event["events"]] == ["pure_dp", "pure_dp"]
    before = _charges(settings)
    r = client.post("/v1/evaluations", json=body, headers=alice)
    assert r.status_code == 202, r.text
    evaluation = str(r.json()["id"])
    count, spent = _charges(settings)
    assert count == before[0] + 1 and spent - before[1] == to_micro_up(1.0)
    assert execute_job(evaluation, settings) == Outcome.released
    ev = client.get(f"/v1/jobs/{evaluation}/release", headers=alice).json()["evaluation"]
    _check_auc(ev["metrics"]["auc"], n=held.holdout_rows, classes=2, epsilon=0.5)

    gauss = {**body, "delta": 1e-6, "noise": "gaussian", "metrics": ["auc"]}
    q = client.post("/v1/evaluations/quote", json=gauss, headers=alice).json()
    leaves = [e["events"][0]["type"] for e in q["plan"]["event"]["events"][0]["events"]]
    assert leaves == ["poisson_subsampled_gaussian"] * 2 and q["admitted"] is True


def test_refusals_are_4xx_and_charge_nothing(
    client: Any, keys: Keys, settings: Any, held: Any
) -> None:
    alice, bob = auth(keys.alice), auth(keys.bob)
    trained = _train(client, settings, keys.alice)
    on_toy = _train(client, settings, keys.alice, dataset="toy")
    r = client.post("/v1/jobs", json={"dataset": HELD, **TRAIN}, headers=alice)
    queued = str(r.json()["id"])  # admitted, never run
    ok = {"job_id": trained, "epsilon": 0.5}
    cases: list[tuple[dict[str, Any], dict[str, str], int]] = [
        ({**ok, "job_id": "no-such-job"}, alice, 404),
        (ok, bob, 404),  # not the caller's job
        ({**ok, "job_id": queued}, alice, 409),  # not released
        ({**ok, "job_id": on_toy}, alice, 422),  # dataset without a holdout
        ({**ok, "metrics": ["auc"], "noise": "gaussian"}, alice, 422),  # needs δ > 0
        ({**ok, "metrics": ["accuracy", "accuracy"]}, alice, 422),
        ({**ok, "metrics": ["precision"]}, alice, 422),
        ({**ok, "metrics": []}, alice, 422),
        ({**ok, "noise": "gaussian"}, alice, 422),  # Gaussian needs δ > 0
        ({**ok, "sample": 3}, alice, 422),  # one sample released
        ({**ok, "epsilon": -1}, alice, 422),
        ({**ok, "confidence": 1.5}, alice, 422),
        ({"job_id": trained}, alice, 422),  # no ε
    ]
    before = _charges(settings)
    for body, who, status in cases:
        for path in ("/v1/evaluations/quote", "/v1/evaluations"):
            r = client.post(path, json=body, headers=who)
            assert r.status_code == status, (path, body, r.text)
            assert r.headers["content-type"].startswith("application/problem+json"), r.text
    # POST /v1/jobs does not take evaluations.
    fake = {"dataset": HELD, "method": "evaluation", "epsilon": 1.0, "evaluation": ok}
    assert client.post("/v1/jobs", json=fake, headers=alice).status_code == 422
    assert _charges(settings) == before
    with transaction(engine_for(settings.resolved_database_url)) as s:
        methods = [j.plan["method"] for j in s.scalars(select(Job))]
        assert "evaluation" not in methods


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_evaluate_prints_each_metric_with_its_interval(
    live: str, keys: Keys, settings: Any
) -> None:
    _register_held(settings)
    import httpx

    r = httpx.post(f"{live}/v1/jobs", json={"dataset": HELD, **TRAIN}, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    trained = str(r.json()["id"])
    assert execute_job(trained, settings) == Outcome.released

    engine = engine_for(settings.resolved_database_url)
    done = threading.Event()

    def worker() -> None:  # the enclave's worker, in process: runs the evaluation once queued
        while not done.is_set():
            with transaction(engine) as s:
                queued = [
                    j.id
                    for j in s.scalars(select(Job).where(Job.status == JobStatus.queued))
                    if j.plan["method"] == "evaluation"
                ]
            for job_id in queued:
                execute_job(job_id, settings)
            time.sleep(0.1)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    env = {"ENCLAVE_URL": live, "ENCLAVE_API_KEY": keys.alice, "COLUMNS": "200"}
    try:
        args = ["jobs", "evaluate", trained, "--epsilon", "1", "--metrics", "accuracy,log_loss"]
        quote = CliRunner().invoke(app, [*args, "--quote"], env=env)
        assert quote.exit_code == 0, quote.output
        assert "evaluation" in quote.output and "admitted" in quote.output
        result = CliRunner().invoke(app, [*args, "--interval", "0.1", "--timeout", "120"], env=env)
    finally:
        done.set()
        thread.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert "accuracy" in result.output and "log_loss" in result.output
    assert result.output.count("[") >= 2  # an interval per metric
    bad = [*args[:3], "--epsilon", "1", "--metrics", "auc", "--noise", "gaussian"]
    refused = CliRunner().invoke(app, bad, env=env)
    assert refused.exit_code == 1 and "delta" in refused.stderr


def test_migration_0008_adds_and_drops_holdout_rows(settings: Any, held: Any) -> None:
    from sqlalchemy import inspect

    from service.migrate import downgrade, upgrade

    url = settings.resolved_database_url

    def columns() -> set[str]:
        engine_for.cache_clear()
        return {c["name"] for c in inspect(engine_for(url)).get_columns("datasets")}

    assert "holdout_rows" in columns()
    engine_for.cache_clear()
    downgrade(url, "0007")
    assert "holdout_rows" not in columns()
    engine_for.cache_clear()
    upgrade(url)
    assert "holdout_rows" in columns()
    with transaction(engine_for(url)) as s:
        assert {d.name: d.holdout_rows for d in s.scalars(select(Dataset))} == {
            "toy": None,
            HELD: None,  # not recorded before 0008: an old ledger has no holdout
        }
    engine_for.cache_clear()


def test_a_three_class_model_is_evaluated_on_its_holdout(
    client: Any, keys: Keys, settings: Any, tmp_path: Path
) -> None:
    from service.datasets.kinds import load_schema_yaml
    from tests.integration.test_multiclass import _three_classes

    csv, schema_path = _three_classes(tmp_path, n=900)
    registered = register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=load_schema_yaml(schema_path.read_text()),
        csv_path=csv,
        epsilon_total=40.0,
        delta_total=1e-4,
        holdout_fraction=0.3,
    )
    alice = auth(keys.alice)
    body = {"dataset": "tri", "method": "dpsgd", "epsilon": 2.0, "delta": 1e-5}
    r = client.post("/v1/jobs", json=body, headers=alice)
    assert r.status_code == 202, r.text
    trained = str(r.json()["id"])
    assert execute_job(trained, settings) == Outcome.released

    ask = {"job_id": trained, "epsilon": 3.0, "metrics": ["accuracy", "confusion", "auc"]}
    r = client.post("/v1/evaluations", json=ask, headers=alice)
    assert r.status_code == 202, r.text
    assert r.json()["plan"]["model"]["classes"] == 3  # the evaluated (fitted) model
    evaluation = str(r.json()["id"])
    assert execute_job(evaluation, settings) == Outcome.released
    ev = client.get(f"/v1/jobs/{evaluation}/release", headers=alice).json()["evaluation"]
    assert ev["classes"] == 3 and ev["holdout_rows"] == registered.holdout_rows
    assert len(ev["metrics"]["confusion"]["counts"]) == 3
    _check_auc(ev["metrics"]["auc"], n=registered.holdout_rows, classes=3, epsilon=1.0)
    assert all(len(row) == 3 for row in ev["metrics"]["confusion"]["counts"])
    acc = ev["metrics"]["accuracy"]
    # Well-separated clusters: a DP-SGD model at eps 2 is far above chance (1/3); the noise
    # at eps 1 per metric on ~270 rows is about 1/270 per unit.
    assert acc["value"] > 0.6, acc
    # The noisy count may pass n (value > 1, as seen in CI); the interval is within [0, 1].
    inside = min(max(acc["value"], 0.0), 1.0)
    assert acc["interval"]["lower"] <= inside <= acc["interval"]["upper"]


def test_a_tampered_release_fails_the_evaluation_before_the_holdout_is_read(
    client: Any, keys: Keys, settings: Any, held: Any
) -> None:
    from service.releases import release_paths

    alice = auth(keys.alice)
    trained = _train(client, settings, keys.alice)
    r = client.post("/v1/evaluations", json={"job_id": trained, "epsilon": 0.5}, headers=alice)
    assert r.status_code == 202, r.text
    evaluation = str(r.json()["id"])
    run_token = client.get(f"/v1/jobs/{trained}/release", headers=alice).json()["run_token"]
    weights = release_paths(settings.resolved_release_dir, trained, run_token).weights
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")  # no longer the card's SHA-256
    assert execute_job(evaluation, settings) == Outcome.failed
    with transaction(engine_for(settings.resolved_database_url)) as s:
        job = s.get_one(Job, evaluation)
        assert job.status == JobStatus.failed and not job.data_touched and not job.data_read


def test_the_dashboard_shows_the_holdout(client: Any, keys: Keys, held: Any) -> None:
    r = client.post("/dashboard/login", data={"api_key": keys.admin}, follow_redirects=False)
    assert r.status_code == 303
    page = client.get(f"/dashboard/datasets/{HELD}")
    assert page.status_code == 200
    assert f"<dt>Holdout rows</dt><dd>{held.holdout_rows}: reserved at registration" in page.text
    assert "less the holdout" in page.text
    toy = client.get("/dashboard/datasets/toy")
    assert "none: no holdout was reserved" in toy.text
