"""The service's side of the broker: it only sends task messages, by name.

The service never imports the worker; the task name is the contract.
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery

from service.config import Settings

RUN_JOB_TASK = "enclave.run_job"


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


def send_run_job(settings: Settings, job_id: str) -> None:
    """Send one message; raises if the broker is unreachable or does not answer within
    `broker_send_timeout_s` (the sweeper retries)."""
    client = _client(
        settings.resolved_broker_url,
        settings.queue,
        settings.broker_key_prefix,
        settings.broker_send_timeout_s,
    )
    client.send_task(RUN_JOB_TASK, args=[job_id], queue=settings.queue, retry=False)
