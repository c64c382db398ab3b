"""Stored JSON values with a typed contract: :class:`Typed` validates a value against
pydantic models and keeps the value itself.

Privacy plans, events and model cards are stored JSON: the ledger keeps plans as JSON, the
worker compares a stored plan with the one it re-derives, and digests are taken of their
serialisation. Turning such a value into model instances and back would reorder its keys
(a model writes its fields in declaration order), fill in defaults the stored value left
out and change a stored integer into a float or back. A field annotated
``Annotated[dict[str, Any], Typed(Model)]`` is therefore documented in the OpenAPI document
as ``Model`` (so generated clients get typed classes) and validated against it whenever the
containing model is validated, while its Python value stays the JSON object as given, which
serialises back byte for byte.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, TypeAdapter, ValidationInfo
from pydantic_core import core_schema

from service.schemas.common import method_names

__all__ = ["Typed", "UntypedMechanism", "mechanism_union", "one_of"]

Pick = Callable[[Any, ValidationInfo], TypeAdapter[Any] | None]
"""Which type a value must satisfy (given the value and the fields validated before it), or
None where no type applies (then any JSON object is kept)."""

_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


@dataclass(frozen=True)
class Typed:
    """Marker for ``Annotated[dict[str, Any], Typed(doc)]``: the value must validate as
    ``doc`` (or as the adapter ``pick`` returns, where given, else as any JSON object), is
    documented as ``doc`` and is kept as given (in a new outer dict)."""

    doc: Any
    pick: Pick | None = None

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        documented = handler.generate_schema(self.doc)
        pick = self.pick

        def keep(
            value: Any, validate: core_schema.ValidatorFunctionWrapHandler, info: ValidationInfo
        ) -> Any:
            if pick is None:
                validate(value)
            else:
                (pick(value, info) or _OBJECT).validate_python(value)
            # A new outer dict, as ``dict[str, Any]`` validation makes (values shared).
            return dict(value) if isinstance(value, dict) else value

        return core_schema.with_info_wrap_validator_function(
            keep,
            documented,
            # Written as a plain JSON object, as ``dict[str, Any]`` is (a copy, keys in
            # their stored order); the document still shows ``doc`` for responses.
            serialization=core_schema.simple_ser_schema("dict"),
        )


def one_of(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a field whose union members exclude each other (each
    requires keys or constants the others lack) but share no discriminator key: document
    it as ``oneOf`` (pydantic writes such a union as ``anyOf``)."""
    if "anyOf" in schema:
        schema["oneOf"] = schema.pop("anyOf")


class UntypedMechanism(BaseModel):
    """The mechanism of a method that has no typed model in this document yet: any JSON
    object (its keys are the method's own)."""

    model_config = ConfigDict(extra="allow")


def mechanism_union(
    models: tuple[type[BaseModel], ...], *, typed: Collection[str]
) -> tuple[Any, Callable[[dict[str, Any]], None]]:
    """The documented type of a mechanism field and its ``json_schema_extra``: the union of
    ``models`` as ``oneOf`` when every job method (``method_names()``) is in ``typed``;
    otherwise (a method added before its mechanism model) ``anyOf`` the models and
    :class:`UntypedMechanism`, the description naming the untyped methods."""
    untyped = [m for m in method_names() if m not in typed]
    members = (*models, UntypedMechanism) if untyped else models
    doc = reduce(operator.or_, members)

    def extra(schema: dict[str, Any]) -> None:
        if not untyped:
            one_of(schema)
            return
        note = f"Methods without a model here ({', '.join(untyped)}): UntypedMechanism."
        schema["description"] = f"{schema.get('description', '')} {note}".strip()

    return doc, extra
