"""Pronunciation lexicons uploaded at run time, as ElevenLabs' pronunciation dictionaries are: ``POST`` a W3C PLS
file, get an id, name it in a request's ``lexicons``.

- ``POST /v1/lexicons``: the PLS document as the body (``application/pls+xml``, or any XML type; ``?name=``), or a
  multipart form with ``file`` (and ``name``); 201 with the lexicon.
- ``GET /v1/lexicons``, ``GET /v1/lexicons/{id}``, ``DELETE /v1/lexicons/{id}`` (the server's own, from
  ``RTVOICE_LEXICONS``, cannot be deleted: 409).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from rtvoice.app.errors import HttpError
from rtvoice.app.state import engine_of
from rtvoice.engine.errors import InvalidRequest
from rtvoice.engine.lexicon_store import LexiconInfo, UnknownLexicon

router = APIRouter(tags=["Lexicons"])

_XML_TYPES = ("application/pls+xml", "application/xml", "text/xml", "text/plain", "application/octet-stream")


def lexicon_fields(info: LexiconInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "name": info.name,
        "language": info.language,
        "lexemes": info.lexemes,
        "source": info.source,
    }


async def _upload(request: Request) -> tuple[bytes, str]:
    """The PLS document and its name, from a raw body or a multipart form."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    name = request.query_params.get("name", "")
    if media_type == "multipart/form-data":
        try:
            form = await request.form()
        except Exception as error:  # python-multipart's errors for a broken body
            raise InvalidRequest(f"malformed form body: {error}", code="invalid_form") from error
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest(
                "'file' is required: upload the PLS lexicon as a file", code="missing_file", param="file"
            )
        field = form.get("name")
        return await upload.read(), field if isinstance(field, str) else name
    if media_type and media_type not in _XML_TYPES:
        raise HttpError(
            f"unsupported media type {media_type!r}: send the PLS document as application/pls+xml, or as 'file' in a "
            "multipart form",
            code="unsupported_media_type",
            status=415,
        )
    return await request.body(), name


@router.post("/v1/lexicons", status_code=201, responses={201: {"description": "The new lexicon."}})
async def add_lexicon(request: Request) -> Response:
    """Upload a W3C PLS lexicon (grapheme → IPA phonemes, or → alias); kept across restarts."""
    data, name = await _upload(request)
    if not data.strip():
        raise InvalidRequest("the lexicon is empty: send a PLS document", code="empty_input", param="file")
    info = await engine_of(request).add_lexicon(data, name[:128])
    return JSONResponse(lexicon_fields(info), status_code=201, headers={"Location": f"/v1/lexicons/{info.id}"})


@router.get("/v1/lexicons")
async def list_lexicons(request: Request) -> JSONResponse:
    return JSONResponse({"lexicons": [lexicon_fields(info) for info in engine_of(request).lexicon_infos()]})


def lexicon_of(request: Request, lexicon_id: str) -> LexiconInfo:
    """The lexicon named in the path (a dependency); 404 when there is none."""
    try:
        return engine_of(request).lexicon_info(lexicon_id)
    except UnknownLexicon:
        raise HttpError(
            f"no lexicon {lexicon_id!r}", code="lexicon_not_found", param="lexicon_id", status=404
        ) from None


PathLexicon = Annotated[LexiconInfo, Depends(lexicon_of)]


@router.get("/v1/lexicons/{lexicon_id}")
async def get_lexicon(lexicon: PathLexicon) -> JSONResponse:
    return JSONResponse(lexicon_fields(lexicon))


@router.delete("/v1/lexicons/{lexicon_id}", status_code=204)
async def delete_lexicon(request: Request, lexicon: PathLexicon) -> Response:
    """Delete an uploaded lexicon (streams already reading with it keep it)."""
    await engine_of(request).delete_lexicon(lexicon.id)
    return Response(status_code=204)
