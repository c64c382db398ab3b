"""The API's selection bodies expose every field of their kind's request (service/
selection/plans.py), except what the body itself decides (the per-candidate budget from
the workflow's (ε, δ)): a field added to a kind's request must not go missing from the API."""

from __future__ import annotations

import pytest

from service.selection.api_bodies import (
    ArchitectureSelection,
    FeatureSelection,
    HyperparameterSelection,
    _Body,
)
from service.selection.plans import REQUEST_MODELS

BODIES = {
    "architecture": ArchitectureSelection,
    "hyperparameters": HyperparameterSelection,
    "features": FeatureSelection,
}
DECIDED_BY_THE_BODY = {"budget", "epsilon", "delta"}


@pytest.mark.parametrize("kind", sorted(REQUEST_MODELS))
def test_every_kind_has_a_body_with_its_requests_fields(kind: str) -> None:
    body = BODIES[kind]
    own = set(body.model_fields) - set(_Body.model_fields) - {"kind"}
    assert own == set(REQUEST_MODELS[kind].model_fields) - DECIDED_BY_THE_BODY
    assert body.model_fields["kind"].annotation.__args__ == (kind,)  # type: ignore[union-attr]
