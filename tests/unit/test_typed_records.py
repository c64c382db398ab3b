"""Plans and model cards are typed (issue 26) without changing a byte of what is stored.

A plan's ``model``, ``event`` and ``mechanism`` and a card's ``model``, ``mechanism`` and
``privacy.event`` are documented as typed unions (service/schemas/events.py, each method's
mechanism model) and validated against them, while the stored JSON is kept as it is. For
every kind of plan the service builds (DP-SGD's schedules and engines, both ExpM samplers,
ExpM+NF, every selection kind, train then evaluate, evaluation jobs): the plan validates
and serialises back to the same bytes, and each typed part, parsed into its model and
written back, gives the same JSON (keys, values and int/float types), so the models
describe what is really stored. The card the worker writes for each method validates the
same way. Old plans (before keys were added) still validate; malformed ones are refused.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from service.datasets.kinds import load_schema_yaml
from service.evaluations import plan_evaluation_job, training_part, with_evaluation
from service.methods import METHODS
from service.modelspec import ModelSpec
from service.plans import plan_for_dataset
from service.privacy.events import EVENT_TYPES
from service.schemas import TRAINING_METHODS, JobRequest, ModelCard, PrivacyPlan, method_names
from service.schemas import common as schemas_common
from service.schemas.evaluations import EvaluationMechanism, EvaluationMetricPlan, PlanEvaluation
from service.schemas.events import DpEventJson
from service.schemas.jobs import PLAN_MECHANISMS
from service.schemas.releases import CARD_MECHANISMS, NoModel
from service.selection.api_bodies import SelectionRequest, job_request, plan_selection_job

ROOT = Path(__file__).resolve().parents[2]
N_ROWS = 30_000

QUOTES: dict[str, dict[str, Any]] = {
    "dpsgd constant": {"method": "dpsgd", "epsilon": 1.0, "delta": 1e-5, "dpsgd": {"epochs": 1}},
    "dpsgd pld decaying": {
        "method": "dpsgd",
        "epsilon": 1.0,
        "delta": 1e-5,
        "dpsgd": {
            "epochs": 2,
            "accountant": "pld",
            "noise_schedule": "exponential",
            "noise_decay": 0.8,
        },
    },
    "dpsgd jl": {
        "method": "dpsgd",
        "epsilon": 1.0,
        "delta": 1e-5,
        "dpsgd": {"epochs": 1, "engine": "jl", "jl_projections": 8},
    },
    "dpsgd ghost relu mlp": {
        "method": "dpsgd",
        "epsilon": 1.0,
        "delta": 1e-5,
        "model": {"kind": "mlp", "hidden": [8], "activation": "relu"},
        "dpsgd": {"epochs": 1, "engine": "ghost"},
    },
    "dpsgd grud": {
        "dataset": "icu",
        "method": "dpsgd",
        "epsilon": 1.0,
        "delta": 1e-5,
        "model": {"kind": "grud", "hidden": 8},
        "dpsgd": {"epochs": 1},
    },
    "expm langevin": {"method": "expm", "epsilon": 1.0, "delta": 1e-5},
    "expm mcmc, 2 samples": {
        "method": "expm",
        "epsilon": 1.0,
        "delta": 1e-5,
        "samples": 2,
        "expm": {"sampler": "mcmc"},
    },
    "expm_nf": {"method": "expm_nf", "epsilon": 0.5, "delta": 0.0},
    "expm_nf sylvester box": {
        "method": "expm_nf",
        "epsilon": 0.5,
        "delta": 0.0,
        "model": {"kind": "mlp", "hidden": [4]},
        "expm_nf": {"flow": "sylvester", "l2": 0, "domain_radius": 3.0},
    },
}

EVALUATE: dict[str, dict[str, Any]] = {
    "dpsgd, evaluated (laplace, every metric)": {
        "method": "dpsgd",
        "epsilon": 1.0,
        "delta": 1e-5,
        "dpsgd": {"epochs": 1},
        "evaluate": {
            "epsilon": 0.5,
            "metrics": ["accuracy", "auc", "log_loss", "calibration_error", "confusion"],
        },
    },
    "expm_nf, evaluated (gaussian)": {
        "method": "expm_nf",
        "epsilon": 0.5,
        "delta": 0.0,
        "evaluate": {"epsilon": 0.5, "delta": 1e-6, "noise": "gaussian", "metrics": ["auc"]},
    },
}
"""Train then evaluate (service/evaluations.py ``with_evaluation``): the plan's
``evaluation``, on a holdout of :data:`HOLDOUT_ROWS`."""
HOLDOUT_ROWS = 3_000

EVALUATIONS: dict[str, dict[str, Any]] = {
    "evaluation job (laplace, every metric)": {
        "epsilon": 1.0,
        "delta": 0.0,
        "evaluation": {
            "job_id": "8a1f",
            "sample": 0,
            "metrics": ["accuracy", "auc", "log_loss", "calibration_error", "confusion"],
            "noise": "laplace",
            "confidence": 0.95,
        },
    },
    "evaluation job (gaussian, sample 1)": {
        "epsilon": 0.5,
        "delta": 1e-6,
        "evaluation": {
            "job_id": "8a1f",
            "sample": 1,
            "metrics": ["auc", "confusion"],
            "noise": "gaussian",
            "confidence": 0.9,
        },
    },
}
"""Evaluation jobs (POST /v1/evaluations; service/evaluations.py ``plan_evaluation_job``):
the stored request's ``evaluation`` as ``evaluation_job_request`` writes it, on a holdout
of :data:`HOLDOUT_ROWS`."""

SELECTIONS: dict[str, dict[str, Any]] = {
    "architecture rs": {
        "kind": "architecture",
        "epsilon": 3.0,
        "delta": 1e-6,
        "space": {"depths": [1], "widths": [8, 16]},
        "search": {"algorithm": "rs", "trainings": 2},
        "training": {"epochs": 1, "batch_size": 256},
    },
    "architecture poisson runs": {
        "kind": "architecture",
        "epsilon": 3.0,
        "delta": 1e-6,
        "space": {"depths": [1], "widths": [8]},
        "search": {"algorithm": "rs"},
        "runs": {"kind": "poisson", "mu": 2.0, "max_runs": 6},
        "training": {"epochs": 1, "batch_size": 256},
    },
    "architecture expm_nf": {
        "kind": "architecture",
        "epsilon": 2.0,
        "delta": 1e-6,
        "method": "expm_nf",
        "space": {"depths": [1], "widths": [8]},
        "search": {"algorithm": "rs", "trainings": 2},
    },
    "hyperparameters decaying": {
        "kind": "hyperparameters",
        "epsilon": 3.0,
        "delta": 1e-5,
        "epochs": [1],
        "batch_sizes": [256],
        "noise_decays": [None, 0.9],
    },
    "features cfs_greedy": {"kind": "features", "epsilon": 1.0, "delta": 1e-6, "max_selected": 3},
    "features pafs": {
        "kind": "features",
        "epsilon": 3.0,
        "delta": 1e-6,
        "method": "pafs",
        "ga": {"population": 2, "generations": 1},
    },
}


@cache
def schema_of(name: str) -> dict[str, Any]:
    schema = load_schema_yaml((ROOT / f"examples/{name}/schema.yaml").read_text())
    return schema.model_dump(mode="json")


@cache
def planned(name: str) -> tuple[JobRequest, PrivacyPlan, dict[str, Any]]:
    """The request, the plan and the public schema, as the API's quote computes them."""
    if name in QUOTES:
        body = {"dataset": "adult", **QUOTES[name]}
        schema = schema_of(str(body["dataset"]))
        request = JobRequest.model_validate(body)
        return request, plan_for_dataset(request, n_rows=N_ROWS, public_schema=schema), schema
    if name in EVALUATE:
        schema = schema_of("adult")
        request = JobRequest.model_validate({"dataset": "adult", **EVALUATE[name]})
        training = plan_for_dataset(training_part(request), n_rows=N_ROWS, public_schema=schema)
        plan = with_evaluation(training, request, holdout_rows=HOLDOUT_ROWS, public_schema=schema)
        return request, plan, schema
    if name in EVALUATIONS:
        schema = schema_of("adult")
        body = {"dataset": "adult", "method": "evaluation", **EVALUATIONS[name]}
        request = JobRequest.model_validate(body)
        plan = plan_evaluation_job(request, holdout_rows=HOLDOUT_ROWS, public_schema=schema)
        return request, plan, schema
    schema = schema_of("adult")
    selection = SelectionRequest.model_validate({"dataset": "adult", **SELECTIONS[name]}).root
    request = job_request(selection, n_rows=N_ROWS, public_schema=schema)
    _, plan = plan_selection_job(request, n_rows=N_ROWS, public_schema=schema)
    return request, plan, schema


