"""Structured (JSON) logs with request ids for the processes outside the enclave.

One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, the
``request_id`` of the HTTP request being served (when there is one) and any ``extra``
fields a call site passes. The API's access log (:class:`RequestLog`) writes one line per
request with the method, the route *template* (``/v1/jobs/{job_id}``: never ids or query
strings), the status and the duration: nothing derived from private rows and no secrets
(no headers, no bodies, no keys).

The request id is the caller's ``X-Request-ID`` when it is a short token of safe
characters, a fresh UUID otherwise; it is echoed in the response's ``X-Request-ID`` so a
client can quote it to the admin.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any, Literal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

REQUEST_ID_HEADER = "X-Request-ID"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# Attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = request_id.get()  # a record of this request's own lines carries it already
        if rid is not None:
            out["request_id"] = rid
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(*, fmt: Literal["json", "text"], level: str = "INFO") -> None:
    """Send the root logger's records to stderr, as JSON lines or as plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def _incoming_id(scope: Scope) -> str:
    for name, value in scope.get("headers") or []:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if _SAFE_ID.match(text):
                return text
    return uuid.uuid4().hex


class RequestLog:
    """ASGI middleware: a request id for every HTTP request (in the log context and the
    response header) and one access-log line when the response starts."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self.log = logging.getLogger("enclave.api.access")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _incoming_id(scope)
        token = request_id.set(rid)
        start = time.perf_counter()

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                headers.append((REQUEST_ID_HEADER.lower().encode(), rid.encode()))
                message["headers"] = headers
                route = getattr(scope.get("route"), "path", None)
                self.log.info(
                    "request",
                    extra={
                        "request_id": rid,
                        "method": scope.get("method"),
                        "route": route,
                        "status": message["status"],
                        "duration_ms": round((time.perf_counter() - start) * 1000, 2),
                    },
                )
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            request_id.reset(token)
