"""Releases: where they live, and a small numpy helper that loads one and predicts.

An analyst needs only this module (numpy + safetensors, no torch) and the public schema
to use a released logistic-regression or MLP model on their own data.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from safetensors.numpy import load as load_safetensors

from service.datasets.tabular import (
    TabularSchema,
    ValidationReport,
    encode_features,
    encode_target,
    parse_schema,
    validate_frame,
)
from service.schemas import Guarantee

NOMINAL_STATEMENT = (
    "NOMINAL guarantee: this model was sampled through a normalizing flow trained to "
    "approximate the exponential mechanism's density. The exponential mechanism itself "
    "(density ∝ exp(ε·u), a utility monotone in the data) is ε-DP under add/remove one "
    "row, but the flow only approximates it and no proof covers the gap, so the stated ε "
    "is nominal, not proven."
)
ASYMPTOTIC_STATEMENT = (
    "ASYMPTOTIC guarantee: the stated (ε, δ) holds for an exact draw from the regularised "
    "exponential mechanism's density (Gaussian-DP, Gopi, Lee & Liu 2022). This model is the "
    "final state of a Markov chain (MCMC) whose law tends to that density as its steps grow; "
    "the chain ran a fixed number of steps and no proof bounds its distance from the "
    "density, so the (ε, δ) is exact only in the limit, not proven for this run. "
    "Convergence diagnostics were recorded inside the enclave."
)
PROVEN_STATEMENT = (
    "PROVEN guarantee: the training run is (ε, δ)-differentially private under the named "
    "accountant, for the plan's exact noise multiplier, sampling rate and number of steps, "
    "with add/remove-one-row neighbours and only the public values listed in the card "
    "treated as public."
)
STATEMENTS: dict[Guarantee, str] = {
    "proven": PROVEN_STATEMENT,
    "asymptotic": ASYMPTOTIC_STATEMENT,
    "nominal": NOMINAL_STATEMENT,
}
"""The model card's sentence for each guarantee label."""


NEIGHBOURING_RELATION = (
    "add/remove one row: datasets D and D' are neighbours when one is the other plus one "
    "row. Every charge of the ledger, and this release's (ε, δ), is for this relation."
)


def public_values(
    *, n_rows: int, count_epsilon: float | None, method: str, sampler: str | None = None
) -> dict[str, str]:
    """What the mechanism may depend on besides the private rows, in words (model cards,
    API). ``count_epsilon`` None marks a dataset whose exact row count was published;
    ``sampler`` is the plan's ExpM sampler, if any."""
    if count_epsilon is None:
        count = (
            f"{n_rows}: the exact row count, published when the dataset was registered "
            "(before noisy counts); the guarantee treats it as public"
        )
    else:
        count = (
            f"{n_rows}: a DP noisy count (two-sided geometric noise, ε = {count_epsilon:g}) "
            "released at registration and charged to the dataset's budget"
        )
    uses = {
        "dpsgd": "q = batch_size / row count and the expected batch q·row count",
        "expm": "the Langevin step: the noisy gradient sum is scaled by learning_rate / row count",
        "selection": (
            "the public training and validation counts it splits into (DP-SGD's "
            "q = batch_size / training count; the noisy score's divisor, the validation count)"
        ),
    }.get(method, "nothing (the exponential mechanism does not use it)")
    if sampler == "mcmc":
        uses = "nothing (the MCMC sampler's target does not depend on it)"
    return {
        "public_schema": (
            "declared by the admin: columns, bounds, levels, target encoding (time series: "
            "variables, units, bounds, imputation means, time grid, outcome encoding)"
        ),
        "row_count": count,
        "row_count_used_for": uses,
        "plan": "the request and every value under `mechanism` and `event`",
    }


@dataclass(frozen=True)
class ReleasePaths:
    directory: Path
    weights: Path
    card: Path


def release_paths(release_dir: Path, job_id: str, run_token: str) -> ReleasePaths:
    d = release_dir / job_id / run_token
    return ReleasePaths(d, d / "model.safetensors", d / "card.json")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class LoadedRelease:
    card: dict[str, Any]
    tensors: dict[str, np.ndarray]

    @property
    def schema(self) -> TabularSchema:
        """The tabular schema the release was trained on (the numpy helpers here are for
        tabular releases; a GRU-D release's stays are encoded by
        :func:`service.datasets.timeseries.encode_series` and it runs as a torch module)."""
        public = self.card["preprocessing"]["public_schema"]
        if public.get("kind") == "timeseries":
            raise ValueError(
                "a time-series (GRU-D) release: encode stays with service.datasets.timeseries "
                "(validate_series, encode_series) and load the weights into GRU-D"
            )
        return parse_schema(public)

    def sample_weights(self, index: int = 0) -> dict[str, np.ndarray]:
        prefix = f"sample_{index}."
        return {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}


