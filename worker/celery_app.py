"""The enclave's Celery app: JSON only, prefetch 1, late acks, reject on worker loss.

``worker_cancel_long_running_tasks_on_connection_loss`` is set, to False, on purpose (it is
Celery 5's opt-in for what becomes Celery 6's default, True). With True, a broker
connection loss terminates every running late-ack task, because its ack can no longer
be sent and the broker will deliver the message again. Here that redelivery is already
harmless, and the cancellation is not:

- a redelivered message finds the job claimed with a fresh heartbeat (or finished) and
  is skipped (:func:`worker.runner._claim`); a release is a compare-and-set on the run
  token, so a duplicate run is never released;
- terminating a run that has read private rows keeps its charge and makes the sweeper
  start the mechanism again on the same rows (another attempt): a Redis restart would
  turn every running job into a second execution. Left running, the job finishes and is
  released once, as issue 11's broker-restart fault test checks (one attempt).

A starting worker checks the private folders' permissions (issue 26,
:func:`service.private_files.warn_private_permissions`): one warning per folder wider than
0700 or file wider than 0600; it starts anyway.

Every worker process then calls each compiled IEEE kernel once on tiny public inputs
(worker/kernel_warm_up.py, issues 24/25: numba's first call, ~0.5-0.7 s, is paid at start,
not by the first release), before it takes a task (Celery sends ``worker_process_init`` in
the solo pool's process, which ``enclave worker``, ``enclave up`` and ``enclave demo`` run,
and in each prefork child). A kernel that fails there stops the worker (SystemExit: Celery
logs and goes on after a handler's Exception, not after SystemExit).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_init

from service.config import get_settings
from service.private_files import warn_private_permissions
from service.queue import celery_config


def make_celery() -> Celery:
    app = Celery("enclave-worker", include=["worker.tasks"])
    app.conf.update(celery_config(get_settings()))
    app.conf.update(
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,  # see the module docstring
    )
    return app


app = make_celery()
log = logging.getLogger("enclave.worker")


@worker_init.connect
def check_permissions_at_start(sender: Any = None, **_: Any) -> None:
    """Start-up check of this worker's private folders (never stops the worker)."""
    if getattr(sender, "app", None) is app:
        settings = get_settings()
        # The worker alone names the private data folder (the service never reads it).
        warn_private_permissions(settings, private_folders=[settings.resolved_data_dir])


@worker_process_init.connect
def warm_up_kernels(**_: Any) -> None:
    """Each compiled kernel's first call, in the process that runs the tasks (module
    docstring); stops the worker if one is broken."""
    from worker.kernel_warm_up import KernelWarmUpError, warm_up  # numba: worker side only

    try:
        done = warm_up()
    except KernelWarmUpError as exc:
        log.critical("compiled kernel warm-up failed, the worker stops: %s", exc)
        raise SystemExit(f"compiled kernel warm-up failed: {exc}") from exc
    log.info("compiled kernels warmed up: %d in %.2f s", len(done.kernels), done.seconds)
