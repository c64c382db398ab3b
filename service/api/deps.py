"""The API's dependencies: the caller's identity and role (from its API key), its planning
slot; the engine, settings and limiter come from service.app_state (shared with the
dashboard) and are re-exported here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.errors import ProblemError
from service.app_state import EngineDep as EngineDep
from service.app_state import LimiterDep as LimiterDep
from service.app_state import SettingsDep as SettingsDep
from service.auth import analyst_for_key
from service.db import transaction
from service.ledger.tables import Role

_bearer = HTTPBearer(auto_error=False, description="An API key issued by the admin.")


@dataclass(frozen=True)
class Caller:
    id: int
    name: str
    role: Role


def current_caller(
    request: Request,
    engine: EngineDep,
    limiter: LimiterDep,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    # A call without a valid key spends a token of its address's bucket (a 429 once empty,
    # issue 19); a valid key spends only its own, never slowed by others' bad guesses.
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        limiter.take_unauthenticated(request)
        raise ProblemError(401, "unauthorized", "missing API key")
    with transaction(engine) as s:
        analyst = analyst_for_key(s, creds.credentials)
        caller = None if analyst is None else Caller(analyst.id, analyst.name, Role(analyst.role))
    if caller is None:
        limiter.take_unauthenticated(request)
        raise ProblemError(401, "unauthorized", "invalid, revoked or expired API key")
    limiter.take(caller.id)
    return caller


CallerDep = Annotated[Caller, Depends(current_caller)]


def planning_slot(caller: CallerDep, limiter: LimiterDep) -> Iterator[None]:
    """Held while a quote or submission computes its plan (the expensive part)."""
    with limiter.planning(caller.id):
        yield


PlanningDep = Annotated[None, Depends(planning_slot)]


def require_admin(caller: CallerDep) -> Caller:
    if caller.role != Role.admin:
        raise ProblemError(403, "forbidden", "this endpoint is for the admin")
    return caller


AdminDep = Annotated[Caller, Depends(require_admin)]