def load_release(weights: bytes, card: dict[str, Any]) -> LoadedRelease:
    """Check the weights against the card's SHA-256 and load them."""
    if sha256_bytes(weights) != card["weights_sha256"]:
        raise ValueError("the weights do not match the model card's sha256")
    return LoadedRelease(card=card, tensors=load_safetensors(weights))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def input_columns(release: LoadedRelease) -> list[int] | None:
    """Where the model's inputs sit in the schema's full encoding: the card's
    ``preprocessing.model_inputs`` (a model trained on selected features reads only
    their encoded columns), or None when it reads them all."""
    inputs = release.card["preprocessing"].get("model_inputs")
    if inputs is None:
        return None
    position = {name: i for i, name in enumerate(release.schema.feature_names)}
    return [position[name] for name in inputs]


def n_classes(release: LoadedRelease) -> int:
    """The release's number of classes K: 2 for a binary model, else its model's
    ``classes`` (multinomial logistic regression, a K-logit MLP or CNN)."""
    return int(release.card["model"].get("classes") or 2)


def predict_class_proba(release: LoadedRelease, x: np.ndarray, sample: int = 0) -> np.ndarray:
    """(rows, K) softmax probabilities over the declared classes (in the schema's order) for
    encoded features x, from a K-class release (``model.classes`` = K ≥ 3: multinomial
    logistic regression, an MLP or a CNN)."""
    if n_classes(release) < 3:
        raise ValueError("a binary release: use predict_proba (P(y = 1 | x))")
    kind = release.card["model"]["kind"]
    w = release.sample_weights(sample)
    if kind == "cnn":
        z = cnn_logits(release.card["model"], w, x)
    elif kind == "logistic":
        z = x.astype(np.float64) @ w["linear.weight"].T.astype(np.float64) + w["linear.bias"]
    elif kind == "mlp":
        z = mlp_logits(release.card["model"], w, x)
    else:
        raise ValueError(
            f"predict_class_proba supports logistic, mlp and cnn releases, not {kind!r}"
        )
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def predict_proba(release: LoadedRelease, x: np.ndarray, sample: int = 0) -> np.ndarray:
    """P(y = 1 | x) for encoded features x (see :func:`encode_for`), logistic or MLP. For a
    model trained on selected features, x may hold every encoded column (it is sliced to
    the card's ``model_inputs``) or only those inputs."""
    cols = input_columns(release)
    if cols is not None and x.shape[1] != len(cols):
        if x.shape[1] != release.schema.n_features:
            raise ValueError(
                f"x has {x.shape[1]} columns: expected the schema's {release.schema.n_features} "
                f"encoded features or the model's {len(cols)} inputs"
            )
        x = x[:, cols]
    if n_classes(release) >= 3:
        raise ValueError("a multi-class release: use predict_class_proba (one column a class)")
    w = release.sample_weights(sample)
    kind = release.card["model"]["kind"]
    h = x.astype(np.float64)
    if kind == "logistic":
        return _sigmoid(h @ w["linear.weight"].T[:, 0] + w["linear.bias"][0])
    if kind == "mlp":
        return _sigmoid(mlp_logits(release.card["model"], w, h)[:, 0])
    if kind == "cnn":
        return _sigmoid(cnn_logits(release.card["model"], w, x)[:, 0])
    raise ValueError(f"predict_proba supports logistic, mlp and cnn releases, not {kind!r}")


def mlp_logits(model: dict[str, Any], w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """An MLP release's logits (rows, 1 or K) for encoded features x, in float64 numpy:
    worker/models/mlp.py's forward (each Linear layer ``net.<i>.weight``/``bias`` in order,
    the card's ``activation``, tanh unless it says relu, between them)."""
    relu = model.get("activation", "tanh") == "relu"
    layers = sorted({k.split(".")[1] for k in w if k.startswith("net.")}, key=int)
    h = x.astype(np.float64)
    for i, idx in enumerate(layers):
        h = h @ w[f"net.{idx}.weight"].T.astype(np.float64) + w[f"net.{idx}.bias"]
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0) if relu else np.tanh(h)
    return np.asarray(h)


# Rows per block of the CNN forward below (its windows are a view; the products allocate
# rows × channels × output pixels × window floats per layer).
_CNN_ROWS = 256


