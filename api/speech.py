"""POST /v1/audio/speech, OpenAI-compatible."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Awaitable, TypeVar

from fastapi import APIRouter, Depends, Request, Response

from tts_core.access import Caller, RateLimitState
from tts_core.audio import FORMATS
from tts_core.service import InvalidRequest, SpeechService

from .errors import error_response
from .schemas import SpeechRequest, error_responses

router = APIRouter(tags=["speech"])
T = TypeVar("T")

AUDIO_RESPONSES = {200: {"content": {spec.content_type: {"schema": {"type": "string", "format": "binary"}}
                               for spec in FORMATS.values()}, "description": "The audio"},
                   **error_responses(400, 401, 413, 429, 500, 503, 504)}


class ClientGone(Exception):
    pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await work, cancelling it (and so its queued items) if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done():
            raise ClientGone() from None
        raise
    finally:
        watcher.cancel()


def admitted(request: Request) -> tuple[Caller, RateLimitState | None]:
    """Identify the caller and count the request against its tier's rate limit (before the body
    is validated, so unauthenticated or limited callers are refused first)."""
    access = request.app.state.access
    caller, limit = access.admit(request.headers.get("authorization"),
                                 request.client.host if request.client else None,
                                 request.headers.get("x-forwarded-for"))
    request.state.speech = {"client": caller.identity}  # read by the request log
    return caller, limit


@router.post("/v1/audio/speech", response_class=Response, responses=AUDIO_RESPONSES)
async def create_speech(body: SpeechRequest, request: Request,
                        admission: tuple[Caller, RateLimitState | None] = Depends(admitted)) -> Response:
    service: SpeechService = request.app.state.service
    caller, limit = admission
    request.state.speech["characters"] = len(body.input)
    if body.stream_format == "sse":
        raise InvalidRequest("stream_format 'sse' is not supported yet; use 'audio'", "stream_format",
                             "unsupported_value")
    try:
        spoken = await until_disconnect(request, service.speak(
            body.input, body.voice_name, body.model, body.speed, body.response_format, caller))
    except ClientGone:
        return error_response(499, "client closed the request", None, "client_closed")
    request.state.speech.update(voice=spoken.voice, audio_s=spoken.duration_s, **asdict(spoken.timings))
    headers = {"X-Chorus-Voice": spoken.voice, "X-Chorus-Audio-Duration": f"{spoken.duration_s:.3f}",
               "X-Chorus-Cache": spoken.cache}
    if limit is not None:
        headers.update(limit.headers())
    if spoken.degraded:
        headers["X-Chorus-Degraded"] = ",".join(spoken.degraded)
    return Response(spoken.data, media_type=spoken.content_type, headers=headers)
