"""Time-series datasets end to end: `enclave datasets check/register` with a long-format
CSV and an outcomes file (reports, never tracebacks), and GRU-D jobs through the API and
the in-process worker for each method."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from enclave.cli import app
from service.datasets.kinds import load_schema_yaml
from service.modelspec import GrudSpec, parameter_count
from tests.unit.test_timeseries import TINY
from worker.synthetic_icu import PUBLIC_SCHEMA

REPO = Path(__file__).resolve().parents[2]
ICU = REPO / "examples" / "icu"
runner = CliRunner()


def write_tiny_series(folder: Path, *, stays: int = 60, seed: int = 0) -> tuple[Path, Path, Path]:
    """A tiny synthetic time-series dataset in TINY's schema (test data, not private):
    the outcome follows the heart rate."""
    rng = np.random.default_rng(seed)
    ids = [f"s{i}" for i in range(stays)]
    risk = rng.standard_normal(stays)
    rows = []
    for i, stay in enumerate(ids):
        for hour in range(4):
            if rng.random() < 0.6:
                rows.append(
                    (stay, hour + 0.5, "hr", round(90 + 25 * risk[i] + rng.normal(0, 5), 1))
                )
            if rng.random() < 0.3:
                rows.append((stay, hour + 0.25, "sbp", round(120 - 10 * risk[i], 1)))
    obs = pd.DataFrame(rows, columns=["stay_id", "time", "variable", "value"])
    died = np.where(risk + 0.3 * rng.standard_normal(stays) > 0.3, "yes", "no")
    paths = (folder / "obs.csv", folder / "outcomes.csv", folder / "schema.yaml")
    obs.to_csv(paths[0], index=False)
    pd.DataFrame({"stay_id": ids, "died": died}).to_csv(paths[1], index=False)
    paths[2].write_text(yaml.safe_dump(TINY))
    return paths


def test_bundled_icu_schema_is_the_generators_public_schema() -> None:
    schema = load_schema_yaml((ICU / "schema.yaml").read_text())
    assert schema.kind == "timeseries"
    assert tuple(v.name for v in schema.variables) == PUBLIC_SCHEMA.names
    assert tuple(v.unit for v in schema.variables) == PUBLIC_SCHEMA.units
    assert tuple(v.mean for v in schema.variables) == PUBLIC_SCHEMA.means
    assert tuple(v.min for v in schema.variables) == PUBLIC_SCHEMA.lows
    assert tuple(v.max for v in schema.variables) == PUBLIC_SCHEMA.highs
    assert schema.scaled_means == pytest.approx(PUBLIC_SCHEMA.scaled_means)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_check_and_register_report_bad_lines_and_count_stays(settings: Any, tmp_path: Path) -> None:
    obs, outcomes, schema = write_tiny_series(tmp_path)
    good_lines = len(pd.read_csv(obs))
    with obs.open("a") as f:  # unknown variable, out of bounds, NaN, outside the horizon,
        f.write("s0,1.0,weight,70\ns0,1.0,sbp,400\ns0,2.0,hr,nan\ns0,7.5,hr,80\n")
        f.write("s1,3.0,sbp,100\ns1,3.0,sbp,101\n")  # and a duplicated time stamp
    base = ["--csv", str(obs), "--schema", str(schema), "--outcomes", str(outcomes)]
    r = runner.invoke(app, ["datasets", "check", *base])
    assert r.exit_code == 0, r.output
    assert "2 variables on 4 steps of 1 h" in r.output
    assert "stays (outcomes file): 60 stays kept of 60" in r.output
    assert f"{good_lines} lines kept of {good_lines + 6} (6 rejected)" in r.output
    for fact in ("unknown variable: 1", "above max: 1", "NaN or infinite: 1",
                 "outside the horizon: 1", "duplicated time stamp: 2"):  # fmt: skip
        assert fact in r.output, r.output
    no_outcomes = runner.invoke(
        app, ["datasets", "check", "--csv", str(obs), "--schema", str(schema)]
    )
    assert no_outcomes.exit_code == 1 and "needs its outcomes file" in no_outcomes.output
    missing = tmp_path / "missing.csv"
    pd.read_csv(obs).drop(columns=["value"]).to_csv(missing, index=False)
    r = runner.invoke(app, ["datasets", "check", *base[2:], "--csv", str(missing)])
    assert r.exit_code == 1 and "missing column(s): value" in r.output
    assert "Traceback" not in r.output

    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    register = ["datasets", "register", "tiny-icu", *base, "--epsilon", "5", "--delta", "1e-5",
                "--allow-nominal"]  # fmt: skip
    r = runner.invoke(app, register)
    assert r.exit_code == 0, r.output
    assert "60 stays kept of 60" in r.output and "public row count:" in r.output
    assert "warning" not in r.output  # GRU-D's methods can be admitted
    empty = tmp_path / "empty_outcomes.csv"
    empty.write_text("stay_id,died\ns0,maybe\n")
    bad = ["datasets", "register", "other", "--csv", str(obs), "--schema", str(schema),
           "--outcomes", str(empty), "--epsilon", "5", "--delta", "1e-5"]  # fmt: skip
    schema.write_text(yaml.safe_dump({**TINY, "name": "other"}))
    r = runner.invoke(app, bad)
    assert r.exit_code == 1 and "no row passed validation" in r.output, r.output
    assert "unknown outcome value: 1" in r.output and "Traceback" not in r.output
    # Outcomes written on the observation lines instead of a file of their own.
    inline = {**TINY, "name": "inline", "outcome": {**TINY["outcome"], "source": "observations"}}
    schema.write_text(yaml.safe_dump(inline))
    lines = pd.read_csv(obs).merge(pd.read_csv(outcomes), on="stay_id")
    lines.to_csv(tmp_path / "inline.csv", index=False)
    check = ["datasets", "check", "--csv", str(tmp_path / "inline.csv"), "--schema", str(schema)]
    r = runner.invoke(app, check)
    assert r.exit_code == 0 and "60 stays kept of 60" in r.output, r.output
    r = runner.invoke(app, [*check, "--outcomes", str(outcomes)])
    assert r.exit_code == 1 and "leave out --outcomes" in r.output


def test_check_reads_wide_per_stay_files_from_a_folder(tmp_path: Path) -> None:
    obs, outcomes, schema = write_tiny_series(tmp_path)
    schema.write_text(yaml.safe_dump({**TINY, "layout": "wide"}))
    folder = tmp_path / "stays"
    folder.mkdir()
    lines = pd.read_csv(obs)
    for stay, part in lines.groupby("stay_id"):
        wide = part.pivot(index="time", columns="variable", values="value").reset_index()
        wide.to_csv(folder / f"{stay}.csv.gz", index=False)
    args = ["--csv", str(folder), "--schema", str(schema), "--outcomes", str(outcomes)]
    r = runner.invoke(app, ["datasets", "check", *args])
    assert r.exit_code == 0, r.output
    assert "60 stays kept of 60" in r.output
    assert f"{len(lines)} lines kept of {len(lines)} (0 rejected)" in r.output
    r = runner.invoke(app, ["datasets", "check", *args[:1], str(obs), *args[2:]])
    assert r.exit_code == 1 and "folder of per-stay files" in r.output


def _register_tiny(settings: Any, folder: Path) -> None:
    from service.db import engine_for
    from worker.registration import register_dataset

    obs, outcomes, schema_path = write_tiny_series(folder)
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=load_schema_yaml(schema_path.read_text()),
        csv_path=obs,
        outcomes_path=outcomes,
        epsilon_total=20.0,
        delta_total=1e-5,
        allow_nominal=True,
    )


GRUD_JOBS = {
    "dpsgd": (
        {"epsilon": 2.0, "delta": 1e-5, "dpsgd": {"epochs": 1, "batch_size": 10}},
        "proven",  # worker/mechanisms/exact_grud.py (issue 25)
    ),
    "expm_nf": (
        {
            "epsilon": 1.0,
            "delta": 0.0,
            "expm_nf": {"steps": 3, "n_samples_per_step": 4, "batch_size": 8},
        },
        "nominal",
    ),
}


@pytest.mark.parametrize("method", sorted(GRUD_JOBS))
def test_grud_job_through_the_api_and_the_worker(
    method: str, client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    from service.releases import load_release
    from tests.conftest import auth
    from worker.models import build_module
    from worker.runner import Outcome, execute_job

    _register_tiny(settings, tmp_path)
    options, guarantee = GRUD_JOBS[method]
    body = {"dataset": "tiny-icu", "method": method, "model": {"kind": "grud", "hidden": 3},
            **options}  # fmt: skip
    # A sampler too large for the worker's memory is refused at quote time (estimate by
    # the grid's T and GRU-D's size), before anything is charged.
    sizes = {"n_samples_per_step": 4096, "batch_size": 100_000}
    huge = {"dataset": "tiny-icu", "method": "expm_nf", "model": body["model"], "epsilon": 1.0,
            "delta": 0.0, "expm_nf": sizes}  # fmt: skip
    refused = client.post("/v1/quote", json=huge, headers=auth(keys.alice))
    assert refused.status_code == 422 and "GiB" in refused.json()["detail"]
    # The tabular default model does not fit a time-series dataset: a 422, nothing charged.
    wrong = client.post("/v1/quote", json={**body, "model": {"kind": "logistic"}},
                        headers=auth(keys.alice))  # fmt: skip
    assert wrong.status_code == 422 and "GRU-D" in wrong.json()["detail"]
    r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "released"
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    assert card["privacy"]["guarantee"] == guarantee
    assert card["preprocessing"]["feature_names"] == ["hr", "sbp"]
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=auth(keys.alice)).content
    state = {
        k: torch.as_tensor(v) for k, v in load_release(weights, card).sample_weights(0).items()
    }
    module = build_module(GrudSpec(hidden=3), 2)
    module.load_state_dict(state)  # strict: every parameter and the public means
    torch.testing.assert_close(module.x_mean, torch.tensor([0.4, 0.35]))
    with pytest.raises(ValueError, match="time-series"):  # the numpy helpers are tabular
        _ = load_release(weights, card).schema
    # The analyst scores public stays with the release (a fresh sample of the same kind).
    from enclave.analyst import score_series

    public = tmp_path / "public"
    public.mkdir()
    (public / "card.json").write_text(json.dumps(card))
    (public / "model.safetensors").write_bytes(weights)
    obs, outcomes, _ = write_tiny_series(public, stays=30, seed=1)
    scored = score_series(public, obs, outcomes)
    assert scored.probabilities.shape == (30,) and scored.stay_ids[0] == "s0"
    assert ((scored.probabilities > 0) & (scored.probabilities < 1)).all()
    assert scored.auc is not None and scored.report.rows_kept == 30
    if method == "dpsgd":
        mech = card["mechanism"]
        assert mech["parameters"] == parameter_count(GrudSpec(hidden=3), 2)
        assert mech["public_n_rows"] == job["plan"]["n_rows"]


def test_dpsgd_grud_plans_beyond_the_job_time_limit_are_refused_before_any_charge(
    client: Any, keys: Any, settings: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """Issue 11: DP-SGD's work is estimated at quote time from public values (steps,
    expected batch, GRU-D's parameters, the grid's T; service/methods/dpsgd.py) and a plan
    beyond ENCLAVE_JOB_TIME_LIMIT_S is a 422 at quote and at submission, nothing charged;
    a small plan passes, and runs."""
    from service.methods.dpsgd import dpsgd_seconds
    from service.schemas import PrivacyPlan
    from tests.conftest import auth

    _register_tiny(settings, tmp_path)
    monkeypatch.setattr(settings, "job_time_limit_s", 20.0)
    big = {"dataset": "tiny-icu", "method": "dpsgd", "model": {"kind": "grud", "hidden": 64},
           "epsilon": 2.0, "delta": 1e-5, "dpsgd": {"epochs": 100, "batch_size": 30}}  # fmt: skip
    before = client.get("/v1/datasets", headers=auth(keys.alice)).json()
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=big, headers=auth(keys.alice))
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "worker time" in r.json()["detail"], r.text
    assert client.get("/v1/datasets", headers=auth(keys.alice)).json() == before
    small = {
        **big,
        "model": {"kind": "grud", "hidden": 3},
        "dpsgd": {"epochs": 1, "batch_size": 10},
    }
    quote = client.post("/v1/quote", json=small, headers=auth(keys.alice))
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text
    plan = PrivacyPlan.model_validate(quote.json()["plan"])
    assert dpsgd_seconds(plan, series_steps=TINY["grid"]["steps"]) < 20.0
    assert client.post("/v1/jobs", json=small, headers=auth(keys.alice)).status_code == 202


def test_grud_architecture_search_through_the_api_and_the_worker(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    """Issue 10: architecture search on time series. GRU-D candidates (hidden sizes of a
    declared space) trained by DP-SGD on a per-stay training part, scored by the noisy
    accuracy on the rest, the whole search charged once at admission; mismatched spaces
    and the features kind are 422s with nothing charged."""
    from service.releases import load_release
    from tests.conftest import auth
    from worker.models import build_module
    from worker.runner import Outcome, execute_job

    _register_tiny(settings, tmp_path)
    body = {"dataset": "tiny-icu", "kind": "architecture", "epsilon": 4.0, "delta": 1e-5,
            "space": {"model": "grud", "depths": [1], "widths": [2, 3]},
            "search": {"algorithm": "rs", "trainings": 2},
            "training": {"epochs": 1, "batch_size": 10}}  # fmt: skip
    before = client.get("/v1/datasets/tiny-icu", headers=auth(keys.alice)).json()["budget"]
    for wrong, needle in (
        ({**body, "space": {"depths": [1], "widths": [2, 3]}}, "does not fit"),  # MLP
        ({**body, "dataset": "toy"}, "does not fit"),  # GRU-D on tabular rows
        ({**body, "space": {"model": "grud", "depths": [2], "widths": [2]}}, "depths [1]"),
        (
            {"dataset": "tiny-icu", "kind": "features", "epsilon": 1.0, "delta": 1e-6},
            "tabular",
        ),
    ):
        r = client.post("/v1/selections/quote", json=wrong, headers=auth(keys.alice))
        assert r.status_code == 422, r.text
        assert needle in r.text, r.text
    assert client.get("/v1/datasets/tiny-icu", headers=auth(keys.alice)).json()["budget"] == before

    quote = client.post("/v1/selections/quote", json=body, headers=auth(keys.alice))
    assert quote.status_code == 200, quote.text
    plan = quote.json()["plan"]
    assert plan["model"] == {"kind": "grud", "hidden": 3}  # the charged (largest) candidate
    assert plan["mechanism"]["trainings"] == 2 and plan["guarantee"] == "proven"
    r = client.post("/v1/selections", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "released" and job["progress_step"] == 2
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    hidden = card["selection"]["selected"]["hidden"]
    assert hidden in ([2], [3]) and card["model"] == {"kind": "grud", "hidden": hidden[0]}
    assert card["privacy"]["epsilon"] <= 4.0 and card["privacy"]["guarantee"] == "proven"
    weights = client.get(f"/v1/jobs/{job_id}/release/weights", headers=auth(keys.alice))
    release = load_release(weights.content, card)
    module = build_module(GrudSpec(hidden=hidden[0]), 2)
    module.load_state_dict({k: torch.as_tensor(v) for k, v in release.sample_weights(0).items()})


def test_grud_hyperparameter_tuning_through_the_api_and_the_worker(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    """Random-stopping hyperparameter tuning of a GRU-D on time series, with a cap on K:
    planned for the series dataset, charged once, released with K hidden."""
    from tests.conftest import auth
    from worker.runner import Outcome, execute_job

    _register_tiny(settings, tmp_path)
    body = {"dataset": "tiny-icu", "kind": "hyperparameters", "epsilon": 4.0, "delta": 1e-5,
            "model": {"kind": "grud", "hidden": 3}, "learning_rates": [0.5, 2.0],
            "batch_sizes": [10], "epochs": [1],
            "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.9,
                     "max_runs": 2}}  # fmt: skip
    r = client.post("/v1/selections", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["plan"]["model"] == {"kind": "grud", "hidden": 3}
    assert job["plan"]["event"]["runs"]["max_runs"] == 2
    assert execute_job(job["id"], settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job['id']}/release", headers=auth(keys.alice)).json()
    assert card["selection"]["selected"]["learning_rate"] in (0.5, 2.0)
    assert card["model"]["kind"] == "grud" and card["privacy"]["guarantee"] == "proven"
    assert set(card["selection"]) == {"selected", "model", "noisy_validation_accuracy"}
