"""The OpenAPI document a running server publishes: valid, every reference in it resolves, and true about the
request bodies: the JSON routes' models, and how the form routes take their fields."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel

from rtvoice.app import openapi
from rtvoice.app.cartesia.requests import SpeechRequest as CartesiaSpeechRequest
from rtvoice.app.cosyvoice_api import CrossLingualForm, Instruct2Form, SftForm, ZeroShotForm
from rtvoice.app.openai_speech import SpeechRequest as OpenAISpeechRequest
from rtvoice.app.piper_api import SynthesizeRequest
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


def references(node: Any, where: str = "#") -> Iterator[tuple[str, str]]:
    """Every ``$ref`` under ``node``: (where it is, as a JSON pointer; what it refers to)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield where, value
            else:
                yield from references(value, f"{where}/{key.replace('~', '~0').replace('/', '~1')}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from references(value, f"{where}/{index}")


def resolve(document: dict[str, Any], ref: str) -> Any:
    """What ``ref`` points at, read from the document's root; KeyError (or IndexError) when nothing is there."""
    if not ref.startswith("#/"):
        raise KeyError(f"{ref} is not a pointer into this document")
    node: Any = document
    for token in unquote(ref[2:]).split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def test_every_reference_resolves_from_the_document_root(document: dict[str, Any]) -> None:
    """A body schema embedded whole would carry its own ``$defs`` and ``#/$defs/...`` references, which tools
    (Swagger UI, schemathesis) read from the document's root, where nothing is: its models go to
    components/schemas instead (app/openapi.py)."""
    found = list(references(document))
    assert any(ref.startswith("#/components/schemas/") for _, ref in found)
    unresolved = []
    for where, ref in found:
        try:
            resolve(document, ref)
        except (KeyError, IndexError, ValueError, TypeError):
            unresolved.append(f"{where}: {ref}")
    assert not unresolved, "references that do not resolve from the document's root:\n" + "\n".join(unresolved)


JSON_ROUTES: dict[str, type[BaseModel]] = {
    "/v1/audio/speech": OpenAISpeechRequest,
    "/tts/bytes": CartesiaSpeechRequest,
    "/synthesize": SynthesizeRequest,
}


@pytest.mark.parametrize("path", list(JSON_ROUTES))
def test_json_bodies_are_their_models(document: dict[str, Any], path: str) -> None:
    model_schema = JSON_ROUTES[path].model_json_schema(ref_template=openapi.REF_TEMPLATE)
    body = document["paths"][path]["post"]["requestBody"]
    assert body["required"] is True and set(body["content"]) == {"application/json"}
    schema = resolve(document, body["content"]["application/json"]["schema"]["$ref"])
    assert schema["type"] == "object"
    assert set(schema["properties"]) == set(model_schema["properties"])
    assert schema.get("required", []) == model_schema.get("required", [])
    for name, field in schema["properties"].items():  # a nested model: its own schema in components/schemas
        if "$ref" in field:
            nested = resolve(document, field["$ref"])
            assert nested == model_schema["$defs"][field["$ref"].rpartition("/")[2]], name


def test_two_models_of_one_name_need_one_named() -> None:
    class Clash(BaseModel):
        text: str

    first = openapi.schema_ref(Clash, "TestOpenAPIClash")
    assert openapi.schema_ref(Clash, "TestOpenAPIClash") == first  # the same schema again: the same reference

    class Other(BaseModel):
        count: int

    with pytest.raises(ValueError, match="TestOpenAPIClash"):
        openapi.schema_ref(Other, "TestOpenAPIClash")


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
    response = httpx.request(
        "GET",
        f"{server.url}/inference_sft",
        params={"spk_id": "no-such-voice"},
        data={"tts_text": "Body wins.", "spk_id": "en_US-joe-medium", "format": "pcm"},
        timeout=60,
    )
    assert response.status_code == 200 and response.headers["x-voice"] == "en_US-joe-medium"
    assert len(response.content) > 2 * EMBEDDED_VOICE_RATE // 4
