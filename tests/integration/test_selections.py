"""Selection jobs (issue 10) through the API and the worker, on real databases: the quote
is the charge, the ledger records the plan's event, refusals charge nothing, and both
kinds run end to end to a release whose card states the whole workflow's guarantee."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from service.db import engine_for, transaction
from service.ledger.tables import LedgerEntry
from service.privacy.amounts import curve_to_micro_up
from service.privacy.events import event_from_json
from service.privacy.orders import ORDERS
from service.privacy.rdp import epsilon_from_rdp
from service.releases import load_release, predict_proba
from service.selection.plans import ArchitectureRequest, SelectionBudget, architecture_plan
from tests.conftest import auth
from worker.runner import Outcome, execute_job

ARCH = {
    "dataset": "toy",
    "kind": "architecture",
    "epsilon": 3.0,
    "delta": 1e-6,
    "space": {"depths": [1], "widths": [2, 4]},
    "search": {"algorithm": "rs", "trainings": 2},
    "training": {"epochs": 1, "batch_size": 50},
}
HYPER = {
    "dataset": "toy",
    "kind": "hyperparameters",
    "epsilon": 3.0,
    "delta": 1e-6,
    "model": {"kind": "mlp", "hidden": [4]},
    "learning_rates": [0.5, 2.0],
    "batch_sizes": [50],
    "epochs": [1],
    # K ≥ 1 always (truncated at 0), E[K] = 1/0.9 ≈ 1.1: the test trains about once.
    "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.9},
}


def _charges(settings: Any) -> list[LedgerEntry]:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        rows = s.scalars(
            select(LedgerEntry).where(LedgerEntry.kind == "charge", LedgerEntry.job_id.is_not(None))
        ).all()
        s.expunge_all()
        return list(rows)


def _problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["type"].endswith(slug), body
    return body


@pytest.mark.parametrize("body", [ARCH, HYPER], ids=["architecture", "hyperparameters"])
def test_quote_is_the_charge_and_charges_nothing(
    client: Any, keys: Any, settings: Any, body: Any
) -> None:
    q = client.post("/v1/selections/quote", json=body, headers=auth(keys.alice))
    assert q.status_code == 200, q.text
    quote = q.json()
    assert quote["admitted"] is True and _charges(settings) == []
    plan = quote["plan"]
    assert plan["method"] == "selection" and plan["guarantee"] == "proven"
    # The stated ε is the charged curve at δ, within what was asked; the per-training ε
    # was calibrated so the whole workflow fits (bisection: it uses nearly all of it).
    assert plan["epsilon"] == pytest.approx(quote["charged_epsilon"])
    assert 0.9 * body["epsilon"] < plan["epsilon"] <= body["epsilon"]
    stages = plan["mechanism"]["stages"]
    assert stages["fitness"]["epsilon"] == 0.1 and stages["training"]["epsilon"] > 0
    if body["kind"] == "architecture":
        assert plan["mechanism"]["trainings"] == 2 and plan["mechanism"]["runs"] is None
    else:
        assert plan["mechanism"]["trainings"] is None
        assert plan["mechanism"]["runs"]["kind"] == "truncated_negative_binomial"

    r = client.post("/v1/selections", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["method"] == "selection" and job["status"] == "queued"
    assert job["plan"] == plan
    after = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    assert after == quote["dataset_after"]
    assert len(_charges(settings)) == 1


def test_the_ledger_records_the_searchs_cost(client: Any, keys: Any, settings: Any) -> None:
    """Cost of a search = what the ledger records: the entry's event is the plan's, and its
    RDP charge is that event's curve, which is N × (training + noisy score) computed here
    independently from i10b's planner with the calibrated per-training ε."""
    job = client.post(
        "/v1/selections", json={**ARCH, "training_epsilon": 1.0}, headers=auth(keys.alice)
    ).json()
    (entry,) = _charges(settings)
    assert entry.job_id == job["id"]
    assert entry.event == job["plan"]["event"]
    request = ArchitectureRequest.model_validate(
        {k: ARCH[k] for k in ("space", "search", "training")}
        | {"budget": SelectionBudget(training_epsilon=1.0, training_delta=1e-6)}
    )
    n_train_plan = architecture_plan(
        request, dataset="toy", n_rows=job["plan"]["n_rows"], n_features=5
    )
    assert n_train_plan.event.to_json() == entry.event
    curve = n_train_plan.event.rdp(ORDERS)
    assert entry.rdp_micro == curve_to_micro_up(curve)
    # Two trainings and two scores composed: twice one candidate's curve.
    one = event_from_json(entry.event["event"]).rdp(ORDERS)  # type: ignore[index]
    assert entry.event["count"] == 2  # type: ignore[index]
    np.testing.assert_allclose(curve, 2 * np.asarray(one), rtol=1e-12)
    assert job["epsilon"] == pytest.approx(
        epsilon_from_rdp(rdp=curve, orders=ORDERS, delta=ARCH["delta"])
    )


