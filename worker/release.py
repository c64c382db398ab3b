"""Write a release: safetensors weights plus a JSON model card that states the guarantee."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors_torch
from safetensors.torch import save as save_safetensors

from service.releases import (
    NEIGHBOURING_RELATION,
    STATEMENTS,
    ReleasePaths,
    public_values,
    release_paths,
    sha256_bytes,
)
from service.schemas import PrivacyPlan


def model_card(
    *,
    job_id: str,
    run_token: str,
    plan: PrivacyPlan,
    public_schema: dict[str, Any],
    count_epsilon: float | None,
    weights_sha256: str,
    samples: int,
    selection: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The card states the guarantee, the neighbouring relation it is for, and the public
    values the mechanism was allowed to depend on. Nothing in it counts other people's
    activity (no global ledger ids or sequence numbers): only this job's own values.

    ``selection`` (selection jobs): the released choice (worker/mechanisms/model_selection
    ``released_summary``); the card's model is then the selected one, and its privacy
    section is the whole workflow's (every training and noisy score, one event)."""
    card: dict[str, Any] = {
        "card_version": 1,
        "job_id": job_id,
        "run_token": run_token,
        "model": plan.model,
        "samples": samples,
        "weights_layout": "tensors are named sample_<i>.<state-dict key>, i = 0..samples-1",
        "output": "sigmoid(logits) = P(y = 1 | x), in [0, 1]",
        "preprocessing": {
            "description": _PREPROCESSING[str(public_schema.get("kind", "tabular"))],
            "feature_names": _feature_names(public_schema),
            "public_schema": public_schema,
        },
        "mechanism": {"method": plan.method, **_engine(plan), **plan.mechanism},
        "privacy": {
            "epsilon": plan.epsilon,
            "delta": plan.delta,
            "units": "ε in nats; δ a probability; for the whole job (all samples)",
            "accountant": plan.accountant,
            "guarantee": plan.guarantee,
            "statement": STATEMENTS[plan.guarantee],
            "neighbouring_relation": NEIGHBOURING_RELATION,
            "public_values": public_values(
                n_rows=plan.n_rows,
                count_epsilon=count_epsilon,
                method=plan.method,
                sampler=plan.mechanism.get("sampler"),
            ),
            "event": plan.event,
        },
        "weights_sha256": weights_sha256,
    }
    if selection is not None:
        # The selected model; {} when none was trained or none was run (DP-CFS; K = 0).
        card["model"] = selection.get("model") or {}
        card["selection"] = selection
        chosen = (selection.get("selected") or {}).get("features")
        if chosen is not None and samples > 0:
            # Feature selection: the model reads only the chosen columns' encoded inputs.
            card["preprocessing"]["model_inputs"] = _inputs_of(public_schema, set(chosen))
        privacy: dict[str, Any] = card["privacy"]
        privacy["statement"] = (
            f"{STATEMENTS[plan.guarantee]} The (ε, δ) is for the whole selection workflow: "
            "every candidate's training (DP-SGD, or ExpM+NF whose ε is nominal) and noisy "
            "validation score, composed (or, for "
            "a random number of runs, bounded by Papernot & Steinke 2022), charged "
            "as one event; choosing the best noisy score is post-processing."
        )
    return card


def _engine(plan: PrivacyPlan) -> dict[str, str]:
    """DP-SGD's per-example gradient engine: plans of the default engine leave the key out
    (they stay identical to plans stored before engines existed); the card states it."""
    return {"engine": "exact"} if plan.method == "dpsgd" else {}


_PREPROCESSING = {
    "tabular": (
        "Data-independent: numeric columns are clipped to the schema's declared "
        "[min, max] (after log1p where declared) and scaled to [0, 1]; categorical "
        "columns are one-hot over the declared levels; the target is 1 for the "
        "declared positive values."
    ),
    "timeseries": (
        "Data-independent: each stay's observations are binned on the schema's time grid "
        "(the latest observation in a step wins), values clipped to the variable's declared "
        "[min, max] and scaled to [0, 1]; GRU-D's inputs are (values, masks, hours since "
        "the last observation) of shape (3, T, V), and its imputation means are the "
        "schema's public means (service/timeseries.py); the outcome is 1 for the declared "
        "positive values. One row of the neighbouring relation is one stay (all its "
        "observations and its outcome)."
    ),
}


def _feature_names(public_schema: dict[str, Any]) -> list[str]:
    from service.dataschema import parse_dataset_schema

    return parse_dataset_schema(public_schema).feature_names


def _inputs_of(public_schema: dict[str, Any], columns: set[str]) -> list[str]:
    """The encoded input names of the chosen schema columns, in the schema's order (the
    order worker.mechanisms.feature_selection slices the encoded rows in)."""
    from service.dataschema import NumericColumn, parse_schema

    out: list[str] = []
    for col in parse_schema(public_schema).columns:
        if col.name in columns:
            names = (
                [col.name]
                if isinstance(col, NumericColumn)
                else [f"{col.name}={level}" for level in col.levels]
            )
            out.extend(names)
    return out


def weights_bytes(releases: list[dict[str, torch.Tensor]]) -> bytes:
    tensors = {
        f"sample_{i}.{k}": v.detach().cpu().contiguous()
        for i, sd in enumerate(releases)
        for k, v in sd.items()
    }
    return save_safetensors(tensors)


def write_release(
    release_dir: Path, job_id: str, run_token: str, payload: bytes, card: dict[str, Any]
) -> ReleasePaths:
    paths = release_paths(release_dir, job_id, run_token)
    paths.directory.mkdir(parents=True, exist_ok=True)
    paths.weights.write_bytes(payload)
    paths.card.write_text(json.dumps(card, indent=2, sort_keys=True))
    return paths


def load_state_dicts(payload: bytes, samples: int) -> list[dict[str, torch.Tensor]]:
    tensors = load_safetensors_torch(payload)
    out = []
    for i in range(samples):
        prefix = f"sample_{i}."
        out.append({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
    return out


__all__ = ["load_state_dicts", "model_card", "sha256_bytes", "weights_bytes", "write_release"]
