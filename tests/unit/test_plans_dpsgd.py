"""DP-SGD plans with a noise schedule: the request schema, the plan, what is charged."""

from __future__ import annotations

import itertools
import math
from functools import cache
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from service.plans import PlanError, build_plan
from service.privacy.calibrate import epsilon_for, pld_value_discretization
from service.privacy.events import (
    ComposedEvent,
    PoissonSubsampledGaussianEvent,
    event_from_json,
    leaf_counts,
)
from service.privacy.orders import ORDERS
from service.privacy.sampling import noise_slack
from service.privacy.schedules import decaying_event
from service.schemas import DpsgdOptions, JobRequest, PrivacyPlan

N_ROWS = 30162  # Adult-like public row count
N_FEATURES = 3


def _request(*, accountant: str = "rdp", epochs: int = 3, **schedule: Any) -> JobRequest:
    return JobRequest(
        dataset="adult",
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        dpsgd=DpsgdOptions(epochs=epochs, batch_size=256, accountant=accountant, **schedule),  # type: ignore[arg-type]
    )


@cache
def _plan(accountant: str, schedule: str, decay: float | None) -> PrivacyPlan:
    """Plans are pure values; building each once keeps the file fast."""
    extra: dict[str, Any] = {} if schedule == "constant" else {"noise_decay": decay}
    request = _request(accountant=accountant, noise_schedule=schedule, **extra)
    return build_plan(request, n_rows=N_ROWS, n_features=N_FEATURES)


# ---------------------------------------------------------------- the request schema


@pytest.mark.parametrize(
    "options",
    [
        {"noise_schedule": "exponential"},  # R missing
        {"noise_schedule": "exponential", "noise_decay": 0.0},
        {"noise_schedule": "exponential", "noise_decay": 1.0},
        {"noise_schedule": "exponential", "noise_decay": 1.2},
        {"noise_schedule": "exponential", "noise_decay": -0.5},
        {"noise_schedule": "exponential", "noise_decay": "nan"},
        {"noise_decay": 0.9},  # R without the exponential schedule
        {"noise_schedule": "linear", "noise_decay": 0.9},
    ],
)
def test_bad_schedule_options_are_validation_errors(options: dict[str, Any]) -> None:
    """Parsed from raw JSON-like data as the API does: a ValidationError is its 422."""
    body = {"dataset": "adult", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-5}
    with pytest.raises(ValidationError):
        JobRequest.model_validate({**body, "dpsgd": options})


def test_good_schedule_options_parse() -> None:
    options = DpsgdOptions.model_validate({"noise_schedule": "exponential", "noise_decay": 0.9})
    assert (options.noise_schedule, options.noise_decay) == ("exponential", 0.9)
    assert DpsgdOptions().noise_schedule == "constant"


# ---------------------------------------------------------------- constant: unchanged


def test_constant_plan_carries_no_schedule_keys() -> None:
    """Plans stored before schedules existed are re-derived by the worker and compared
    key for key: the constant plan must not grow keys."""
    plan = _plan("rdp", "constant", None)
    assert set(plan.mechanism) == {
        "epochs",
        "batch_size",
        "max_grad_norm",
        "learning_rate",
        "accountant",
        "public_n_rows",
        "expected_batch_size",
        "sampling_rate",
        "steps_per_epoch",
        "steps",
        "noise_multiplier",
        "parameters",
        "grid_bits",
        "noise",
    }
    assert plan.event["events"][0]["type"] == "poisson_subsampled_gaussian"
    explicit = build_plan(_request(noise_schedule="constant"), n_rows=N_ROWS, n_features=N_FEATURES)
    assert explicit == plan


