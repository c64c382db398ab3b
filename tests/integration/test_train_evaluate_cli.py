"""Train then evaluate from the analyst's CLI (issue 21): `enclave jobs quote|submit
--evaluate METRICS --evaluate-epsilon E [...]` sends the request's ``evaluate`` block
(service/schemas/evaluations.py TrainingEvaluation) to a live API in a child process; the
in-process worker runs the job and `download` prints the released evaluation. A bad value
is the API's 422 problem on one line, and charges nothing. SQLite (the live API's ledger)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from service.db import engine_for, transaction
from service.ledger.tables import LedgerEntry
from service.schemas.evaluations import TrainingEvaluation
from tests.conftest import Keys, auth
from tests.integration.test_analyst_cli import jobs, one_error_line
from tests.integration.test_evaluations import HELD, _register_held
from worker.runner import Outcome, execute_job

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

TRAIN = ["--dataset", HELD, "--method", "dpsgd", "--epsilon", "2", "--delta", "1e-5"]
TRAIN_BODY = {"dataset": HELD, "method": "dpsgd", "epsilon": 2, "delta": 1e-5,
              "dpsgd": {"epochs": 1, "batch_size": 50}}  # fmt: skip
EVALUATE = ["--evaluate", "accuracy, auc", "--evaluate-epsilon", "0.5"]


def _entries(settings: Any) -> int:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        return int(s.scalar(select(func.count()).select_from(LedgerEntry)) or 0)


def test_the_flags_name_every_field_of_the_evaluate_block() -> None:
    """One --evaluate* flag per field the API declares for ``evaluate``, no other."""
    from enclave.jobs_cli import _evaluate_block

    block = _evaluate_block("accuracy,auc", 0.5, 1e-6, "gaussian", 0.9, 1)
    assert set(block) == set(TrainingEvaluation.model_fields)
    TrainingEvaluation.model_validate(block)
    assert _evaluate_block(None, None, None, None, None, None) == {}


@SQLITE
def test_quote_submit_and_download_a_trained_and_evaluated_job(
    live: str, keys: Keys, settings: Any, tmp_path: Path
) -> None:
    _register_held(settings)
    before = _entries(settings)
    q = jobs(live, keys.alice, "quote", *TRAIN, *EVALUATE)
    assert q.exit_code == 0, q.output + q.stderr
    assert "evaluation ε, δ" in q.output and "accuracy, auc of sample 0 on" in q.output
    assert "training ε, δ" in q.output and "admitted" in q.output
    assert _entries(settings) == before  # a quote charges nothing
    # The same request over HTTP: the CLI's quote is of exactly this body.
    body = {**TRAIN_BODY, "evaluate": {"metrics": ["accuracy", "auc"], "epsilon": 0.5}}
    plan = httpx.post(f"{live}/v1/quote", json=body, headers=auth(keys.alice)).json()["plan"]
    assert plan["evaluation"]["epsilon"] == 0.5
    assert [m["metric"] for m in plan["evaluation"]["metrics"]] == ["accuracy", "auc"]

    # A --body file's evaluate block, with flags on top of its fields.
    file = tmp_path / "request.json"
    file.write_text(json.dumps({**TRAIN_BODY, "evaluate": {"epsilon": 0.3, "metrics": ["auc"]}}))
    s = jobs(
        live, keys.alice, "submit", "--body", str(file),
        "--evaluate-epsilon", "0.5", "--evaluate-delta", "1e-6", "--evaluate-noise", "gaussian",
        "--evaluate-confidence", "0.9",
    )  # fmt: skip
    assert s.exit_code == 0, s.output + s.stderr
    assert "(training and evaluation)" in s.output
    job_id = s.output.strip().splitlines()[-1]
    assert _entries(settings) == before + 1  # one charge for both
    job = httpx.get(f"{live}/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    sent = job["request"]["evaluate"]
    assert (sent["metrics"], sent["epsilon"], sent["delta"]) == (["auc"], 0.5, 1e-6)
    assert (sent["noise"], sent["confidence"], sent["sample"]) == ("gaussian", 0.9, 0)
    evaluation = job["plan"]["evaluation"]
    assert evaluation["noise"] == "gaussian" and evaluation["delta"] == 1e-6
    assert job["plan"]["epsilon"] == pytest.approx(evaluation["training_epsilon"] + 0.5)

    assert execute_job(job_id, settings) == Outcome.released
    out = tmp_path / "release"
    d = jobs(live, keys.alice, "download", job_id, "--out", str(out))
    assert d.exit_code == 0, d.output + d.stderr
    assert f"Private evaluation of job {job_id}" in d.output and "auc" in d.output
    card = json.loads((out / "card.json").read_text())
    assert card["evaluation"]["job_id"] == job_id and list(card["evaluation"]["metrics"]) == ["auc"]


@SQLITE
def test_bad_evaluate_values_are_the_apis_problem_and_charge_nothing(
    live: str, keys: Keys, settings: Any
) -> None:
    _register_held(settings)
    before = _entries(settings)
    invalid, unplannable = "error: Invalid request: ", "error: Request cannot be planned: "
    metric = ["--evaluate", "accuracy", "--evaluate-epsilon", "0.5"]
    refusals = {
        # Values the request's schema refuses (422 invalid-request), the field named.
        ("--evaluate", "precision", "--evaluate-epsilon", "0.5"): (invalid, "evaluate.metrics.0"),
        ("--evaluate", "accuracy", "--evaluate-epsilon", "-1"): (invalid, "evaluate.epsilon"),
        (*metric, "--evaluate-confidence", "1.5"): (invalid, "evaluate.confidence"),
        (*metric, "--evaluate-noise", "cauchy"): (invalid, "evaluate.noise"),
        ("--evaluate", "accuracy,accuracy", "--evaluate-epsilon", "0.5"): (invalid, "each metric"),
        (*metric, "--evaluate-sample", "1"): (invalid, "evaluate.sample 1"),
        # Values the plan refuses (422 invalid-plan), saying why.
        ("--evaluate", "auc", "--evaluate-epsilon", "0.5", "--evaluate-noise", "gaussian"): (
            unplannable,
            "Gaussian noise needs delta > 0",
        ),
    }
    for command in ("quote", "submit"):
        for flags, (title, why) in refusals.items():
            line = one_error_line(jobs(live, keys.alice, command, *TRAIN, *flags))
            assert line.startswith(title) and why in line, (flags, line)
        # A dataset without a holdout: the API's 422, naming the dataset.
        toy = ["--dataset", "toy", *TRAIN[2:], *EVALUATE]
        line = one_error_line(jobs(live, keys.alice, command, *toy))
        assert line.startswith(unplannable) and "'toy' has no evaluation holdout" in line, line
        # No ε for the evaluation: the CLI's own error, before any request.
        line = one_error_line(jobs(live, keys.alice, command, *TRAIN, "--evaluate", "accuracy"))
        assert "--evaluate-epsilon" in line
    assert _entries(settings) == before
