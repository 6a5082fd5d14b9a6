"""WHEP's HTTP side (draft-ietf-wish-whep): the endpoint ``/whep`` and session resources ``/whep/{id}``.

``POST /whep`` (an SDP offer) -> 201 with the SDP answer, ``Location``, ``ETag`` and
``Link: rel="ice-server"``; ``PATCH`` a session with a trickle-ICE fragment -> 204
(new ICE credentials, an ICE restart -> 422); ``DELETE`` -> 200. Text to speak comes on
a DataChannel or, for players that cannot open one, ``POST /whep/{id}/speak``.
Errors carry the project's JSON error body.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from rtvoice.app.access import grant_of
from rtvoice.app.errors import HttpError
from rtvoice.app.fields import MAX_SPEED, MIN_SPEED
from rtvoice.app.json_body import read_json
from rtvoice.app.state import engine_of
from rtvoice.app.whep.endpoint import WhepEndpoint
from rtvoice.app.whep.messages import parse_speak
from rtvoice.app.whep.resource import IceRestartUnsupported, WhepResource
from rtvoice.app.whep.sdp import SdpError, parse_fragment, parse_offer

router = APIRouter(tags=["WHEP"])

SDP = "application/sdp"
SDP_FRAGMENT = "application/trickle-ice-sdpfrag"
ENDPOINT_METHODS = "OPTIONS, GET, POST"
SESSION_METHODS = "OPTIONS, GET, PATCH, DELETE"


def endpoint_of(request: Request) -> WhepEndpoint:
    endpoint: WhepEndpoint = request.app.state.whep
    return endpoint


def _require_media_type(request: Request, media_type: str, what: str, accept_header: str) -> None:
    """415, with the header that names the accepted type, unless the body is ``media_type``."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != media_type:
        raise HttpError(
            f"{what} must be sent as {media_type}",
            code="unsupported_media_type",
            status=415,
            headers={accept_header: media_type},
        )


def session_of(request: Request, session_id: str) -> WhepResource:
    """The session named in the path (a dependency); 404 when it ended or never existed."""
    resource = endpoint_of(request).get(session_id)
    if resource is None:
        raise HttpError(
            f"no WHEP session {session_id!r} (it ended, or never existed)", code="session_not_found", status=404
        )
    return resource


Session = Annotated[WhepResource, Depends(session_of)]


def _location(request: Request, resource: WhepResource) -> str:
    """The session's URL: absolute on this replica's ``public_url`` when set (so a player's later requests reach
    the replica that holds it), else relative (a balancer routes on the ``<replica_id>~`` the id starts with)."""
    public_url = endpoint_of(request).settings.public_url.rstrip("/")
    return f"{public_url or request.scope.get('root_path', '')}/whep/{resource.id}"


# -- the endpoint -----------------------------------------------------------------------------------


@router.options("/whep", include_in_schema=False)
async def endpoint_options(request: Request) -> Response:
    """Allowed methods, and the ICE servers (TURN with fresh credentials) for a player that gathers before offering."""
    response = Response(status_code=200, headers={"Accept-Post": SDP, "Allow": ENDPOINT_METHODS})
    for link in endpoint_of(request).links(f"preflight-{secrets.token_hex(6)}"):
        response.headers.append("Link", link)
    return response


@router.get("/whep", status_code=204, response_class=Response)
async def endpoint_get(request: Request) -> Response:
    """WHEP resources have no representation: 204."""
    return Response(status_code=204)


@router.post(
    "/whep",
    status_code=201,
    response_class=Response,
    openapi_extra={
        "requestBody": {"required": True, "content": {SDP: {"schema": {"type": "string"}}}},
        "parameters": [
            {
                "name": "voice",
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "The session's voice id.",
            }
        ],
    },
    responses={201: {"content": {SDP: {}}, "description": "The SDP answer; Location names the session."}},
)
async def create_session(request: Request) -> Response:
    """Start playback: the player's SDP offer (recvonly audio, a DataChannel for text) in, the answer out."""
    _require_media_type(request, SDP, "the offer", "Accept-Post")
    engine = engine_of(request)
    voice = engine.voice_info(request.query_params.get("voice") or None, "voice")
    endpoint = endpoint_of(request)
    try:
        offer = parse_offer(await request.body())
        resource, answer = await endpoint.create(offer, voice)
    except SdpError as error:
        raise HttpError(error.message, code=error.code, param="sdp") from error
    grant = grant_of(request)
    if grant is not None:  # the offer's stream lease becomes the session's: its key's quota counts it until it ends
        lease = grant.keep_lease()
        if resource.closed:
            lease.release()
        else:
            resource.on_close.append(lease.release)
    response = Response(
        answer,
        status_code=201,
        media_type=SDP,
        headers={"Location": _location(request, resource), "ETag": resource.etag},
    )
    for link in endpoint.links(resource.id):
        response.headers.append("Link", link)
    return response


