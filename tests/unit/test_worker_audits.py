"""worker/audits.py: the one-run audit's guesser, its refusals, and one real audit run
(DP-SGD logistic regression on the bundled Adult training set, 100 canaries)."""

from __future__ import annotations

import numpy as np
import pytest

from service.modelspec import LogisticSpec
from service.privacy.one_run_audit import ceiling
from service.schemas import DpsgdOptions
from worker.audits import (
    MAX_CANARY_FRACTION,
    AuditRefused,
    correct_guesses,
    run_one_run_audit,
)


def test_guesser_top_and_bottom_k() -> None:
    included = np.array([True, False, True, False, True, False])
    scores = np.array([5.0, -3.0, 4.0, -2.0, 0.0, 0.1])  # members scored high
    perm = np.arange(6)
    # top 2 → canaries 0, 2 (in, right); bottom 2 → 1, 3 (out, right)
    assert correct_guesses(scores=scores, included=included, guesses=4, tie_break=perm) == 4
    # r = 6: also 5 guessed "in" (wrong) and 4 "out" (wrong)
    assert correct_guesses(scores=scores, included=included, guesses=6, tie_break=perm) == 4
    # the opposite scores get every guess wrong
    assert correct_guesses(scores=-scores, included=included, guesses=4, tie_break=perm) == 0
    # r odd: one more "in" guess than "out"
    assert correct_guesses(scores=scores, included=included, guesses=3, tie_break=perm) == 3


def test_ties_are_broken_by_the_permutation_not_by_membership() -> None:
    included = np.array([True, False, True, False])
    scores = np.zeros(4)
    got = {
        correct_guesses(scores=scores, included=included, guesses=2, tie_break=np.array(p))
        for p in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2])
    }
    assert got == {0, 2}  # the tie order decides, so both extremes occur


def test_refusals() -> None:
    with pytest.raises(AuditRefused, match="cannot be audited"):
        run_one_run_audit(method="expm", epsilon=1.0, delta=1e-5, canaries=10, dataset="icu")
    with pytest.raises(AuditRefused, match="model 'logistic' cannot be audited"):
        run_one_run_audit(
            method="dpsgd",
            epsilon=1.0,
            delta=1e-5,
            canaries=10,
            dataset="icu",
            model=LogisticSpec(),
        )
    with pytest.raises(AuditRefused, match="out of range for icu"):
        run_one_run_audit(method="dpsgd", epsilon=1.0, delta=1e-5, canaries=201, dataset="icu")
    with pytest.raises(AuditRefused, match="out of range"):
        run_one_run_audit(method="dpsgd", epsilon=1.0, delta=1e-5, canaries=10**6)
    with pytest.raises(AuditRefused, match="out of range"):
        run_one_run_audit(method="dpsgd", epsilon=1.0, delta=1e-5, canaries=0)
    with pytest.raises(AuditRefused, match="unknown public dataset"):
        run_one_run_audit(method="dpsgd", epsilon=1.0, delta=1e-5, canaries=10, dataset="x")
    with pytest.raises(AuditRefused, match="guesses"):
        run_one_run_audit(method="dpsgd", epsilon=1.0, delta=1e-5, canaries=10, guesses=11)


def test_one_audit_on_adult() -> None:
    a = run_one_run_audit(method="dpsgd", epsilon=1.0, delta=1e-5, canaries=100, guesses=40)
    b = a.bound
    assert (b.canaries, b.guesses) == (100, 40)
    assert 0 <= b.correct <= 40
    assert b.ceiling == pytest.approx(ceiling(canaries=100, confidence=0.95, delta=1e-5))
    assert 0.0 <= b.epsilon <= b.ceiling
    assert a.rows > 30_000 and a.rows * MAX_CANARY_FRACTION >= 100
    assert a.noise_multiplier is not None and a.noise_multiplier > 0
    assert a.steps is not None and a.steps > 0
    assert a.sampling_rate is not None and 0 < a.sampling_rate < 1
    assert a.seconds > 0


def test_one_audit_of_expm_langevin_on_adult() -> None:
    """The proven ExpM (its default Langevin sampler): one release, scored like DP-SGD's."""
    a = run_one_run_audit(method="expm", epsilon=1.0, delta=1e-5, canaries=50)
    assert a.model == "logistic" and a.bound.canaries == 50
    assert 0.0 <= a.bound.epsilon <= a.bound.ceiling
    assert a.noise_multiplier is not None and a.sampling_rate is None  # no Poisson sampling


def test_one_audit_of_grud_on_the_icu_sample() -> None:
    """GRU-D by DP-SGD on the bundled synthetic ICU sample (2,000 stays), one epoch."""
    a = run_one_run_audit(
        method="dpsgd",
        epsilon=1.0,
        delta=1e-5,
        canaries=40,
        dataset="icu",
        options=DpsgdOptions(epochs=1),
    )
    assert (a.model, a.dataset, a.rows) == ("grud", "icu", 2_000)
    assert 0 <= a.bound.correct <= a.bound.guesses == 8
    assert 0.0 <= a.bound.epsilon <= a.bound.ceiling
