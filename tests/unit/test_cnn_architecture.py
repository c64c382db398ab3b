"""Architecture search over CNN spaces on image datasets (issue 20): the space the service
fits to an image dataset (the default there), the refusals across data kinds, the
extremes that bound every candidate's size and cost, the charge (the MLP search's
accounting, the same composition of the same kind of events), the quote's estimate and
its refusal, and a worker run on a binary image set."""

from __future__ import annotations

import re
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import torch

from service.datasets.kinds import load_schema_yaml
from service.methods.dpsgd import dpsgd_training_seconds
from service.modelspec import (
    CnnSpec,
    cnn_parameter_count,
    cnn_row_floats,
    cnn_row_macs,
)
from service.plans import PlanError, plan_for_dataset
from service.privacy.events import ComposedEvent, SelfComposedEvent, event_from_json
from service.privacy.sampling import count_event
from service.resources import ResourceLimits, plan_resources, resource_refusal
from service.schemas import DpsgdOptions, JobRequest
from service.selection.api_bodies import SelectionRequest, job_request, plan_selection_job
from service.selection.plans import (
    ArchitectureRequest,
    SelectionBudget,
    fit_to_dataset,
    plan_selection,
)
from service.selection.search_space import (
    ArchitectureCandidate,
    ArchitectureSearch,
    ArchitectureSpace,
)
from tests.plan_cases import N_ROWS, adult_schema
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.model_selection import released_summary, run_architecture_selection

REPO = Path(__file__).resolve().parents[2]
DIGITS: dict[str, Any] = load_schema_yaml(
    (REPO / "examples" / "digits" / "schema.yaml").read_text()
).model_dump(mode="json")
DIGITS_ROWS = 1797
BUDGET = SelectionBudget(training_epsilon=2.0, training_delta=1e-5, fitness_epsilon=0.5)


def _images(classes: int, size: int = 6) -> dict[str, Any]:
    """A public image schema (size × size, one channel) with ``classes`` classes."""
    return {
        **DIGITS,
        "name": "toy",
        "height": size,
        "width": size,
        "classes": [f"c{i}" for i in range(classes)],
    }


def _request(space: dict[str, Any], trainings: int = 3) -> ArchitectureRequest:
    return ArchitectureRequest(
        space=ArchitectureSpace.model_validate(space),
        search=ArchitectureSearch(algorithm="rs", trainings=trainings),
        training=DpsgdOptions(epochs=1, batch_size=128, learning_rate=1.0),
        budget=BUDGET,
    )


SPACE = {"depths": [1, 2], "widths": [2, 4], "kernels": [1, 3], "pools": ["none", "avg2"]}
COSTLY = {"depths": [1, 2], "widths": [2, 4], "kernels": [3], "pools": ["avg2"]}


def _fitted(space: dict[str, Any], schema: dict[str, Any]) -> ArchitectureRequest:
    fitted = fit_to_dataset("architecture", _request(space), schema)
    assert isinstance(fitted, ArchitectureRequest)
    return fitted


def test_an_image_dataset_gets_the_cnn_space_by_default_fitted_to_its_images() -> None:
    for space in ({}, {"model": "cnn"}):
        fitted = _fitted(space, DIGITS).space
        assert fitted.model == "cnn" and fitted.activations == ["relu"]
        assert fitted.image is not None and fitted.image.model_dump() == {
            "channels": 1,
            "height": 8,
            "width": 8,
        }
        assert fitted.classes == 10
        largest = fitted.largest()
        assert isinstance(largest, CnnSpec) and largest.classes == 10
    # binary images: one logit, no classes
    binary = _fitted({}, _images(2)).space
    assert binary.classes is None and binary.image is not None
    # a tabular dataset keeps the MLP space, dumped as before CNN spaces existed
    mlp = _fitted({}, adult_schema()).space
    assert mlp.model == "mlp"
    assert set(mlp.model_dump()) == {
        "model",
        "depths",
        "widths",
        "activations",
        "learning_rates",
        "batch_sizes",
    }
    assert ArchitectureCandidate(hidden=(4,), activation="tanh").model_dump() == {
        "hidden": (4,),
        "activation": "tanh",
        "learning_rate": None,
        "batch_size": None,
    }


