"""An evaluation job's work inside the enclave (issue 21): load the evaluated release's
model, score the dataset's holdout, noise the statistics (worker/mechanisms/evaluation.py)
and return what the evaluation's card releases: the noisy metrics with their intervals,
nothing else derived from the holdout (no weights, no exact count, no prediction)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter
from sqlalchemy import Engine

from service.db import transaction
from service.ledger.tables import Job, JobStatus, Release
from service.modelspec import ModelSpec
from service.privacy.evaluation import EvaluationPlan
from service.releases import load_release, release_paths
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.evaluation import EvaluationRelease, evaluate
from worker.models import build_module
from worker.release import load_state_dicts

__all__ = [
    "EvaluatedModelError",
    "evaluated_model",
    "release_json",
    "released_module",
    "score_holdout",
]


class EvaluatedModelError(RuntimeError):
    """The evaluated release cannot be loaded: not released, on another dataset, its
    weights missing or not matching the card's SHA-256."""


def evaluated_model(
    engine: Engine,
    release_dir: Path,
    *,
    job_id: str,
    dataset_id: int,
    sample: int,
    n_features: int,
) -> torch.nn.Module:
    """The evaluated job's released model (sample ``sample``), checked against its card's
    SHA-256, on the CPU in eval mode. Public input only (a release), read before the
    holdout is opened."""
    with transaction(engine) as s:
        job = s.get(Job, job_id)
        release = s.get(Release, job_id)
        if job is None or release is None or job.status != JobStatus.released:
            raise EvaluatedModelError(f"job {job_id} has no release")
        if job.dataset_id != dataset_id:
            raise EvaluatedModelError(f"job {job_id} was trained on another dataset")
        card = dict(release.card)
    payload = release_paths(release_dir, job_id, card["run_token"]).weights.read_bytes()
    loaded = load_release(payload, card)  # refuses weights that do not match the card
    samples = int(card["samples"])
    if not (0 <= sample < samples):
        raise EvaluatedModelError(f"job {job_id} has no sample {sample}")
    del loaded
    return released_module(
        payload, samples=samples, sample=sample, model=card["model"], n_features=n_features
    )


def released_module(
    payload: bytes, *, samples: int, sample: int, model: dict[str, Any], n_features: int
) -> torch.nn.Module:
    """Sample ``sample`` of a release's weights file (``payload``: safetensors, the layout
    of worker/release.py ``weights_bytes``) as the card's ``model`` (a plan's model), on
    the CPU in eval mode: exactly the model the release holds."""
    state = load_state_dicts(payload, samples)[sample]
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(model)
    module = build_module(spec, n_features)
    module.load_state_dict(state)
    return module.eval()


def score_holdout(module: torch.nn.Module, data: TabularTrainingSet) -> torch.Tensor:
    """The model's probabilities on every holdout row (float64, CPU), as the release's card
    states its output: sigmoid(logit) = P(y = 1 | x), shape (n,), for a binary model;
    softmax over K logits, shape (n, K), for a K-class one. ``data.x`` is encoded as the
    kind's training rows are (worker/data.py ``load_holdout``): features (n, d), flattened
    pixels (n, H·W·C), or GRU-D's inputs (n, 3, T, V)."""
    with torch.no_grad():
        logits = module(data.x.to("cpu", torch.float32)).to(torch.float64)
        if logits.ndim == 2 and logits.shape[1] > 1:
            return torch.softmax(logits, dim=1)
        return torch.sigmoid(logits.reshape(-1))


def _plain(value: Any) -> Any:
    """JSON values: numpy scalars as Python numbers, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, bool | int | float | str):
        return value.item()
    return value


def release_json(
    release: EvaluationRelease, *, plan: EvaluationPlan, evaluated_job: str, sample: int
) -> dict[str, Any]:
    """The evaluation card's ``evaluation`` section: the noisy results (dataclasses as
    JSON: values, intervals, each metric's ε, δ and noise scale) and the public plan values
    they were computed under."""
    results = {
        name: _plain(value)
        for name, value in dataclasses.asdict(release).items()
        if isinstance(value, dict)
    }
    return {
        "job_id": evaluated_job,
        "sample": sample,
        "holdout_rows": plan.n,
        "classes": plan.classes,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "noise": plan.noise,
        "confidence": plan.confidence,
        "metrics": results,
        "interval_meaning": (
            "each interval covers the population value at the stated confidence over both "
            "the holdout's draw (rows i.i.d. from the population) and the DP noise; "
            "pointwise, not simultaneous across metrics"
        ),
    }


def run_evaluation(
    *, plan: EvaluationPlan, module: torch.nn.Module, data: TabularTrainingSet
) -> EvaluationRelease:
    """Score the holdout and noise the statistics (the only randomness: worker/noise.py's
    secure generator, inside :func:`evaluate`)."""
    return evaluate(
        plan=plan, probabilities=score_holdout(module, data), labels=data.y.cpu().long()
    )