# ---------------------------------------------------------------- exponential


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_exponential_plan_charges_the_stepwise_curve_never_the_tcdp_estimate(
    accountant: str,
) -> None:
    plan = _plan(accountant, "exponential", 0.8)
    m = plan.mechanism
    sigma0, sigmas = m["noise_multiplier"], m["noise_multipliers"]
    assert m["noise_schedule"] == "exponential" and m["noise_decay"] == 0.8
    assert len(sigmas) == m["epochs"] == 3 and sigmas[0] == sigma0
    assert all(b < a for a, b in itertools.pairwise(sigmas))
    # The stored event is the per-epoch history the worker runs, plus the slack ...
    event = event_from_json(plan.event)
    gaussian_leaves = {
        leaf.noise_multiplier: count
        for leaf, count in leaf_counts(event).items()
        if isinstance(leaf, PoissonSubsampledGaussianEvent)
    }
    assert gaussian_leaves == {s: m["steps_per_epoch"] for s in sigmas}
    # ... and the charged curve is exactly that event's curve, rebuilt independently.
    slack = noise_slack(draws=m["parameters"] * m["steps"])
    history = decaying_event(
        sampling_rate=m["sampling_rate"],
        sigma0=sigma0,
        decay=0.8,
        steps_per_epoch=m["steps_per_epoch"],
        epochs=3,
    )
    expected = ComposedEvent(events=(history, slack)).rdp(ORDERS)
    assert np.array_equal(np.array(plan.rdp_curve), expected)
    assert np.array_equal(np.array(plan.rdp_curve), event.rdp(ORDERS))
    # The tCDP figure is display only: a number (or None) that no accounting reads.
    tcdp = m["tcdp_estimate_epsilon"]
    assert tcdp is None or (math.isfinite(tcdp) and tcdp > 0)
    assert isinstance(m["tcdp_estimate_conditions_hold"], bool)
    # The plan's guarantee holds by its own accountant on that event.
    vdi = pld_value_discretization(epsilon=1.0, steps=m["steps"])
    assert (
        epsilon_for(
            event=event,
            delta=1e-5,
            accountant=accountant,  # type: ignore[arg-type]
            value_discretization_interval=vdi,
        )
        <= 1.0
    )


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_decay_to_one_reproduces_the_constant_sigma(accountant: str) -> None:
    """R → 1 is the constant schedule. Both searches stop within a factor 1 + 1e-3 above
    their thresholds; the thresholds differ only by the slack's handling (exact vs. a
    margin, ~1e-9) and, for PLD, by dp_accounting's accountant vs. its PLD objects, so
    2e-3 bounds the gap."""
    const = _plan(accountant, "constant", None).mechanism["noise_multiplier"]
    near = _plan(accountant, "exponential", 1.0 - 1e-9).mechanism["noise_multiplier"]
    assert abs(near / const - 1.0) <= 2e-3


def test_exponential_plan_is_reproducible() -> None:
    """The worker re-derives the plan and refuses a mismatch."""
    again = build_plan(
        _request(noise_schedule="exponential", noise_decay=0.8),
        n_rows=N_ROWS,
        n_features=N_FEATURES,
    )
    assert again == _plan("rdp", "exponential", 0.8)


def test_unreachable_decay_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="cannot calibrate"):
        build_plan(
            _request(noise_schedule="exponential", noise_decay=1e-6, epochs=5),
            n_rows=N_ROWS,
            n_features=N_FEATURES,
        )