@pytest.mark.parametrize(
    ("space", "schema", "text"),
    [
        ({"model": "cnn"}, "adult", "needs an image dataset; this dataset is tabular"),
        ({"model": "mlp"}, "digits", "searches CNNs (space.model 'cnn'"),
        (
            {"model": "grud", "depths": [1], "widths": [4]},
            "digits",
            "not space.model 'grud'",
        ),
        # 4 × 4 images: three 2 × 2 poolings leave an empty map
        ({"depths": [3], "pools": ["avg2"]}, "small", "does not fit the images"),
        (
            {"image": {"channels": 3, "height": 8, "width": 8}},
            "digits",
            "differs from the dataset's",
        ),
        ({"classes": 4}, "digits", "space.classes 4 differs from the dataset's 10"),
    ],
)
def test_what_does_not_fit_the_dataset_is_a_plan_error(
    space: dict[str, Any], schema: str, text: str
) -> None:
    schemas = {"adult": adult_schema(), "digits": DIGITS, "small": _images(3, size=4)}
    with pytest.raises(PlanError, match=re.escape(text)):
        plan_selection(
            "architecture",
            _request(space),
            dataset="x",
            n_rows=1000,
            n_features=1,
            schema=schemas[schema],
        )


def test_the_cnn_fields_belong_to_a_cnn_space() -> None:
    with pytest.raises(ValueError, match="for a CNN space"):
        ArchitectureSpace(model="mlp", kernels=[3])
    with pytest.raises(ValueError, match="no activations to choose"):
        ArchitectureSpace(model="cnn", activations=["tanh"])
    with pytest.raises(ValueError, match="at most 64"):
        ArchitectureSpace(model="cnn", widths=[128])
    with pytest.raises(ValueError):
        ArchitectureSpace.model_validate({"model": "cnn", "kernels": [2]})  # odd kernels only


def test_the_extremes_bound_every_candidate_and_the_largest_has_the_most_parameters() -> None:
    space = _fitted(SPACE, DIGITS).space
    every: list[CnnSpec] = [
        spec
        for depth in space.depths
        for channels in product(space.widths, repeat=depth)
        for k, pool in product(space.cnn_kernels, space.cnn_pools)
        if isinstance(
            spec := space.spec_of(
                ArchitectureCandidate(hidden=channels, activation="relu", kernel=k, pool=pool)
            ),
            CnnSpec,
        )
    ]
    assert len(every) == (2 + 4) * 2 * 2
    extremes = space.cnn_extremes()
    assert len(extremes) == 2 * 2 * 2
    for measure in (cnn_parameter_count, cnn_row_macs, cnn_row_floats):
        best = max(measure(s) for s in every)
        assert max(measure(s) for s in extremes) == best, measure.__name__
    largest = space.largest()
    assert isinstance(largest, CnnSpec)
    assert cnn_parameter_count(largest) == max(cnn_parameter_count(s) for s in every)


def _expected_event(plan_json: dict[str, Any], schema: dict[str, Any], n_rows: int) -> Any:
    """The MLP search's accounting, rebuilt from its parts: N × (the largest candidate's
    DP-SGD event, as a DP-SGD job on the training split plans it, + one noisy count)."""
    request = JobRequest.model_validate(plan_json["request"])
    kind = ArchitectureRequest.model_validate(request.selection["request"])  # type: ignore[index]
    mech = plan_json["mechanism"]
    (candidate,) = mech["candidates"]
    training = JobRequest(
        dataset=request.dataset,
        method="dpsgd",
        model=request.model,
        epsilon=kind.budget.training_epsilon,
        delta=kind.budget.training_delta,
        dpsgd=kind.training.model_copy(update={"batch_size": candidate["batch_size"]}),
    )
    train = plan_for_dataset(training, n_rows=mech["n_train_public"], public_schema=schema)
    one = ComposedEvent(
        events=(
            event_from_json(train.event),
            count_event(epsilon=kind.budget.fitness_epsilon),
        )
    )
    return SelfComposedEvent(event=one, count=mech["trainings"])


def _quoted(body: dict[str, Any], schema: dict[str, Any], n_rows: int) -> dict[str, Any]:
    selection = SelectionRequest.model_validate({"dataset": str(schema["name"]), **body}).root
    request = job_request(selection, n_rows=n_rows, public_schema=schema)
    _, plan = plan_selection_job(request, n_rows=n_rows, public_schema=schema)
    return {
        "request": request.model_dump(mode="json"),
        "plan": plan,
        "mechanism": plan.mechanism,
    }


