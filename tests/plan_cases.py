"""A fixed set of quote requests and the digest of each one's plan, as the API computes it
(tests/unit/test_plan_digests.py and benchmarks/plan_digests.py share them).

Every request of :data:`REQUESTS` (DP-SGD with each accountant and schedule, the
Langevin and MCMC exponential mechanism, ExpM+NF, and every selection kind and search,
one refusal) is planned on the bundled Adult dataset's public schema with a fixed public
row count, by the functions the API's quotes call (``plan_for_dataset``; ``job_request``
and ``plan_selection_job`` for selections, which calibrate the per-training ε). A digest
is the sha256 of the stored job request and of the privacy plan as JSON, fields at their
defaults left out (a field another change adds at its default changes no digest), floats
written by ``repr`` (one bit of difference in σ or in a resolved per-training ε changes
it), or of the refusal's message. A speed-up of planning must leave every digest as it
was.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
N_ROWS = 32_561  # a public (noisy) row count of Adult; any fixed value would do

# name → (endpoint, body). "quote": POST /v1/quote; "selection": POST /v1/selections/quote.
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "dpsgd rdp": (
        "quote",
        {"method": "dpsgd", "epsilon": 1.0, "delta": 1e-5, "dpsgd": {"epochs": 3}},
    ),
    "dpsgd pld": (
        "quote",
        {
            "method": "dpsgd",
            "epsilon": 0.7,
            "delta": 1e-5,
            "dpsgd": {"epochs": 3, "batch_size": 200, "accountant": "pld"},
        },
    ),
    "dpsgd pld exponential": (
        "quote",
        {
            "method": "dpsgd",
            "epsilon": 1.3,
            "delta": 1e-5,
            "dpsgd": {
                "epochs": 5,
                "accountant": "pld",
                "noise_schedule": "exponential",
                "noise_decay": 0.8,
            },
        },
    ),
    "dpsgd mlp": (
        "quote",
        {
            "method": "dpsgd",
            "epsilon": 2.0,
            "delta": 1e-6,
            "model": {"kind": "mlp", "hidden": [32, 32]},
            "dpsgd": {"epochs": 2, "batch_size": 256},
        },
    ),
    "expm langevin": ("quote", {"method": "expm", "epsilon": 1.0, "delta": 1e-5}),
    "expm mcmc": (
        "quote",
        {"method": "expm", "epsilon": 1.0, "delta": 1e-5, "expm": {"sampler": "mcmc"}},
    ),
    "expm_nf": ("quote", {"method": "expm_nf", "epsilon": 0.5, "delta": 0.0}),
    "architecture paas": (
        "selection",
        {"kind": "architecture", "epsilon": 2.0, "delta": 1e-6},
    ),
    "architecture rs": (
        "selection",
        {
            "kind": "architecture",
            "epsilon": 3.0,
            "delta": 1e-6,
            "space": {"depths": [1, 2], "widths": [8, 32]},
            "search": {"algorithm": "rs", "trainings": 4},
            "training": {"epochs": 2, "batch_size": 256},
        },
    ),
    "architecture mgrs batches": (
        "selection",
        {
            "kind": "architecture",
            "epsilon": 4.0,
            "delta": 1e-5,
            "space": {"depths": [1], "widths": [16], "batch_sizes": [64, 256]},
            "search": {"algorithm": "mgrs", "generations": 2, "per_generation": 3},
            "training": {"epochs": 2},
        },
    ),
    "architecture rs runs": (
        "selection",
        {
            "kind": "architecture",
            "epsilon": 3.0,
            "delta": 1e-6,
            "search": {"algorithm": "rs"},
            "runs": {"kind": "poisson", "mu": 4.0},
            "training": {"epochs": 2, "batch_size": 256},
        },
    ),
    "architecture rs report_noisy_max": (
        "selection",
        {
            "kind": "architecture",
            "epsilon": 2.5,
            "delta": 1e-6,
            "search": {"algorithm": "rs", "trainings": 6},
            "scoring": "report_noisy_max",
        },
    ),
    "architecture expm_nf": (
        "selection",
        {
            "kind": "architecture",
            "epsilon": 2.0,
            "delta": 1e-6,
            "method": "expm_nf",
            "space": {"depths": [1], "widths": [8]},
            "search": {"algorithm": "rs", "trainings": 3},
        },
    ),
    "architecture given training_epsilon": (
        "selection",
        {
            "kind": "architecture",
            "epsilon": 20.0,
            "delta": 1e-6,
            "training_epsilon": 1.0,
            "search": {"algorithm": "rs", "trainings": 3},
        },
    ),
    "hyperparameters tnb": (
        "selection",
        {
            "kind": "hyperparameters",
            "epsilon": 2.0,
            "delta": 1e-6,
            "epochs": [2],
            "batch_sizes": [256],
        },
    ),
    "hyperparameters grid": (
        "selection",
        {
            "kind": "hyperparameters",
            "epsilon": 3.0,
            "delta": 1e-5,
            "epochs": [1, 2],
            "batch_sizes": [128, 256],
            "noise_decays": [None, 0.9],
            "runs": {"kind": "truncated_negative_binomial", "eta": 0.5, "gamma": 0.1},
        },
    ),
    "hyperparameters poisson capped": (
        "selection",
        {
            "kind": "hyperparameters",
            "epsilon": 6.0,
            "delta": 1e-6,
            "epochs": [2],
            "runs": {"kind": "poisson", "mu": 3.0, "max_runs": 10},
        },
    ),
    "hyperparameters poisson capped, too small": (
        "selection",
        {
            "kind": "hyperparameters",
            "epsilon": 2.0,
            "delta": 1e-6,
            "epochs": [2],
            "runs": {"kind": "poisson", "mu": 3.0, "max_runs": 10},
        },
    ),
    "features cfs_greedy": (
        "selection",
        {"kind": "features", "epsilon": 1.0, "delta": 1e-6, "max_selected": 5},
    ),
    "features cfs_ga final": (
        "selection",
        {
            "kind": "features",
            "epsilon": 2.0,
            "delta": 1e-6,
            "method": "cfs_ga",
            "final": {"epsilon": 1.0, "delta": 1e-7},
        },
    ),
    "features pafs": (
        "selection",
        {
            "kind": "features",
            "epsilon": 3.0,
            "delta": 1e-6,
            "method": "pafs",
            "ga": {"population": 4, "generations": 2},
        },
    ),
}


@cache
def adult_schema() -> dict[str, Any]:
    """The bundled Adult dataset's public schema as the ledger stores it."""
    from service.datasets.kinds import load_schema_yaml

    schema = load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())
    return schema.model_dump(mode="json")


