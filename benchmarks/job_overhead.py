"""A whole DP-SGD job through the API against its training (issue 26, job overhead).

Embedded mode (a SQLite ledger in a temporary home, the CPU), UCI Adult's training part
registered as the admin does (``worker.registration.register_dataset``). Each job: the
analyst's ``POST /v1/jobs`` through the HTTP API (FastAPI's TestClient), the worker's own
``execute_job`` in this process (what the Celery task calls; the broker's delivery delay
is left out), then ``GET /v1/jobs/{id}`` until it reads ``released``. Timed per job:

- **job**: from the POST to the GET that reads ``released`` (wall clock, this process);
- **worker**: ``execute_job`` alone;
- **load**: ``worker.data.load_training_set`` inside the job (read + encode, or the
  encoded cache);
- **training**: the mechanism alone (``run_mechanism``).

The load and training times are taken by wrapping the two functions the runner imported
(``worker.runner.load_training_set`` / ``run_mechanism``), here in the benchmark only.
``--cold`` deletes the dataset's encoded cache before every job (the uncached path).

    .venv/bin/python benchmarks/job_overhead.py [--jobs 6] [--epochs 1] [--cold]

Results: benchmarks/results/job_overhead.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
ADULT = REPO / "examples" / "adult"


def _timed(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - t0)

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--cold", action="store_true", help="delete the encoded cache before each job")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="job-overhead-"))
    os.environ.update(
        ENCLAVE_HOME=str(home / "home"),
        ENCLAVE_DATABASE_URL=f"sqlite:///{home / 'ledger.sqlite'}",
        ENCLAVE_BROKER_URL=f"sqla+sqlite:///{home / 'broker.sqlite'}",
        ENCLAVE_DEVICE="cpu",
        ENCLAVE_RATE_LIMIT_BURST="100000",
    )
    import yaml
    from fastapi.testclient import TestClient

    import worker.runner as runner
    from service.app import create_app
    from service.auth import hash_api_key, new_api_key
    from service.config import get_settings
    from service.datasets.tabular import parse_schema
    from service.db import engine_for, transaction
    from service.ledger.tables import Analyst, Role
    from service.migrate import upgrade
    from worker.registration import register_dataset

    get_settings.cache_clear()
    settings = get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    engine = engine_for(settings.resolved_database_url)
    schema = parse_schema(yaml.safe_load((ADULT / "schema.yaml").read_text()))
    t0 = time.perf_counter()
    register_dataset(
        engine,
        settings,
        schema=schema,
        csv_path=ADULT / "adult.data.gz",
        epsilon_total=1000.0,
        delta_total=1e-5,
        allow_nominal=True,
    )
    registration_s = time.perf_counter() - t0
    key = new_api_key()
    with transaction(engine) as s:
        s.add(Analyst(name="alice", key_hash=hash_api_key(key), role=Role.analyst))

    loads: list[float] = []
    trainings: list[float] = []
    runner.load_training_set = _timed(runner.load_training_set, loads)  # type: ignore[attr-defined]
    runner.run_mechanism = _timed(runner.run_mechanism, trainings)  # type: ignore[attr-defined]
    folder = settings.resolved_data_dir / schema.name
    body = {
        "dataset": "adult",
        "model": {"kind": "logistic"},
        "method": "dpsgd",
        "epsilon": 1.0,
        "delta": 1e-5,
        "dpsgd": {
            "epochs": args.epochs,
            "batch_size": 256,
            "max_grad_norm": 1.0,
            "learning_rate": 1.0,
            "accountant": "rdp",
        },
    }
    headers = {"Authorization": f"Bearer {key}"}
    jobs: list[float] = []
    workers: list[float] = []
    with TestClient(create_app(settings, run_sweeper=False)) as client:
        for _ in range(args.jobs):
            if args.cold:
                for cached in folder.glob("encoded*"):
                    cached.unlink()
            t0 = time.perf_counter()
            r = client.post("/v1/jobs", json=body, headers=headers)
            r.raise_for_status()
            job_id = r.json()["id"]
            t1 = time.perf_counter()
            runner.execute_job(job_id, settings)
            workers.append(time.perf_counter() - t1)
            job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
            jobs.append(time.perf_counter() - t0)
            assert job["status"] == "released", job

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    print(f"Adult, {args.jobs} DP-SGD jobs (logistic, {args.epochs} epoch(s), batch 256)")
    print(f"cold cache: {args.cold}; registration {registration_s:.2f} s")
    print("job s     ", [round(x, 3) for x in jobs])
    print("worker s  ", [round(x, 3) for x in workers])
    print("load s    ", [round(x, 3) for x in loads])
    print("training s", [round(x, 3) for x in trainings])
    later = slice(1, None) if args.jobs > 1 else slice(None)
    print(
        f"median of jobs 2..{args.jobs}: job {med(jobs[later]):.3f} s, worker "
        f"{med(workers[later]):.3f} s, load {med(loads[later]):.3f} s, training "
        f"{med(trainings[later]):.3f} s; job / training "
        f"{med(jobs[later]) / med(trainings[later]):.2f}"
    )
    overhead = [j - t for j, t in zip(jobs, trainings, strict=True)]
    ratios = [j / t for j, t in zip(jobs, trainings, strict=True)]
    print("overhead s", [round(x, 3) for x in overhead], "(job - training)")
    print(
        f"overhead (job - training): median {med(overhead[later]):.3f} s, min "
        f"{min(overhead[later]):.3f} s of jobs 2..{args.jobs}; "
        f"min job / training {min(ratios[later]):.2f}"
    )
    print(
        f"first job: job {jobs[0]:.3f} s, load {loads[0]:.3f} s, training {trainings[0]:.3f} s; "
        f"job / training {jobs[0] / trainings[0]:.2f}"
    )


if __name__ == "__main__":
    main()
