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
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_serializer,
)
from pydantic_core import core_schema

from service.schemas.common import method_names

__all__ = ["Flaggable", "Typed", "UntypedMechanism", "mechanism_union", "one_of", "unreadable"]

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


def unreadable(field: str, exc: ValidationError, *, limit: int = 2000) -> str:
    """Where and why a stored value failed its type (each error's location, under
    ``field`` where given, and message, never the value itself), for a flagged row and the
    service's log."""
    parts = [
        f"{'.'.join(map(str, (field, *e['loc']) if field else e['loc']))}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    text = "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Flaggable(BaseModel):
    """A listed row built from stored JSON that can be served flagged (issue 26): where a
    stored value fails its documented type (tampering, or a writer ahead of this model),
    the admin's listing still shows the row, built with :meth:`flagged` from the stored
    values as they are (unchecked) and ``unreadable`` saying where and why. Such a row is
    written field by field as stored: its typed fields' serializers never see the value
    they could not validate. Rows that validate are written as before (``unreadable``
    left out)."""

    unreadable: str | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description=(
            "Set only on a row whose stored JSON fails its documented type (tampered with, "
            "or written by a newer service): which values and why. The row's values are "
            "then served as stored, unchecked: they may not match this schema."
        ),
    )

    @classmethod
    def flagged(cls, why: str, values: dict[str, Any]) -> Self:
        """A row of ``values`` (every field's, as stored), unvalidated, flagged ``why``."""
        return cls.model_construct(**values, unreadable=why)

    # Unannotated on purpose: a return annotation would replace the model's own schema in
    # the serialization-mode document (``-> Any`` documents an arbitrary value).
    @model_serializer(mode="wrap")
    def _as_stored(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        if self.unreadable is None:
            return handler(self)
        # The values as stored; pydantic writes them by their JSON types (datetimes as
        # ISO 8601, enums by value).
        return {name: getattr(self, name, None) for name in type(self).model_fields}
