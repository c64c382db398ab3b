"""The main job: the whole product end to end on the embedded default.

Admin (inside the enclave): migrate the ledger, register Adult's training part with a
budget, create an analyst. Then the API and a worker start as processes, and the analyst
works over HTTP only: list datasets, get a quote, submit a DP-SGD logistic-regression
job, watch its progress, download the release, evaluate it on the public holdout.
Finally the admin prints the ledger and verifies its hash chain.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from enclave.analyst import score_csv
from enclave.privacy_text import privacy_number
from enclave.processes import child_env, free_port, start_api, start_worker, stop, wait_ready
from service.private_files import make_private_dir
from service.releases import load_release

REPO = Path(__file__).resolve().parents[1]
ADULT = REPO / "examples" / "adult"


@dataclass(frozen=True)
class AdminSteps:
    """The admin commands the demo runs inside the enclave (the CLI's own functions,
    passed in by the ``enclave demo`` command so this module does not import the CLI)."""

    db_upgrade: Callable[[], None]
    datasets_register: Callable[..., None]
    analysts_create_key: Callable[[str, str], str]
    ledger_table: Callable[[list[dict[str, Any]]], Table]


def run_demo(
    *, epsilon: float, epochs: int, keep: bool, console: Console, admin_steps: AdminSteps
) -> None:
    t0 = time.monotonic()
    home = Path(".enclave-demo").resolve()
    if home.exists():
        shutil.rmtree(home)
    make_private_dir(home)  # 0700: it holds the private data and the logs
    env_vars = {
        "ENCLAVE_HOME": str(home),
        "ENCLAVE_SWEEP_INTERVAL_S": "2",
        # The release hold (service/release_hold.py) stays on; its factor is scaled to the
        # demo's tiny jobs, whose time estimates (made to refuse plans, on the high side)
        # are 2-20 times their runs: D is then 1 s, a run past it released at 2 s.
        "ENCLAVE_RELEASE_HOLD_FACTOR": os.environ.get("ENCLAVE_RELEASE_HOLD_FACTOR", "0.1"),
    }
    os.environ.update(env_vars)
    from service.config import get_settings

    get_settings.cache_clear()

    db_upgrade, datasets_register = admin_steps.db_upgrade, admin_steps.datasets_register
    analysts_create_key, ledger_table = admin_steps.analysts_create_key, admin_steps.ledger_table

    console.rule("[bold]1. Admin, inside the enclave")
    db_upgrade()
    datasets_register(
        "adult",
        csv=ADULT / "adult.data.gz",
        schema=ADULT / "schema.yaml",
        epsilon=10.0,
        delta=1e-5,
        allow_nominal=True,
    )
    admin_key = analysts_create_key("admin", "admin")
    analyst_key = analysts_create_key("alice", "analyst")
    console.print("created the admin and analyst 'alice' (keys are shown once, stored hashed)")

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = child_env(env_vars)
    api_proc = start_api(env, port, log=home / "api.log")
    worker_proc = start_worker(env, log=home / "worker.log")
    try:
        wait_ready(base)
        console.print(f"API on {base}, one worker (Celery over SQLite) started")
        analyst = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {analyst_key}"}, timeout=60
        )
        admin = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60
        )

        console.rule("[bold]2. Analyst, over HTTP")
        ds = analyst.get("/v1/datasets").raise_for_status().json()[0]
        budget = ds["budget"]
        console.print(
            f"dataset {ds['name']}: {ds['n_rows']} rows (public DP noisy count, "
            f"ε = {privacy_number(ds['count_epsilon'])} charged at registration), "
            f"{len(ds['public_schema']['columns'])} columns, "
            f"budget ε={privacy_number(budget['epsilon_total'])}, "
            f"δ={privacy_number(budget['delta_total'])} ({budget['rule']} rule)"
        )
        request = {
            "dataset": "adult",
            "model": {"kind": "logistic"},
            "method": "dpsgd",
            "epsilon": epsilon,
            "delta": 1e-5,
            "dpsgd": {
                "epochs": epochs,
                "batch_size": 256,
                "max_grad_norm": 1.0,
                "learning_rate": 1.0,
                "accountant": "rdp",
            },
        }
        _run_job(analyst, request, key="demo-1", home=home, console=console)
        # The same data through the proven exponential mechanism (regularised logistic
        # loss, Langevin sampler): the guarantee is proven for the steps that ran.
        expm = {"dataset": "adult", "method": "expm", "epsilon": epsilon, "delta": 1e-5}
        _run_job(analyst, expm, key="demo-2", home=home, console=console)

        console.rule("[bold]3. Admin: the ledger")
        console.print(ledger_table(admin.get("/v1/admin/ledger").raise_for_status().json()))
        verdict = admin.get("/v1/admin/ledger/verify").raise_for_status().json()
        console.print(f"hash chain and running totals verified: {verdict['ok']}")
        if not verdict["ok"]:
            raise SystemExit("ledger verification failed")
    finally:
        stop(api_proc, worker_proc)
        if not keep:
            shutil.rmtree(home, ignore_errors=True)
    console.print(f"demo finished in {time.monotonic() - t0:.1f} s")


def _run_job(
    analyst: httpx.Client, request: dict[str, Any], *, key: str, home: Path, console: Console
) -> None:
    """Quote, submit, watch, download and score one job, as the analyst over HTTP."""
    quote = analyst.post("/v1/quote", json=request).raise_for_status().json()
    console.print(
        f"quote: admitted={quote['admitted']}, noise multiplier "
        f"{quote['plan']['mechanism']['noise_multiplier']:.3f}, "
        f"{quote['plan']['mechanism']['steps']} steps; remaining ε after: "
        f"{privacy_number(quote['dataset_after']['remaining_epsilon'], down=True)}"
    )
    job = (
        analyst.post("/v1/jobs", json=request, headers={"Idempotency-Key": key})
        .raise_for_status()
        .json()
    )
    console.print(f"submitted job {job['id']} ({job['status']})")
    last = None
    deadline = time.monotonic() + 300
    while job["status"] in ("queued", "running"):
        if time.monotonic() > deadline:
            raise SystemExit(f"the job did not finish in 300 s; see {home}/worker.log")
        time.sleep(0.5)
        job = analyst.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
        line = f"  {job['status']}: step {job['progress_step']} of {job['progress_total']}"
        if line != last:
            console.print(line)
            last = line
    if job["status"] != "released":
        raise SystemExit(f"job ended {job['status']}: {job['error']}")
    held = datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])
    console.print(
        f"  released at its public release time, {held.total_seconds():g} s after its start "
        "(a grid point fixed from the plan, not the run's end)"
    )
    card = analyst.get(f"/v1/jobs/{job['id']}/release").raise_for_status().json()
    weights = analyst.get(f"/v1/jobs/{job['id']}/release/weights").raise_for_status().content
    release = load_release(weights, card)
    p = card["privacy"]
    console.print(
        f"release: {card['model']['kind']}, ε={privacy_number(p['epsilon'])}, "
        f"δ={privacy_number(p['delta'])}, "
        f"accountant={p['accountant']}, guarantee={p['guarantee'].upper()}"
    )
    console.print(f"  {p['statement']}")

    scored = score_csv(release, ADULT / "adult.test.gz")
    console.print(
        f"[bold]AUC on the public holdout ({len(scored.kept_index)} rows): {scored.auc:.4f}[/bold]"
    )
