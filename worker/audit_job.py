"""Run one admin audit inside the enclave (issue 22): claim it, run it, record the result.

The audit is a row of service/audits.py's table, queued by ``POST /v1/admin/audits``. The
claim is a compare-and-set from queued to running, so a duplicate message runs nothing.
worker/audits.py trains once on the PUBLIC dataset the request names (Adult or the
synthetic ICU sample; no ledger budget, no private row) and the bound, its ceiling and
the run's public figures are written back. A LiRA audit (``attack: "lira"``) runs
worker/lira.py's :func:`~worker.lira.run_lira_audit` on a public Adult pool instead; its
one-run bound and its figures (worker.lira.audit_figures) are written back the same way.
A failure is recorded with a generic sentence; its detail goes to the worker's log only.
"""

from __future__ import annotations

import enum
import logging
import time
from typing import Any

from service.audits import claim_audit, finish_audit
from service.config import Settings, get_settings
from service.db import engine_for, transaction
from service.privacy.one_run_audit import OneRunBound
from service.schemas.audits import AuditRequest, LiraFigures
from worker.audits import AuditRefused, run_requested_audit
from worker.lira import audit_figures, run_lira_audit

log = logging.getLogger("enclave.worker")

AUDIT_FAILURE = "the audit failed inside the enclave; the worker's log has the details"


class AuditOutcome(enum.StrEnum):
    done = "done"
    failed = "failed"
    skipped = "skipped"  # unknown, or already taken by another message


def execute_audit(audit_id: str, settings: Settings | None = None) -> AuditOutcome:
    settings = settings or get_settings()
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        request = claim_audit(s, audit_id, time_limit_s=settings.job_time_limit_s)
    if request is None:
        log.info("audit %s: not queued (unknown, or taken); skipped", audit_id)
        return AuditOutcome.skipped
    start = time.perf_counter()
    try:
        bound, run, lira = _run(request)
    except Exception as exc:
        log.exception("audit %s failed", audit_id)
        # A refusal is about the public request (checked by the service already): say it.
        failure = str(exc) if isinstance(exc, AuditRefused) else AUDIT_FAILURE
        with transaction(engine) as s:
            finish_audit(s, audit_id, failure=failure, seconds=time.perf_counter() - start)
        return AuditOutcome.failed
    seconds = time.perf_counter() - start
    with transaction(engine) as s:
        finish_audit(s, audit_id, bound=bound, run=run, seconds=seconds, lira=lira)
    log.info("audit %s done in %.1f s", audit_id, seconds)
    return AuditOutcome.done


def _run(request: AuditRequest) -> tuple[OneRunBound, dict[str, Any], LiraFigures | None]:
    """The audit the request asks for: its one-run bound, the run's public figures (rows,
    noise_multiplier, steps, sampling_rate) and a LiRA audit's figures."""
    if request.attack == "lira":
        result = run_lira_audit(request)
        run = {"rows": result.pool} | {
            k: result.plan.get(k) for k in ("noise_multiplier", "steps", "sampling_rate")
        }
        return result.one_run, run, audit_figures(result)
    audit = run_requested_audit(request)
    run = {
        "rows": audit.rows,
        "noise_multiplier": audit.noise_multiplier,
        "steps": audit.steps,
        "sampling_rate": audit.sampling_rate,
    }
    return audit.bound, run, None