ALL = [*QUOTES, *EVALUATE, *EVALUATIONS, *SELECTIONS]


def sorted_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def typed_round_trip(adapter: TypeAdapter[Any], value: dict[str, Any]) -> str:
    """The value parsed into its typed model and written back (only the keys it had)."""
    return sorted_json(adapter.dump_python(adapter.validate_python(value), exclude_unset=True))


def plan_mechanism_model(plan: PrivacyPlan) -> type[BaseModel]:
    parsed = PLAN_MECHANISMS[plan.method].validate_python(plan.mechanism)
    assert isinstance(parsed, BaseModel)
    return type(parsed)


@pytest.mark.parametrize("name", ALL)
def test_a_plan_validates_and_serialises_to_the_same_bytes(name: str) -> None:
    _, plan, _ = planned(name)
    stored = plan.model_dump_json()
    again = PrivacyPlan.model_validate(json.loads(stored))
    assert again.model_dump_json() == stored
    assert again.model_dump(mode="json") == json.loads(stored)


@pytest.mark.parametrize("name", ALL)
def test_each_typed_part_of_a_plan_round_trips_through_its_model(name: str) -> None:
    _, plan, _ = planned(name)
    stored = json.loads(plan.model_dump_json())
    mechanism = PLAN_MECHANISMS[plan.method]
    assert typed_round_trip(mechanism, stored["mechanism"]) == sorted_json(stored["mechanism"])
    events = TypeAdapter(DpEventJson)
    assert typed_round_trip(events, stored["event"]) == sorted_json(stored["event"])
    models = TypeAdapter(ModelSpec)
    assert typed_round_trip(models, stored["model"]) == sorted_json(stored["model"])


