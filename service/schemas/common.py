"""What every schema module shares: the method and guarantee vocabularies, and the base
classes of request bodies (:class:`ApiInput`) and of responses read from ORM objects
(:class:`ApiOutput`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema
from pydantic_core import PydanticCustomError

from service.params import InputModel

TRAINING_METHODS: list[str] = ["dpsgd", "expm_nf", "expm"]
"""The request schema's table of methods (issue 23): the names a training request may give
as ``method``, one line per method. A method's plan builder, guarantee and resource estimate
are its entry in service.methods.METHODS, its mechanism its entry in
worker/mechanisms/registry.py, and its options (where it has any) a field of ``JobRequest``
named after it; tests/unit/test_method_registry.py keeps the tables naming the same methods
and runs a method registered in them alone (a dummy) end to end."""
SELECTION_METHOD = "selection"
"""A selection job's method (POST /v1/selections), never submitted to POST /v1/jobs."""
EVALUATION_METHOD = "evaluation"
"""A private evaluation's method (POST /v1/evaluations, issue 21), never submitted to
POST /v1/jobs: it scores a released model on the dataset's holdout."""
AUTO_METHOD = "auto"
"""A training request's ``method`` when the service is to choose it (issue 21, point 3;
service/methods/auto.py): never a plan's or a job's method, which is the one chosen."""


def method_names() -> list[str]:
    """Every value a job's ``method`` may take: the training methods, then ``selection``
    and ``evaluation``."""
    return [*TRAINING_METHODS, SELECTION_METHOD, EVALUATION_METHOD]


def request_method_names() -> list[str]:
    """Every value a job request's ``method`` may take: :func:`method_names` and ``auto``."""
    return [*TRAINING_METHODS, AUTO_METHOD, SELECTION_METHOD, EVALUATION_METHOD]


def _one_of(names: Callable[[], list[str]]) -> Callable[[str], str]:
    """A validator of a name in ``names()``, looked up when a value is validated, not when
    the model is built (so the table is the one place a method is named); its error is
    pydantic's own for a Literal."""

    def check(value: str) -> str:
        allowed = names()
        if value not in allowed:
            quoted = [repr(n) for n in allowed]
            expected = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1])
            expected += "" if len(quoted) == 1 else f" or {quoted[-1]}"
            raise PydanticCustomError(
                "literal_error", "Input should be {expected}", {"expected": expected}
            )
        return value

    return check


TrainingMethod = Annotated[
    str,
    AfterValidator(_one_of(lambda: TRAINING_METHODS)),
    WithJsonSchema({"enum": list(TRAINING_METHODS), "type": "string"}),
]
"""A name in :data:`TRAINING_METHODS` (documented as the enum of the names at start-up)."""
Method = Annotated[
    str,
    AfterValidator(_one_of(method_names)),
    WithJsonSchema({"enum": method_names(), "type": "string"}),
]
"""A training method, ``selection`` or ``evaluation``."""
RequestMethod = Annotated[
    str,
    AfterValidator(_one_of(request_method_names)),
    WithJsonSchema({"enum": request_method_names(), "type": "string"}),
]
"""A request's method: a :data:`Method` or ``auto`` (the service chooses the method)."""


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
