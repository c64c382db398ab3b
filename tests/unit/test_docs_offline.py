"""/docs and /redoc work without internet: their pages name no other host, every
script, style and icon they load is served by the service itself (ReDoc's footer logo
included), and each page's Content-Security-Policy allows only that."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.docs import REDOC_LOGO, offline_redoc_bundle
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


@pytest.mark.parametrize("page", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_docs_pages_carry_a_csp_that_allows_only_what_they_load(
    client: TestClient, page: str
) -> None:
    r = client.get(page)
    csp = r.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'" and directives["base-uri"] == "'none'"
    # No other host, no scheme but data: (images) and blob: (ReDoc's search worker).
    assert "://" not in csp and "*" not in csp
    assert directives["connect-src"] == "'self'" and directives["img-src"] == "'self' data:"
    # Scripts: the service's files, and each inline script by its own hash, no other.
    script_src = directives["script-src"].split()
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src
    inline = re.findall(r"<script>(.*?)</script>", r.text, re.DOTALL)
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in inline
    ]
    assert script_src == ["'self'", *hashes]
    assert bool(inline) == (page != "/redoc")  # Swagger UI's pages have one; ReDoc none
    assert ("worker-src" in directives) == (page == "/redoc")


def test_redoc_footer_logo_is_served_here_not_by_the_cdn(client: TestClient) -> None:
    html = client.get("/redoc").text
    [js] = re.findall(r"""<script src=["']([^"']+)["']""", html)
    bundle = client.get(js).text
    assert "Redoc" in bundle and "cdn.redoc.ly" not in bundle
    assert not re.search(r"""\bsrc:\s*["']https?://""", bundle)  # no remote image or script
    assert bundle.count(f'src:"{REDOC_LOGO}"') == 1
    logo = client.get(REDOC_LOGO)
    assert logo.status_code == 200 and logo.headers["content-type"] == "image/svg+xml"
    # The files under the static mount are still served from the package.
    assert client.get("/docs-assets/redoc.standalone.js").status_code == 200


def test_offline_redoc_bundle_refuses_a_bundle_it_does_not_recognise() -> None:
    with pytest.raises(RuntimeError, match=r"cdn\.redoc\.ly"):
        offline_redoc_bundle("a bundle without the logo")
