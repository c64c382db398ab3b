"""Shared dependencies: the engine, settings and the caller's identity and role."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from service.api.errors import ProblemError
from service.api.limits import Limiter
from service.auth import analyst_for_key
from service.config import Settings
from service.db import transaction
from service.ledger.tables import Role

_bearer = HTTPBearer(auto_error=False, description="An API key issued by the admin.")


def get_engine_dep(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


EngineDep = Annotated[Engine, Depends(get_engine_dep)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


@dataclass(frozen=True)
class Caller:
    id: int
    name: str
    role: Role


def get_limiter_dep(request: Request) -> Limiter:
    return request.app.state.limiter  # type: ignore[no-any-return]


LimiterDep = Annotated[Limiter, Depends(get_limiter_dep)]


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
