"""Request-level guards, app-wide and in one place.

:func:`reject_hostile_input` (a dependency of every route, set on the app) refuses, before
any other dependency or the route runs, values that no field of this API accepts and that
a database chokes on: a NUL character (``\\x00``) in a path parameter, the query string,
a header, a form field or any string (value or key) of a JSON body, and a JSON integer
outside the signed 64-bit range. PostgreSQL cannot store NUL in text and neither database
stores integers beyond int64, so such values used to surface as database errors (500s)
instead of as the client's mistake. The refusal is the usual 422 ``validation-error``
problem whose ``errors`` name each offending field (``["path", "job_id"]``,
``["query", "dataset"]``, ``["body", "space", "widths", 0]``...). Nothing is charged.

:class:`ServerErrors` sits just inside the request log: it answers any exception that
escaped the app with the opaque 500 problem, and makes sure every 5xx response is logged
once, with the request id (see :func:`service.api.errors.log_server_error`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from service.api.errors import (
    ProblemError,
    internal_response,
    log_server_error,
    server_error_scope,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NUL = "\x00"
_NUL_MSG = "NUL (\\x00) characters are not allowed"
_INT_MSG = f"Integer must be between {INT64_MIN} and {INT64_MAX}"


def _nul(loc: list[Any]) -> dict[str, Any]:
    return {"loc": loc, "msg": _NUL_MSG, "type": "string_nul"}


def _walk_json(value: Any, loc: list[Any]) -> Iterator[dict[str, Any]]:
    """The problems in a parsed JSON value: NUL in strings or keys, ints beyond int64."""
    stack: list[tuple[Any, list[Any]]] = [(value, loc)]
    while stack:  # not recursive: the depth of a JSON body is the client's choice
        item, where = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                yield _nul(where)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                yield {"loc": where, "msg": _INT_MSG, "type": "int_out_of_range"}
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if NUL in key:
                    yield _nul([*where, key])
                stack.append((child, [*where, key]))
        elif isinstance(item, list):
            for i in reversed(range(len(item))):
                stack.append((item[i], [*where, i]))


async def _body_issues(request: Request) -> list[dict[str, Any]]:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media in ("application/x-www-form-urlencoded", "multipart/form-data"):
        try:
            form = await request.form()  # parsed once: the route's own Form() reads it too
        except Exception:
            return []  # unreadable: the framework answers it
        out = []
        for name, value in form.multi_items():
            text = (value.filename or "") if isinstance(value, UploadFile) else value
            if NUL in name or NUL in text:
                out.append(_nul(["body", name]))
        return out
    if media and media != "application/json" and not media.endswith("+json"):
        return []
    # No content type is read as JSON by the framework: so it is here.
    if not await request.body():
        return []
    try:
        parsed = await request.json()  # parsed once: the route's body is this object
    except Exception:
        return []  # not JSON: the framework answers 400 malformed-json
    return list(_walk_json(parsed, ["body"]))


async def reject_hostile_input(request: Request) -> None:
    """422 (nothing charged) for NUL characters anywhere in the request and for JSON
    integers beyond int64; see the module docstring."""
    issues = [
        _nul(["path", name])
        for name, value in request.path_params.items()
        if isinstance(value, str) and NUL in value
    ]
    issues += [
        _nul(["query", name])
        for name, value in request.query_params.multi_items()
        if NUL in name or NUL in value
    ]
    issues += [
        _nul(["header", name])
        for name, value in request.headers.items()
        if NUL in name or NUL in value
    ]
    issues += await _body_issues(request)
    if issues:
        raise ProblemError(422, "validation-error", "The request is invalid.", errors=issues)


class ServerErrors:
    """ASGI middleware, just inside the request log: an exception that escaped the app is
    logged (with its traceback and the request id) and answered with the opaque 500
    problem; any other 5xx response not yet logged is logged with the request id."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        with server_error_scope() as logged:

            async def sending(message: Message) -> None:
                nonlocal started
                if message["type"] == "http.response.start":
                    started = True
                    status = int(message["status"])
                    if status >= 500 and not logged():
                        log_server_error(f"{status} response", status=status, exc_info=False)
                await send(message)

            try:
                await self.app(scope, receive, sending)
            except Exception as exc:
                if not logged():
                    log_server_error("unhandled exception", exc_info=exc)
                if started:
                    raise  # too late for a response: the server closes the connection
                await internal_response()(scope, receive, send)
