"""The enclave's Celery app: JSON only, prefetch 1, late acks, reject on worker loss."""

from __future__ import annotations

from celery import Celery

from service.config import get_settings
from service.queue import celery_config


def make_celery() -> Celery:
    app = Celery("enclave-worker", include=["worker.tasks"])
    app.conf.update(celery_config(get_settings()))
    app.conf.update(worker_hijack_root_logger=False, worker_send_task_events=False)
    return app


app = make_celery()
