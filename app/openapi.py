"""Request bodies that routes document by hand (``openapi_extra``), with references that resolve in the document.

A route that parses its own body (for its errors' shape) describes the body with a pydantic model's JSON schema.
Embedded as pydantic makes it, a model with nested models carries ``$defs`` and ``#/$defs/...`` references,
which mean the schema's own root but are read from the OpenAPI document's root (by Swagger UI, schemathesis),
where nothing is. Here the schemas refer to ``#/components/schemas/<Name>`` instead; what they refer to is
collected as they are made, and :func:`install` adds it to the app's document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

REF_TEMPLATE = "#/components/schemas/{model}"

_components: dict[str, dict[str, Any]] = {}
"""What goes under ``components/schemas``, by name: filled as the route modules are imported."""


def _register(name: str, schema: dict[str, Any]) -> None:
    if _components.setdefault(name, schema) != schema:
        raise ValueError(f"two different schemas are named {name!r} in components/schemas: name one otherwise")


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema to embed in the document: the models it nests go to ``components/schemas``, and it
    refers to them there."""
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    for name, definition in schema.pop("$defs", {}).items():
        _register(name, definition)
    return schema


def schema_ref(model: type[BaseModel], name: str | None = None) -> dict[str, str]:
    """A reference to ``model``'s schema, which goes to ``components/schemas/<name>`` (the class's name unless
    given: two models of one name need one given)."""
    name = name or model.__name__
    _register(name, model_schema(model))
    return {"$ref": REF_TEMPLATE.format(model=name)}


def install(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI document (``/openapi.json``, ``/docs``) hold the schemas collected here."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = generate()  # FastAPI's, which keeps it as app.openapi_schema
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in _components.items():
            if schemas.setdefault(name, schema) != schema:
                raise ValueError(f"FastAPI's components/schemas has another schema named {name!r}")
        return document

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the document
