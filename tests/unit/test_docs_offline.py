"""/docs and /redoc work without internet: their pages name no other host, and every
script, style and icon they load is served by the service itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.config import Settings


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    home = tmp_path_factory.mktemp("home")
    settings = Settings(home=home, database_url=f"sqlite:///{Path(home) / 'x.sqlite'}")
    return TestClient(create_app(settings, run_sweeper=False))


@pytest.mark.parametrize(
    ("page", "script"),
    [("/docs", "SwaggerUIBundle"), ("/redoc", "Redoc")],
)
def test_docs_page_loads_only_local_assets(client: TestClient, page: str, script: str) -> None:
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    # No absolute URL of any host, no protocol-relative one, no Google fonts.
    assert "://" not in html and not re.search(r"""(src|href)=["']//""", html), html
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert len(assets) >= 2, html
    for url in assets:
        a = client.get(url)
        assert a.status_code == 200, url
        assert len(a.content) > 1000, url
    js = [u for u in assets if u.endswith(".js")]
    assert js and all(script in client.get(u).text for u in js)
    # The document the page loads is the service's own.
    assert "url: '/openapi.json'" in html or 'spec-url="/openapi.json"' in html
    assert client.get("/openapi.json").status_code == 200


def test_swagger_ui_does_not_call_the_public_validator(client: TestClient) -> None:
    assert '"validatorUrl": null' in client.get("/docs").text
    assert client.get("/docs/oauth2-redirect").status_code == 200
