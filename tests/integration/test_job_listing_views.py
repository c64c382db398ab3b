"""The dashboard's jobs page (issue 26): its filter form and cursor links. Seeded as in
test_job_listing.py (ties in created_at)."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

from typer.testing import CliRunner

from service.db import engine_for, transaction
from service.ledger.tables import Job, JobStatus
from tests.conftest import Keys
from tests.integration.test_job_listing import BASE, seed

runner = CliRunner()


def sign_in(client: Any, key: str) -> None:
    r = client.post("/dashboard/login", data={"api_key": key}, follow_redirects=False)
    assert r.status_code == 303


def row_ids(html: str) -> list[str]:
    return re.findall(r'<tr>\s*<td title="([^"]+)">', html)


def test_the_dashboard_filters_and_pages_jobs(client: Any, keys: Keys, settings: Any) -> None:
    jobs = seed(settings, keys, client)
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        template = s.get_one(Job, jobs[1].id)
        extra = []
        for i in range(50):  # more than a page (50) of failed jobs: 55 in all
            job = Job(
                id=f"zz{i:02d}-" + str(uuid.uuid4())[:20],
                analyst_id=template.analyst_id,
                dataset_id=template.dataset_id,
                request_hash=template.request_hash,
                request=template.request,
                plan=template.plan,
                status=JobStatus.failed,
                created_at=BASE + timedelta(seconds=3),  # ties with seeded rows
            )
            s.add(job)
            extra.append(job.id)
    failed = {j.id for j in jobs if j.status == "failed"} | set(extra)
    assert len(failed) > 50
    sign_in(client, keys.admin)
    page = client.get("/dashboard/jobs")
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "<script" not in page.text and "style=" not in page.text
    assert '<form method="get" action="/dashboard/jobs"' in page.text
    for name in ("status", "dataset", "method", "guarantee", "analyst"):
        assert f'<select id="filter-{name}" name="{name}">' in page.text
    assert '<option value="failed">failed</option>' in page.text
    assert '<option value="bob">bob</option>' in page.text
    assert f"{len(jobs) + 50} jobs match" in page.text

    # Filter by status: every failed job exactly once over the pages; the filter stays
    # selected and in the next-page links.
    seen: list[str] = []
    url: str | None = "/dashboard/jobs?status=failed&dataset=&method=&guarantee=&analyst="
    pages = 0
    while url is not None:
        page = client.get(url)
        assert page.status_code == 200, page.text
        assert '<option value="failed" selected>failed</option>' in page.text
        assert f"{len(failed)} jobs match these filters" in page.text
        seen += row_ids(page.text)
        cells = re.findall(r"<td>(queued|running|released|failed|cancelled)</td>", page.text)
        assert set(cells) == {"failed"}
        links = re.findall(r'<a href="([^"]+)" rel="next">older</a>', page.text)
        url = links[0].replace("&amp;", "&") if links else None
        if url is not None:
            assert "status=failed" in url and "cursor=" in url and "dataset=" not in url
        pages += 1
        if pages > 1:
            assert 'rel="first">newest</a>' in page.text
    assert pages == 2 and len(seen) == len(set(seen)) and set(seen) == failed

    # Analyst and method together; a blank field matches everything.
    page = client.get("/dashboard/jobs", params={"analyst": "bob", "method": "expm"})
    expected = {j.id for j in jobs if j.analyst == "bob" and j.method == "expm"}
    assert set(row_ids(page.text)) == expected and expected
    assert '<option value="bob" selected>bob</option>' in page.text
    page = client.get("/dashboard/jobs", params={"dataset": "toy", "status": "queued"})
    assert set(row_ids(page.text)) == {j.id for j in jobs if j.status == "queued"}

    # Unknown values: a 422 page (HTML, not problem+json); a forged cursor: a 400 page.
    for params in ({"status": "finished"}, {"method": "sgd"}, {"guarantee": "x"}):
        r = client.get("/dashboard/jobs", params=params)
        assert r.status_code == 422 and "Invalid filter" in r.text, params
        assert r.headers["content-type"].startswith("text/html")
    r = client.get("/dashboard/jobs", params={"cursor": "nonsense"})
    assert r.status_code == 400 and "No such page" in r.text
    assert r.headers["content-type"].startswith("text/html")


def test_the_jobs_page_shows_each_plans_estimate(client: Any, keys: Keys, settings: Any) -> None:
    """Each row shows its plan's quote-time estimate (service/resources.py), the figures the
    analyst's quote showed."""
    body = {"dataset": "toy", "method": "dpsgd", "epsilon": 1.0, "delta": 1e-5,
            "dpsgd": {"epochs": 1, "batch_size": 50}}  # fmt: skip
    alice = {"Authorization": f"Bearer {keys.alice}"}
    quote = client.post("/v1/quote", json=body, headers=alice).json()
    assert client.post("/v1/jobs", json=body, headers=alice).status_code == 202
    sign_in(client, keys.admin)
    page = client.get("/dashboard/jobs")
    assert page.status_code == 200 and "estimate (at most)" in page.text
    seconds, memory = quote["estimate"]["seconds"], quote["estimate"]["memory_bytes"]
    cell = f'<td class="estimate">~{seconds:.3g} s, ~{memory / 2**20:.3g} MiB</td>'
    assert cell in page.text
