"""The text side of a WHEP session: JSON messages on a DataChannel, and the body of ``POST .../speak``.

Client to server::

    {"type": "tts_request", "text": "...", "speaker_id": "en_US-joe-medium", "request_id": "r1", "speed": 1.0}
    {"type": "cancel"}

``speaker_id`` may also be spelled ``voice``; it, ``request_id``, ``speed`` and ``seed`` are optional.
Server to client: ``accepted``, ``audio_start``, ``word``, ``mark``, ``done`` (with ``ignored`` when the text's
markup asked for something that was not done), ``cancelled`` and ``error`` events (see ``event``), each a JSON
object with a ``type``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rtvoice.app.errors import invalid_value
from rtvoice.app.fields import InputType, Lexicons, Normalize, Speed
from rtvoice.engine.errors import InvalidRequest


class SpeakRequest(BaseModel):
    """One utterance: the DataChannel's ``tts_request`` and the JSON body of ``POST /whep/{id}/speak``."""

    model_config = ConfigDict(extra="ignore")

    text: str = Field(description="The text to speak.")
    voice: str | None = Field(None, description="A voice id; the session's voice when omitted.")
    request_id: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="The client's id for this utterance; the server makes one when omitted.",
    )
    speed: Speed = 1.0
    seed: int | None = Field(None, description="Makes the voice's random draws reproducible.")
    normalize: Normalize = True
    input_type: InputType = "auto"
    lexicons: Lexicons = Field(default_factory=list)

    voice_param: str = Field("voice", exclude=True)
    """Which field named the voice (``speaker_id`` or ``voice``), for error messages."""

    @model_validator(mode="before")
    @classmethod
    def _speaker_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("voice") is None and data.get("speaker_id") is not None:
            data = {**data, "voice": data["speaker_id"], "voice_param": "speaker_id"}
        return data


@dataclass(frozen=True)
class Cancel:
    pass


def parse_speak(body: Any) -> SpeakRequest:
    if not isinstance(body, dict):
        raise InvalidRequest("the request must be a JSON object", code="invalid_json")
    body = {k: v for k, v in body.items() if k != "voice_param"}
    try:
        return SpeakRequest.model_validate(body)
    except ValidationError as error:
        raise invalid_value(error) from error


def parse_message(data: str | bytes) -> SpeakRequest | Cancel:
    """A DataChannel message: a ``tts_request`` or a ``cancel``; raises InvalidRequest for anything else."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidRequest("messages are UTF-8 JSON text", code="invalid_json") from error
    try:
        message = json.loads(data)
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"the message is not valid JSON: {error}", code="invalid_json") from error
    if not isinstance(message, dict):
        raise InvalidRequest("a message must be a JSON object with a 'type'", code="invalid_message")
    kind = message.get("type")
    if kind == "tts_request":
        return parse_speak(message)
    if kind == "cancel":
        return Cancel()
    raise InvalidRequest(
        f"unknown message type {kind!r}; expected 'tts_request' or 'cancel'", code="unknown_type", param="type"
    )


def event(kind: str, **fields: Any) -> str:
    """One server event as JSON text (fields that are None are left out)."""
    return json.dumps({"type": kind, **{k: v for k, v in fields.items() if v is not None}}, separators=(",", ":"))
