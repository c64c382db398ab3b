"""Issue 20 (point 3): the declared CNN family (``kind: cnn``). Normalisation other than
none is refused at validation (batchnorm because it mixes rows), parameter counts equal the
torch module's, the plan takes the image dataset's shape and classes and is proven with the
exact engine only, bad geometry and the size cap are plan errors, and the quote's resource
estimate covers it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.datasets.kinds import load_schema_yaml
from service.methods.dpsgd import dpsgd_training_seconds
from service.modelspec import (
    MAX_CNN_PARAMETERS,
    MODEL_SPEC,
    CnnSpec,
    parameter_count,
)
from service.plans import PlanError, plan_for_dataset
from service.resources import plan_resources
from service.schemas import JobRequest
from tests.plan_cases import adult_schema

SCHEMA = load_schema_yaml((Path(__file__).parents[2] / "examples/digits/schema.yaml").read_text())
DIGITS = SCHEMA.model_dump(mode="json")
BINARY = {**DIGITS, "name": "digits01", "classes": ["0", "1"]}
CONV = [{"channels": 6, "kernel": 3, "padding": 1, "pool": "avg2"}, {"channels": 8}]


def _request(conv: list[dict[str, Any]] = CONV, **extra: Any) -> JobRequest:
    model = {"kind": "cnn", "conv": conv, **extra.pop("model", {})}
    body = {"dataset": "digits", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-5, "model": model}
    return JobRequest.model_validate({**body, **extra})


@pytest.mark.parametrize(
    ("norm", "text"),
    [("batchnorm", "batchnorm mixes rows"), ("groupnorm", "groupnorm is refused for now")],
)
def test_normalisation_is_refused_with_its_reason(norm: str, text: str) -> None:
    with pytest.raises(ValidationError, match=text):
        MODEL_SPEC.validate_python({"kind": "cnn", "conv": CONV, "norm": norm})
    with pytest.raises(ValidationError, match=text):
        _request(model={"norm": norm})


@pytest.mark.parametrize("classes", [None, 10])
@pytest.mark.parametrize(
    "conv",
    [
        CONV,
        [{"channels": 4, "kernel": 5, "stride": 2, "padding": 2}],
        [{"channels": 3, "kernel": 2, "pool": "avg2"}] * 2,
    ],
)
def test_parameter_counts_equal_the_modules(
    conv: list[dict[str, Any]], classes: int | None
) -> None:
    from tests.unit.worker.test_exact_conv import _spec
    from worker.models import build_module

    for shape in [(1, 8, 8), (3, 11, 9)]:
        fitted = _spec(conv, classes=classes, shape=shape)
        module = build_module(fitted, shape[0] * shape[1] * shape[2])
        count = sum(p.numel() for p in module.parameters())
        assert parameter_count(fitted, shape[0] * shape[1] * shape[2]) == count


def test_the_plan_takes_the_datasets_shape_and_classes_and_is_proven() -> None:
    plan = plan_for_dataset(_request(), n_rows=1797, public_schema=DIGITS)
    assert plan.guarantee == "proven"
    assert plan.model["classes"] == 10
    assert plan.model["image"] == {"channels": 1, "height": 8, "width": 8}
    # (1·9 + 1)·6 + (6·9 + 1)·8 + (8·2·2 + 1)·10: the 8 × 8 map pooled to 4 × 4, then 2 × 2
    assert plan.mechanism["parameters"] == 60 + 440 + 330
    stated = _request(model={"image": {"channels": 1, "height": 8, "width": 8}})
    assert plan_for_dataset(stated, n_rows=1797, public_schema=DIGITS) == plan
    binary = plan_for_dataset(_request(), n_rows=360, public_schema=BINARY)
    assert "classes" not in binary.model and binary.mechanism["parameters"] == 60 + 440 + 33


@pytest.mark.parametrize("engine", ["ghost", "jl"])
def test_ghost_and_jl_are_refused_for_convolutions(engine: str) -> None:
    options: dict[str, Any] = {"engine": engine}
    if engine == "jl":
        options["jl_projections"] = 4
    with pytest.raises(PlanError, match="not built for convolutions"):
        plan_for_dataset(_request(dpsgd=options), n_rows=360, public_schema=BINARY)


@pytest.mark.parametrize(
    ("request_", "text"),
    [
        (_request([{"channels": 4, "kernel": 7}] * 2), "does not fit"),
        (_request([{"channels": 4, "padding": 1, "pool": "avg2"}] * 4), "empty"),
        (_request(model={"image": {"channels": 3, "height": 8, "width": 8}}), "differs"),
        (_request(method="expm", delta=1e-5), "DP-SGD"),
    ],
)
def test_what_the_family_cannot_plan_is_a_plan_error(request_: JobRequest, text: str) -> None:
    with pytest.raises(PlanError, match=text):
        plan_for_dataset(request_, n_rows=1797, public_schema=DIGITS)


def test_the_size_cap_and_the_data_kind() -> None:
    wide = [{"channels": 64, "kernel": 7, "padding": 3}] * 4
    source = {**DIGITS["source"], "layout": "nhwc"}
    big = {**DIGITS, "height": 32, "width": 32, "channels": 3, "source": source}
    with pytest.raises(PlanError, match=f"more than {MAX_CNN_PARAMETERS}"):
        plan_for_dataset(_request(wide), n_rows=1797, public_schema=big)
    with pytest.raises(PlanError, match="CNNs for image datasets"):
        plan_for_dataset(_request(dataset="adult"), n_rows=1000, public_schema=adult_schema())


def test_the_quote_estimates_time_and_memory_growing_with_the_network() -> None:
    small = plan_for_dataset(_request(), n_rows=1797, public_schema=DIGITS)
    wide = [{"channels": 32, "kernel": 3, "padding": 1}, {"channels": 32, "padding": 1}]
    large = plan_for_dataset(_request(wide), n_rows=1797, public_schema=DIGITS)
    a, b = plan_resources(small, schema=SCHEMA), plan_resources(large, schema=SCHEMA)
    assert a.seconds is not None and b.seconds is not None
    assert a.memory_bytes is not None and b.memory_bytes is not None
    assert 0 < a.seconds < b.seconds and 0 < a.memory_bytes < b.memory_bytes
    spec = CnnSpec.model_validate(small.model)
    assert dpsgd_training_seconds(spec, small.mechanism) == a.seconds
