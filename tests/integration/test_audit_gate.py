"""The release gate (issue 22, point 2; service/audit_gate.py): per dataset, training jobs
only with a recent passing audit of their configuration.

The audits here are rows of the real ``audits`` table written as the worker's
``finish_audit`` leaves a done audit (tests/integration/test_audits_api.py runs real
audits end to end); what is tested is the gate's decision on them through the API, the
ledger's record of the gate, the card of a gated job run by the real worker, and the
migration."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from sqlalchemy import inspect, select
from typer.testing import CliRunner

from enclave.cli import app
from service.api.routes import jobs as routes
from service.audit_gate import GateCheck, JobAudit, recheck_under_lock, set_audit_gate
from service.audits import Audit
from service.datasets.kinds import parse_dataset_schema
from service.db import engine_for, transaction
from service.ledger.tables import Analyst, Dataset, EntryKind, Job, LedgerEntry, Role
from service.migrate import downgrade, upgrade
from tests.conftest import auth
from tests.integration.test_dashboard_forms import ledger_rows, post, signed_in
from tests.integration.test_selections import ARCH
from worker.audit_job import AuditOutcome, execute_audit
from worker.registration import register_dataset
from worker.runner import Outcome, execute_job

JOB = {
    "dataset": "toy",
    "method": "dpsgd",
    "epsilon": 1.0,
    "delta": 1e-5,
    "dpsgd": {"epochs": 1, "batch_size": 50},
}
GATE = "/v1/admin/datasets/toy/audit-gate"
PROBLEM_JSON = "application/problem+json"


def _sigma(client: Any, keys: Any) -> float:
    r = client.post("/v1/quote", json=JOB, headers=auth(keys.alice))
    assert r.status_code == 200, r.text
    return float(r.json()["plan"]["mechanism"]["noise_multiplier"])


def _audit(
    settings: Any,
    *,
    sigma: float,
    bound: float = 0.3,
    claimed: float = 1.0,
    age_days: float = 1.0,
    status: str = "done",
    model: str = "logistic",
    engine: str = "exact",
    method: str = "dpsgd",
    attack: str = "one_run",
    expm: dict[str, Any] | None = None,
    hidden: list[int] | None = None,
    dataset: str = "adult",
    spec: dict[str, Any] | None = None,
) -> str:
    """A finished audit row of the configuration given, as finish_audit writes one
    (``spec``: the request's model, instead of the one ``model`` and ``hidden`` name)."""
    finished = datetime.now(UTC) - timedelta(days=age_days)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        admin = s.scalars(select(Analyst).where(Analyst.role == Role.admin)).first()
        assert admin is not None
        audit = Audit(
            id=str(uuid.uuid4()),
            status=status,
            requested_by=admin.id,
            request={
                "method": method,
                "model": spec
                or (
                    {"kind": model}
                    if model == "logistic"
                    else {"kind": model, "hidden": hidden or [8]}
                ),
                "epsilon": claimed,
                "delta": 1e-5,
                "canaries": 1000,
                "dataset": dataset,
                "guesses": 200,
                "confidence": 0.95,
                "attack": attack,
                **({"dpsgd": {"epochs": 1, "engine": engine}} if method == "dpsgd" else {}),
                **({"expm": expm} if expm is not None else {}),
            },
            planned={"noise_multiplier": sigma, "steps": 4, "sampling_rate": 0.25},
            ceiling=5.8,
            created_at=finished - timedelta(minutes=5),
            started_at=finished - timedelta(minutes=4),
            finished_at=finished,
            result=None
            if status != "done"
            else {
                "epsilon_lower_bound": bound,
                "ceiling": 5.8,
                "canaries": 1000,
                "guesses": 200,
                "correct": 120,
                "confidence": 0.95,
                "rows": 30162,
                "noise_multiplier": sigma,
                "steps": 4,
                "sampling_rate": 0.25,
            },
            failure=None if status == "done" else "the audit did not finish",
        )
        s.add(audit)
        return audit.id


def _spent(client: Any, keys: Any) -> tuple[Any, Any]:
    r = client.get("/v1/datasets/toy", headers=auth(keys.alice))
    assert r.status_code == 200, r.text
    return r.json()["budget"], r.json()["analyst_budget"]


def _jobs(settings: Any) -> int:
    with transaction(engine_for(settings.resolved_database_url)) as s:
        return len(s.scalars(select(Job)).all())


def _gate(client: Any, keys: Any, days: float | None) -> None:
    r = client.put(GATE, json={"max_age_days": days}, headers=auth(keys.admin))
    assert r.status_code == 200, r.text
    assert r.json() == {"dataset": "toy", "max_age_days": days}


def _refused(client: Any, keys: Any, settings: Any, words: str) -> None:
    before, jobs = _spent(client, keys), _jobs(settings)
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=JOB, headers=auth(keys.alice))
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == PROBLEM_JSON
        assert r.json()["type"].endswith("audit-gate") and words in r.json()["detail"]
    assert _spent(client, keys) == before and _jobs(settings) == jobs  # nothing charged


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_gate_off_changes_nothing_and_on_without_audit_refuses(
    client: Any, keys: Any, settings: Any
) -> None:
    assert client.get(GATE, headers=auth(keys.admin)).json()["max_age_days"] is None
    assert client.get(GATE, headers=auth(keys.alice)).status_code == 403
    assert client.put(GATE, json={"max_age_days": 30}, headers=auth(keys.alice)).status_code == 403
    r = client.post("/v1/jobs", json=JOB, headers=auth(keys.alice))
    assert r.status_code == 202, r.text  # gate off: as before
    _gate(client, keys, 30)
    assert client.get(GATE, headers=auth(keys.admin)).json()["max_age_days"] == 30
    _refused(client, keys, settings, "no done audit matches it")
    r = client.post("/v1/selections/quote", json=ARCH, headers=auth(keys.alice))
    assert r.status_code == 422 and "selections are refused" in r.json()["detail"], r.text
    _gate(client, keys, None)
    r = client.post("/v1/jobs", json=JOB, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    with transaction(engine_for(settings.resolved_database_url)) as s:
        events = [
            e.event
            for e in s.scalars(select(LedgerEntry).order_by(LedgerEntry.id))
            if e.kind == EntryKind.budget and e.event.get("action") == "set_audit_gate"
        ]
    assert events == [
        {"action": "set_audit_gate", "max_age_days": 30},
        {"action": "set_audit_gate", "max_age_days": None},
    ]
    ledger = client.get("/v1/admin/ledger", headers=auth(keys.admin))
    assert ledger.status_code == 200, ledger.text
    assert sum(e["event"].get("action") == "set_audit_gate" for e in ledger.json()) == 2


@pytest.mark.parametrize(("bad_value"), [0, -1, 3651, "x", True, float("inf")], ids=str)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_bad_gate_values_are_422_and_unknown_datasets_404(
    client: Any, keys: Any, bad_value: Any
) -> None:
    body = f'{{"max_age_days": {"Infinity" if bad_value == float("inf") else bad_value}}}'
    if isinstance(bad_value, str):
        body = '{"max_age_days": "x"}'
    if bad_value is True:
        body = '{"max_age_days": true}'
    r = client.put(
        GATE, content=body, headers={**auth(keys.admin), "content-type": "application/json"}
    )
    assert r.status_code in (400, 422), r.text
    assert r.headers["content-type"] == PROBLEM_JSON
    assert client.get(GATE, headers=auth(keys.admin)).json()["max_age_days"] is None
    r = client.put(
        "/v1/admin/datasets/nope/audit-gate", json={"max_age_days": 1}, headers=auth(keys.admin)
    )
    assert r.status_code == 404


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"age_days": 40.0}, "1 older than the gate allows"),
        ({"bound": 1.2}, "1 failed"),
        ({"status": "failed"}, "no done audit matches it"),
        ({"engine": "ghost"}, "no done audit matches it"),
        ({"model": "mlp"}, "no done audit matches it"),
        ({"sigma_factor": 1.01}, "no done audit matches it"),  # audited at more noise
        ({"attack": "lira"}, "no done audit matches it"),  # LiRA opens no gate
    ],
)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_expired_failed_or_other_audits_do_not_open_the_gate(
    client: Any, keys: Any, settings: Any, changes: dict[str, Any], words: str
) -> None:
    sigma = _sigma(client, keys) * changes.pop("sigma_factor", 1.0)
    _audit(settings, sigma=sigma, **changes)
    _gate(client, keys, 30)
    _refused(client, keys, settings, words)


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_recent_passing_audit_admits_and_the_card_names_it(
    client: Any, keys: Any, settings: Any
) -> None:
    sigma = _sigma(client, keys)
    _audit(settings, sigma=sigma * 1.5, bound=0.1)  # more noise than the job: not covering
    _audit(settings, sigma=sigma, bound=0.9, age_days=10.0)  # covering, older
    newest = _audit(settings, sigma=sigma * 0.5, bound=0.4, age_days=2.0)  # covering, newest
    _gate(client, keys, 30)
    quote = client.post("/v1/quote", json=JOB, headers=auth(keys.alice))
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text
    r = client.post("/v1/jobs", json=JOB, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert execute_job(job_id, settings) == Outcome.released
    card = client.get(f"/v1/jobs/{job_id}/release", headers=auth(keys.alice))
    assert card.status_code == 200, card.text
    audit = card.json()["audit"]
    assert audit["id"] == newest
    assert audit["epsilon_lower_bound"] == 0.4 and audit["ceiling"] == 5.8
    assert audit["claimed_epsilon"] == 1.0 and audit["noise_multiplier"] == sigma * 0.5
    assert datetime.fromisoformat(audit["finished_at"]) < datetime.now(UTC) - timedelta(days=1)
    assert "not a proof" in audit["reading"]
    _gate(client, keys, 1)  # now the newest passing audit is too old
    _refused(client, keys, settings, "2 older than the gate allows")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_gate_is_read_again_under_the_lock(client: Any, keys: Any, settings: Any) -> None:
    """A gate shortened (or turned off and on) between planning and admission refuses the
    job whose audit no longer passes; the function also refuses a check made with the gate
    off (the API does not call it then: service/audit_gate.py says why)."""
    engine = engine_for(settings.resolved_database_url)
    with transaction(engine) as s:
        ds = s.scalars(select(Dataset).where(Dataset.name == "toy")).one()
        assert recheck_under_lock(s, ds.id, GateCheck(None)) is None  # still off
        set_audit_gate(s, dataset=ds, max_age_days=5)
        assert "changed while the job was planned" in (
            recheck_under_lock(s, ds.id, GateCheck(None)) or ""
        )
        old = datetime.now(UTC) - timedelta(days=6)
        assert recheck_under_lock(s, ds.id, GateCheck(30, "a", old)) is not None
        recent = datetime.now(UTC) - timedelta(days=4)
        assert recheck_under_lock(s, ds.id, GateCheck(30, "a", recent)) is None


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_the_migration_adds_and_removes_the_tables(settings: Any) -> None:
    url = settings.resolved_database_url
    engine_for.cache_clear()
    tables = set(inspect(engine_for(url)).get_table_names())
    assert {"audit_gates", "job_audits"} <= tables
    downgrade(url, "0010")
    engine_for.cache_clear()
    tables = set(inspect(engine_for(url)).get_table_names())
    assert not {"audit_gates", "job_audits"} & tables and "audits" in tables
    upgrade(url)
    engine_for.cache_clear()
    assert {"audit_gates", "job_audits"} <= set(inspect(engine_for(url)).get_table_names())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_admin_cli_sets_and_shows_the_gate(client: Any, keys: Any) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["datasets", "audit-gate", "toy"])
    assert r.exit_code == 0 and "toy: audit gate off" in r.output, r.output
    r = runner.invoke(app, ["datasets", "audit-gate", "toy", "--days", "14"])
    assert r.exit_code == 0 and "on: audits that passed within 14 days" in r.output, r.output
    assert client.get(GATE, headers=auth(keys.admin)).json()["max_age_days"] == 14
    both = runner.invoke(app, ["datasets", "audit-gate", "toy", "--days", "1", "--off"])
    assert both.exit_code == 1
    assert runner.invoke(app, ["datasets", "audit-gate", "nope", "--off"]).exit_code == 1
    assert runner.invoke(app, ["datasets", "audit-gate", "toy", "--days", "0"]).exit_code != 0
    r = runner.invoke(app, ["datasets", "audit-gate", "toy", "--off"])
    assert r.exit_code == 0 and "toy: audit gate off" in r.output, r.output
    assert client.get(GATE, headers=auth(keys.admin)).json()["max_age_days"] is None


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_sets_the_gate(client: Any, keys: Any, settings: Any) -> None:
    csrf = signed_in(client, keys)
    page = client.get("/dashboard/datasets/toy")
    assert page.status_code == 200 and "Release gate" in page.text and "not a proof" in page.text
    form = "/dashboard/datasets/toy/audit-gate"
    before = [e.hash for e in ledger_rows(settings)]
    assert post(client, form, {"max_age_days": "30"}).status_code == 403  # no CSRF token
    for bad in ("abc", "0", "nan", "4000"):
        r = post(client, form, {"csrf": csrf, "max_age_days": bad})
        assert r.status_code == 422 and "Nothing was changed" in r.text, bad
    assert [e.hash for e in ledger_rows(settings)] == before
    assert post(client, form, {"csrf": csrf, "max_age_days": "30"}).status_code == 303
    assert client.get(GATE, headers=auth(keys.admin)).json()["max_age_days"] == 30
    assert 'value="30"' in client.get("/dashboard/datasets/toy").text
    _refused(client, keys, settings, "no done audit matches it")
    assert post(client, form, {"csrf": csrf, "max_age_days": ""}).status_code == 303
    assert client.get(GATE, headers=auth(keys.admin)).json()["max_age_days"] is None
    assert client.post("/v1/jobs", json=JOB, headers=auth(keys.alice)).status_code == 202


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_gate_shortened_after_planning_refuses_at_admission(
    client: Any, keys: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin shortens the gate while a job is between planning and admission: the
    admission's re-check under the lock refuses it and its charge is rolled back."""
    _audit(settings, sigma=_sigma(client, keys), age_days=2.0)
    _gate(client, keys, 30)
    planned = routes._gate

    def admin_acts_meanwhile(*args: Any) -> GateCheck:
        seen = planned(*args)
        _gate(client, keys, 1)  # a separate request, committed before admission
        return seen

    monkeypatch.setattr(routes, "_gate", admin_acts_meanwhile)
    before, jobs = _spent(client, keys), _jobs(settings)
    r = client.post("/v1/jobs", json=JOB, headers=auth(keys.alice))
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM_JSON, r.text
    assert "changed while the job was planned" in r.json()["detail"]
    assert _spent(client, keys) == before and _jobs(settings) == jobs
    monkeypatch.setattr(routes, "_gate", planned)
    _gate(client, keys, 30)
    assert client.post("/v1/jobs", json=JOB, headers=auth(keys.alice)).status_code == 202


EXPM_JOB = {"dataset": "toy", "method": "expm", "epsilon": 1.0, "delta": 1e-5}
NF_JOB = {"dataset": "toy", "method": "expm_nf", "epsilon": 1.0, "delta": 0.0}


def _quote(client: Any, keys: Any, body: dict[str, Any]) -> Any:
    return client.post("/v1/quote", json=body, headers=auth(keys.alice))


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_expm_and_expm_nf_audits_open_the_gate_for_their_jobs(
    client: Any, keys: Any, settings: Any
) -> None:
    """An ExpM audit (its default Langevin sampler) covers ExpM Langevin jobs at a σ no
    lower; an ExpM+NF audit covers ExpM+NF jobs at an ε no higher; neither covers DP-SGD,
    the MCMC sampler, or a job at less noise / a higher ε."""
    r = _quote(client, keys, EXPM_JOB)
    assert r.status_code == 200, r.text
    sigma = float(r.json()["plan"]["mechanism"]["noise_multiplier"])
    _gate(client, keys, 30)
    for body in (EXPM_JOB, NF_JOB):
        assert _quote(client, keys, body).status_code == 422  # no audit yet
    _audit(settings, sigma=sigma * 1.01, method="expm")  # more noise than the job's
    _audit(settings, sigma=0.0, claimed=0.5, method="expm_nf")  # a lower ε than the job's
    for body in (EXPM_JOB, NF_JOB, JOB):
        r = _quote(client, keys, body)
        assert r.status_code == 422 and r.json()["type"].endswith("audit-gate"), r.text
    _audit(settings, sigma=sigma, method="expm")
    _audit(settings, sigma=0.0, claimed=1.0, method="expm_nf")
    for body in (EXPM_JOB, NF_JOB):
        r = _quote(client, keys, body)
        assert r.status_code == 200 and r.json()["admitted"], r.text
    mcmc = {**EXPM_JOB, "expm": {"sampler": "mcmc"}}
    assert _quote(client, keys, mcmc).status_code == 422
    assert _quote(client, keys, JOB).status_code == 422  # DP-SGD: still no audit of its own


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_audit_of_the_hmc_sampler_does_not_open_the_gate_for_langevin_jobs(
    client: Any, keys: Any, settings: Any
) -> None:
    """An ExpM audit names its sampler in its expm options: an HMC audit (even recorded
    with the Langevin job's σ) covers no Langevin job, and no HMC job either (it has no
    σ); the same audit of the Langevin sampler, named or by default, does."""
    r = _quote(client, keys, EXPM_JOB)
    assert r.status_code == 200, r.text
    sigma = float(r.json()["plan"]["mechanism"]["noise_multiplier"])
    _gate(client, keys, 30)
    _audit(settings, sigma=sigma, method="expm", expm={"sampler": "mcmc"})
    mcmc = {**EXPM_JOB, "expm": {"sampler": "mcmc"}}
    for body in (EXPM_JOB, mcmc):
        r = _quote(client, keys, body)
        assert r.status_code == 422 and r.json()["type"].endswith("audit-gate"), r.text
    _audit(settings, sigma=sigma, method="expm", expm={"sampler": "langevin"})
    r = _quote(client, keys, EXPM_JOB)
    assert r.status_code == 200 and r.json()["admitted"], r.text
    assert _quote(client, keys, mcmc).status_code == 422


MLP_JOB = {**JOB, "model": {"kind": "mlp", "hidden": [256]}}


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_an_audit_of_one_mlp_width_does_not_open_the_gate_for_another(
    client: Any, keys: Any, settings: Any
) -> None:
    """The gate matches the model's architecture, not only its kind: a passing audit of a
    width-8 MLP leaves a width-256 MLP job refused at quote and submission (422, nothing
    charged); an audit of the width-256 MLP (its activation by default, as the job's)
    admits it, and covers no width-8 job in turn."""
    r = client.post("/v1/quote", json=MLP_JOB, headers=auth(keys.alice))
    assert r.status_code == 200, r.text
    sigma = float(r.json()["plan"]["mechanism"]["noise_multiplier"])
    _audit(settings, sigma=sigma, model="mlp", hidden=[8])
    _gate(client, keys, 30)
    before, jobs = _spent(client, keys), _jobs(settings)
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=MLP_JOB, headers=auth(keys.alice))
        assert r.status_code == 422 and r.headers["content-type"] == PROBLEM_JSON, r.text
        assert r.json()["type"].endswith("audit-gate"), r.text
        assert "no done audit matches it" in r.json()["detail"]
        assert '"hidden":[256]' in r.json()["detail"]
    assert _spent(client, keys) == before and _jobs(settings) == jobs  # nothing charged
    _audit(settings, sigma=sigma, model="mlp", hidden=[256])
    quote = client.post("/v1/quote", json=MLP_JOB, headers=auth(keys.alice))
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text
    assert client.post("/v1/jobs", json=MLP_JOB, headers=auth(keys.alice)).status_code == 202
    relu = {**MLP_JOB, "model": {"kind": "mlp", "hidden": [256], "activation": "relu"}}
    assert client.post("/v1/quote", json=relu, headers=auth(keys.alice)).status_code == 422
    narrow = {**MLP_JOB, "model": {"kind": "mlp", "hidden": [16]}}
    assert client.post("/v1/quote", json=narrow, headers=auth(keys.alice)).status_code == 422


DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"
CNN = {"kind": "cnn", "conv": [{"channels": 4, "kernel": 3, "pool": "avg2"}]}


def _register_digits(settings: Any, folder: Path, name: str, **change: Any) -> None:
    """The bundled digits registered as the private image dataset ``name``: as they are
    (no ``change``), 2× larger (``scale``), as 3 equal channels (``channels``), or only
    the classes 0-4 (``classes``)."""
    with np.load(DIGITS / "digits.npz") as npz:
        images, labels = npz["images"], npz["labels"]
    schema = yaml.safe_load((DIGITS / "schema.yaml").read_text())
    if "scale" in change:
        images = images.repeat(change["scale"], axis=1).repeat(change["scale"], axis=2)
        schema.update(height=images.shape[1], width=images.shape[2])
    if "channels" in change:
        images = np.repeat(images[..., None], change["channels"], axis=3)  # n × H × W × C
        schema.update(channels=change["channels"])
        schema["source"]["layout"] = "nhwc"
    if "classes" in change:
        keep = labels < change["classes"]
        images, labels = images[keep], labels[keep]
        schema.update(classes=[str(k) for k in range(change["classes"])])
    np.savez(folder / f"{name}.npz", images=images, labels=labels)
    schema.update(name=name)
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=parse_dataset_schema(schema),
        csv_path=folder / f"{name}.npz",
        epsilon_total=40.0,
        delta_total=1e-4,
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_audit_on_the_digits_opens_the_gate_for_images_of_their_shape_and_classes_only(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    """The spec leaves ``image`` and ``classes`` out (the schema fills them in): a passing
    audit of a CNN on the bundled digits (8 × 8, 1 channel, 10 classes) opens the gate of
    a registered image dataset of that shape and those classes, and of no other (16 × 16,
    3 channels, 5 classes: 422, nothing charged) though its σ is at most each job's. The
    same for logistic regression on the flattened pixels, whose audit on Adult (tabular,
    binary) covers no job on images, nor its audit on the digits a job on a tabular one."""
    datasets = {
        "digits": {},
        "digits-16": {"scale": 2},
        "digits-rgb": {"channels": 3},
        "digits-5": {"classes": 5},
    }
    for name, change in datasets.items():
        _register_digits(settings, tmp_path, name, **change)
    cnn = {**JOB, "model": CNN, "dpsgd": {"epochs": 1, "batch_size": 64}}
    logistic = {**JOB, "model": {"kind": "logistic"}}
    sigmas = []
    for name in datasets:
        for job in (cnn, logistic):
            r = _quote(client, keys, {**job, "dataset": name})
            assert r.status_code == 200, r.text
            sigmas.append(float(r.json()["plan"]["mechanism"]["noise_multiplier"]))
    mlp = {**JOB, "model": {"kind": "mlp", "hidden": [8]}}
    sigmas.append(_sigma(client, keys))  # the logistic job on the tabular toy
    r = _quote(client, keys, mlp)
    assert r.status_code == 200, r.text
    sigmas.append(float(r.json()["plan"]["mechanism"]["noise_multiplier"]))
    sigma = min(sigmas)  # the audits' σ: no job below it, so only the data's shape decides
    _audit(settings, sigma=sigma, dataset="digits", spec=CNN)
    _audit(settings, sigma=sigma, dataset="adult", spec={"kind": "logistic"})
    _audit(settings, sigma=sigma, dataset="digits", spec=mlp["model"])
    for name in [*datasets, "toy"]:
        r = client.put(
            f"/v1/admin/datasets/{name}/audit-gate",
            json={"max_age_days": 30},
            headers=auth(keys.admin),
        )
        assert r.status_code == 200, r.text
    shapes = {
        "digits-16": "16×16 with 1 channel(s), 10 classes",
        "digits-rgb": "8×8 with 3 channel(s), 10 classes",
        "digits-5": "8×8 with 1 channel(s), 5 classes",
    }

    def refused(body: dict[str, Any], words: str) -> None:
        for path in ("/v1/quote", "/v1/jobs"):
            r = client.post(path, json=body, headers=auth(keys.alice))
            assert r.status_code == 422 and r.headers["content-type"] == PROBLEM_JSON, r.text
            assert r.json()["type"].endswith("audit-gate"), r.text
            assert "no done audit matches it" in r.json()["detail"] and words in r.json()["detail"]

    for name, words in shapes.items():
        refused({**cnn, "dataset": name}, words)
    refused({**logistic, "dataset": "digits"}, "8×8 with 1 channel(s), 10 classes")
    refused(mlp, 'architecture {"activation":"tanh","hidden":[8]}')  # its audit: on digits
    quote = _quote(client, keys, {**logistic, "dataset": "toy"})  # Adult's audit covers it
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text
    quote = _quote(client, keys, {**cnn, "dataset": "digits"})
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text
    _audit(settings, sigma=sigma, dataset="digits", spec={"kind": "logistic"})
    quote = _quote(client, keys, {**logistic, "dataset": "digits"})
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text
    for name, words in shapes.items():
        refused({**logistic, "dataset": name}, words)
    with transaction(engine_for(settings.resolved_database_url)) as s:
        jobs = s.scalars(select(Job)).all()
    assert jobs == []  # every refusal charged nothing: no job was admitted


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_binary_audit_opens_no_gate_of_a_three_class_tabular_or_series_dataset(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    """Classes are compared on every kind of dataset: a passing audit of logistic
    regression on Adult (binary) leaves a 3-class tabular dataset's logistic job refused,
    and one of GRU-D on the ICU sample (binary) a 3-class series' GRU-D job (quote and
    submission: 422 naming the job's 3 classes, nothing charged, no job admitted), though
    each audit's σ is at most the job's. The same audits still open the gate of a binary
    tabular dataset (the toy: 5 encoded columns to Adult's 104, the width not compared)
    and of a binary series (TINY)."""
    from tests.integration.test_multiclass import _register, _three_classes
    from tests.integration.test_timeseries import _register_tiny
    from tests.integration.test_timeseries_classes import register_three_class_series

    _register(settings, *_three_classes(tmp_path))  # "tri": 3 classes, tabular
    register_three_class_series(settings, tmp_path, stays=60)  # "tri-icu": 3 classes
    (tmp_path / "tiny").mkdir()
    _register_tiny(settings, tmp_path / "tiny")  # "tiny-icu": binary
    grud = {"kind": "grud", "hidden": 3}
    jobs = {
        "toy": JOB,
        "tri": {**JOB, "dataset": "tri"},
        "tiny-icu": {**JOB, "dataset": "tiny-icu", "model": grud, "dpsgd": {"epochs": 1}},
        "tri-icu": {**JOB, "dataset": "tri-icu", "model": grud, "dpsgd": {"epochs": 1}},
    }
    sigmas = []
    for body in jobs.values():
        r = _quote(client, keys, body)
        assert r.status_code == 200, r.text
        sigmas.append(float(r.json()["plan"]["mechanism"]["noise_multiplier"]))
    sigma = min(sigmas)  # no job's σ below the audits': only the data's classes decide
    _audit(settings, sigma=sigma, dataset="adult", spec={"kind": "logistic"})
    _audit(settings, sigma=sigma, dataset="icu", spec=grud)
    for name in jobs:
        r = client.put(
            f"/v1/admin/datasets/{name}/audit-gate",
            json={"max_age_days": 30},
            headers=auth(keys.admin),
        )
        assert r.status_code == 200, r.text
    for name in ("tri", "tri-icu"):
        before = client.get(f"/v1/datasets/{name}", headers=auth(keys.alice)).json()
        for path in ("/v1/quote", "/v1/jobs"):
            r = client.post(path, json=jobs[name], headers=auth(keys.alice))
            assert r.status_code == 422 and r.headers["content-type"] == PROBLEM_JSON, r.text
            assert r.json()["type"].endswith("audit-gate"), r.text
            assert "no done audit matches it" in r.json()["detail"]
            assert "data 3 classes" in r.json()["detail"], r.text
        after = client.get(f"/v1/datasets/{name}", headers=auth(keys.alice)).json()
        assert (after["budget"], after["analyst_budget"]) == (
            before["budget"],
            before["analyst_budget"],
        )  # nothing charged
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalars(select(Job)).all() == []  # no job admitted
    for name in ("toy", "tiny-icu"):
        quote = _quote(client, keys, jobs[name])
        assert quote.status_code == 200 and quote.json()["admitted"], quote.text
        r = client.post("/v1/jobs", json=jobs[name], headers=auth(keys.alice))
        assert r.status_code == 202, r.text


TABLES = Path(__file__).resolve().parents[2] / "examples"


def _register_digits_table(settings: Any, folder: Path, name: str, classes: int) -> None:
    """The bundled digits-table (examples/digits-table) registered as the private tabular
    dataset ``name``, keeping the digits 0 … classes − 1 (10: all of it)."""
    import pandas as pd

    from service.datasets.kinds import load_schema_yaml

    schema = yaml.safe_load((TABLES / "digits-table" / "schema.yaml").read_text())
    frame = pd.read_csv(TABLES / "digits-table" / "digits-table.data.gz")
    frame = frame[frame["digit"] < classes]
    frame.to_csv(folder / f"{name}.csv", index=False)
    schema.update(name=name)
    schema["target"]["classes"] = [str(k) for k in range(classes)]
    register_dataset(
        engine_for(settings.resolved_database_url),
        settings,
        schema=load_schema_yaml(yaml.safe_dump(schema)),
        csv_path=folder / f"{name}.csv",
        epsilon_total=40.0,
        delta_total=1e-4,
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_audits_on_the_bundled_k_class_tables_open_the_gate_of_that_k_only(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    """Real one-run audits through the API and the worker's task (no row written by hand):
    multinomial logistic regression by DP-SGD on the bundled wine (tabular, 3 classes) and
    an 8-unit MLP on the bundled digits-table (tabular, 10 classes), each at ε = 4, above
    the ceiling its canaries allow (m = 17: 1.65; m = 40: 2.55), so both pass whatever
    their bound. Then, with the gate on everywhere, the 3-class "tri" admits the logistic
    job and the 10-class "ten" the MLP job (same configuration, each job's σ at least the
    audit's), while the same jobs are refused (422, nothing charged) on the 4-class "four"
    (digits 0-3 of the same table), the binary toy, and with the other model on "tri" and
    "ten"."""
    from tests.integration.test_multiclass import _register, _three_classes

    _register(settings, *_three_classes(tmp_path))  # "tri": 3 classes, 3 columns
    _register_digits_table(settings, tmp_path, "ten", 10)
    _register_digits_table(settings, tmp_path, "four", 4)
    mlp = {"kind": "mlp", "hidden": [8]}
    options = {"epochs": 1, "batch_size": 50}
    audits = {
        "wine": {"model": {"kind": "logistic"}, "canaries": 17},
        "digits-table": {"model": mlp, "canaries": 40},
    }
    sigmas = {}
    for dataset, changes in audits.items():
        body = {"method": "dpsgd", "epsilon": 4.0, "delta": 1e-5, "dataset": dataset}
        r = client.post(
            "/v1/admin/audits", json={**body, **changes, "dpsgd": options}, headers=auth(keys.admin)
        )
        assert r.status_code == 202, r.text
        assert execute_audit(r.json()["id"], settings) == AuditOutcome.done
        done = client.get(f"/v1/admin/audits/{r.json()['id']}", headers=auth(keys.admin)).json()
        assert done["status"] == "done", done
        assert done["result"]["epsilon_lower_bound"] <= done["result"]["ceiling"] < 4.0
        sigmas[dataset] = done["result"]["noise_multiplier"]
    logistic = {**JOB, "dataset": "tri", "model": {"kind": "logistic"}, "dpsgd": options}
    wide = {**JOB, "dataset": "ten", "model": mlp, "dpsgd": options}
    for body, audited in ((logistic, "wine"), (wide, "digits-table")):
        r = _quote(client, keys, body)
        assert r.status_code == 200, r.text
        # The precondition of the admissions below: no job σ under its audit's.
        assert r.json()["plan"]["mechanism"]["noise_multiplier"] >= sigmas[audited], r.text
    for name in ("tri", "ten", "four", "toy"):
        r = client.put(
            f"/v1/admin/datasets/{name}/audit-gate",
            json={"max_age_days": 30},
            headers=auth(keys.admin),
        )
        assert r.status_code == 200, r.text

    def refused(body: dict[str, Any], words: str) -> None:
        name = body["dataset"]
        before = client.get(f"/v1/datasets/{name}", headers=auth(keys.alice)).json()
        for path in ("/v1/quote", "/v1/jobs"):
            r = client.post(path, json=body, headers=auth(keys.alice))
            assert r.status_code == 422 and r.headers["content-type"] == PROBLEM_JSON, r.text
            assert r.json()["type"].endswith("audit-gate"), r.text
            assert "no done audit matches it" in r.json()["detail"], r.text
            assert words in r.json()["detail"], r.text
        after = client.get(f"/v1/datasets/{name}", headers=auth(keys.alice)).json()
        assert (after["budget"], after["analyst_budget"]) == (
            before["budget"],
            before["analyst_budget"],
        )  # nothing charged

    refused({**logistic, "dataset": "four"}, "data 4 classes")
    refused({**wide, "dataset": "four"}, "data 4 classes")
    refused({**logistic, "dataset": "toy"}, "data 2 classes")
    refused({**logistic, "dataset": "ten"}, "data 10 classes")  # its audit: K = 3
    refused({**wide, "dataset": "tri"}, "data 3 classes")  # its audit: K = 10
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalars(select(Job)).all() == []  # no job admitted
    for body in (logistic, wide):
        quote = _quote(client, keys, body)
        assert quote.status_code == 200 and quote.json()["admitted"], quote.text
        r = client.post("/v1/jobs", json=body, headers=auth(keys.alice))
        assert r.status_code == 202, r.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_audit_on_the_bundled_three_class_series_opens_the_gate_of_k_3_series_only(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    """A real one-run audit through the API and the worker's task of 3-logit GRU-D by
    DP-SGD on the bundled icu3 (the ICU sample's stays, a 3-class outcome), at ε = 4, above
    the ceiling of its 40 canaries (2.55), so it passes whatever its bound. With the gate
    on, the 3-class series "tri-icu" then admits the GRU-D job of that configuration (its
    σ at least the audit's), while the binary series "tiny-icu" refuses it (422 naming its
    2 classes, nothing charged): the binary ICU sample's audit would be needed there."""
    from tests.integration.test_timeseries import _register_tiny
    from tests.integration.test_timeseries_classes import register_three_class_series

    register_three_class_series(settings, tmp_path, stays=60)  # "tri-icu": 3 classes
    (tmp_path / "tiny").mkdir()
    _register_tiny(settings, tmp_path / "tiny")  # "tiny-icu": binary
    grud = {"kind": "grud", "hidden": 3}
    options = {"epochs": 1}
    body = {"method": "dpsgd", "epsilon": 4.0, "delta": 1e-5, "dataset": "icu3"}
    r = client.post(
        "/v1/admin/audits",
        json={**body, "model": grud, "canaries": 40, "dpsgd": options},
        headers=auth(keys.admin),
    )
    assert r.status_code == 202, r.text
    assert execute_audit(r.json()["id"], settings) == AuditOutcome.done
    done = client.get(f"/v1/admin/audits/{r.json()['id']}", headers=auth(keys.admin)).json()
    assert done["status"] == "done", done
    assert done["result"]["epsilon_lower_bound"] <= done["result"]["ceiling"] < 4.0
    job = {**JOB, "dataset": "tri-icu", "model": grud, "dpsgd": options}
    r = _quote(client, keys, job)
    assert r.status_code == 200, r.text
    # The precondition of the admission below: the job's σ no lower than the audit's.
    assert r.json()["plan"]["mechanism"]["noise_multiplier"] >= done["result"]["noise_multiplier"]
    for name in ("tri-icu", "tiny-icu"):
        r = client.put(
            f"/v1/admin/datasets/{name}/audit-gate",
            json={"max_age_days": 30},
            headers=auth(keys.admin),
        )
        assert r.status_code == 200, r.text
    binary = {**job, "dataset": "tiny-icu"}
    before = client.get("/v1/datasets/tiny-icu", headers=auth(keys.alice)).json()
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=binary, headers=auth(keys.alice))
        assert r.status_code == 422 and r.headers["content-type"] == PROBLEM_JSON, r.text
        assert r.json()["type"].endswith("audit-gate"), r.text
        assert "no done audit matches it" in r.json()["detail"], r.text
        assert "data 2 classes" in r.json()["detail"], r.text
    after = client.get("/v1/datasets/tiny-icu", headers=auth(keys.alice)).json()
    assert (after["budget"], after["analyst_budget"]) == (
        before["budget"],
        before["analyst_budget"],
    )  # nothing charged
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalars(select(Job)).all() == []  # no job admitted
    quote = _quote(client, keys, job)
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text
    r = client.post("/v1/jobs", json=job, headers=auth(keys.alice))
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_audit_on_a_digits_table_view_opens_the_gate_of_its_k_only(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    """A K the bundled files alone never covered: a real one-run audit through the API and
    the worker's task of multinomial logistic regression by DP-SGD on digits-table-k5 (the
    digits-table's rows of digits 0-4, 5 classes), at ε = 4, above the ceiling of its 40
    canaries (2.55), so it passes whatever its bound. With the gate on, the registered
    5-class "five" (digits 0-4 of the table) admits the job of that configuration (its σ at
    least the audit's), while the 6-class "six" (digits 0-5) refuses it (quote and
    submission: 422 naming its 6 classes, nothing charged, no job admitted)."""
    _register_digits_table(settings, tmp_path, "five", 5)
    _register_digits_table(settings, tmp_path, "six", 6)
    options = {"epochs": 1, "batch_size": 50}
    body = {"method": "dpsgd", "epsilon": 4.0, "delta": 1e-5, "dataset": "digits-table-k5"}
    r = client.post(
        "/v1/admin/audits",
        json={**body, "canaries": 40, "dpsgd": options},
        headers=auth(keys.admin),
    )
    assert r.status_code == 202, r.text
    assert execute_audit(r.json()["id"], settings) == AuditOutcome.done
    done = client.get(f"/v1/admin/audits/{r.json()['id']}", headers=auth(keys.admin)).json()
    assert done["status"] == "done", done
    assert done["result"]["rows"] == 901
    assert done["result"]["epsilon_lower_bound"] <= done["result"]["ceiling"] < 4.0
    job = {**JOB, "dataset": "five", "model": {"kind": "logistic"}, "dpsgd": options}
    six = {**job, "dataset": "six"}
    for body in (job, six):
        r = _quote(client, keys, body)
        assert r.status_code == 200, r.text
        # The precondition of the decisions below: no job σ under the audit's.
        sigma = r.json()["plan"]["mechanism"]["noise_multiplier"]
        assert sigma >= done["result"]["noise_multiplier"], r.text
    for name in ("five", "six"):
        r = client.put(
            f"/v1/admin/datasets/{name}/audit-gate",
            json={"max_age_days": 30},
            headers=auth(keys.admin),
        )
        assert r.status_code == 200, r.text
    before = client.get("/v1/datasets/six", headers=auth(keys.alice)).json()
    for path in ("/v1/quote", "/v1/jobs"):
        r = client.post(path, json=six, headers=auth(keys.alice))
        assert r.status_code == 422 and r.headers["content-type"] == PROBLEM_JSON, r.text
        assert r.json()["type"].endswith("audit-gate"), r.text
        assert "no done audit matches it" in r.json()["detail"], r.text
        assert "data 6 classes" in r.json()["detail"], r.text
    after = client.get("/v1/datasets/six", headers=auth(keys.alice)).json()
    assert (after["budget"], after["analyst_budget"]) == (
        before["budget"],
        before["analyst_budget"],
    )  # nothing charged
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalars(select(Job)).all() == []  # no job admitted
    quote = _quote(client, keys, job)
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text
    r = client.post("/v1/jobs", json=job, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    with transaction(engine_for(settings.resolved_database_url)) as s:
        link = s.get(JobAudit, r.json()["id"])
        assert link is not None and link.audit_id == done["id"]  # admitted on this audit


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_expm_audit_on_wine_opens_the_gate_of_a_three_class_table_for_expm_jobs(
    client: Any, keys: Any, settings: Any, tmp_path: Path
) -> None:
    """Real one-run audits through the API and the worker's task on the bundled wine (3
    classes, m = 17, ceiling ≈ 1.65), at ε = 4, so each passes whatever its bound: first
    multinomial logistic regression by DP-SGD only. With the gate on, the registered
    3-class "tri" admits its DP-SGD job of that configuration but refuses its ExpM job
    (Langevin sampler; quote and submission: 422 naming method expm, nothing charged, no
    job admitted): a DP-SGD audit covers no ExpM job. Then ExpM's own audit on wine (its
    Langevin sampler on multinomial logistic regression, the row-norm bound from wine's
    schema): the same ExpM job on "tri" is admitted (its σ at least the audit's) and names
    that audit, while the binary toy still refuses the ExpM job (its audit is K = 3)."""
    from tests.integration.test_multiclass import _register, _three_classes

    _register(settings, *_three_classes(tmp_path))  # "tri": 3 classes, 3 columns
    options = {"epochs": 1, "batch_size": 50}

    def audit(method: str) -> dict[str, Any]:
        body = {"method": method, "epsilon": 4.0, "delta": 1e-5, "dataset": "wine"}
        body |= {"canaries": 17, "dpsgd": options if method == "dpsgd" else None}
        r = client.post("/v1/admin/audits", json=body, headers=auth(keys.admin))
        assert r.status_code == 202, r.text
        assert execute_audit(r.json()["id"], settings) == AuditOutcome.done
        done = client.get(f"/v1/admin/audits/{r.json()['id']}", headers=auth(keys.admin)).json()
        assert done["status"] == "done", done
        assert done["result"]["epsilon_lower_bound"] <= done["result"]["ceiling"] < 4.0
        return dict(done)

    dpsgd_audit = audit("dpsgd")
    dpsgd_job = {**JOB, "dataset": "tri", "model": {"kind": "logistic"}, "dpsgd": options}
    expm_job = {**EXPM_JOB, "dataset": "tri", "model": {"kind": "logistic"}}
    r = _quote(client, keys, dpsgd_job)
    assert r.status_code == 200, r.text
    assert (
        r.json()["plan"]["mechanism"]["noise_multiplier"]
        >= dpsgd_audit["result"]["noise_multiplier"]
    )
    for name in ("tri", "toy"):
        r = client.put(
            f"/v1/admin/datasets/{name}/audit-gate",
            json={"max_age_days": 30},
            headers=auth(keys.admin),
        )
        assert r.status_code == 200, r.text

    def refused(body: dict[str, Any], words: str) -> None:
        name = body["dataset"]
        before = client.get(f"/v1/datasets/{name}", headers=auth(keys.alice)).json()
        for path in ("/v1/quote", "/v1/jobs"):
            r = client.post(path, json=body, headers=auth(keys.alice))
            assert r.status_code == 422 and r.headers["content-type"] == PROBLEM_JSON, r.text
            assert r.json()["type"].endswith("audit-gate"), r.text
            assert "no done audit matches it" in r.json()["detail"], r.text
            assert words in r.json()["detail"], r.text
        after = client.get(f"/v1/datasets/{name}", headers=auth(keys.alice)).json()
        assert (after["budget"], after["analyst_budget"]) == (
            before["budget"],
            before["analyst_budget"],
        )  # nothing charged

    refused(expm_job, "method expm")  # the DP-SGD audit matches DP-SGD jobs only
    with transaction(engine_for(settings.resolved_database_url)) as s:
        assert s.scalars(select(Job)).all() == []  # no job admitted
    quote = _quote(client, keys, dpsgd_job)
    assert quote.status_code == 200 and quote.json()["admitted"], quote.text

    expm_audit = audit("expm")
    assert expm_audit["result"]["sampling_rate"] is None  # ExpM: full batch, no Poisson q
    r = _quote(client, keys, expm_job)
    assert r.status_code == 200, r.text
    mechanism = r.json()["plan"]["mechanism"]
    assert (mechanism["sampler"], mechanism["classes"]) == ("langevin", 3)
    # The precondition of the admission below: the job's σ no lower than the audit's.
    assert mechanism["noise_multiplier"] >= expm_audit["result"]["noise_multiplier"], r.text
    assert r.json()["admitted"], r.text
    refused({**expm_job, "dataset": "toy", "model": {"kind": "logistic"}}, "data 2 classes")
    r = client.post("/v1/jobs", json=expm_job, headers=auth(keys.alice))
    assert r.status_code == 202, r.text
    with transaction(engine_for(settings.resolved_database_url)) as s:
        link = s.get(JobAudit, r.json()["id"])
        assert link is not None and link.audit_id == expm_audit["id"]  # admitted on it
