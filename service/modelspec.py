"""Target-model specifications: public, validated, part of every request and model card."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogisticSpec(_Spec):
    """Logistic regression: sigmoid(w·x + b), output in [0, 1]."""

    kind: Literal["logistic"] = "logistic"


class MlpSpec(_Spec):
    """A small MLP with tanh hidden layers and a sigmoid output in [0, 1]."""

    kind: Literal["mlp"] = "mlp"
    hidden: list[Annotated[int, Field(ge=1, le=256)]] = Field(
        default=[16], min_length=1, max_length=3
    )


class GrudSpec(_Spec):
    """GRU-D (Che et al. 2018) for irregular time series, sigmoid head in [0, 1]."""

    kind: Literal["grud"] = "grud"
    hidden: int = Field(default=16, ge=1, le=128)


ModelSpec = Annotated[LogisticSpec | MlpSpec | GrudSpec, Field(discriminator="kind")]