def cnn_logits(model: dict[str, Any], w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """A CNN release's logits (rows, 1 or K) for encoded pixels x (rows, C·H·W, channel-major
    as the image kind encodes them), in float64 numpy: worker/models/cnn.py's forward
    (each convolution with its stride and zero padding, ReLU, 2 × 2 average pooling that
    drops a trailing odd row or column, then the Linear head on the flattened maps), with
    the card's ``model`` (its layers and public image shape) and the sample's weights
    (``convs.<i>.weight``/``bias``, ``head.weight``/``bias``).
    ``tests/unit/test_release_scoring_cnn.py`` compares it with the torch module."""
    image = model["image"]
    shape = (int(image["channels"]), int(image["height"]), int(image["width"]))
    if x.ndim != 2 or x.shape[1] != shape[0] * shape[1] * shape[2]:
        raise ValueError(f"x must be (rows, {shape[0] * shape[1] * shape[2]}) encoded pixels")
    blocks = [
        _cnn_block(model["conv"], w, x[start : start + _CNN_ROWS], shape)
        for start in range(0, len(x), _CNN_ROWS)
    ]
    head = len(w["head.bias"])
    return np.concatenate(blocks) if blocks else np.zeros((0, head))


def _cnn_block(
    layers: list[dict[str, Any]], w: dict[str, np.ndarray], x: np.ndarray, shape: tuple[int, ...]
) -> np.ndarray:
    a = x.astype(np.float64).reshape(len(x), *shape)
    for i, layer in enumerate(layers):
        weight = w[f"convs.{i}.weight"].astype(np.float64)  # (c_out, c_in, k, k)
        pad, stride, k = int(layer.get("padding", 0)), int(layer.get("stride", 1)), weight.shape[-1]
        if pad:
            a = np.pad(a, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        windows = np.lib.stride_tricks.sliding_window_view(a, (k, k), axis=(2, 3))
        windows = windows[:, :, ::stride, ::stride]  # (rows, c_in, out_h, out_w, k, k)
        a = np.einsum("ncxyij,ocij->noxy", windows, weight, optimize=True)
        a = np.maximum(a + w[f"convs.{i}.bias"].astype(np.float64)[None, :, None, None], 0.0)
        if layer.get("pool", "none") == "avg2":
            n, c, h, wd = a.shape
            a = a[:, :, : h - h % 2, : wd - wd % 2].reshape(n, c, h // 2, 2, wd // 2, 2)
            a = a.mean(axis=(3, 5))
    flat = a.reshape(len(a), -1)
    return np.asarray(flat @ w["head.weight"].astype(np.float64).T + w["head.bias"])


@dataclass(frozen=True)
class EncodedRows:
    """Public rows encoded by a public schema, with what was dropped and why.

    ``x`` (float32, rows × features) and ``y`` (float32 in {0, 1}; None for unlabelled
    rows) hold the kept rows in input order; ``kept_index`` holds their labels in the
    input frame's index; ``dropped`` maps every other row's label to the reason(s), e.g.
    ``"age: above max; workclass: unknown level"``.
    """

    x: np.ndarray
    y: np.ndarray | None
    kept_index: pd.Index
    dropped: dict[Hashable, str]
    report: ValidationReport


def encode_rows(
    schema: TabularSchema, raw: pd.DataFrame, *, labelled: bool | None = None
) -> EncodedRows:
    """Preprocess public rows exactly as the enclave does (public schema only).

    ``labelled`` None encodes the target when ``raw`` has the target column and leaves
    ``y`` None otherwise; True requires it; False ignores it. A feature column missing
    from ``raw`` is a :class:`ValueError` naming it (nothing could be encoded); rows of
    which none passes (e.g. read with the wrong separator) warn with a hint.
    """
    target = schema.target.column
    if labelled is None:
        labelled = target in raw.columns
    elif labelled and target not in raw.columns:
        raise ValueError(
            f"the rows have no target column {target!r}; pass labelled=False to encode "
            "unlabelled rows"
        )
    checked = validate_frame(schema, raw, labelled=labelled)
    if checked.report.missing_columns:
        hint = f" ({checked.report.hint})" if checked.report.hint else ""
        raise ValueError(
            f"the rows have no column(s) {list(checked.report.missing_columns)}; "
            f"read them with the schema's csv options (read_csv_kwargs){hint}"
        )
    if checked.report.rows_in and not checked.report.rows_kept:
        warnings.warn(
            f"no row passed validation ({checked.report.hint}); see EncodedRows.dropped",
            UserWarning,
            stacklevel=2,
        )
    return EncodedRows(
        x=encode_features(schema, checked.frame),
        y=encode_target(schema, checked.frame) if labelled else None,
        kept_index=raw.index[checked.kept],
        dropped={raw.index[pos]: why for pos, why in checked.dropped().items()},
        report=checked.report,
    )


def encode_for(release: LoadedRelease, raw: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Labelled rows → (x, y) for a release (see :func:`encode_rows` for the dropped rows
    and their reasons, and for unlabelled rows)."""
    rows = encode_rows(release.schema, raw, labelled=True)
    assert rows.y is not None
    return rows.x, rows.y


def card_json(card: dict[str, Any]) -> str:
    return json.dumps(card, indent=2, sort_keys=True)