def test_the_charge_is_the_mlp_searchs_accounting_for_the_same_number_of_runs() -> None:
    common = {
        "kind": "architecture",
        "epsilon": 3.0,
        "delta": 1e-5,
        "training_epsilon": 1.0,
        "fitness_epsilon": 0.2,
        "search": {"algorithm": "paas", "population": 2, "generations": 3},
        "training": {"epochs": 1, "batch_size": 128},
    }
    cnn = _quoted({**common, "space": SPACE}, DIGITS, DIGITS_ROWS)
    mlp = _quoted({**common, "space": {"depths": [1], "widths": [4]}}, adult_schema(), N_ROWS)
    for quoted, schema, n in ((cnn, DIGITS, DIGITS_ROWS), (mlp, adult_schema(), N_ROWS)):
        plan = quoted["plan"]
        assert quoted["mechanism"]["trainings"] == 6
        assert event_from_json(plan.event) == _expected_event(quoted, schema, n)
    assert cnn["plan"].guarantee == "proven"
    assert cnn["plan"].model["kind"] == "cnn" and cnn["plan"].model["classes"] == 10
    assert cnn["request"]["selection"]["request"]["space"]["model"] == "cnn"
    assert "cost_models" not in mlp["mechanism"]


def test_the_quote_estimates_every_candidate_and_refuses_over_the_time_limit() -> None:
    body = {
        "kind": "architecture",
        "epsilon": 3.0,
        "delta": 1e-5,
        # pooled after every layer: the deeper network has fewer parameters (a smaller
        # head) but more multiply-adds, so the costliest candidate is not the largest
        "space": COSTLY,
        "search": {"algorithm": "rs", "trainings": 4},
        "training": {"epochs": 2, "batch_size": 128},
    }
    quoted = _quoted(body, DIGITS, DIGITS_ROWS)
    plan = quoted["plan"]
    schema = load_schema_yaml((REPO / "examples" / "digits" / "schema.yaml").read_text())
    estimate = plan_resources(plan, schema=schema)
    assert estimate.seconds is not None and estimate.memory_bytes is not None
    (mechanism,) = plan.mechanism["candidates"]
    space = _fitted(COSTLY, DIGITS).space
    # every candidate's own estimate, four times, is covered (not only the largest's)
    for spec in space.cnn_extremes():
        assert estimate.seconds >= 4 * dpsgd_training_seconds(spec, mechanism) - 1e-9
    largest_only = 4 * dpsgd_training_seconds(space.largest(), mechanism)
    assert estimate.seconds > largest_only
    limits = ResourceLimits(seconds=estimate.seconds / 2, memory_bytes=1 << 40)
    refusal = resource_refusal(plan, schema=schema, limits=limits)
    assert refusal is not None and "train fewer candidates" in refusal
    assert resource_refusal(plan, schema=schema, limits=ResourceLimits(1e9, 1 << 40)) is None


def test_a_binary_cnn_search_trains_the_planned_candidates_and_releases_one() -> None:
    schema = _images(2)
    request = _fitted({"depths": [1], "widths": [2, 3], "kernels": [3]}, schema)
    request = request.model_copy(update={"search": ArchitectureSearch(algorithm="rs", trainings=2)})
    plan = plan_selection(
        "architecture", request, dataset="toy", n_rows=400, n_features=36, schema=schema
    )
    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 36, generator=g)
    y = (x[:, :18].mean(dim=1) > x[:, 18:].mean(dim=1)).float()
    seen: list[tuple[int, int]] = []
    out = run_architecture_selection(
        request=request,
        plan=plan,
        data=TabularTrainingSet(x, y),
        device=torch.device("cpu"),
        progress=lambda a, b: seen.append((a, b)),
    )
    assert out.trainings == 2 and seen[-1] == (2, 2)
    assert out.selected is not None and out.weights is not None
    summary = released_summary(out)
    model = CnnSpec.model_validate(summary["model"])
    assert model.classes is None and model.conv[0].kernel == 3
    assert model.conv[0].channels in (2, 3)
    assert summary["selected"]["kernel"] == 3  # type: ignore[index]
    assert out.weights["head.weight"].shape == (1, model.conv[0].channels * 3 * 3)
