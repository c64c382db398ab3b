"""What every schema module shares: the method and guarantee vocabularies, and the base
classes of request bodies (:class:`ApiInput`) and of responses read from ORM objects
(:class:`ApiOutput`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from service.params import InputModel

TrainingMethod = Literal["dpsgd", "expm_nf", "expm"]
Method = Literal[TrainingMethod, "selection"]
"""``selection``: a selection job (POST /v1/selections), never submitted to POST /v1/jobs."""
Guarantee = Literal["proven", "asymptotic", "nominal"]
"""How far a release's (ε, δ) is proven, strongest first: **proven** (a proof covers the run
that executed, finite steps included), **asymptotic** (the sampler is exact only in the
limit of infinitely many steps; convergence diagnostics stay in the enclave), **nominal**
(no proof: ExpM sampled through a normalizing flow)."""
GUARANTEE_ORDER: tuple[Guarantee, ...] = ("proven", "asymptotic", "nominal")


def weakest_guarantee(*labels: Guarantee) -> Guarantee:
    """The weakest of the labels (a transcript is only as proven as its weakest release)."""
    return max(labels, key=GUARANTEE_ORDER.index, default="proven")


class ApiInput(InputModel):
    """Inputs: unknown fields, NaN, infinities and booleans for numbers are errors."""


class ApiOutput(BaseModel):
    model_config = ConfigDict(from_attributes=True)