def test_over_budget_is_refused_and_charges_nothing(client: Any, keys: Any, settings: Any) -> None:
    # The toy dataset's budget is ε = 10: a workflow of ε ≈ 40 cannot fit.
    body = {**ARCH, "epsilon": 40.0}
    q = client.post("/v1/selections/quote", json=body, headers=auth(keys.alice)).json()
    assert q["admitted"] is False and q["reason"]
    _problem(
        client.post("/v1/selections", json=body, headers=auth(keys.alice)), 409, "budget-exceeded"
    )
    assert _charges(settings) == []


@pytest.mark.parametrize(
    ("change", "slug"),
    [
        ({"kind": "features_typo"}, "validation-error"),
        ({"space": {"depths": [1], "widths": [0]}}, "validation-error"),
        ({"search": {"algorithm": "exhaustive"}}, "validation-error"),
        ({"delta": 0}, "validation-error"),
        # More privacy settings than the planner calibrates in reasonable time.
        (
            {"space": {"depths": [1], "widths": [2], "batch_sizes": list(range(10, 100, 10))}},
            "validation-error",
        ),
        # Random stopping is for random search only (the kind request's own check).
        (
            {"runs": {"kind": "poisson", "mu": 3}, "search": {"algorithm": "paas"}},
            "invalid-plan",
        ),
        # An explicit per-training ε whose workflow exceeds the stated ε.
        ({"training_epsilon": 5.0}, "invalid-plan"),
        # Too small a total ε for any calibratable training.
        ({"epsilon": 0.01}, "invalid-plan"),
    ],
)
def test_bad_input_is_422_and_charges_nothing(
    client: Any, keys: Any, settings: Any, change: Any, slug: str
) -> None:
    body = {**ARCH, **change}
    _problem(client.post("/v1/selections/quote", json=body, headers=auth(keys.alice)), 422, slug)
    _problem(client.post("/v1/selections", json=body, headers=auth(keys.alice)), 422, slug)
    assert _charges(settings) == []


def test_unknown_dataset_is_404(client: Any, keys: Any) -> None:
    _problem(
        client.post("/v1/selections", json={**ARCH, "dataset": "nope"}, headers=auth(keys.alice)),
        404,
        "not-found",
    )


def test_selection_method_is_not_a_training_job(client: Any, keys: Any, settings: Any) -> None:
    body = {
        "dataset": "toy",
        "method": "selection",
        "epsilon": 1.0,
        "delta": 1e-6,
        "selection": {"kind": "architecture", "request": {}},
    }
    _problem(client.post("/v1/jobs", json=body, headers=auth(keys.alice)), 422, "invalid-plan")
    assert _charges(settings) == []


def test_idempotent_replay_and_refunded_cancel(client: Any, keys: Any, settings: Any) -> None:
    h = {**auth(keys.alice), "Idempotency-Key": "sel-1"}
    first = client.post("/v1/selections", json=ARCH, headers=h)
    again = client.post("/v1/selections", json=ARCH, headers=h)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and len(_charges(settings)) == 1
    before = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    job_id = first.json()["id"]
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(keys.alice))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    after = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()["budget"]
    assert after["remaining_epsilon"] > before["remaining_epsilon"]  # refunded
    assert [j["id"] for j in client.get("/v1/jobs", headers=auth(keys.alice)).json()] == [job_id]


def _run_and_fetch(client: Any, keys: Any, settings: Any, body: Any) -> tuple[dict, dict, bytes]:
    r = client.post("/v1/selections", json=body, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert execute_job(job_id, settings) == Outcome.released
    job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
    assert job["status"] == "released"
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice)).json()
    w = client.get(f"/v1/jobs/{job_id}/release/weights", headers=auth(keys.alice))
    assert w.status_code == 200
    return job, card, w.content


def _check_card_privacy(job: dict, card: dict) -> None:
    privacy = card["privacy"]
    assert privacy["epsilon"] == job["plan"]["epsilon"] <= job["request"]["epsilon"]
    assert privacy["delta"] == job["plan"]["delta"]
    assert privacy["guarantee"] == "proven" and privacy["accountant"] == "rdp"
    assert privacy["event"] == job["plan"]["event"]
    assert "whole selection workflow" in privacy["statement"]
    assert card["mechanism"]["method"] == "selection"