@pytest.mark.parametrize("name", EVALUATE)
def test_a_plans_evaluation_round_trips_through_its_model(name: str) -> None:
    """The typed ``evaluation`` has exactly the keys with_evaluation writes (the metrics'
    too: every MetricPlan field, null where it does not apply) and round-trips through
    PlanEvaluation; a plan without ``evaluate`` has none."""
    stored = json.loads(planned(name)[1].model_dump_json())["evaluation"]
    assert set(PlanEvaluation.model_fields) == set(stored)
    for metric in stored["metrics"]:
        assert set(EvaluationMetricPlan.model_fields) == set(metric)
    adapter = TypeAdapter(PlanEvaluation)
    assert typed_round_trip(adapter, stored) == sorted_json(stored)
    assert "evaluation" not in json.loads(planned("dpsgd constant")[1].model_dump_json())


def test_a_malformed_plan_evaluation_is_refused() -> None:
    stored = json.loads(planned("dpsgd, evaluated (laplace, every metric)")[1].model_dump_json())
    evaluation = stored["evaluation"]
    metric = evaluation["metrics"][0]
    for bad in (
        {k: v for k, v in evaluation.items() if k != "training_epsilon"},
        {**evaluation, "noise": "cauchy"},
        {**evaluation, "holdout_rows": "many"},
        {**evaluation, "metrics": [{**metric, "metric": "f1"}]},
        {**evaluation, "metrics": [{k: v for k, v in metric.items() if k != "scale"}]},
        [evaluation],
    ):
        with pytest.raises(ValidationError):
            PrivacyPlan.model_validate({**stored, "evaluation": bad})


def test_the_plans_cover_every_mechanism_model() -> None:
    seen = {plan_mechanism_model(planned(name)[1]).__name__ for name in ALL}
    assert seen == {
        "DpsgdMechanism",
        "ExpmLangevinMechanism",
        "ExpmMcmcMechanism",
        "ExpmNfMechanism",
        "SelectionMechanism",
        "EvaluationMechanism",
    }
    kinds = {planned(name)[1].mechanism["kind"] for name in SELECTIONS}
    assert kinds == {"architecture", "hyperparameters", "features"}
    event_types: set[str] = set()

    def walk(e: dict[str, Any]) -> None:
        event_types.add(e["type"])
        for child in e.get("events", [e["event"]] if "event" in e else []):
            walk(child)

    for name in ALL:
        walk(planned(name)[1].event)
    assert event_types == set(EVENT_TYPES)


def test_every_registered_method_has_a_typed_mechanism() -> None:
    methods = {method for method, _ in METHODS} | {"selection", "evaluation"}
    assert methods == set(method_names()) == set(PLAN_MECHANISMS) == set(CARD_MECHANISMS)


