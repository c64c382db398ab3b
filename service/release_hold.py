"""The public release time: when an analyst may see that a job ended, from public values.

Without it, what an analyst sees of a run (GET /v1/jobs: status, progress_step,
finished_at) times the mechanism, and its time grows with the private row count (Poisson
batch sizes, full-batch passes), with the noise drawn (rejection loops) and with where a
guard fails. With ``ENCLAVE_RELEASE_HOLD`` on (the default), the worker (worker/runner.py)
fixes at its claim a hold ``D`` from public values only, never measured from the run:

    D = q · 2^k, the least such value ≥ factor × the plan's time estimate
        (service/resources.py plan_resources: a function of the plan and the dataset's
        public schema), at least q (``release_hold_quantum_s``), at most the cap C
        (0.9 × ``job_time_limit_s``, below Celery's soft limit at 0.95 ×);

and stores ``release_at = started_at + D``. It then holds the finished job, whether it was
trained or failed after reading rows, without committing its status, writing its release
files or taking the next job, until the first grid point ``started_at + D·2^j``
(j = 0, 1, …; C the last point) not before the run's end, and records that point as
``finished_at``. Analysts' progress is :func:`public_progress`: elapsed wall time against
``D``, never the run's step counter.

What still leaks (a bound on a channel, not a proof): which grid point the release took,
i.e. whether the run overshot ``D`` and by how many doublings, ⌈log2(run time / D)⌉ — a
coarse function of the run time, dominated by the machine's load and the estimate's
slack; a run past the cap C releases when it ends (its time then shows, within
[0.9, 0.95] × the job time limit, where the soft limit fails it). Failures before the first
row is read are not held (their time depends on public facts only). The admin's view and
the enclave's log keep the exact facts (the run's step counter; the log the run's
duration). The release's wall-clock cost is the throughput price: a worker holds each job
up to 2 × max(q, factor × estimate) (README, "Release hold").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from service.datasets.kinds import parse_dataset_schema
from service.resources import plan_resources
from service.schemas import PrivacyPlan

log = logging.getLogger("enclave.release_hold")

# The cap on a hold, as a share of the job time limit: below Celery's soft limit (0.95 ×,
# service/queue.py), so that a held job is released before the limit fails it.
HOLD_CAP_SHARE = 0.9


@dataclass(frozen=True)
class HoldPolicy:
    """The settings a hold is computed from (Settings: release_hold_factor,
    release_hold_quantum_s, job_time_limit_s): all public."""

    factor: float
    quantum_s: float
    time_limit_s: float

    @property
    def cap_s(self) -> float:
        return HOLD_CAP_SHARE * self.time_limit_s


def hold_seconds(estimate_s: float | None, policy: HoldPolicy) -> float:
    """D: the least ``q·2^k`` (k ≥ 0) at least ``factor × estimate_s``, capped at the
    policy's cap. A plan without a time estimate (None or 0; every job kind the worker runs
    has one, service/resources.py) holds for one quantum, and releases at the first
    doubling it does not overshoot."""
    target = policy.factor * (estimate_s or 0.0)
    d = policy.quantum_s
    while d < target and d < policy.cap_s:
        d *= 2.0  # exact in binary floating point: D is q times a power of two
    return min(d, policy.cap_s)


def plan_hold_seconds(plan: dict[str, Any], public_schema: Any, policy: HoldPolicy) -> float:
    """D of a job from its stored plan and its dataset's public schema (both shown to the
    analyst): :func:`hold_seconds` of the plan's time estimate. A plan the estimate cannot
    read (the worker's plan check then fails it, before any row) holds one quantum."""
    try:
        estimate = plan_resources(
            PrivacyPlan.model_validate(plan), schema=parse_dataset_schema(public_schema)
        ).seconds
    except Exception:
        log.warning("no time estimate for this plan; the hold is one quantum", exc_info=True)
        estimate = None
    return hold_seconds(estimate, policy)


def release_time(started: datetime, hold_s: float, cap_s: float, now: datetime) -> datetime:
    """The first grid point ``started + hold_s·2^j`` (j ≥ 0; ``started + cap_s`` the last)
    not before ``now``; ``now`` itself once past the cap."""
    elapsed = (now - started).total_seconds()
    point = hold_s
    while point < elapsed and point < cap_s:
        point *= 2.0
    point = min(point, cap_s)
    if point < elapsed:
        return now
    return started + timedelta(seconds=point)


def public_progress(
    *,
    status: str,
    started: datetime | None,
    release_at: datetime | None,
    total: int,
    now: datetime,
) -> int:
    """The analyst's "step k of T" of a held job (``release_at`` set): elapsed wall time
    against D while running (at most T − 1: the job is not done until released), T once
    released, 0 otherwise (queued, cancelled, failed: a failed job's step reached may
    depend on the rows). A function of public times only; it reads the same for any two
    jobs with the same start and hold, whatever their rows or their runs' speed."""
    if status == "released":
        return total
    if status != "running" or started is None or release_at is None:
        return 0
    hold = (release_at - started).total_seconds()
    elapsed = (now - started).total_seconds()
    if hold <= 0 or elapsed <= 0:
        return 0
    return max(0, min(total - 1, int(total * elapsed / hold)))
