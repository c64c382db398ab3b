"""The synthetic ICU generator: shapes, missingness, GRU-D deltas, a public schema that
does not depend on the generated rows."""

from __future__ import annotations

import numpy as np

from worker.synthetic_icu import PUBLIC_SCHEMA, deltas_from_masks, generate_icu


def test_shapes_ranges_and_missingness() -> None:
    s = generate_icu(300, rng=np.random.default_rng(0))
    n, t, v = s.values.shape
    assert (n, t) == (300, 48) and 6 <= v <= 10
    assert s.masks.shape == s.deltas.shape == s.values.shape and s.labels.shape == (300,)
    assert 0.6 <= s.missing_rate <= 0.9
    assert set(np.unique(s.masks)) <= {0.0, 1.0} and set(np.unique(s.labels)) == {0.0, 1.0}
    assert 0.1 < s.labels.mean() < 0.5
    assert (s.values[s.masks == 0] == 0).all()
    observed = s.values[s.masks > 0].reshape(-1)
    assert np.isfinite(observed).all()
    scaled = s.scaled_values()
    assert scaled.min() >= 0.0 and scaled.max() <= 1.0
    assert s.packed().shape == (300, 3, 48, v) and s.packed().dtype == np.float32


def test_deltas_follow_che_et_al() -> None:
    masks = np.array([[[1.0], [0.0], [0.0], [1.0], [1.0], [0.0]]], dtype=np.float32)
    assert deltas_from_masks(masks).reshape(-1).tolist() == [0, 1, 2, 3, 1, 1]


def test_public_schema_is_a_constant_not_a_statistic_of_the_rows() -> None:
    a = generate_icu(50, rng=np.random.default_rng(1))
    b = generate_icu(80, rng=np.random.default_rng(2))
    assert a.schema == b.schema == PUBLIC_SCHEMA
    assert len(PUBLIC_SCHEMA.scaled_means) == PUBLIC_SCHEMA.n_vars
    assert all(0.0 < m < 1.0 for m in PUBLIC_SCHEMA.scaled_means)


def test_outcome_depends_on_the_trajectories() -> None:
    s = generate_icu(4000, rng=np.random.default_rng(3))
    lactate = PUBLIC_SCHEMA.names.index("lactate")
    obs = s.masks[:, :, lactate] > 0
    mean_lactate = np.where(obs, s.values[:, :, lactate], 0).sum(1) / np.maximum(obs.sum(1), 1)
    has = obs.sum(1) > 0
    pos, neg = mean_lactate[has & (s.labels == 1)], mean_lactate[has & (s.labels == 0)]
    assert pos.mean() > neg.mean() + 0.3
