"""DP-SGD runs exactly the planned mechanism."""

from __future__ import annotations

import pytest
import torch

from service.modelspec import LogisticSpec
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.dpsgd import PlanMismatch, run_dpsgd


def _mech(**kw: float) -> dict:
    base = dict(
        noise_multiplier=1.0,
        sampling_rate=0.1,
        steps_per_epoch=10,
        epochs=3,
        batch_size=1,
        max_grad_norm=1.0,
        learning_rate=0.1,
        accountant="rdp",
    )
    return {**base, **kw}


def _data(n: int = 10) -> TabularTrainingSet:
    g = torch.Generator().manual_seed(0)
    return TabularTrainingSet(
        torch.rand(n, 3, generator=g), (torch.rand(n, generator=g) > 0.5).float()
    )


def test_runs_every_planned_step_even_with_empty_poisson_batches() -> None:
    steps: list[tuple[int, int]] = []
    out = run_dpsgd(
        spec=LogisticSpec(),
        mechanism=_mech(),
        samples=1,
        data=_data(),
        device=torch.device("cpu"),
        progress=lambda k, t: steps.append((k, t)),
    )
    assert [k for k, _ in steps] == list(range(1, 31)) and {t for _, t in steps} == {30}
    w = out.releases[0]
    assert set(w) == {"linear.weight", "linear.bias"}
    assert all(torch.isfinite(v).all() for v in w.values())


def test_noise_is_not_reproducible_by_anyone() -> None:
    """Two runs with identical inputs differ: the noise is drawn from fresh CSPRNG seeds."""
    runs = [
        run_dpsgd(
            spec=LogisticSpec(),
            mechanism=_mech(noise_multiplier=5.0),
            samples=1,
            data=_data(),
            device=torch.device("cpu"),
            progress=lambda k, t: None,
        )
        for _ in range(2)
    ]
    assert not torch.equal(
        runs[0].releases[0]["linear.weight"], runs[1].releases[0]["linear.weight"]
    )


def test_refuses_a_plan_whose_schedule_differs_from_opacus() -> None:
    with pytest.raises(PlanMismatch):
        run_dpsgd(
            spec=LogisticSpec(),
            mechanism=_mech(steps_per_epoch=7),
            samples=1,
            data=_data(),
            device=torch.device("cpu"),
            progress=lambda k, t: None,
        )
