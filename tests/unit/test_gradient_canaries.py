"""White-box gradient canaries of the one-run audit (worker/gradient_canaries.py): they enter
the real DP-SGD run as rows of its Poisson sampler, only an admin audit can insert them,
the audit finds them when the noise is switched off, and its bound stays below the claim
when the noise is on."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from service.audits import AuditRefused
from service.modelspec import LogisticSpec
from service.privacy.sampling import GRID_BITS
from service.schemas import DpsgdOptions
from tests.unit.test_dpsgd import _mech as dpsgd_mech
from worker.audits import run_one_run_audit
from worker.mechanisms import dpsgd
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.dpsgd import GradientCanaries, run_dpsgd, run_dpsgd_with_canaries
from worker.mechanisms.guards import GuardFailed
from worker.mechanisms.registry import MECHANISMS, run_mechanism

REPO = Path(__file__).resolve().parents[2]
FULL_BATCH = DpsgdOptions(batch_size=30_212, epochs=3)  # q = 1 on Adult (n̂ = 30,162 + m/2)
"""Every row in every step: given the iterates the data's sum is known exactly, so with the
noise off a canary's score is its own T·2^k and nothing else."""


@pytest.fixture
def noise_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test-only control of tests/unit/test_dpsgd.py: the DP noise is zero."""
    monkeypatch.setattr(
        dpsgd, "rounded_gaussian", lambda rng, *, scale, size: np.zeros(size, np.int64)
    )


def _mech(**kw: float) -> dict:
    """test_dpsgd's plan, q = 1 and 5 steps unless told."""
    base = dict(sampling_rate=1.0, steps=5, expected_batch_size=10.0, steps_per_epoch=5)
    return dpsgd_mech(**{**base, **kw})


def _dirac(coords: list[int], parameters: int = 4) -> GradientCanaries:
    vectors = torch.zeros((len(coords), parameters), dtype=torch.int64)
    vectors[torch.arange(len(coords)), torch.tensor(coords)] = 1 << GRID_BITS
    return GradientCanaries(vectors, grid_bits=GRID_BITS)


def test_a_canary_above_the_clip_bound_is_refused() -> None:
    ok = torch.zeros((2, 4), dtype=torch.int64)
    ok[0, 1] = 1 << GRID_BITS
    ok[1, :] = 1 << (GRID_BITS - 1)  # norm exactly 2^k
    GradientCanaries(ok, grid_bits=GRID_BITS)
    over = ok.clone()
    over[1, 0] += 1
    with pytest.raises(GuardFailed, match="exceeds 2"):
        GradientCanaries(over, grid_bits=GRID_BITS)
    with pytest.raises(GuardFailed):
        GradientCanaries(ok.double(), grid_bits=GRID_BITS)  # type: ignore[arg-type]


def test_canaries_add_exactly_their_vector_in_the_real_run(noise_off: None) -> None:
    """q = 1, noise off, all-zero features: the data never touches the weights, so the run's
    summed noisy sums on a canary's weight are exactly T·2^k and the released weight is
    exactly −lr·C·2^−k/B̂ times that (the engine's own step)."""
    data = TabularTrainingSet(torch.zeros(10, 3), torch.ones(10))
    hook = _dirac([0, 2])
    release = run_dpsgd_with_canaries(
        spec=LogisticSpec(),
        mechanism=_mech(),
        data=data,
        device=torch.device("cpu"),
        canaries=hook,
    )
    steps, unit = 5, 1 << GRID_BITS
    assert hook.observed.tolist()[:3] == [steps * unit, 0, steps * unit]
    assert len(hook.iterates) == steps
    weight = release["linear.weight"][0].double()
    assert weight[0].item() == pytest.approx(-0.1 * steps / 10.0, rel=1e-6)
    assert weight[1].item() == 0.0


def test_canaries_are_sampled_like_rows(noise_off: None) -> None:
    """With q < 1 each canary enters a step w.p. q, independently: its count over T steps is
    Binomial(T, q). 50 canaries × 200 steps at q = 1/8: the total is 1,250 ± 33 (sd); a
    canary sampled in every step (or never) would be far outside 6 sd."""
    q, steps, m = 0.125, 200, 50
    data = TabularTrainingSet(torch.zeros(8, m - 1), torch.ones(8))
    hook = _dirac(list(range(m)), parameters=m)
    run_dpsgd_with_canaries(
        spec=LogisticSpec(),
        mechanism=_mech(sampling_rate=q, steps=steps, steps_per_epoch=steps, parameters=m),
        data=data,
        device=torch.device("cpu"),
        canaries=hook,
    )
    counts = hook.observed[: m - 1] / (1 << GRID_BITS)  # the weights: no data gradient
    assert torch.equal(counts, counts.round())
    total, mean, sd = (
        float(counts.sum()),
        q * steps * (m - 1),
        (q * (1 - q) * steps * (m - 1)) ** 0.5,
    )
    assert abs(total - mean) < 6 * sd
    assert counts.min() > 0 and counts.max() < steps


