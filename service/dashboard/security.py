"""Security headers on every dashboard response (pages, redirects and errors alike).

The pages use no script at all, inline or not, so the policy forbids it; styles come only
from the dashboard's own stylesheet; no page may be framed (clickjacking); nothing is
cached (the pages show the ledger) and no Referer leaves them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS: dict[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
PREFIX = "/dashboard"

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class DashboardHeaders:
    """ASGI middleware: set :data:`HEADERS` on responses under ``/dashboard``."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k in HEADERS}
                kept = [
                    (k, v) for k, v in message.get("headers", []) if k.decode().lower() not in names
                ]
                message["headers"] = kept + [(k.encode(), v.encode()) for k, v in HEADERS.items()]
            await send(message)

        await self.app(scope, receive, send_with_headers)