@pytest.mark.parametrize("name", EVALUATIONS)
def test_an_evaluation_jobs_mechanism_round_trips_through_its_model(name: str) -> None:
    """The typed mechanism of an evaluation job has exactly the keys plan_evaluation_job
    writes (the metrics' too) with their int/float types, and shares the public plan's
    model with a train-then-evaluate plan's ``evaluation``: the same keys, less the
    training's and the composition's, plus the evaluated job."""
    stored = json.loads(planned(name)[1].model_dump_json())["mechanism"]
    assert set(EvaluationMechanism.model_fields) == set(stored)
    for metric in stored["metrics"]:
        assert set(EvaluationMetricPlan.model_fields) == set(metric)
    assert typed_round_trip(TypeAdapter(EvaluationMechanism), stored) == sorted_json(stored)
    assert stored["evaluated_job"] == EVALUATIONS[name]["evaluation"]["job_id"]
    assert stored["sample"] == EVALUATIONS[name]["evaluation"]["sample"]
    trained = json.loads(planned(next(iter(EVALUATE)))[1].model_dump_json())["evaluation"]
    own = {"epsilon", "delta", "training_epsilon", "training_delta", "composition", "accountant"}
    assert set(trained) - own == set(stored) - {"evaluated_job"}


def test_a_malformed_evaluation_mechanism_is_refused() -> None:
    stored = json.loads(planned("evaluation job (laplace, every metric)")[1].model_dump_json())
    mechanism = stored["mechanism"]
    metric = mechanism["metrics"][0]
    for bad in (
        {k: v for k, v in mechanism.items() if k != "evaluated_job"},
        {k: v for k, v in mechanism.items() if k != "metrics"},
        {**mechanism, "sample": -1},
        {**mechanism, "holdout_rows": "many"},
        {**mechanism, "noise": "cauchy"},
        {**mechanism, "metrics": [{**metric, "metric": "f1"}]},
        {**mechanism, "metrics": [{k: v for k, v in metric.items() if k != "scale"}]},
        json.loads(planned("dpsgd constant")[1].model_dump_json())["mechanism"],
    ):
        with pytest.raises(ValidationError):
            PrivacyPlan.model_validate({**stored, "mechanism": bad})


def test_evaluation_plans_stored_before_later_keys_existed_still_validate() -> None:
    """The first evaluation jobs' plans (7f639b6): metrics without AUC's
    ``count_sensitivity_*`` and with propose-test-release's ``delta_bad`` (since
    removed) still validate and serialise to the same bytes."""
    stored = json.loads(planned("evaluation job (laplace, every metric)")[1].model_dump_json())
    later = {"count_sensitivity_l1", "count_sensitivity_l2"}
    metrics = [
        {**{k: v for k, v in m.items() if k not in later}, "delta_bad": None}
        for m in stored["mechanism"]["metrics"]
        if m["metric"] != "auc"
    ]
    old = {**stored, "mechanism": {**stored["mechanism"], "metrics": metrics}}
    assert PrivacyPlan.model_validate(old).model_dump_json() == json.dumps(
        old, ensure_ascii=False, separators=(",", ":")
    )


@pytest.mark.parametrize("model", [PrivacyPlan, ModelCard])
def test_the_document_names_the_mechanism_models_and_any_untyped_method(
    model: type[BaseModel],
) -> None:
    """oneOf the typed models when every job method has one; otherwise (a method added
    before its model) anyOf them and UntypedMechanism, whose methods the text names."""
    untyped = sorted(set(method_names()) - set(PLAN_MECHANISMS))
    field = model.model_json_schema(mode="serialization")["properties"]["mechanism"]
    members = field["anyOf" if untyped else "oneOf"]
    names = {m["$ref"].rsplit("/", 1)[1].replace("Card", "") for m in members}
    typed = {"DpsgdMechanism", "ExpmLangevinMechanism", "ExpmMcmcMechanism"}
    typed |= {"ExpmNfMechanism", "SelectionMechanism", "EvaluationMechanism"}
    assert names == (typed | {"UntypedMechanism"} if untyped else typed)
    assert all(m in field["description"] for m in untyped)


