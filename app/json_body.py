"""A JSON request body into a pydantic model, or the error response that says why not."""

from __future__ import annotations

import json
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from rtvoice.app.errors import error_response, validation_error_response

Model = TypeVar("Model", bound=BaseModel)


async def parse_json_body(request: Request, model: type[Model]) -> Model | JSONResponse:
    """The body as ``model`` whatever the Content-Type says (as OpenAI's, Cartesia's and Piper's servers read
    it); a 400 with the error body for a body that is not a JSON object or does not validate."""
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return error_response(400, f"request body is not valid JSON: {error}", code="invalid_json")
    if not isinstance(body, dict):
        return error_response(400, "request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        return validation_error_response(error)