def test_architecture_selection_end_to_end(client: Any, keys: Any, settings: Any) -> None:
    job, card, weights = _run_and_fetch(client, keys, settings, ARCH)
    assert job["progress_step"] == job["progress_total"] == 2  # "k of T" over trainings
    _check_card_privacy(job, card)
    selected = card["selection"]["selected"]
    assert selected["hidden"] in ([2], [4]) and card["model"]["hidden"] == selected["hidden"]
    assert isinstance(card["selection"]["noisy_validation_accuracy"], float)
    assert set(card["selection"]) == {"selected", "model", "noisy_validation_accuracy"}
    release = load_release(weights, card)
    p = predict_proba(release, np.random.default_rng(0).uniform(size=(3, 5)))
    assert p.shape == (3,) and np.all((p >= 0) & (p <= 1))


def test_hyperparameter_selection_end_to_end_hides_k(client: Any, keys: Any, settings: Any) -> None:
    job, card, weights = _run_and_fetch(client, keys, settings, HYPER)
    # K is secret (Papernot–Steinke): progress is 0 of 1 → 1 of 1, never k of K.
    assert job["progress_step"] == job["progress_total"] == 1
    assert job["plan"]["mechanism"]["trainings"] is None
    _check_card_privacy(job, card)
    selected = card["selection"]["selected"]
    assert selected["learning_rate"] in (0.5, 2.0) and selected["batch_size"] == 50
    assert card["model"] == {**card["model"], "hidden": [4]}
    assert "trainings" not in card["selection"] and card["samples"] == 1
    assert load_release(weights, card).card["weights_sha256"] == card["weights_sha256"]


def test_report_noisy_max_charges_one_score_not_n(client: Any, keys: Any) -> None:
    body = {**ARCH, "training_epsilon": 1.0, "search": {"algorithm": "rs", "trainings": 4}}

    def charged(extra: dict[str, Any]) -> float:
        q = client.post("/v1/selections/quote", json={**body, **extra}, headers=auth(keys.alice))
        assert q.status_code == 200, q.text
        return float(q.json()["charged_epsilon"])

    assert charged({"scoring": "report_noisy_max"}) < charged({})


FEATURES = {
    "dataset": "toy",
    "kind": "features",
    "epsilon": 2.0,
    "delta": 1e-6,
    "method": "cfs_greedy",
    "numeric_bins": 4,
    "max_selected": 2,
}


def test_feature_selection_cfs_end_to_end(client: Any, keys: Any, settings: Any) -> None:
    """DP-CFS: one charge for the noisy histograms (the whole (ε, δ)), no trainings, the
    selected columns released, no weights."""
    q = client.post("/v1/selections/quote", json=FEATURES, headers=auth(keys.alice)).json()
    assert q["plan"]["mechanism"]["trainings"] == 0
    assert set(q["plan"]["mechanism"]["stages"]) == {"statistics"}
    assert q["plan"]["epsilon"] <= FEATURES["epsilon"]
    job, card, _ = _run_and_fetch(client, keys, settings, FEATURES)
    (entry,) = _charges(settings)
    assert entry.event == job["plan"]["event"] == card["privacy"]["event"]
    _check_card_privacy(job, card)
    selected = card["selection"]["selected"]
    assert selected["method"] == "cfs_greedy"
    assert 1 <= len(selected["features"]) <= 2 and set(selected["features"]) <= {"a", "b", "c"}
    assert card["samples"] == 0 and card["model"] == {}


def test_feature_selection_pafs_is_calibrated_to_the_workflow(client: Any, keys: Any) -> None:
    body = {
        **FEATURES,
        "method": "pafs",
        "ga": {"population": 2, "generations": 1},
        "model": {"kind": "mlp", "hidden": [2]},
        "training": {"epochs": 1, "batch_size": 50},
    }
    q = client.post("/v1/selections/quote", json=body, headers=auth(keys.alice))
    assert q.status_code == 200, q.text
    plan = q.json()["plan"]
    assert plan["mechanism"]["trainings"] == 2
    assert 0.9 * body["epsilon"] < plan["epsilon"] <= body["epsilon"]
    cfs_with_training = {**FEATURES, "training_epsilon": 1.0}
    _problem(
        client.post("/v1/selections/quote", json=cfs_with_training, headers=auth(keys.alice)),
        422,
        "invalid-plan",
    )


