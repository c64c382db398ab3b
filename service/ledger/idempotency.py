"""Idempotency-Key replays: a request's digest, and the job an earlier request made."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ledger.errors import IdempotencyConflict
from service.ledger.tables import Job
from service.schemas import LANGEVIN_ONLY_FIELDS, MCMC_ONLY_FIELDS, JobRequest

# Request fields added after requests were first hashed, with their defaults: a field at its
# default is left out of the digest, so an Idempotency-Key retry of a request sent before the
# field existed still matches its first job.
_LATER_OPTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "dpsgd": {
        "noise_schedule": "constant",
        "noise_decay": None,
        "engine": "exact",
        "jl_projections": None,
    },
    "expm": dict.fromkeys(MCMC_ONLY_FIELDS + LANGEVIN_ONLY_FIELDS),
    "expm_nf": {"domain_radius": None},
}
_LATER_TOP_LEVEL_FIELDS = ("expm",)  # options of methods added later, left out when None


def request_digest(request: JobRequest) -> str:
    data = request.model_dump(mode="json")
    for key in _LATER_TOP_LEVEL_FIELDS:
        if data.get(key) is None:
            data.pop(key, None)
    for options, later in _LATER_OPTION_DEFAULTS.items():
        if isinstance(data.get(options), dict):
            for key, default in later.items():
                if data[options].get(key, default) == default:
                    data[options].pop(key, None)
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def find_idempotent(
    session: Session, *, analyst_id: int, key: str, request_hash: str
) -> Job | None:
    job = session.scalars(
        select(Job).where(Job.analyst_id == analyst_id, Job.idempotency_key == key)
    ).one_or_none()
    if job is not None and job.request_hash != request_hash:
        raise IdempotencyConflict("this Idempotency-Key was already used with a different body")
    return job
