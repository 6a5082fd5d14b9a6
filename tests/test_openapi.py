"""The OpenAPI document a running server publishes: valid, and true about how the form routes take their fields."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from rtvoice.app.cosyvoice_api import CrossLingualForm, Instruct2Form, SftForm, ZeroShotForm
from tests.conftest import Server
from tests.engine_output import EMBEDDED_VOICE_RATE

FORM_ROUTES = {
    "/inference_sft": (SftForm, ()),
    "/inference_zero_shot": (ZeroShotForm, ("prompt_wav",)),
    "/inference_cross_lingual": (CrossLingualForm, ("prompt_wav",)),
    "/inference_instruct2": (Instruct2Form, ("prompt_wav",)),
}


@pytest.fixture(scope="module")
def document(server: Server) -> dict[str, Any]:
    return httpx.get(f"{server.url}/openapi.json").json()


def test_the_document_is_valid_openapi(document: dict[str, Any]) -> None:
    validate(document)
    assert document["openapi"].startswith("3.1")


@pytest.mark.parametrize("path", list(FORM_ROUTES))
def test_get_takes_query_parameters_and_the_form_body(document: dict[str, Any], path: str) -> None:
    form, files = FORM_ROUTES[path]
    operation = document["paths"][path]["get"]
    parameters = {p["name"]: p for p in operation["parameters"]}
    assert set(parameters) == set(form.model_fields)
    assert {p["in"] for p in parameters.values()} == {"query"}
    # Each field may come in the body instead, so none is required in the query; the description says which are.
    assert not any(p["required"] for p in parameters.values())
    for name, field in form.model_fields.items():
        assert ("Required" in parameters[name]["description"]) == field.is_required(), name
    body = operation["requestBody"]
    assert "CosyVoice's client" in body["description"]
    if files:  # an upload needs a multipart body, on GET too
        assert body["required"] is True and set(body["content"]) == {"multipart/form-data"}
    else:
        assert body["required"] is False
        assert set(body["content"]) == {"application/x-www-form-urlencoded", "multipart/form-data"}
    for media in body["content"].values():
        schema = media["schema"]
        assert set(schema["properties"]) == set(form.model_fields) | set(files)
        assert schema["required"] == list(files)  # the other fields may be in the query
        for name in files:
            assert schema["properties"][name]["format"] == "binary"


@pytest.mark.parametrize("path", list(FORM_ROUTES))
def test_post_takes_a_form_body(document: dict[str, Any], path: str) -> None:
    form, files = FORM_ROUTES[path]
    operation = document["paths"][path]["post"]
    assert "parameters" not in operation
    body = operation["requestBody"]
    assert body["required"] is True
    for media in body["content"].values():
        required = {name for name, field in form.model_fields.items() if field.is_required()}
        assert set(media["schema"]["required"]) == required | set(files)


def test_a_field_in_query_and_body_takes_the_body_value(server: Server) -> None:
    """What the GET body's description says, as the server does it."""
    response = httpx.request("GET", f"{server.url}/inference_sft", params={"spk_id": "no-such-voice"},
                             data={"tts_text": "Body wins.", "spk_id": "en_US-joe-medium", "format": "pcm"}, timeout=60)
    assert response.status_code == 200 and response.headers["x-voice"] == "en_US-joe-medium"
    assert len(response.content) > 2 * EMBEDDED_VOICE_RATE // 4
