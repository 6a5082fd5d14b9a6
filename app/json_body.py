"""A JSON request body into a pydantic model, or the error that says why not."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from rtvoice.app.errors import invalid_value
from rtvoice.engine.errors import InvalidRequest

Model = TypeVar("Model", bound=BaseModel)


async def read_json(request: Request) -> Any:
    """The body as JSON whatever the Content-Type says; InvalidRequest (400) when it is not JSON."""
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequest(f"request body is not valid JSON: {error}", code="invalid_json") from error


async def parse_json_body(request: Request, model: type[Model]) -> Model:
    """The body as ``model`` (as OpenAI's, Cartesia's and Piper's servers read it, whatever the Content-Type
    says); InvalidRequest (400) for a body that is not a JSON object or does not validate."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise invalid_value(error) from error