def test_a_tampered_selection_is_refused_before_data(client: Any, keys: Any, settings: Any) -> None:
    """The worker re-derives the selection's plan from the stored request and refuses a
    mismatch before opening the data (here: a larger per-training ε than was charged)."""
    from sqlalchemy import update

    from service.ledger.tables import Job
    from worker.runner import PLAN_FAILURE

    job = client.post("/v1/selections", json=ARCH, headers=auth(keys.alice)).json()
    request = job["request"]
    request["selection"]["request"]["budget"]["training_epsilon"] *= 2
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        s.execute(update(Job).where(Job.id == job["id"]).values(request=request))
    assert execute_job(job["id"], settings) == Outcome.failed
    after = client.get(f"/v1/jobs/{job['id']}", headers=auth(keys.alice)).json()
    assert after["status"] == "failed" and after["error"] == PLAN_FAILURE
    with transaction(engine) as s:
        assert s.get_one(Job, job["id"]).data_touched is False


@pytest.mark.parametrize("body", [ARCH, HYPER], ids=["architecture", "hyperparameters"])
def test_a_selection_over_the_work_limit_is_refused_and_charges_nothing(
    client: Any, keys: Any, settings: Any, body: Any, monkeypatch: Any
) -> None:
    # The same selection fits the default limit and not a 1 ms one: the estimate counts
    # every training (service/resources.py), at quote and at submission, before any charge.
    ok = client.post("/v1/selections/quote", json=body, headers=auth(keys.alice))
    assert ok.status_code == 200, ok.text
    monkeypatch.setattr(settings, "job_time_limit_s", 1e-3)
    before = client.get("/v1/datasets/toy", headers=auth(keys.alice)).json()
    for path in ("/v1/selections/quote", "/v1/selections"):
        problem = _problem(
            client.post(path, json=body, headers=auth(keys.alice)), 422, "invalid-plan"
        )
        assert "worker time" in problem["detail"]
    assert client.get("/v1/datasets/toy", headers=auth(keys.alice)).json() == before
    assert _charges(settings) == []


def test_selection_work_counts_trainings_the_cap_or_a_high_quantile(client: Any, keys: Any) -> None:
    from service.privacy.tuning import (
        RUNS_WORK_QUANTILE,
        TruncatedNegativeBinomialRuns,
        runs_quantile,
    )
    from service.resources import selection_estimate, selection_trainings
    from service.schemas import PrivacyPlan

    def plan_of(body: dict[str, Any]) -> PrivacyPlan:
        q = client.post("/v1/selections/quote", json=body, headers=auth(keys.alice))
        assert q.status_code == 200, q.text
        return PrivacyPlan.model_validate(q.json()["plan"])

    four = plan_of({**ARCH, "search": {"algorithm": "rs", "trainings": 4}})
    two = plan_of(ARCH)
    assert selection_trainings(four) == 4 and selection_trainings(two) == 2
    assert selection_estimate(four, n_features=5)[0] == pytest.approx(
        2 * selection_estimate(two, n_features=5)[0]
    )
    free = plan_of({**HYPER, "runs": {**HYPER["runs"], "gamma": 0.1}})
    law = TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.1)
    assert selection_trainings(free) == runs_quantile(law, RUNS_WORK_QUANTILE) > 10
    capped = plan_of({**HYPER, "runs": {**HYPER["runs"], "gamma": 0.1, "max_runs": 5}})
    assert capped.mechanism["runs"]["max_runs"] == 5
    assert capped.event["runs"]["max_runs"] == 5  # type: ignore[index]
    assert selection_trainings(capped) == 5


def test_random_stopping_architecture_search_hides_k(client: Any, keys: Any, settings: Any) -> None:
    body = {
        **ARCH,
        "search": {"algorithm": "rs"},
        "runs": {"kind": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.9},
    }
    job, card, _ = _run_and_fetch(client, keys, settings, body)
    assert job["plan"]["mechanism"]["trainings"] is None
    assert job["plan"]["mechanism"]["runs"]["kind"] == "truncated_negative_binomial"
    assert job["progress_step"] == job["progress_total"] == 1
    assert card["privacy"]["event"]["type"] == "random_stopping"
    assert set(card["selection"]) == {"selected", "model", "noisy_validation_accuracy"}


