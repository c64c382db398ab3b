"""Interactive API docs served offline: /docs (Swagger UI) and /redoc load their scripts
and styles from the service itself, never from a CDN (an enclave's network may not reach
one). The files come from the pinned `fastapi-offline` package, which ships the Swagger UI
and ReDoc bundles; only its files are used."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")


def install_docs(app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Serve the docs pages; the app must be built with ``docs_url=None, redoc_url=None``."""
    assert app.docs_url is None and app.redoc_url is None, "FastAPI's CDN pages are on"
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect = f"{docs_url}/oauth2-redirect"
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title}: API docs",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            oauth2_redirect_url=oauth2_redirect,
            # No badge that asks the public validator about the document.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(oauth2_redirect, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(redoc_url, include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title}: API reference",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
