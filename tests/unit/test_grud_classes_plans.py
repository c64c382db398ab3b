"""Issue 20, K-class time series: a time-series schema's outcome declares K ≥ 3 classes
(public), DP-SGD with the exact engine plans a GRU-D with K logits (``classes: K`` in the
plan's model, K·(H + 1) head parameters), every other engine and method refuses it at
quote time, and a binary time-series schema, its encoding and its plans are unchanged."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from pydantic import ValidationError

from service.datasets.kinds import parse_dataset_schema
from service.datasets.timeseries import TimeSeriesSchema
from service.modelspec import GrudSpec, parameter_count
from service.plans import PlanError, plan_for_dataset
from service.schemas import DpsgdOptions, JobRequest
from tests.unit.test_timeseries import TINY

CLASSES = ["home", "ward", "icu"]


def _public(outcome: dict[str, Any]) -> dict[str, Any]:
    schema = parse_dataset_schema({**TINY, "outcome": outcome})
    assert isinstance(schema, TimeSeriesSchema)
    return schema.model_dump(mode="json")


def _request(engine: str = "exact", **model: Any) -> JobRequest:
    options: dict[str, Any] = {"epochs": 1, "batch_size": 10, "engine": engine}
    if engine == "jl":
        options["jl_projections"] = 4
    return JobRequest.model_validate(
        {
            "dataset": "tiny-icu",
            "method": "dpsgd",
            "epsilon": 2.0,
            "delta": 1e-5,
            "model": {"kind": "grud", "hidden": 3, **model},
            "dpsgd": DpsgdOptions.model_validate(options).model_dump(),
        }
    )


def test_an_outcome_declares_classes_or_positive_and_negative_never_both() -> None:
    k_class = parse_dataset_schema({**TINY, "outcome": {"column": "died", "classes": CLASSES}})
    assert isinstance(k_class, TimeSeriesSchema)
    assert k_class.n_classes == 3 and k_class.outcome.values == CLASSES
    assert k_class.outcome.encode(pd.Series(["icu", "home", "ward"])).tolist() == [2, 0, 1]
    binary = parse_dataset_schema(TINY)
    assert isinstance(binary, TimeSeriesSchema) and binary.n_classes == 2
    assert binary.model_dump(mode="json")["outcome"] == {
        "source": "file",
        "stay": "stay_id",
        "column": "died",
        "positive": ["yes"],
        "negative": ["no"],
    }  # the binary dump (and so the encoded-cache key) as before
    for bad in (
        {"column": "died", "classes": CLASSES, "positive": ["icu"]},
        {"column": "died", "classes": ["a", "b"]},
        {"column": "died", "classes": ["a", "b", "a"]},
        {"column": "died", "positive": ["yes"]},
    ):
        with pytest.raises(ValidationError):
            parse_dataset_schema({**TINY, "outcome": bad})


def test_dpsgd_exact_plans_a_k_logit_grud_and_the_binary_plan_is_unchanged() -> None:
    public = _public({"column": "died", "classes": CLASSES})
    plan = plan_for_dataset(_request(), n_rows=60, public_schema=public)
    assert plan.model == {"kind": "grud", "hidden": 3, "classes": 3}
    assert plan.mechanism["parameters"] == parameter_count(GrudSpec(hidden=3, classes=3), 2)
    assert parameter_count(GrudSpec(hidden=3, classes=3), 2) == (
        parameter_count(GrudSpec(hidden=3), 2) + 2 * (3 + 1)
    )
    stated = plan_for_dataset(_request(classes=3), n_rows=60, public_schema=public)
    assert stated.model_dump() == plan.model_dump()
    with pytest.raises(PlanError, match="differs from the dataset's 3 classes"):
        plan_for_dataset(_request(classes=4), n_rows=60, public_schema=public)
    binary = plan_for_dataset(
        _request(), n_rows=60, public_schema=parse_dataset_schema(TINY).model_dump(mode="json")
    )
    assert binary.model == {"kind": "grud", "hidden": 3}
    assert binary.mechanism["parameters"] == parameter_count(GrudSpec(hidden=3), 2)
    # Same privacy numbers: the head's width changes no sensitivity (clipping bounds it).
    assert (
        binary.epsilon == plan.epsilon
        and binary.mechanism["noise_multiplier"] == (plan.mechanism["noise_multiplier"])
    )


@pytest.mark.parametrize("engine", ["ghost", "jl"])
def test_other_engines_refuse_a_k_class_grud(engine: str) -> None:
    public = _public({"column": "died", "classes": CLASSES})
    with pytest.raises(PlanError, match="3 classes"):
        plan_for_dataset(_request(engine), n_rows=60, public_schema=public)


def test_expm_nf_refuses_a_k_class_grud() -> None:
    public = _public({"column": "died", "classes": CLASSES})
    request = JobRequest.model_validate(
        {
            "dataset": "tiny-icu",
            "method": "expm_nf",
            "epsilon": 1.0,
            "delta": 0.0,
            "model": {"kind": "grud", "hidden": 3},
        }
    )
    with pytest.raises(PlanError, match="3 classes"):
        plan_for_dataset(request, n_rows=60, public_schema=public)
