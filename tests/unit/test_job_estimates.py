"""Every job kind the worker runs has a public time estimate (service/resources.py
``plan_resources``), so that the release hold's D (service/release_hold.py) is made from
it rather than one quantum: ExpM+NF, ExpM by MCMC, evaluations, train then evaluate, and
every selection kind (ExpM+NF candidates, random stopping, the features statistics).
Estimates read the plan and the public schema only: the same public facts give the same D,
and each grows with the public sizes it counts."""

from __future__ import annotations

import math
from typing import Any

import pytest

from service.datasets.kinds import parse_dataset_schema
from service.evaluations import plan_evaluation_job, with_evaluation
from service.plans import plan_for_dataset
from service.privacy.tuning import padded_runs, runs_distribution_from_json
from service.release_hold import HoldPolicy, plan_hold_seconds
from service.resources import evaluation_seconds, plan_resources, selection_trainings
from service.schemas import JobRequest, PrivacyPlan
from tests.plan_cases import N_ROWS, REQUESTS, adult_schema

# A policy whose quantum is far below every estimate: D is then the estimate's own power
# of two, never the quantum (which is what a plan without an estimate gets).
POLICY = HoldPolicy(factor=1.0, quantum_s=1e-3, time_limit_s=1e9)

EVALUATE = {"epsilon": 1.0, "metrics": ["accuracy", "log_loss", "auc"]}


def _quote_plan(body: dict[str, Any], *, n_rows: int = N_ROWS) -> PrivacyPlan:
    schema = adult_schema()
    request = JobRequest.model_validate({"dataset": schema["name"], **body})
    return plan_for_dataset(request, n_rows=n_rows, public_schema=schema)


def _selection_plan(body: dict[str, Any]) -> PrivacyPlan:
    from service.selection.api_bodies import SelectionRequest, job_request, plan_selection_job

    schema = adult_schema()
    selection = SelectionRequest.model_validate({"dataset": schema["name"], **body}).root
    request = job_request(selection, n_rows=N_ROWS, public_schema=schema)
    return plan_selection_job(request, n_rows=N_ROWS, public_schema=schema)[1]


def _evaluation_plan(holdout_rows: int, model: dict[str, Any] | None = None) -> PrivacyPlan:
    schema = adult_schema()
    request = JobRequest.model_validate(
        {
            "dataset": schema["name"],
            "method": "evaluation",
            "model": model or {"kind": "logistic"},
            "epsilon": 1.0,
            "delta": 0.0,
            "evaluation": {
                "job_id": "j",
                "sample": 0,
                "metrics": ["accuracy", "auc"],
                "noise": "laplace",
                "confidence": 0.95,
            },
        }
    )
    return plan_evaluation_job(request, holdout_rows=holdout_rows, public_schema=schema)


def _seconds(plan: PrivacyPlan) -> float:
    seconds = plan_resources(plan, schema=parse_dataset_schema(adult_schema())).seconds
    assert seconds is not None
    return seconds


def _hold(plan: PrivacyPlan) -> float:
    return plan_hold_seconds(plan.model_dump(mode="json"), adult_schema(), POLICY)


KINDS = ["expm mcmc", "expm_nf", "architecture expm_nf", "features cfs_greedy", "dpsgd rdp"]


@pytest.mark.parametrize("name", KINDS)
def test_each_kind_has_a_positive_finite_estimate_and_a_hold_above_one_quantum(
    name: str,
) -> None:
    endpoint, body = REQUESTS[name]
    plan = _quote_plan(body) if endpoint == "quote" else _selection_plan(body)
    seconds = _seconds(plan)
    assert 0 < seconds < math.inf
    assert _hold(plan) >= seconds > POLICY.quantum_s  # D covers the estimate


def test_expm_nf_estimate_counts_its_public_sizes() -> None:
    base = {"method": "expm_nf", "epsilon": 0.5, "delta": 0.0}
    short = _quote_plan({**base, "expm_nf": {"steps": 100}})
    long = _quote_plan({**base, "expm_nf": {"steps": 200}})
    wide = _quote_plan({**base, "expm_nf": {"steps": 100, "batch_size": 4096}})
    sylvester = _quote_plan({**base, "expm_nf": {"steps": 100, "flow": "sylvester"}})
    assert _seconds(short) < _seconds(long) and _seconds(short) < _seconds(wide)
    assert _seconds(short) < _seconds(sylvester)
    # the fidelity check's reference over n̂ rows: a larger public count, a longer estimate
    assert _seconds(short) < _seconds(
        _quote_plan({**base, "expm_nf": {"steps": 100}}, n_rows=2 * N_ROWS)
    )


def test_evaluation_estimate_is_the_public_holdout_size() -> None:
    small, large = _evaluation_plan(1000), _evaluation_plan(4000)
    assert 0 < _seconds(small) < _seconds(large) < math.inf
    assert _hold(small) > POLICY.quantum_s
    mlp = _evaluation_plan(1000, {"kind": "mlp", "hidden": [256, 256]})
    assert _seconds(mlp) > _seconds(small)


def test_train_then_evaluate_is_the_sum() -> None:
    train = {"method": "dpsgd", "epsilon": 1.0, "delta": 1e-5, "dpsgd": {"epochs": 1}}
    trained = _quote_plan(train)
    schema = adult_schema()
    request = JobRequest.model_validate({"dataset": schema["name"], **train, "evaluate": EVALUATE})
    both = with_evaluation(trained, request, holdout_rows=3000, public_schema=schema)
    assert both.evaluation is not None and both.evaluation["holdout_rows"] == 3000
    extra = evaluation_seconds(
        parse_model(trained), holdout_rows=3000, n_features=parse_dataset_schema(schema).n_features
    )
    assert _seconds(both) == pytest.approx(_seconds(trained) + extra, rel=1e-12)
    assert _hold(both) >= _hold(trained)


def parse_model(plan: PrivacyPlan) -> Any:
    from service.modelspec import MODEL_SPEC

    return MODEL_SPEC.validate_python(plan.model)


def test_random_stopping_counts_the_public_quantile_never_k() -> None:
    """A random-stopping selection's estimate counts K's public 99.9% quantile (or its cap):
    a function of K's public law, so every realised K below it gets the same D."""
    plan = _selection_plan(REQUESTS["hyperparameters tnb"][1])
    law = runs_distribution_from_json(plan.mechanism["runs"])
    assert selection_trainings(plan) == padded_runs(law) > 1
    one = plan.model_copy(update={"mechanism": {**plan.mechanism, "runs": None, "trainings": 1}})
    assert _seconds(plan) == pytest.approx(selection_trainings(plan) * _seconds(one), rel=1e-12)


def test_the_same_public_facts_give_the_same_hold() -> None:
    """The estimate's inputs are the plan and the public schema: two plans built from the
    same public facts (whatever private rows stand behind them) get the same D."""
    body = {"method": "expm_nf", "epsilon": 0.5, "delta": 0.0, "expm_nf": {"steps": 50}}
    a, b = _quote_plan(body), _quote_plan(body)
    assert a == b and _hold(a) == _hold(b)
