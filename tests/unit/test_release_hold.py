"""The public release time's arithmetic (service/release_hold.py): D on the quantum's
powers of two, the release at the first grid point not before the run's end, and the
analyst's progress from wall time alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.release_hold import HoldPolicy, hold_seconds, public_progress, release_time

POLICY = HoldPolicy(factor=1.5, quantum_s=1.0, time_limit_s=3600.0)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_hold_is_the_least_power_of_two_quanta_above_the_scaled_estimate() -> None:
    assert hold_seconds(None, POLICY) == 1.0  # no estimate: one quantum
    assert hold_seconds(0.0, POLICY) == 1.0
    assert hold_seconds(0.5, POLICY) == 1.0  # 0.75 -> 1
    assert hold_seconds(1.0, POLICY) == 2.0  # 1.5 -> 2
    assert hold_seconds(8.983, POLICY) == 16.0  # 13.47 -> 16
    assert hold_seconds(32.0 / 1.5, POLICY) == 32.0  # exactly on the grid stays there
    quarter = HoldPolicy(factor=1.0, quantum_s=0.25, time_limit_s=3600.0)
    assert hold_seconds(0.3, quarter) == 0.5
    # Capped at 0.9 × the job time limit (below Celery's soft limit at 0.95 ×).
    assert hold_seconds(3000.0, POLICY) == 0.9 * 3600.0


def test_release_at_the_first_grid_point_not_before_the_end() -> None:
    cap = POLICY.cap_s

    def at(elapsed: float) -> float:
        return (release_time(T0, 4.0, cap, T0 + timedelta(seconds=elapsed)) - T0).total_seconds()

    assert at(0.1) == 4.0 and at(4.0) == 4.0  # within D: at D
    assert at(4.01) == 8.0 and at(8.0) == 8.0  # overshoot: the next doubling
    assert at(9.0) == 16.0 and at(100.0) == 128.0
    assert at(3000.0) == cap  # the cap is the last grid point
    assert at(cap + 5.0) == cap + 5.0  # past it: at once (the leak the docstring states)


def test_public_progress_is_a_function_of_wall_time_and_the_hold_only() -> None:
    release_at = T0 + timedelta(seconds=10)

    def step(status: str, elapsed: float) -> int:
        now = T0 + timedelta(seconds=elapsed)
        return public_progress(status=status, started=T0, release_at=release_at, total=100, now=now)

    assert [step("running", e) for e in (0, 1, 2.5, 9.99, 10, 50)] == [0, 10, 25, 99, 99, 99]
    assert step("released", 3) == 100  # released: T whatever the time
    assert step("failed", 10) == 0  # a failed job's step reached is not shown
    assert step("queued", 5) == 0
    none = public_progress(status="running", started=T0, release_at=None, total=5, now=T0)
    assert none == 0
