"""The data-kind tables (issue 23): the service's ``DATA_KINDS`` and the worker's
``WORKER_KINDS`` name the same kinds, every schema class and model kind has its entry, and
a kind registered in the table alone (monkeypatched here) is picked up by the plan, the
selection width and the schema loader without editing any other module."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.datasets.kinds import DATA_KINDS, DataKind, DatasetSchema, load_schema_yaml
from service.datasets.tabular import SchemaError, TabularSchema
from service.methods.expm import row_norm_sq_bound
from service.modelspec import LogisticSpec, ModelSpec
from service.plans import PlanError, build_plan, plan_for_dataset
from service.schemas import JobRequest
from service.selection.api_bodies import n_features_of
from worker.data import WORKER_KINDS

ADULT = Path(__file__).resolve().parents[2] / "examples" / "adult" / "schema.yaml"


def test_the_service_and_worker_tables_name_the_same_kinds() -> None:
    assert set(DATA_KINDS) == set(WORKER_KINDS)
    assert all(entry.name == kind for kind, entry in DATA_KINDS.items())
    assert all(entry.name == kind for kind, entry in WORKER_KINDS.items())


def test_every_schema_class_is_a_registered_kind() -> None:
    kinds = set()
    for cls in typing.get_args(DatasetSchema):
        (kind,) = typing.get_args(cls.model_fields["kind"].annotation)
        kinds.add(kind)
    assert kinds == set(DATA_KINDS)


def test_every_model_kind_fits_some_data_kind_and_defaults_fit_their_kind() -> None:
    model_kinds = set()
    for spec in typing.get_args(typing.get_args(ModelSpec)[0]):
        (kind,) = typing.get_args(spec.model_fields["kind"].annotation)
        model_kinds.add(kind)
    assert model_kinds == set().union(*(e.model_kinds for e in DATA_KINDS.values()))
    for entry in DATA_KINDS.values():
        assert entry.default_model().kind in entry.model_kinds


def test_the_tabular_bound_is_the_expm_bound() -> None:
    schema = load_schema_yaml(ADULT.read_text())
    assert isinstance(schema, TabularSchema)
    bound = DATA_KINDS["tabular"].norm_sq_bound
    assert bound is not None and bound(schema) == row_norm_sq_bound(schema)


@dataclass(frozen=True)
class _DummySchema:
    name: str
    n_features: int


def _dummy_kind() -> DataKind:
    return DataKind(
        name="dummy",
        parse=lambda data: _DummySchema(name=data["name"], n_features=int(data["width"])),
        model_kinds=frozenset({"logistic"}),
        default_model=LogisticSpec,
        norm_sq_bound=lambda schema: schema.n_features + 1,
        mapping_keys="name, kind, width",
        describe=lambda schema: f"schema {schema.name!r}: dummy",
    )


def _request(method: str, model: dict[str, typing.Any] | None = None) -> JobRequest:
    return JobRequest.model_validate(
        {
            "dataset": "d",
            "method": method,
            "epsilon": 1.0,
            "delta": 1e-6,
            "model": model or {"kind": "logistic"},
        }
    )


def test_a_kind_registered_in_the_table_alone_is_picked_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    public = {"kind": "dummy", "name": "d", "width": 5}
    with pytest.raises(PlanError, match="unknown dataset kind 'dummy'"):
        plan_for_dataset(_request("expm"), n_rows=1000, public_schema=public)

    monkeypatch.setitem(DATA_KINDS, "dummy", _dummy_kind())
    plan = plan_for_dataset(_request("expm"), n_rows=1000, public_schema=public)
    assert plan.mechanism["row_norm_sq_bound"] == 6  # the entry's bound: width + 1
    expected = build_plan(
        _request("expm"), n_rows=1000, n_features=5, dataset_kind="dummy", norm_sq_bound=6
    )
    assert plan.model_dump(mode="json") == expected.model_dump(mode="json")
    assert plan_for_dataset(_request("dpsgd"), n_rows=1000, public_schema=public).model == {
        "kind": "logistic"
    }
    with pytest.raises(PlanError, match="model 'mlp' does not fit a dummy dataset"):
        mlp = _request("dpsgd", {"kind": "mlp", "hidden": [4], "activation": "tanh"})
        plan_for_dataset(mlp, n_rows=1000, public_schema=public)
    assert n_features_of(public) == 5
    with pytest.raises(SchemaError, match=r"; dummy: name, kind, width\)$"):
        load_schema_yaml("- not a mapping\n")


def test_unknown_kinds_keep_their_errors() -> None:
    with pytest.raises(PlanError, match="unknown dataset kind 'image'"):
        plan_for_dataset(_request("dpsgd"), n_rows=1000, public_schema={"kind": "image"})
    with pytest.raises(PlanError, match="unknown dataset kind 'image'"):
        n_features_of({"kind": "image"})
    with pytest.raises(SchemaError, match=r"^a schema must be a YAML mapping \(tabular: name"):
        load_schema_yaml("[]")
