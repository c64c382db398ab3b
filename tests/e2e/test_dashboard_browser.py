"""The admin dashboard in a real browser: headless Chromium (Debian's `chromium`) driven by
Playwright, against a live API process on a registered dataset with real charges. Signs in,
opens every page, submits one form of each kind, signs out; the pages must raise no console
error (a Content-Security-Policy violation would be one). Screenshots go to
ENCLAVE_SCREENSHOT_DIR (docs/dashboard holds the committed ones) or the test's folder.

Skipped, with the reason, where Playwright or Chromium is not installed; .ci/run installs
Chromium from Debian's packages, the dev extras install Playwright.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from enclave.processes import child_env, free_port, start_api, stop, wait_ready
from service.db import engine_for, transaction
from service.ledger.tables import Job, JobStatus
from tests.conftest import auth
from tests.integration.test_dashboard import DPSGD

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("ENCLAVE_TEST_CHROMIUM") or shutil.which("chromium")


@pytest.fixture
def live(settings: Any, keys: Any, tmp_path: Path) -> Iterator[str]:
    env = child_env(
        {
            "ENCLAVE_HOME": str(settings.home),
            "ENCLAVE_DATABASE_URL": settings.resolved_database_url,
            "ENCLAVE_BROKER_URL": settings.resolved_broker_url,
            "ENCLAVE_DEVICE": "cpu",
        }
    )
    port = free_port()
    api = start_api(env, port, log=tmp_path / "api.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base)
        yield base
    finally:
        stop(api)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_in_a_real_browser(
    live: str, keys: Any, settings: Any, tmp_path: Path
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        pytest.skip("no chromium (Debian package) installed")
    shots = Path(os.environ.get("ENCLAVE_SCREENSHOT_DIR") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    api = httpx.Client(base_url=live, headers=auth(keys.alice))
    jobs = [api.post("/v1/jobs", json=DPSGD).json()["id"] for _ in range(3)]
    assert api.post(f"/v1/jobs/{jobs[0]}/cancel").is_success
    with transaction(engine_for(settings.resolved_database_url)) as s:
        s.execute(
            update(Job)
            .where(Job.id == jobs[1])
            .values(status=JobStatus.failed, error="the job failed in the enclave")
        )

    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        # Console errors other than HTTP statuses (the 409 below, /favicon.ico's 404): a
        # Content-Security-Policy violation, for one.
        page.on(
            "console",
            lambda m: (
                errors.append(m.text)
                if m.type == "error" and not m.text.startswith("Failed to load resource")
                else None
            ),
        )
        page.on("pageerror", lambda e: errors.append(str(e)))
        expect = sync_api.expect

        def shot(name: str) -> None:
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

        # Sign in: the key goes in a labelled field; the cookie holds a session token.
        page.goto(f"{live}/dashboard")
        expect(page).to_have_url(f"{live}/dashboard/login")
        shot("01-sign-in")
        page.get_by_label("API key").fill(keys.admin)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Datasets and budgets")).to_be_visible()
        (cookie,) = context.cookies()
        assert cookie["value"] != keys.admin and keys.admin not in cookie["value"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["path"] == "/dashboard"
        expect(page.get_by_text("intact")).to_be_visible()
        shot("02-datasets")

        # The dataset page: the chart, then one form of each kind on it.
        page.get_by_role("link", name="toy").click()
        chart = page.get_by_role("img", name="Cumulative ε spent on toy over time")
        expect(chart).to_be_visible()
        expect(page.locator("svg .pt.charge")).to_have_count(4)  # 3 jobs + the noisy count
        expect(page.locator("svg .pt.refund")).to_have_count(1)
        shot("03-dataset-chart")
        page.get_by_label("ε total (nats)").fill("15")
        page.get_by_role("button", name="Save budget").click()
        expect(page.get_by_role("status")).to_have_text("Budget saved.")
        page.get_by_label("refused").check()
        page.get_by_role("button", name="Save policy").click()
        expect(page.get_by_role("status")).to_have_text("Nominal policy saved.")
        page.get_by_label("Analyst").select_option("alice")
        page.get_by_label("Cap ε (nats)").fill("5")
        page.get_by_label("Cap δ (0 for pure mechanisms only)").fill("1e-5")
        page.get_by_role("button", name="Save cap").click()
        expect(page.get_by_role("status")).to_have_text("Cap saved.")
        expect(page.get_by_role("cell", name="(5, 1e-05)")).to_be_visible()
        # Bad input: a 4xx page that says nothing changed.
        page.get_by_label("ε total (nats)").fill("0.001")
        page.get_by_role("button", name="Save budget").click()
        expect(page.get_by_role("alert")).to_contain_text("Nothing was changed")
        page.go_back()

        # Analysts: create, rotate, revoke.
        page.get_by_role("link", name="Analysts").click()
        page.get_by_label("Name (letters, digits, _ . -)").fill("carol")
        page.get_by_role("button", name="Create analyst").click()
        expect(page.get_by_role("heading", name="Key created for carol")).to_be_visible()
        key = page.get_by_label("API key").input_value()
        assert httpx.get(f"{live}/v1/datasets", headers=auth(key)).status_code == 200
        shot("05-new-key")
        page.get_by_role("link", name="Back to analysts").click()
        page.get_by_role("button", name="Rotate carol's key").click()
        expect(page.get_by_role("heading", name="Key rotated for carol")).to_be_visible()
        assert httpx.get(f"{live}/v1/datasets", headers=auth(key)).status_code == 401
        page.get_by_role("link", name="Back to analysts").click()
        page.get_by_role("button", name="Revoke carol's key").click()
        # A confirmation page first (issue 26): nothing is revoked until confirmed.
        expect(page.get_by_role("heading", name="Revoke carol's key?")).to_be_visible()
        page.get_by_role("button", name="Yes, revoke carol's key").click()
        expect(page.get_by_role("status")).to_contain_text("Key revoked")
        shot("04-analysts")

        # Jobs: the failed job's reason and a refund; no guarantee on unreleased jobs.
        page.get_by_role("link", name="Jobs").click()
        expect(page.get_by_text("the job failed in the enclave")).to_be_visible()
        # (the filter form offers "proven" as a choice; the table shows no guarantee)
        expect(page.get_by_role("table").get_by_text("PROVEN")).to_have_count(0)
        page.get_by_label("reason").fill("lost worker, never read a row")
        page.get_by_role("button", name=re.compile("^Refund job")).click()
        expect(page.get_by_role("status")).to_have_text("Refund recorded in the ledger.")
        shot("06-jobs")

        # The ledger, with timestamps and both refunds' ε and δ negative.
        page.get_by_role("link", name="Ledger").click()
        expect(page.get_by_role("cell", name="-1e-05")).to_have_count(2)
        shot("07-ledger")

        # A phone-sized viewport: the chart still fits.
        page.set_viewport_size({"width": 390, "height": 844})
        page.goto(f"{live}/dashboard/datasets/toy")
        box = chart.bounding_box()
        assert box is not None and box["width"] <= 390
        shot("08-dataset-phone")
        page.set_viewport_size({"width": 1280, "height": 900})

        # Sign out: the old cookie opens nothing.
        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(f"{live}/dashboard/login")
        r = httpx.get(f"{live}/dashboard", cookies={"enclave_session": cookie["value"]})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
        browser.close()
    assert errors == []