def test_request_digest_is_unchanged_by_fields_added_at_their_default() -> None:
    """An Idempotency-Key retry of a request hashed before noise_schedule/noise_decay existed
    still matches: at their defaults they are left out of the digest."""
    import hashlib
    import json

    from service.ledger.idempotency import request_digest

    r = JobRequest(
        dataset="a", method="dpsgd", epsilon=1.0, delta=1e-5, dpsgd=DpsgdOptions(epochs=2)
    )
    before = r.model_dump(mode="json")
    del before["dpsgd"]["noise_schedule"], before["dpsgd"]["noise_decay"]
    del before["dpsgd"]["engine"], before["dpsgd"]["jl_projections"]  # added later too
    del before["expm"]  # the method's options did not exist either
    old = hashlib.sha256(
        json.dumps(before, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert request_digest(r) == old
    decaying = r.model_copy(
        update={"dpsgd": DpsgdOptions(epochs=2, noise_schedule="exponential", noise_decay=0.9)}
    )
    assert request_digest(decaying) != old
    ghost = r.model_copy(update={"dpsgd": DpsgdOptions(epochs=2, engine="ghost")})
    assert request_digest(ghost) != old


def test_defaults_come_from_the_public_row_count() -> None:
    """Issue 12: fixed defaults gave a 750-row dataset 9 steps. Derived: batch n̂/20 in
    [16, 256], epochs for about 300 steps (≥ 3); Adult keeps 256 × 3 (T = 354)."""
    from service.methods.dpsgd import resolve_dpsgd_options

    def resolved(n: int, **kw: int) -> tuple[int | None, int | None]:
        o = resolve_dpsgd_options(DpsgdOptions(**kw), n_rows=n)
        return o.batch_size, o.epochs

    assert resolved(30162) == (256, 3)
    assert resolved(750) == (37, 15)
    assert resolved(100) == (16, 43)
    assert resolved(10) == (10, 100)  # never a batch above n̂; epochs capped at 100
    assert resolved(750, batch_size=100, epochs=2) == (100, 2)  # what the analyst sent wins
    assert resolved(750, batch_size=100) == (100, 38)


def test_mlp_plan_keeps_its_old_shape_unless_the_activation_is_not_the_default() -> None:
    # Plans stored before MLP activations existed must still equal the re-derived plan.
    def plan_model(model: dict[str, object]) -> dict[str, object]:
        request = JobRequest.model_validate(
            {"dataset": "x", "method": "dpsgd", "epsilon": 1, "delta": 1e-6, "model": model}
        )
        return build_plan(request, n_rows=1000, n_features=5).model

    assert plan_model({"kind": "mlp", "hidden": [4]}) == {"kind": "mlp", "hidden": [4]}
    # A non-default activation is recorded.
    relu = {"kind": "mlp", "hidden": [4], "activation": "relu"}
    assert plan_model(relu) == relu


def test_dpsgd_guarantee_is_proven_only_where_the_sum_is_exact() -> None:
    """Issue 25: logistic regression and MLPs (tanh and ReLU) in every engine
    (worker/mechanisms/exact_net.py) and GRU-D (worker/mechanisms/exact_grud.py) are
    proven, in jobs and in every selection kind built on them; a model kind without an
    exact path would say nominal (service.methods.dpsgd.PROVEN_MODELS)."""
    from service.selection.plans import ArchitectureRequest, architecture_plan

    def guarantee(model: dict, dpsgd: dict | None = None, kind: str = "tabular") -> str:
        body = {"dataset": "x", "method": "dpsgd", "epsilon": 1, "delta": 1e-6, "model": model}
        if dpsgd is not None:
            body["dpsgd"] = dpsgd
        request = JobRequest.model_validate(body)
        return build_plan(request, n_rows=1000, n_features=5, dataset_kind=kind).guarantee

    relu = {"kind": "mlp", "hidden": [4], "activation": "relu"}
    assert guarantee(relu) == guarantee({"kind": "logistic"}) == "proven"
    assert guarantee(relu, {"engine": "ghost"}) == "proven"
    assert guarantee(relu, {"engine": "jl", "jl_projections": 5}) == "proven"
    assert guarantee({"kind": "grud", "hidden": 4}, kind="timeseries") == "proven"
    arch = ArchitectureRequest.model_validate(
        {
            "space": {"depths": [1], "widths": [4], "activations": ["tanh", "relu"]},
            "search": {"algorithm": "rs", "trainings": 2},
            "budget": {"training_epsilon": 1.0, "training_delta": 1e-6},
        }
    )
    assert architecture_plan(arch, dataset="x", n_rows=1000, n_features=5).guarantee == "proven"
    jl = arch.model_copy(update={"training": DpsgdOptions(engine="jl", jl_projections=5)})
    assert architecture_plan(jl, dataset="x", n_rows=1000, n_features=5).guarantee == "proven"
