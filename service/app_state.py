"""What the app holds for every request (the ledger's engine, the settings, the rate
limiter), as FastAPI dependencies. Shared by the HTTP API (service.api) and the dashboard
(service.dashboard), so neither front end imports the other."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from service.config import Settings
from service.limits import Limiter


def get_engine_dep(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_limiter_dep(request: Request) -> Limiter:
    return request.app.state.limiter  # type: ignore[no-any-return]


EngineDep = Annotated[Engine, Depends(get_engine_dep)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
LimiterDep = Annotated[Limiter, Depends(get_limiter_dep)]
