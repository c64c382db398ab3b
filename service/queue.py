"""The service's side of the broker: it only sends task messages, by name.

The service never imports the worker; the task name is the contract.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

import redis
from celery import Celery

from service.config import Settings

RUN_JOB_TASK = "enclave.run_job"
RUN_AUDIT_TASK = "enclave.run_audit"  # an admin's privacy audit (issue 22): service/audits.py

log = logging.getLogger("enclave.queue")

# The sweeper reads at most this many of the oldest waiting messages per look (one
# LRANGE); a longer queue's newer messages are not read, and their jobs fall back to the
# sweeper's backoff.
BROKER_SCAN_LIMIT = 10_000


def celery_config(settings: Settings) -> dict[str, object]:
    """Settings shared by the sending service and the worker."""
    return {
        "broker_url": settings.resolved_broker_url,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "task_ignore_result": True,
        "task_default_queue": settings.queue,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": settings.job_time_limit_s,
        "task_soft_time_limit": max(1.0, 0.95 * settings.job_time_limit_s),
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": transport_options(
            settings.resolved_broker_url, settings.broker_key_prefix
        ),
    }


def transport_options(broker_url: str, key_prefix: str = "") -> dict[str, object]:
    # kombu's SQLAlchemy transport hands its options to create_engine(): give it none.
    if broker_url.startswith("sqla+"):
        return {}
    options: dict[str, object] = {"visibility_timeout": 3600}
    if key_prefix and broker_url.startswith(("redis://", "rediss://")):
        options["global_keyprefix"] = key_prefix
    return options


@lru_cache(maxsize=4)
def _client(broker_url: str, queue: str, key_prefix: str, timeout_s: float) -> Celery:
    options = transport_options(broker_url, key_prefix)
    if broker_url.startswith(("redis://", "rediss://")):
        # A send to a Redis that accepts connections but never answers must fail, not hang
        # the request (or the sweeper) that sends it.
        options.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    app = Celery("enclave-service")
    app.conf.update(
        broker_url=broker_url,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=queue,
        broker_connection_retry=False,
        broker_connection_max_retries=1,
        broker_transport_options=options,
    )
    return app


def send_run_job(settings: Settings, job_id: str, task: str = RUN_JOB_TASK) -> None:
    """Send one message (``task``: RUN_JOB_TASK, or RUN_AUDIT_TASK with an audit's id);
    raises if the broker is unreachable or does not answer within `broker_send_timeout_s`
    (the sweeper retries jobs)."""
    client = _client(
        settings.resolved_broker_url,
        settings.queue,
        settings.broker_key_prefix,
        settings.broker_send_timeout_s,
    )
    client.send_task(task, args=[job_id], queue=settings.queue, retry=False)


@dataclass(frozen=True)
class Waiting:
    """One look at the broker's queue: the asked-about jobs that have a run message
    waiting there (not yet delivered to a worker), and whether the look read the whole
    queue (then an asked-about job not in ``job_ids`` has no waiting message)."""

    job_ids: frozenset[str]
    complete: bool


def _job_id_of(raw: bytes) -> str | None:
    """The job id of one kombu Redis message (a JSON envelope around the Celery task
    message, protocol 2: body = [args, kwargs, embed]); None if it is not a run_job."""
    try:
        msg = json.loads(raw)
        if (msg.get("headers") or {}).get("task") != RUN_JOB_TASK:
            return None
        body = msg["body"]
        if (msg.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        payload = json.loads(body)
        args = payload[0] if isinstance(payload, list) else payload.get("args")
        job_id = args[0]
        return job_id if isinstance(job_id, str) else None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


@lru_cache(maxsize=4)
def _redis(broker_url: str, timeout_s: float) -> redis.Redis:
    return redis.Redis.from_url(
        broker_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )


def waiting_in_broker(settings: Settings, job_ids: Collection[str]) -> Waiting | None:
    """Which of ``job_ids`` have a run message waiting in the broker's queue, or None when
    the broker cannot be read this way (not Redis, or Redis does not answer).

    Only the ready list counts: a message a worker has taken (kombu's ``unacked`` hash) is
    not waiting, so a job whose worker took the message and died before claiming it is
    still re-sent. The oldest ``BROKER_SCAN_LIMIT`` messages are read in one LRANGE, with
    the queue's length, in one transaction (kombu pushes on the left and workers pop on the
    right, so the oldest are at the right end)."""
    url = settings.resolved_broker_url
    if not url.startswith(("redis://", "rediss://")) or not job_ids:
        return None
    key = settings.broker_key_prefix + settings.queue
    try:
        pipe = _redis(url, settings.broker_send_timeout_s).pipeline(transaction=True)
        pipe.llen(key)
        pipe.lrange(key, -BROKER_SCAN_LIMIT, -1)
        length, raws = pipe.execute()
    except Exception:
        log.warning("could not read the broker's queue %s", key, exc_info=True)
        return None
    wanted = set(job_ids)
    found = {job_id for raw in raws if (job_id := _job_id_of(raw)) is not None and job_id in wanted}
    return Waiting(frozenset(found), complete=int(length) <= BROKER_SCAN_LIMIT)