def test_every_event_type_has_a_model_with_the_fields_its_encoder_writes() -> None:
    from service.privacy.events import (
        AnyOfEvent,
        ComposedEvent,
        ExponentialMechanismEvent,
        PmfSlackEvent,
        PoissonSubsampledGaussianEvent,
        PureDpEvent,
        RandomStoppingEvent,
        SelfComposedEvent,
    )
    from service.privacy.tuning import TruncatedNegativeBinomialRuns

    leaf = PureDpEvent(epsilon=0.5)
    samples = [
        leaf,
        ExponentialMechanismEvent(epsilon=0.5),
        PoissonSubsampledGaussianEvent(sampling_rate=0.01, noise_multiplier=1.0, steps=3),
        PmfSlackEvent(tau=1e-9),
        ComposedEvent(events=(leaf, leaf)),
        SelfComposedEvent(event=leaf, count=2),
        AnyOfEvent(events=(leaf,)),
        RandomStoppingEvent(
            event=leaf, runs=TruncatedNegativeBinomialRuns(eta=1.0, gamma=0.1, max_runs=5)
        ),
    ]
    assert {type(e).TYPE for e in samples} == set(EVENT_TYPES)
    adapter = TypeAdapter(DpEventJson)
    for event in samples:
        as_json = event.to_json()
        parsed = adapter.validate_python(as_json)
        assert set(type(parsed).model_fields) == set(as_json), type(event).__name__
        assert typed_round_trip(adapter, as_json) == sorted_json(as_json)


@pytest.mark.parametrize(
    "broken",
    [
        {"type": "no_such_event", "version": 1},
        {"type": "pure_dp", "version": 1},  # epsilon missing
        {"type": "pure_dp", "version": 2, "epsilon": 1.0},  # a version this code cannot read
        {"type": "pure_dp", "version": 1, "epsilon": 1.0, "note": "x"},  # the decoder refuses it
        {"type": "composed", "version": 1, "events": [{"type": "pmf_slack", "version": 1}]},
        {"type": "self_composed", "version": 1, "event": {}, "count": 2},
    ],
)
def test_a_malformed_event_is_refused(broken: dict[str, Any]) -> None:
    _, plan, _ = planned("dpsgd constant")
    with pytest.raises(ValidationError):
        PrivacyPlan.model_validate({**json.loads(plan.model_dump_json()), "event": broken})


def test_a_mechanism_is_checked_against_its_plans_method() -> None:
    stored = json.loads(planned("dpsgd constant")[1].model_dump_json())
    langevin = json.loads(planned("expm langevin")[1].model_dump_json())
    missing = {k: v for k, v in stored["mechanism"].items() if k != "noise_multiplier"}
    for bad in (
        {**stored, "mechanism": missing},
        {**stored, "mechanism": {**stored["mechanism"], "steps": "many"}},
        {**stored, "mechanism": langevin["mechanism"]},  # an expm mechanism in a dpsgd plan
        {**langevin, "mechanism": {**langevin["mechanism"], "sampler": "gibbs"}},
        {**stored, "model": {"kind": "transformer"}},
    ):
        with pytest.raises(ValidationError):
            PrivacyPlan.model_validate(bad)


def test_a_method_without_a_model_keeps_its_mechanism_if_it_is_an_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A method in the tables with no mechanism model (tests/unit/test_method_registry.py's
    dummy; a method added before its model) keeps any object, as before typing."""
    monkeypatch.setattr(schemas_common, "TRAINING_METHODS", [*TRAINING_METHODS, "dummy"])
    stored = json.loads(planned("dpsgd constant")[1].model_dump_json())
    mechanism = {"steps": 7, "anything": [1, {"x": None}]}
    plan = PrivacyPlan.model_validate({**stored, "method": "dummy", "mechanism": mechanism})
    assert plan.mechanism == mechanism and plan.mechanism is not mechanism
    with pytest.raises(ValidationError):
        PrivacyPlan.model_validate({**stored, "method": "dummy", "mechanism": [mechanism]})


def test_plans_stored_before_later_keys_existed_still_validate() -> None:
    """The first plans' shapes (git history: the DP-SGD mechanism of the first commit, an
    ExpM+NF mechanism without ``calibration``), with keys added later left out."""
    stored = json.loads(planned("dpsgd constant")[1].model_dump_json())
    first = ("epochs", "batch_size", "max_grad_norm", "learning_rate", "accountant")
    first += ("sampling_rate", "steps_per_epoch", "steps", "noise_multiplier")
    old_dpsgd = {**stored, "mechanism": {k: stored["mechanism"][k] for k in first}}
    nf = json.loads(planned("expm_nf")[1].model_dump_json())
    old_nf = {**nf, "mechanism": {k: v for k, v in nf["mechanism"].items() if k != "calibration"}}
    for old in (old_dpsgd, old_nf):
        again = json.loads(PrivacyPlan.model_validate(old).model_dump_json())
        assert again == old and list(again["mechanism"]) == list(old["mechanism"])


def card_of(
    name: str,
    selection: dict[str, Any] | None = None,
    evaluation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The card the worker writes for this plan (worker/release.py), as stored (JSON)."""
    from worker.release import model_card

    _, plan, schema = planned(name)
    card = model_card(
        job_id="job",
        run_token="token",
        plan=plan,
        public_schema=schema,
        count_epsilon=0.1,
        weights_sha256="0" * 64,
        samples=plan.samples,
        selection=selection,
        evaluation=evaluation,
    )
    return json.loads(json.dumps(card, sort_keys=True))


