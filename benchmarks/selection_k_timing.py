"""Red-team check of issue 19: does a hyperparameter selection's duration, as the analyst's
API shows it (``finished_at − started_at`` of ``GET /v1/jobs/{id}``), depend on the secret
number of runs K?

Runs ``--jobs`` hyperparameter selections (random stopping, truncated geometric law capped
at ``--cap``) through the HTTP API (FastAPI's TestClient) and the worker's own
``execute_job`` on a fresh SQLite ledger with the synthetic toy dataset of the test suite,
reads each job's timestamps from the API and K from the worker's enclave log line, and
prints Spearman's ρ between K and the duration, with its p-value.

    .venv/bin/python benchmarks/selection_k_timing.py --jobs 12 --cap 17

Results: benchmarks/results/selection_k_timing.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _KLog(logging.Handler):
    """Collects K from the worker's enclave log ("selection: K trainings")."""

    def __init__(self) -> None:
        super().__init__()
        self.ks: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = re.match(r"selection: (\d+) trainings", record.getMessage())
        if m:
            self.ks.append(int(m.group(1)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--cap", type=int, default=17)
    ap.add_argument("--gamma", type=float, default=0.2)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="k-timing-"))
    os.environ.update(
        ENCLAVE_HOME=str(home / "home"),
        ENCLAVE_DATABASE_URL=f"sqlite:///{home / 'ledger.sqlite'}",
        ENCLAVE_BROKER_URL=f"sqla+sqlite:///{home / 'broker.sqlite'}",
        ENCLAVE_DEVICE="cpu",
        ENCLAVE_RATE_LIMIT_BURST="100000",
    )
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.config import get_settings
    from service.migrate import upgrade
    from tests.conftest import auth, bootstrap
    from worker.runner import execute_job

    get_settings.cache_clear()
    settings = get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    keys = bootstrap(settings, epsilon=10_000.0, n=600)
    klog = _KLog()
    logging.getLogger("enclave.worker").addHandler(klog)
    logging.getLogger("enclave.worker").setLevel(logging.INFO)
    body = {
        "dataset": "toy",
        "kind": "hyperparameters",
        "epsilon": 50.0,
        "delta": 1e-6,
        "model": {"kind": "mlp", "hidden": [4]},
        "learning_rates": [0.5, 2.0],
        "batch_sizes": [50],
        "epochs": [1],
        "runs": {
            "kind": "truncated_negative_binomial",
            "eta": 1.0,
            "gamma": args.gamma,
            "max_runs": args.cap,
        },
    }
    durations: list[float] = []
    with TestClient(create_app(settings, run_sweeper=False)) as client:
        for _ in range(args.jobs):
            r = client.post("/v1/selections", json=body, headers=auth(keys.alice))
            r.raise_for_status()
            job_id = r.json()["id"]
            execute_job(job_id, settings)
            job = client.get(f"/v1/jobs/{job_id}", headers=auth(keys.alice)).json()
            assert job["status"] == "released", job
            start = datetime.fromisoformat(job["started_at"])
            end = datetime.fromisoformat(job["finished_at"])
            durations.append((end - start).total_seconds())
    ks = klog.ks
    rho, p = stats.spearmanr(ks, durations)
    print(f"jobs {args.jobs}, law TNB(η=1, γ={args.gamma}) capped at {args.cap}")
    print("K:        ", ks)
    print("duration s:", [round(d, 3) for d in durations])
    print(f"Spearman ρ(K, duration) = {rho:.3f} (p = {p:.3g})")
    lo = [d for k, d in zip(ks, durations, strict=True) if k <= 2]
    hi = [d for k, d in zip(ks, durations, strict=True) if k > 2]
    if lo and hi:
        print(
            f"median duration K ≤ 2: {sorted(lo)[len(lo) // 2]:.3f} s; K > 2: "
            f"{sorted(hi)[len(hi) // 2]:.3f} s"
        )


if __name__ == "__main__":
    main()
