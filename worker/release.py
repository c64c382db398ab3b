"""Write a release: safetensors weights plus a JSON model card that states the guarantee."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter
from safetensors.torch import load as load_safetensors_torch
from safetensors.torch import save as save_safetensors

from service.modelspec import ModelSpec, parameter_count
from service.private_files import PRIVATE_FILE_MODE, make_private_dir
from service.releases import (
    NEIGHBOURING_RELATION,
    STATEMENTS,
    ReleasePaths,
    public_values,
    release_paths,
    sha256_bytes,
)
from service.schemas import PrivacyPlan

log = logging.getLogger("enclave.worker")


def _output(model: dict[str, Any], public_schema: dict[str, Any]) -> str:
    """What the released model outputs: P(y = 1 | x) for a binary target; softmax
    probabilities over the declared classes for a K-class one (``model.classes``)."""
    classes = model.get("classes")
    if classes is None:
        return "sigmoid(logits) = P(y = 1 | x), in [0, 1]"
    names = (
        public_schema.get("classes")
        or public_schema.get("target", {}).get("classes")
        or public_schema.get("outcome", {}).get("classes")
    )
    listed = f": {', '.join(map(str, names))}" if names else ""
    return (
        f"softmax(logits) = (P(y = k | x))_k, k = 0 … {classes - 1}, probabilities over the "
        f"{classes} declared classes in the schema's order{listed}"
    )


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
    evaluation: dict[str, Any] | None = None,
    audit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The card states the guarantee, the neighbouring relation it is for, and the public
    values the mechanism was allowed to depend on. Nothing in it counts other people's
    activity (no global ledger ids or sequence numbers): only this job's own values.

    ``selection`` (selection jobs): the released choice (worker/mechanisms/model_selection
    ``released_summary``); the card's model is then the selected one, and its privacy
    section is the whole workflow's (every training and noisy score, one event).

    ``evaluation`` (evaluation jobs, issue 21): the noisy metrics and their intervals
    (worker/evaluation_job.py ``release_json``); the card then has no weights (an empty
    weights file), its model is the evaluated one, and its neighbouring relation and
    public values are the holdout's.

    A training plan with an ``evaluation`` (train then evaluate) takes ``evaluation`` as
    its model's evaluation on the holdout: the card keeps its weights and model.

    ``audit``: the audit that let the job through the dataset's release gate
    (service/audit_gate.py ``audit_of_job``: id, bound, ceiling, finished_at), or None."""
    card: dict[str, Any] = {
        "card_version": 1,
        "job_id": job_id,
        "run_token": run_token,
        "model": plan.model,
        "samples": samples,
        "weights_layout": "tensors are named sample_<i>.<state-dict key>, i = 0..samples-1",
        "output": _output(plan.model, public_schema),
        "preprocessing": {
            "description": _preprocessing(public_schema),
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
    if plan.method_choice is not None:  # method 'auto': requested auto, chose plan.method
        card["method_choice"] = plan.method_choice.model_dump(mode="json")
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
    if audit is not None:
        card["audit"] = audit
    if evaluation is not None and plan.evaluation is not None:
        _trained_and_evaluated(card, plan, evaluation)
    elif evaluation is not None:
        card["evaluation"] = evaluation
        card["weights_layout"] = "no weights: an evaluation releases only its noisy metrics"
        card["output"] = "the noisy metrics under `evaluation`, each with its interval"
        privacy = card["privacy"]
        privacy["statement"] = (
            f"{STATEMENTS[plan.guarantee]} The (ε, δ) is for the whole evaluation: every "
            "metric's noisy statistic (equal shares, basic composition), computed on the "
            "dataset's private holdout in the enclave; the intervals are post-processing."
        )
        privacy["neighbouring_relation"] = (
            "replace one row of the holdout (public size n_h); it follows from the ledger's "
            f"relation on the whole dataset (worker/registration.py). {NEIGHBOURING_RELATION}"
        )
        privacy["public_values"]["row_count"] = (
            f"{plan.n_rows}: the holdout's public size, floor(F × the DP noisy row count) for "
            "the admin's fraction F, fixed at registration"
        )
        privacy["public_values"]["row_count_used_for"] = (
            "the metrics' divisor and intervals; the evaluated release's weights (public)"
        )
    return card


def _trained_and_evaluated(
    card: dict[str, Any], plan: PrivacyPlan, evaluation: dict[str, Any]
) -> None:
    """Train then evaluate (a training plan with ``evaluation``): the card is the
    training's, with the evaluation of its released model (``evaluation``, whose job_id is
    this job's own) and a privacy section for both, charged once."""
    assert plan.evaluation is not None
    card["evaluation"] = evaluation
    privacy = card["privacy"]
    privacy["statement"] = (
        f"{STATEMENTS[plan.guarantee]} The (ε, δ) is for the whole job: the training "
        f"(ε {plan.evaluation['training_epsilon']:g}, δ {plan.evaluation['training_delta']:g}) "
        f"and the evaluation of sample {evaluation['sample']} on the dataset's private "
        f"holdout (ε {plan.evaluation['epsilon']:g}, δ {plan.evaluation['delta']:g}, "
        "its metrics under `evaluation`), composed and charged once; the intervals are "
        "post-processing."
    )
    privacy["public_values"]["holdout_row_count"] = (
        f"{evaluation['holdout_rows']}: the holdout's public size, floor(F × the DP noisy "
        "row count) for the admin's fraction F, fixed at registration; the metrics' "
        "divisor and intervals"
    )


def _engine(plan: PrivacyPlan) -> dict[str, str]:
    """DP-SGD's per-example gradient engine: plans of the default engine leave the key out
    (they stay identical to plans stored before engines existed); the card states it."""
    return {"engine": "exact"} if plan.method == "dpsgd" else {}


def _preprocessing(public_schema: dict[str, Any]) -> str:
    """The card's description of the encoding: the kind's worker/data.py WORKER_KINDS entry."""
    from worker.data import WORKER_KINDS

    text = WORKER_KINDS[str(public_schema.get("kind", "tabular"))].preprocessing
    if public_schema.get("target", {}).get("classes") is not None:  # a K-class tabular target
        text = text.replace(
            "the target is 1 for the declared positive values",
            "the target is its value's index in the declared classes",
        )
    if public_schema.get("outcome", {}).get("classes") is not None:  # a K-class outcome
        text = text.replace(
            "the outcome is 1 for the declared positive values",
            "the outcome is its value's index in the declared classes",
        )
    return text


def _feature_names(public_schema: dict[str, Any]) -> list[str]:
    from service.datasets.kinds import parse_dataset_schema

    return parse_dataset_schema(public_schema).feature_names


def _inputs_of(public_schema: dict[str, Any], columns: set[str]) -> list[str]:
    """The encoded input names of the chosen schema columns, in the schema's order (the
    order worker.mechanisms.feature_selection slices the encoded rows in)."""
    from service.datasets.tabular import NumericColumn, parse_schema

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


class ReleaseSpaceError(Exception):
    """The release folder cannot take this job's release: it is missing and cannot be
    made, it is not writable, or it has too little free space. Raised before any private
    row is read, so the job fails with its charge refundable (and refunded automatically,
    service/ledger/refunds.py ``refund_unread_failure``)."""


RELEASE_SPACE_FAILURE = (
    "the worker's release folder cannot take this job's release (not writable or too "
    "little free space); the job was not run and no private row was read"
)

# The bound is on the high side: every parameter counted as float64 (the weights are
# float32 today), every tensor given a generous safetensors header entry.
_BYTES_PER_PARAMETER = 8
_TENSORS_PER_MODEL = 32  # logistic 2, MLP at most 8, GRU-D 9
_HEADER_BYTES_PER_TENSOR = 512
_CARD_ALLOWANCE = 1 << 20  # fixed text, statements, feature names, selection summary
# Free space needed: SPACE_SAFETY_FACTOR × the bound + SPACE_RESERVE_BYTES (the file
# system keeps working for logs and the ledger after the release is written).
SPACE_SAFETY_FACTOR = 2
SPACE_RESERVE_BYTES = 16 << 20


def release_size_bound(plan: PrivacyPlan, public_schema: dict[str, Any]) -> int:
    """An upper bound on the bytes of a job's release (weights file + model card), from
    public values only: the plan's model and sample count, the public schema's encoded
    width, and the sizes of the plan and schema the card repeats. A selection plan's
    model is its largest candidate (service/selection/api_bodies.py), and it releases at
    most one."""
    from service.datasets.kinds import parse_dataset_schema

    n_features = parse_dataset_schema(public_schema).n_features
    spec: ModelSpec = TypeAdapter(ModelSpec).validate_python(plan.model)
    # + n_features: buffers saved with the parameters (GRU-D's public means, V floats)
    elements = parameter_count(spec, n_features) + n_features
    per_model = _BYTES_PER_PARAMETER * elements + _TENSORS_PER_MODEL * _HEADER_BYTES_PER_TENSOR
    weights = max(plan.samples, 1) * per_model + (64 << 10)
    # The card repeats the schema (and its feature and input names) and the plan's values.
    schema_text = len(json.dumps(public_schema))
    plan_text = len(plan.model_dump_json())
    card = _CARD_ALLOWANCE + 4 * schema_text + 2 * plan_text
    return weights + card


def check_release_space(release_dir: Path, needed_bytes: int) -> None:
    """Fail (:class:`ReleaseSpaceError`) unless ``release_dir`` exists (it is made if
    missing), takes a file (a small one is written and removed), and has at least
    ``SPACE_SAFETY_FACTOR × needed_bytes + SPACE_RESERVE_BYTES`` free. The worker calls
    this before any private row is read: a release that could not be written after
    training would keep the charge of a job whose data was read."""
    try:
        make_private_dir(release_dir)
        fd, probe = tempfile.mkstemp(dir=release_dir, prefix=".space-check-")
        try:
            os.write(fd, b"0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
        free = shutil.disk_usage(release_dir).free
    except OSError as exc:
        raise ReleaseSpaceError(f"release folder {release_dir} is not writable: {exc}") from exc
    wanted = SPACE_SAFETY_FACTOR * needed_bytes + SPACE_RESERVE_BYTES
    if free < wanted:
        raise ReleaseSpaceError(
            f"release folder {release_dir} has {free} bytes free; this release needs "
            f"{wanted} ({SPACE_SAFETY_FACTOR} x a bound of {needed_bytes} + "
            f"{SPACE_RESERVE_BYTES} reserve)"
        )


# Write errors worth another try: interrupted or momentarily unavailable (EIO too: each
# try writes a fresh temporary file from the start and fsyncs it, so a try that got an
# I/O error leaves nothing behind). ENOSPC, EDQUOT, EROFS, EACCES... fail at once.
TRANSIENT_WRITE_ERRNOS = frozenset({errno.EINTR, errno.EAGAIN, errno.EBUSY, errno.EIO})
WRITE_RETRY_DELAYS_S = (0.05, 0.2, 0.5, 1.0, 2.0)


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable (best effort: not every platform opens directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing: a temporary file in the same folder
    (``0600``: mkstemp's mode, chmod-ed again in case), flushed and fsynced, then renamed
    over ``path``. Transient errors are retried with a short backoff; on any failure the
    temporary file is removed."""
    for delay in (*WRITE_RETRY_DELAYS_S, None):
        tmp: str | None = None
        try:
            with tempfile.NamedTemporaryFile(
                dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
            ) as f:
                tmp = f.name
                os.fchmod(f.fileno(), PRIVATE_FILE_MODE)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return
        except OSError as exc:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            if delay is None or exc.errno not in TRANSIENT_WRITE_ERRNOS:
                raise
            log.warning("writing %s failed (%s); retrying in %gs", path.name, exc, delay)
            time.sleep(delay)


def write_release(
    release_dir: Path, job_id: str, run_token: str, payload: bytes, card: dict[str, Any]
) -> ReleasePaths:
    """Write the weights, then the card, each atomically (see :func:`_write_atomically`):
    a card in the folder means the release is complete. If either cannot be written,
    nothing of this run's release is left (the weights are removed, and the run's folder
    if it is then empty) and the error is raised."""
    paths = release_paths(release_dir, job_id, run_token)
    make_private_dir(paths.directory)  # and the job's folder: 0700 (issue 26)
    text = json.dumps(card, indent=2, sort_keys=True).encode()
    try:
        _write_atomically(paths.weights, payload)
        _write_atomically(paths.card, text)
    except BaseException:
        for leftover in (paths.card, paths.weights):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            paths.directory.rmdir()  # only if empty
        raise
    _fsync_dir(paths.directory)
    return paths


def load_state_dicts(payload: bytes, samples: int) -> list[dict[str, torch.Tensor]]:
    tensors = load_safetensors_torch(payload)
    out = []
    for i in range(samples):
        prefix = f"sample_{i}."
        out.append({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
    return out


__all__ = [
    "RELEASE_SPACE_FAILURE",
    "ReleaseSpaceError",
    "check_release_space",
    "load_state_dicts",
    "model_card",
    "release_size_bound",
    "sha256_bytes",
    "weights_bytes",
    "write_release",
]