def test_feature_selection_cfs_with_a_final_model(client: Any, keys: Any, settings: Any) -> None:
    body = {
        **FEATURES,
        "epsilon": 3.0,
        "final": {
            "epsilon": 1.0,
            "delta": 1e-6,
            "model": {"kind": "logistic"},
            "training": {"epochs": 1, "batch_size": 50},
        },
    }
    job, card, weights = _run_and_fetch(client, keys, settings, body)
    stages = job["plan"]["mechanism"]["stages"]
    assert stages["statistics"]["epsilon"] == pytest.approx(2.0)
    assert stages["final"]["epsilon"] == 1.0
    _check_card_privacy(job, card)  # the composed workflow fits the stated ε = 3
    assert card["samples"] == 1 and card["model"]["kind"] == "logistic"
    release = load_release(weights, card)
    # The model reads the chosen columns' encoded inputs only, and the card names them.
    chosen = card["selection"]["selected"]["features"]
    inputs = card["preprocessing"]["model_inputs"]
    assert inputs and {name.split("=")[0] for name in inputs} == set(chosen)
    widths = {t.shape[-1] for t in release.tensors.values() if t.ndim == 2}
    assert widths == {len(inputs)}
    # Scoring takes the schema's full encoding and slices it to the model's inputs itself.
    from service.releases import input_columns

    cols = input_columns(release)
    assert cols is not None and [release.schema.feature_names[i] for i in cols] == inputs
    full = np.random.default_rng(0).random((7, release.schema.n_features))
    np.testing.assert_array_equal(
        predict_proba(release, full), predict_proba(release, full[:, cols])
    )
    with pytest.raises(ValueError, match="encoded features"):
        predict_proba(release, np.hstack([full, full[:, :1]]))  # neither width


EXPM_ARCH = {
    **ARCH,
    "method": "expm_nf",
    "expm_nf": {"steps": 3, "n_samples_per_step": 4, "batch_size": 8},
}


def test_expm_nf_candidates_are_nominal_need_the_switch_and_run(
    client: Any, keys: Any, settings: Any
) -> None:
    """Issue 10: architecture candidates trained by ExpM+NF. Each candidate is one flow
    sample of the exponential mechanism at the calibrated training ε (a pure event, the
    same for every model), composed with the noisy scores; the flow's ε is nominal, so the
    workflow is labelled nominal in the quote, the job and the card, and it needs the
    dataset's nominal switch (403, nothing charged, without it)."""
    admin = auth(keys.admin)
    client.put("/v1/admin/datasets/toy/nominal", json={"allow_nominal": False}, headers=admin)
    refused = client.post("/v1/selections", json=EXPM_ARCH, headers=auth(keys.alice))
    _problem(refused, 403, "nominal-not-allowed")
    q = client.post("/v1/selections/quote", json=EXPM_ARCH, headers=auth(keys.alice)).json()
    assert q["admitted"] is False and "nominal" in q["reason"]
    assert _charges(settings) == []
    client.put("/v1/admin/datasets/toy/nominal", json={"allow_nominal": True}, headers=admin)

    plan = client.post("/v1/selections/quote", json=EXPM_ARCH, headers=auth(keys.alice)).json()[
        "plan"
    ]
    assert plan["guarantee"] == "nominal"
    stages = plan["mechanism"]["stages"]
    assert stages["training"]["mechanism"] == "expm_nf" and stages["training"]["delta"] == 0.0
    assert plan["mechanism"]["candidates"] == [] and plan["mechanism"]["expm_nf"]["flow"]
    # The charge: 2 × (ExpM at the training ε + one noisy count), pure composition.
    event = event_from_json(plan["event"])
    per = event_from_json(plan["event"]["event"])  # type: ignore[arg-type]
    assert plan["event"]["count"] == 2
    eps_t, eps_f = stages["training"]["epsilon"], stages["fitness"]["epsilon"]
    assert per.pure_epsilon() == pytest.approx(eps_t + eps_f)
    assert event.pure_epsilon() == pytest.approx(2 * (eps_t + eps_f))

    job, card, weights = _run_and_fetch(client, keys, settings, EXPM_ARCH)
    assert job["guarantee"] == "nominal" and card["privacy"]["guarantee"] == "nominal"
    assert "nominal" in card["privacy"]["statement"]
    selected = card["selection"]["selected"]
    assert selected["hidden"] in ([2], [4]) and card["model"]["hidden"] == selected["hidden"]
    release = load_release(weights, card)
    p = predict_proba(release, np.random.default_rng(0).uniform(size=(3, 5)))
    assert p.shape == (3,) and np.all((p >= 0) & (p <= 1))


def test_an_expm_nf_search_too_large_for_the_worker_is_refused(client: Any, keys: Any) -> None:
    huge = {**EXPM_ARCH, "expm_nf": {"flow": "sylvester", "layers": 8,
            "n_samples_per_step": 4096, "batch_size": 100_000},
            "space": {"depths": [3], "widths": [256]}}  # fmt: skip
    r = client.post("/v1/selections/quote", json=huge, headers=auth(keys.alice))
    body = _problem(r, 422, "invalid-plan")
    assert "GiB" in body["detail"]