# -- a session ----------------------------------------------------------------------------------------


@router.options("/whep/{session_id}", include_in_schema=False)
async def session_options(session_id: str) -> Response:
    return Response(status_code=200, headers={"Accept-Patch": SDP_FRAGMENT, "Allow": SESSION_METHODS})


@router.get("/whep/{session_id}", status_code=204, response_class=Response)
async def session_get(session: Session) -> Response:
    """WHEP resources have no representation: 204 while the session lives, 404 after."""
    return Response(status_code=204)


@router.patch(
    "/whep/{session_id}",
    status_code=204,
    response_class=Response,
    openapi_extra={"requestBody": {"required": True, "content": {SDP_FRAGMENT: {"schema": {"type": "string"}}}}},
)
async def patch_session(request: Request, session: Session) -> Response:
    """Trickle ICE: add the player's candidates. New ICE credentials (an ICE restart) get 422."""
    _require_media_type(request, SDP_FRAGMENT, "ICE updates", "Accept-Patch")
    try:
        fragment = parse_fragment(await request.body())
        await session.add_candidates(fragment)
    except SdpError as error:
        raise HttpError(error.message, code=error.code, param="sdpfrag") from error
    except IceRestartUnsupported as error:
        raise HttpError(
            "ICE restarts are not supported; the session keeps its ICE session (DELETE it and POST a "
            "new offer to reconnect)",
            code="ice_restart_unsupported",
            status=422,
        ) from error
    return Response(status_code=204)


@router.get("/whep/{session_id}/status")
async def session_status(session: Session) -> Response:
    """What the session sends now (Opus bit rate, FEC and its loss hint, RED) and what its player last reported."""
    return JSONResponse(session.status())


@router.delete("/whep/{session_id}", status_code=200, response_class=Response)
async def delete_session(session: Session) -> Response:
    """End the session: peer connection closed, speech cancelled, everything freed before the answer."""
    await session.close("deleted")
    return Response(status_code=200)


# -- text for players without a DataChannel ------------------------------------------------------------


@router.post(
    "/whep/{session_id}/speak",
    status_code=202,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["text"],
                        "properties": {
                            "text": {"type": "string"},
                            "voice": {"type": "string"},
                            "request_id": {"type": "string"},
                            "speed": {"type": "number", "minimum": MIN_SPEED, "maximum": MAX_SPEED},
                            "seed": {"type": ["integer", "null"]},
                            "normalize": {"type": "boolean", "default": True},
                            "input_type": {"type": "string", "enum": ["auto", "ssml", "text"], "default": "auto"},
                            "lexicons": {"type": "array", "items": {"type": "string"}},
                        },
                    }
                }
            },
        }
    },
)
async def speak(request: Request, session: Session) -> Response:
    """Speak ``text`` on the session's audio track, after what it is already saying; 202 with the request id."""
    utterance = session.speak(parse_speak(await read_json(request)))
    return JSONResponse(
        {
            "request_id": utterance.id,
            "voice": utterance.voice.id,
            "queue_position": session.playback.queue_position(utterance),
        },
        status_code=202,
    )


@router.delete("/whep/{session_id}/speak", status_code=200)
async def cancel_speech(session: Session) -> Response:
    """Barge-in: stop what the session is saying and drop what it has queued."""
    cancelled = session.cancel()
    return JSONResponse({"cancelled": [u.id for u in cancelled]})


@router.get("/debug/whep", include_in_schema=False)
async def debug(request: Request) -> Response:
    """Leak accounting for tests and operators: sessions, peer connections and tasks WHEP holds."""
    return JSONResponse(endpoint_of(request).debug())