def _calls(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.name for a in node.names)
            names.add(node.module or "")
    return names


def test_only_an_admin_audit_can_insert_canaries() -> None:
    """The hook is unreachable from a job: the registry's DP-SGD entry (what the runner
    calls for every job) and run_mechanism take no canaries; the plan is data and names no
    hook; and in the whole product only worker/gradient_canaries.py (run by worker/audits.py
    for POST /v1/admin/audits and `enclave admin audit`) uses the hook's names."""
    assert MECHANISMS[("dpsgd", None)].resolve() is run_dpsgd
    for fn in (run_dpsgd, run_mechanism, dpsgd.DpsgdParams.from_plan):
        assert "canaries" not in inspect.signature(fn).parameters
    users: dict[str, set[str]] = {}
    for top in ("service", "worker", "enclave"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            names = _calls(ast.parse(path.read_text()))
            if names & {"GradientCanaries", "run_dpsgd_with_canaries"}:
                users.setdefault("hook", set()).add(rel)
            if "worker.gradient_canaries" in names or "gradient_canary_run" in names:
                users.setdefault("audit", set()).add(rel)
            if "run_one_run_audit" in names:
                users.setdefault("audits", set()).add(rel)
            if "run_requested_audit" in names:
                users.setdefault("requests", set()).add(rel)
    assert users["hook"] == {"worker/mechanisms/dpsgd.py", "worker/gradient_canaries.py"}
    assert users["audit"] == {"worker/audits.py"}
    # and the audit itself is run, through its request (worker/audits.py's own wrapper), by
    # the admin's audit task and the admin's command only
    assert users["audits"] == {"worker/audits.py"}
    assert users["requests"] == {"worker/audit_job.py", "enclave/audit_cli.py"}
    # In dpsgd.py, _train_one gets canaries from run_dpsgd_with_canaries only.
    tree = ast.parse((REPO / "worker/mechanisms/dpsgd.py").read_text())
    passing = {
        fn.name
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        for call in ast.walk(fn)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", "") == "_train_one"
        and any(k.arg == "canaries" for k in call.keywords)
    }
    assert passing == {"run_dpsgd_with_canaries"}


def test_with_the_noise_off_every_guess_is_right(noise_off: None) -> None:
    """The control: the real audit (m = 100 Dirac canaries on Adult's logistic regression,
    q = 1, the noise switched off) guesses all 40 of its guesses right; so the bounds of
    benchmarks/results/one_run_audit_gradient.md are the noise's, not a blind scorer's."""
    a = run_one_run_audit(
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        canaries=100,
        guesses=40,
        options=FULL_BATCH,
        canary_kind="gradient",
    )
    assert a.canary_kind == "gradient" and a.sampling_rate == 1.0
    assert a.bound.correct == 40
    assert a.bound.epsilon > 1.0  # far above the (switched-off) claim: the test has power


def test_with_the_noise_on_the_bound_stays_below_the_claim() -> None:
    """ε = 1, the same design: the bound (at 99.9%, so a correct mechanism fails this test
    with probability ≤ 0.1%) is below the claimed ε. Its being above 0 is not asserted:
    measured 0 to 0.65 at 95% (benchmarks/results/one_run_audit_gradient.md)."""
    a = run_one_run_audit(
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        canaries=100,
        guesses=20,
        confidence=0.999,
        options=FULL_BATCH,
        canary_kind="gradient",
    )
    assert 0.0 <= a.bound.epsilon <= 1.0


def test_gradient_canaries_are_refused_where_they_cannot_run() -> None:
    with pytest.raises(AuditRefused, match="gradient canaries need"):
        run_one_run_audit(
            method="expm_nf", epsilon=1.0, delta=0.0, canaries=10, canary_kind="gradient"
        )
    with pytest.raises(AuditRefused, match="more than the model's 105 parameters"):
        run_one_run_audit(
            method="dpsgd", epsilon=1.0, delta=1e-5, canaries=106, canary_kind="gradient"
        )