def selection_summary(model: dict[str, Any] | None) -> dict[str, object]:
    from worker.mechanisms.candidates import SelectionOutput
    from worker.mechanisms.model_selection import released_summary

    output = SelectionOutput(
        selected=None, model=model, weights=None, noisy_accuracy=0.75, trainings=2
    )
    return released_summary(output)


def test_a_card_written_by_the_worker_for_each_method_validates() -> None:
    cards = {name: card_of(name) for name in QUOTES}
    mlp = {"kind": "mlp", "hidden": [8], "activation": "tanh"}
    cards["selection"] = card_of("architecture rs", selection_summary(mlp))
    cards["selection, no model"] = card_of("hyperparameters decaying", selection_summary(None))
    # What the card's `evaluation` holds is not this test's concern (worker/evaluation_job.py
    # release_json); its mechanism is.
    for name in EVALUATIONS:
        cards[name] = card_of(name, evaluation={"job_id": "8a1f", "sample": 0, "metrics": {}})
    assert {c["mechanism"]["method"] for c in cards.values()} == set(CARD_MECHANISMS)
    for name, card in cards.items():
        parsed = ModelCard.model_validate(card)
        assert sorted_json(parsed.model_dump(mode="json")) == sorted_json(card), name
        adapter = CARD_MECHANISMS[card["mechanism"]["method"]]
        assert typed_round_trip(adapter, card["mechanism"]) == sorted_json(card["mechanism"])
    assert cards["selection, no model"]["model"] == {}
    NoModel.model_validate(cards["selection, no model"]["model"])
    broken = {**cards["expm_nf"], "mechanism": {**cards["expm_nf"]["mechanism"], "layers": "x"}}
    with pytest.raises(ValidationError):
        ModelCard.model_validate(broken)


def test_the_openapi_document_types_the_plan_and_the_card(tmp_path: Path) -> None:
    """/openapi.json: events discriminated on "type" (every registered type, recursively),
    models on "kind", mechanisms as the union of their models; no free-form object left in
    these fields."""
    from service.app import create_app
    from service.config import Settings

    app = create_app(Settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'x.sqlite'}"))
    schemas = app.openapi()["components"]["schemas"]
    plan, card = schemas["PrivacyPlan"]["properties"], schemas["ModelCard"]["properties"]
    privacy = schemas["CardPrivacy"]["properties"]
    for event in (
        plan["event"],
        privacy["event"],
        *[
            schemas[name]["properties"]["events"]["items"]
            for name in ("ComposedEventJson", "AnyOfEventJson")
        ],
    ):
        assert event["discriminator"]["propertyName"] == "type"
        assert set(event["discriminator"]["mapping"]) == set(EVENT_TYPES)
    assert plan["model"]["discriminator"]["propertyName"] == "kind"
    for field, prefix in ((plan["mechanism"], ""), (card["mechanism"], "Card")):
        members = field.get("oneOf", field.get("anyOf"))
        refs = {m["$ref"].rsplit("/", 1)[1] for m in members}
        assert f"Dpsgd{prefix}Mechanism" in refs and f"Selection{prefix}Mechanism" in refs
        assert "additionalProperties" not in field
    evaluation = plan["evaluation"]["anyOf"]
    assert evaluation == [{"$ref": "#/components/schemas/PlanEvaluation"}, {"type": "null"}]
    metrics = schemas["PlanEvaluation"]["properties"]["metrics"]["items"]
    assert metrics == {"$ref": "#/components/schemas/EvaluationMetricPlan"}
