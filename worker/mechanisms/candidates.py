"""One candidate of a selection workflow: split the rows, train a candidate on the
training part and score it on the validation part, and the workflow's output. Shared by
the architecture and hyperparameter kinds (worker/mechanisms/model_selection.py) and the
PAFS feature search (worker/mechanisms/feature_selection.py), neither of which imports
the other's module for it (issue 23: they used to import each other)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from service.modelspec import GrudSpec, ModelSpec
from service.selection.features import FeatureCandidate
from service.selection.plans import HyperparameterCandidate
from service.selection.search_space import ArchitectureCandidate
from worker.mechanisms.base import TabularTrainingSet
from worker.mechanisms.dpsgd import run_dpsgd
from worker.mechanisms.search import noisy_accuracy
from worker.models import build_module

__all__ = ["SelectionOutput", "split_rows", "train_and_count", "train_and_score"]


@dataclass(frozen=True)
class SelectionOutput:
    selected: (
        ArchitectureCandidate | HyperparameterCandidate | FeatureCandidate | None
    )  # None: K = 0
    model: dict[str, object] | None  # the selected model spec (JSON)
    weights: dict[str, torch.Tensor] | None
    noisy_accuracy: float | None
    # Enclave log only for hyperparameters: K must not be released (see below).
    trainings: int


def split_rows(
    data: TabularTrainingSet, *, validation_fraction: float, rng: np.random.Generator
) -> tuple[TabularTrainingSet, TabularTrainingSet]:
    """Each row goes to validation independently with the public probability."""
    to_val = torch.as_tensor(rng.random(data.n) < validation_fraction, device=data.x.device)
    part = lambda m: TabularTrainingSet(data.x[m], data.y[m], data.public_means)  # noqa: E731
    return part(~to_val), part(to_val)


def train_and_count(
    *,
    spec: ModelSpec,
    mechanism: dict[str, object],
    train: TabularTrainingSet,
    val: TabularTrainingSet,
    device: torch.device,
    method: str = "dpsgd",
) -> tuple[dict[str, torch.Tensor], int]:
    """DP-SGD (or, ``method`` expm_nf, one ExpM+NF sample) on the training part; the exact
    number of correct validation predictions (private: it only leaves noised, see the
    callers)."""
    if method == "expm_nf":
        from worker.mechanisms.expm_job import params_from_mechanism
        from worker.mechanisms.expm_nf import run_expm_nf
        from worker.rng import secure_generator

        grud_means = train.public_means if isinstance(spec, GrudSpec) else None
        out = run_expm_nf(
            spec=spec,
            params=params_from_mechanism(dict(mechanism), samples=1, grud_public_means=grud_means),
            data=train,
            device=device,
            generator=secure_generator(device),
            progress=lambda a, b: None,
        )
    else:
        out = run_dpsgd(
            spec=spec,
            mechanism=dict(mechanism),
            samples=1,
            data=train,
            device=device,
            progress=lambda a, b: None,
        )
    weights = out.releases[0]
    module = build_module(spec, train.n_features, public_means=train.public_means)
    module.load_state_dict(weights)
    with torch.no_grad():
        scores = module.to(device)(val.x)
    if scores.dim() == 2 and scores.shape[1] >= 3:  # K classes: the argmax of the K scores
        return weights, int((scores.argmax(dim=1) == val.y.long()).sum().item())
    return weights, int(((scores > 0.0) == (val.y > 0.5)).sum().item())


def train_and_score(
    *,
    spec: ModelSpec,
    mechanism: dict[str, object],
    train: TabularTrainingSet,
    val: TabularTrainingSet,
    n_val_public: int,
    fitness_epsilon: float,
    device: torch.device,
    rng: np.random.Generator,
    method: str = "dpsgd",
) -> tuple[dict[str, torch.Tensor], float]:
    """:func:`train_and_count`, its count released only through
    :func:`worker.mechanisms.search.noisy_accuracy` (ε_fit-DP, charged by the plan)."""
    weights, correct = train_and_count(
        spec=spec, mechanism=mechanism, train=train, val=val, device=device, method=method
    )
    score = noisy_accuracy(
        correct=correct, n_val_public=n_val_public, epsilon=fitness_epsilon, rng=rng
    )
    return weights, score
