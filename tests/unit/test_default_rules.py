"""The default settings of DP-SGD (logistic, MLP and GRU-D) and the Langevin ExpM sampler
are functions of public values only (issue 21, point 2; the rules are in the module docstrings of
service/methods/dpsgd.py and service/methods/expm.py, chosen on
benchmarks/results/defaults_study.md): what they resolve to, that values a request names
are kept, and that on Adult-sized data the plans are those of the previous defaults."""

from __future__ import annotations

import math

import pytest

from service.methods.dpsgd import resolve_dpsgd_options
from service.methods.expm import langevin_defaults
from service.plans import build_plan
from service.schemas import DpsgdOptions, JobRequest


def _resolved(n: int, model_kind: str | None, **kw: int) -> tuple[int | None, int | None]:
    o = resolve_dpsgd_options(DpsgdOptions(**kw), n_rows=n, model_kind=model_kind)
    return o.batch_size, o.epochs


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (30162, (256, 3)),  # Adult: the previous rule's 256 × 3 (T = 354)
        (5120, (256, 15)),  # from here up, the previous rule's plan
        (3000, (256, 20)),  # ≈ 300 steps would need 25 epochs: capped at 20
        (700, (175, 20)),  # n̂/4, T = 80 (the previous rule: 35 × 15, T = 300)
        (398, (99, 20)),
        (40, (16, 20)),
        (10, (10, 20)),  # never a batch above n̂
    ],
)
def test_logistic_dpsgd_defaults(n: int, expected: tuple[int, int]) -> None:
    assert _resolved(n, "logistic") == expected


def test_mlps_take_the_logistic_dpsgd_rule() -> None:
    # benchmarks/results/defaults_study_mlp_{before,rule}.md: the previous rule's 35 × 15
    # lost 0.076 AUC to the grid's best at 700 Adult rows
    assert _resolved(700, "mlp") == (175, 20)
    assert _resolved(398, "mlp") == (99, 20)
    assert _resolved(30162, "mlp") == _resolved(30162, None) == (256, 3)  # Adult: unchanged
    assert _resolved(5120, "mlp") == _resolved(5120, None) == (256, 15)


def test_grud_takes_the_logistic_dpsgd_rule() -> None:
    # benchmarks/results/defaults_study_grud{,_candidates}.md: the previous rule (n̂/20,
    # ≈ 300 steps) lost 0.09-0.20 AUC to the grid's best on 500-1,000 synthetic ICU stays
    assert _resolved(500, "grud") == _resolved(500, "logistic") == (125, 20)  # T = 80
    assert _resolved(2000, "grud") == (256, 20)  # T = 160 (was 100 × 15, T = 300)
    assert _resolved(10, "grud") == (10, 20)


def test_other_models_keep_the_previous_dpsgd_rule() -> None:
    assert _resolved(750, None) == (37, 15)
    assert _resolved(750, "cnn") == (37, 15)
    assert _resolved(10, "cnn") == (10, 100)


def test_dpsgd_values_the_request_names_are_kept() -> None:
    assert _resolved(700, "logistic", batch_size=35, epochs=15) == (35, 15)
    assert _resolved(700, "logistic", batch_size=35) == (35, 15)  # ≈ 300 steps, ≤ 20 epochs
    assert _resolved(700, "logistic", epochs=2) == (175, 2)


def test_a_logistic_dpsgd_job_plans_with_the_rule() -> None:
    request = JobRequest.model_validate(
        {"dataset": "d", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-5}
    )
    m = build_plan(request, n_rows=700, n_features=104).mechanism
    assert (m["batch_size"], m["epochs"], m["steps"]) == (175, 20, 80)
    assert (m["learning_rate"], m["max_grad_norm"]) == (1.0, 1.0)


@pytest.mark.parametrize(
    ("n", "bound", "epsilon", "expected"),
    [
        (30162, 14, 1.0, (300, 2.0)),  # Adult: the previous default
        (3000, 14, 1.0, (81, 0.99)),  # reach 3000 / (10·√14) = 80.2
        (700, 14, 1.0, (19, 0.985)),
        (398, 31, 1.0, (10, 0.715)),  # reach 7.15 < 10 steps: a shorter step instead
        (30162, 14, 0.1, (81, 0.995)),
        (1000, 7, 10.0, (300, 1.26)),
    ],
)
def test_langevin_defaults(n: int, bound: int, epsilon: float, expected: tuple[int, float]) -> None:
    steps, lr = langevin_defaults(n_rows=n, norm_sq_bound=bound, epsilon=epsilon)
    assert (steps, lr) == expected
    reach = n * epsilon / (10 * math.sqrt(bound))
    if lr < 2.0:  # the reach lr·T is the rule's n̂·ε/(10·√B), up to lr's 3 digits
        assert steps * lr == pytest.approx(reach, rel=5e-3)


def _langevin_plan(expm: dict[str, object] | None, *, n: int, epsilon: float = 1.0):
    body: dict[str, object] = {"dataset": "d", "method": "expm", "epsilon": epsilon, "delta": 1e-5}
    if expm is not None:
        body["expm"] = expm
    return build_plan(JobRequest.model_validate(body), n_rows=n, n_features=104, norm_sq_bound=14)


def test_langevin_default_plan_on_adult_is_the_previous_one() -> None:
    previous = {"sampler": "langevin", "steps": 300, "learning_rate": 2.0, "l2": 1.0}
    assert _langevin_plan(None, n=30162) == _langevin_plan(previous, n=30162)


def test_langevin_plan_follows_the_rule_and_keeps_named_values() -> None:
    m = _langevin_plan(None, n=700).mechanism
    assert (m["steps"], m["learning_rate"], m["l2"]) == (19, 0.985, 1.0)
    # k = 2n̂/(lr·σ²·B) follows from the resolved lr
    sigma = m["noise_multiplier"]
    assert m["inverse_temperature"] == pytest.approx(2 * 700 / (0.985 * sigma**2 * 14))
    named = _langevin_plan({"steps": 300, "learning_rate": 2.0}, n=700).mechanism
    assert (named["steps"], named["learning_rate"], named["l2"]) == (300, 2.0, 1.0)
    lr_only = _langevin_plan({"learning_rate": 0.5}, n=700).mechanism
    assert (lr_only["steps"], lr_only["learning_rate"]) == (19, 0.5)
