"""Every method the API accepts has a mechanism in the worker's registry, and every
registered mechanism resolves to a function that takes the registry's call (issue 23)."""

from __future__ import annotations

import inspect
import typing

from service.schemas import TRAINING_METHODS, ExpmOptions
from worker.mechanisms.registry import MECHANISMS


def _keys() -> set[tuple[str, str | None]]:
    samplers = typing.get_args(ExpmOptions.model_fields["sampler"].annotation)
    keys: set[tuple[str, str | None]] = set()
    for method in TRAINING_METHODS:
        keys |= {(method, s) for s in samplers} if method == "expm" else {(method, None)}
    return keys


def test_every_method_and_sampler_the_api_accepts_is_registered() -> None:
    assert _keys() == set(MECHANISMS)


def test_every_registered_mechanism_takes_the_registrys_call() -> None:
    for key, entry in MECHANISMS.items():
        params = set(inspect.signature(entry.resolve()).parameters)
        common = {"spec", "data", "device", "progress"}
        wanted = common | ({"plan"} if entry.takes_plan else {"mechanism", "samples"})
        assert wanted <= params, (key, params)


def test_the_service_and_the_worker_register_the_same_methods() -> None:
    """Adding a method means a line in each table (its name, service/methods, the worker)."""
    from service.methods import METHODS as PLANNERS

    assert set(PLANNERS) == set(MECHANISMS) == _keys()
