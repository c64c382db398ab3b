"""Interactive API docs served offline: /docs (Swagger UI) and /redoc load their scripts
and styles from the service itself, never from a CDN (an enclave's network may not reach
one). The files come from the pinned `fastapi-offline` package, which ships the Swagger UI
and ReDoc bundles; only its files are used.

ReDoc's bundle draws the "API docs by Redocly" footer with an image fetched from
``cdn.redoc.ly``, whatever its options say (``hideLogo`` is about the document's
``x-logo``, which this service does not set). The service therefore serves the bundle with
that one URL pointing at a blank local image (:data:`REDOC_JS` and :data:`REDOC_LOGO`).

Each page is sent with a Content-Security-Policy that allows what it loads and nothing else
(:func:`content_security_policy`): scripts from the service, plus the one inline script of
the Swagger UI page (and of its OAuth2 redirect page) by its SHA-256; styles from the
service and inline (both UIs set styles from script, ReDoc as ``<style>`` elements);
images from the service and ``data:`` URIs (Swagger UI's icons); requests to the service
only; ReDoc's search index in a ``blob:`` worker; no framing, no ``<base>``, no forms
elsewhere. No other host appears anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")

# ReDoc with its footer logo served here (see the module docstring). Both URLs are routes
# registered before the static mount, so they take precedence over files under it.
REDOC_JS = f"{ASSETS_URL}/redoc.offline.js"
REDOC_LOGO = f"{ASSETS_URL}/redocly-logo.svg"
REDOCLY_LOGO_CDN = "https://cdn.redoc.ly/redoc/logo-mini.svg"
BLANK_SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'

_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def offline_redoc_bundle(source: str) -> str:
    """ReDoc's bundle with the footer logo's CDN URL replaced by :data:`REDOC_LOGO`."""
    if source.count(REDOCLY_LOGO_CDN) != 1:
        raise RuntimeError(f"ReDoc bundle: expected {REDOCLY_LOGO_CDN} once; check the bundle")
    return source.replace(REDOCLY_LOGO_CDN, REDOC_LOGO)


def inline_script_hashes(html: str) -> list[str]:
    """CSP sources (``'sha256-…'``) for each inline ``<script>`` element of a page."""
    return [
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(html)
    ]


def content_security_policy(html: str, *, workers: bool = False) -> str:
    """The policy of a docs page: see the module docstring."""
    script_src = " ".join(["'self'", *inline_script_hashes(html)])
    directives = [
        "default-src 'none'",
        f"script-src {script_src}",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        *(["worker-src blob:"] if workers else []),
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
    return "; ".join(directives)


def _with_policy(page: HTMLResponse, *, workers: bool = False) -> HTMLResponse:
    html = bytes(page.body).decode()
    page.headers["Content-Security-Policy"] = content_security_policy(html, workers=workers)
    return page


def install_docs(app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Serve the docs pages; the app must be built with ``docs_url=None, redoc_url=None``."""
    assert app.docs_url is None and app.redoc_url is None, "FastAPI's CDN pages are on"
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect = f"{docs_url}/oauth2-redirect"
    redoc_bundle = offline_redoc_bundle((ASSETS_DIR / "redoc.standalone.js").read_text("utf-8"))

    @app.get(REDOC_JS, include_in_schema=False)
    def redoc_js() -> Response:
        return Response(redoc_bundle, media_type="text/javascript")

    @app.get(REDOC_LOGO, include_in_schema=False)
    def redoc_logo() -> Response:
        return Response(BLANK_SVG, media_type="image/svg+xml")

    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title}: API docs",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            oauth2_redirect_url=oauth2_redirect,
            # No badge that asks the public validator about the document.
            swagger_ui_parameters={"validatorUrl": None},
        )
        return _with_policy(page)

    @app.get(oauth2_redirect, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return _with_policy(get_swagger_ui_oauth2_redirect_html())

    @app.get(redoc_url, include_in_schema=False)
    def redoc() -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title}: API reference",
            redoc_js_url=REDOC_JS,
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
        return _with_policy(page, workers=True)
