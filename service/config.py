"""Settings: one validated class, read from ``ENCLAVE_*`` environment variables.

Built by the cached getter :func:`get_settings`, never at import time; tests call
``get_settings.cache_clear()`` after changing the environment.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    """``~/.enclave``: the same for every process of one user, whatever its working folder."""
    return Path.home() / ".enclave"


class Settings(BaseSettings):
    """Paths: ``home`` is made absolute when the settings load (a relative ENCLAVE_HOME is
    taken from the working folder then); relative ``release_dir`` and ``data_dir`` are
    under ``home``, never under the working folder, so an API and a worker started from
    different folders with the same settings find the same files."""

    model_config = SettingsConfigDict(env_prefix="ENCLAVE_", extra="ignore")

    home: Path = Field(
        default_factory=default_home, description="Root of the enclave's files (absolute)."
    )
    database_url: str = Field(default="", description="SQLAlchemy URL of the ledger database.")
    broker_url: str = Field(default="", description="Celery broker URL.")
    release_dir: Path | None = Field(
        default=None, description="Where releases are written (default: home/releases)."
    )
    data_dir: Path | None = Field(
        default=None,
        description="Private data volume, only in the worker (default: home/private-data).",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    queue: str = "enclave.jobs"
    broker_key_prefix: str = Field(
        default="",
        description=(
            "Prefix of every key the Redis broker transport writes (kombu's global_keyprefix), "
            "so deployments and test runs can share one Redis database without touching each "
            "other's keys."
        ),
    )
    # The service's sends to the broker give up after this long (a hung Redis would
    # otherwise hang every submission): the job stays queued and the sweeper sends it later.
    broker_send_timeout_s: float = Field(default=5.0, gt=0)
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    # Log lines of the API process: one JSON object per line with the request id
    # (service/logs.py), or plain text.
    log_format: Literal["json", "text"] = "json"
    # A running job whose heartbeat is older than this is presumed lost and re-enqueued.
    # Worst case for a killed worker's job (service/jobs.py, recovery_deadline_s): its last
    # heartbeat at most at the kill, stale heartbeat_timeout_s later, seen by the next sweep
    # at most sweep_interval_s after that, then sent and claimed by an idle worker:
    # 40 s + 10 s = 50 s, leaving 10 s of the 60 s target for the send and the pickup
    # (was 120 s + 15 s = 135 s; measured 137 s). The worker beats every
    # min(5 s, timeout / 4) (worker/runner.py): 5 s, so 7 beats in a row must be missed
    # before a busy but alive worker would be taken for dead.
    heartbeat_timeout_s: float = Field(default=40.0, gt=0)
    sweep_interval_s: float = Field(default=10.0, gt=0)
    # A queued job whose message was sent this long ago and that no worker has started is
    # sent again if its message is lost (a lost message: Redis without persistence, or
    # consumed while the ledger was down). On Redis the sweeper looks in the queue and
    # re-sends only a job whose message is not waiting there; where it cannot tell (another
    # broker, a queue too long to read), it backs off: the wait before the next re-send is
    # the job's age at its last send (doubling), at least requeue_after_s and at most
    # requeue_backoff_max_s. Duplicates are harmless: the worker's claim runs a job once.
    requeue_after_s: float = Field(default=45.0, gt=0)
    requeue_backoff_max_s: float = Field(default=1800.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    # Hard wall-clock limit of one run of a job in the worker (Celery's task_time_limit): a
    # run past it is killed; its job is re-sent (a new attempt) until max_attempts, then
    # failed. The soft limit, a little earlier, ends the run with a failure in-process.
    job_time_limit_s: float = Field(default=3600.0, gt=0)
    # The public release time (service/release_hold.py): the worker holds each job it ran
    # until started_at + D, D = release_hold_quantum_s × 2^k ≥ release_hold_factor × the
    # plan's time estimate (public values only), or the next doubling of D if the run
    # overshoots; analysts see that grid time as finished_at and a progress computed from
    # elapsed time against D. Off: the exact times and progress are shown (tests only).
    release_hold: bool = True
    release_hold_factor: float = Field(default=1.0, gt=0)
    release_hold_quantum_s: float = Field(default=1.0, gt=0)
    # CPU threads torch may use in a worker for one job (torch.set_num_threads); None: torch's
    # default (the machine's cores). benchmarks/results/worker_threads.md measures 1 vs 2.
    worker_threads: int | None = Field(default=None, ge=1, le=1024)
    # Memory a worker may use for one job; plans estimated above it are refused at quote
    # time (service/resources.py), before anything is charged.
    worker_memory_bytes: int = Field(default=16 * 2**30, ge=2**20)
    # Rate limits per API process (service/limits.py): a token bucket per key on every
    # authenticated call, and caps on concurrent quotes/submissions per key and in total.
    rate_limit_per_s: float = Field(default=20.0, gt=0)
    rate_limit_burst: int = Field(default=100, ge=1)
    planning_per_key: int = Field(default=2, ge=1)
    planning_global: int = Field(default=4, ge=1)
    # Wall-clock bound on planning one quote or submission (service/privacy/deadline.py):
    # past it the request is a 422 with nothing charged and its planning slot is freed.
    planning_time_limit_s: float = Field(default=30.0, gt=0)
    # Per client address (issue 19), for traffic with no key to charge: calls with a missing
    # or invalid API key, and GET /metrics (a bucket each), and dashboard sign-in attempts,
    # successful or not (a small burst, then one attempt a minute). Off only where a proxy in
    # front already limits by address. The address is the TCP peer's unless
    # trust_forwarded_for: then the last X-Forwarded-For entry (set that only behind a proxy
    # that appends it, or clients choose their own address).
    address_rate_limits: bool = True
    unauth_rate_limit_per_s: float = Field(default=1.0, gt=0)
    unauth_rate_limit_burst: int = Field(default=30, ge=1)
    login_rate_limit_per_s: float = Field(default=1 / 60, gt=0)
    login_rate_limit_burst: int = Field(default=10, ge=1)
    trust_forwarded_for: bool = False
    # When set (non-empty), GET /metrics requires `Authorization: Bearer <token>`; unset, it
    # is public as before.
    metrics_token: SecretStr | None = None
    # Lifetime of an admin's dashboard session (service/dashboard/sessions.py), from sign-in.
    dashboard_session_ttl_s: float = Field(default=8 * 3600.0, gt=0, le=30 * 86400.0)

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, home: Path) -> Path:
        return home.expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.home / 'ledger.sqlite').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{(self.home / 'broker.sqlite').resolve()}"

    @property
    def resolved_release_dir(self) -> Path:
        return self._under_home(self.release_dir, "releases")

    @property
    def resolved_data_dir(self) -> Path:
        return self._under_home(self.data_dir, "private-data")

    def _under_home(self, path: Path | None, default: str) -> Path:
        """``path`` if absolute, else under ``home`` (``default`` when unset)."""
        return (self.home / (path.expanduser() if path is not None else default)).resolve()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