def plan_digest(endpoint: str, body: dict[str, Any]) -> str:
    """sha256 of the stored job request and its privacy plan, as the quote computes them;
    of the refusal's message where the request is refused."""
    from service.plans import PlanError

    try:
        text = _planned_text(endpoint, body)
    except PlanError as exc:
        text = f"PlanError: {exc}"
    return hashlib.sha256(text.encode()).hexdigest()


def _planned_text(endpoint: str, body: dict[str, Any]) -> str:
    schema = adult_schema()
    payload = {"dataset": str(schema["name"]), **body}
    if endpoint == "quote":
        from service.plans import plan_for_dataset
        from service.schemas import JobRequest

        request = JobRequest.model_validate(payload)
        plan = plan_for_dataset(request, n_rows=N_ROWS, public_schema=schema)
    else:
        from service.selection.api_bodies import (
            SelectionRequest,
            job_request,
            plan_selection_job,
        )

        selection = SelectionRequest.model_validate(payload).root
        request = job_request(selection, n_rows=N_ROWS, public_schema=schema)
        _, plan = plan_selection_job(request, n_rows=N_ROWS, public_schema=schema)
    # exclude_defaults: a field added later at its default (another issue's) changes no digest
    return (
        request.model_dump_json(exclude_defaults=True)
        + "\n"
        + plan.model_dump_json(exclude_defaults=True)
    )
