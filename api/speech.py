"""POST /v1/audio/speech, OpenAI-compatible; and with word timestamps, POST /v1/audio/speech/captioned (also
at Kokoro-FastAPI's /dev/captioned_speech, in its shape)."""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import asdict
from typing import TypeVar

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tts_core.audio.encoding import FORMATS
from tts_core.errors import ClientGone, ErrorCode, InvalidRequest, error_responses
from tts_core.request.access import Caller, RateLimitState
from tts_core.request.ask import Ask
from tts_core.request.captions import SUBTITLE_TYPES, CaptionWord, caption_words, subtitles, word_timings
from tts_core.service import SpeechService, SpokenAudio

from .errors import stream_failure
from .schemas import CaptionedSpeechRequest, SpeechRequest

log = logging.getLogger(__name__)
router = APIRouter(tags=["speech"])
T = TypeVar("T")

AUDIO_RESPONSES = {200: {"content": {**{spec.content_type: {"schema": {"type": "string", "format": "binary"}}
                                  for spec in FORMATS.values()}, "text/event-stream": {"schema": {"type": "string"}}},
                         "description": "The audio, whole or streamed; or server-sent events"},
                   **error_responses(400, 401, 413, 429, 500, 503, 504)}


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
            raise ClientGone("client closed the request") from None
        raise
    finally:
        watcher.cancel()


def ask_of(body: SpeechRequest, caller: Caller, words: bool = False, stream: bool | None = None) -> Ask:
    """What a speech body asks the service for (streamed as the body says, unless told)."""
    streamed = (body.stream or body.stream_format is not None) if stream is None else stream
    return Ask(body.input, body.voice_name, body.model, body.speed, body.response_format, body.sample_rate,
               body.reading(), words, streamed, caller)


async def admitted(request: Request) -> tuple[Caller, RateLimitState | None]:
    """Identify the caller and count the request against its tier's rate limit (before the body
    is validated, so unauthenticated or limited callers are refused first)."""
    access = request.app.state.access
    caller = access.identify(request.headers.get("authorization"), request.client.host if request.client else None,
                             request.headers.get("x-forwarded-for"))
    limit = await access.counted(caller)  # slowapi's LimitExceeded when over: build_api's handler answers it
    request.state.speech = {"client": caller.identity}  # read by the request log
    return caller, limit


async def audio_bytes(encoded: AsyncIterator[tuple[bytes, float, list]], details: dict) -> AsyncIterator[bytes]:
    """The encoded stream's bytes; the audio seconds sent so far are kept in the request's details
    (for the request log and the dashboard, which read them when the response ends)."""
    details["audio_s"] = 0.0
    try:
        async for data, seconds, _ in encoded:
            details["audio_s"] += seconds
            if data:
                yield data
    finally:
        await encoded.aclose()


_CUT = contextvars.ContextVar("stream_cut_on_purpose", default=False)  # set in the request's task: CutOnFailure
UNFINISHED = "ASGI callable returned without completing response."  # what uvicorn logs (as an error) of a cut


class CutOnPurpose(logging.Filter):
    """On uvicorn's error log: drops its line for a response that ended unfinished where CutOnFailure cut it on
    purpose (and logged the failure as its one line); that line of any other response stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_CUT.get() and record.getMessage() == UNFINISHED)


CUT_ON_PURPOSE = CutOnPurpose()  # one, so that each app built adds it once (build_api)


class CutOnFailure(StreamingResponse):
    """A raw audio stream. Audio has no place for an error, so a stream that fails after its headers is cut: its
    body ends without the chunked end, which every HTTP client reads as an incomplete answer (a clean end would
    pass a part of the speech off as all of it). Logged as one line (uvicorn's own line for it is dropped:
    CutOnPurpose); the request log records the error's status (`details` is the request's)."""

    def __init__(self, chunks: AsyncIterator[bytes], details: dict, media_type: str, headers: dict):
        super().__init__(chunks, media_type=media_type, headers=headers)
        self.details = details
        self.cut = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        if self.cut:  # here, in the request's task, which uvicorn logs from (the stream may run in another)
            _CUT.set(True)

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except Exception as error:
            self.details["status"] = stream_failure(error).status
            self.cut = True
            return  # (the server closes the connection: the answer was not completed)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def audio_stream(chunks: AsyncIterator[bytes], details: dict, response_format: str, stream_format: str | None,
                 headers: dict) -> StreamingResponse:
    """A stream's answer: server-sent events, or the audio's bytes as they come."""
    if stream_format == "sse":
        return StreamingResponse(server_sent_events(chunks, details), media_type="text/event-stream", headers=headers)
    return CutOnFailure(chunks, details, FORMATS[response_format].content_type, headers)


AUDIO_TOKENS_PER_S = 50  # the SSE usage counts audio in 20 ms frames (Chorus has no tokens)


async def server_sent_events(chunks: AsyncIterator[bytes], details: dict) -> AsyncIterator[str]:
    """OpenAI's speech SSE: speech.audio.delta events with base64 audio, then speech.audio.done with
    its usage: the input's characters, and the audio in 20 ms frames (`details` is the request's)."""
    try:
        async for data in chunks:
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield "data: " + json.dumps(event) + "\n\n"
    except Exception as error:  # the status line is sent already: report the failure as an event
        failure = stream_failure(error)
        details["status"] = failure.status
        yield "data: " + json.dumps({"type": "error", **failure.body()}) + "\n\n"
        return
    input_tokens, output_tokens = details.get("characters", 0), round(details.get("audio_s", 0) * AUDIO_TOKENS_PER_S)
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}
    yield "data: " + json.dumps({"type": "speech.audio.done", "usage": usage}) + "\n\n"


@router.post("/v1/audio/speech", response_class=Response, responses=AUDIO_RESPONSES)
async def create_speech(body: SpeechRequest, request: Request,
                        admission: tuple[Caller, RateLimitState | None] = Depends(admitted)) -> Response:
    service: SpeechService = request.app.state.service
    caller, limit = admission
    request.state.speech["characters"] = len(body.input)
    ask = ask_of(body, caller)
    if ask.stream:
        stream = await service.answer(ask)
        headers = {"X-Chorus-Voice": stream.voice.name, **(limit.headers() if limit else {})}
        request.state.speech["voice"] = stream.voice.name
        chunks = audio_bytes(stream.encoded(body.response_format, body.sample_rate), request.state.speech)
        return audio_stream(chunks, request.state.speech, body.response_format, body.stream_format, headers)
    spoken = await until_disconnect(request, service.answer(ask))
    request.state.speech.update(voice=spoken.voice, audio_s=spoken.duration_s, **asdict(spoken.timings))
    headers = {"X-Chorus-Voice": spoken.voice, "X-Chorus-Audio-Duration": f"{spoken.duration_s:.3f}",
               "X-Chorus-Cache": spoken.cache}
    if limit is not None:
        headers.update(limit.headers())
    if spoken.degraded:
        headers["X-Chorus-Degraded"] = ",".join(spoken.degraded)
    return Response(spoken.data, media_type=spoken.content_type, headers=headers)


# --- captioned speech ----------------------------------------------------------------------------------

NDJSON = "application/x-ndjson"
CAPTIONED_RESPONSES = {
    200: {"content": {"application/json": {"schema": {"type": "object"}}, NDJSON: {"schema": {"type": "string"}},
                      **{kind: {"schema": {"type": "string"}} for kind in SUBTITLE_TYPES.values()}},
          "description": "The audio (base64) and its words' times; newline-delimited JSON when streamed; or subtitles"},
    **error_responses(400, 401, 413, 429, 500, 503, 504)}


WORD_TIMINGS_HEADER = "X-Chorus-Word-Timings"  # how the words were timed: native, aligned, estimated


def _answer(audio: bytes, response_format: str, words: list[CaptionWord], kokoro: bool) -> dict:
    """One captioned answer (or streamed piece): ours, or Kokoro-FastAPI's shape at its path; with how its words
    were timed where it has any (`word_timings`)."""
    encoded = base64.b64encode(audio).decode()
    timings = {"word_timings": way} if (way := word_timings(words)) else {}
    if kokoro:
        return {"audio": encoded, "audio_format": response_format,
                "timestamps": [{"word": word.word, "start_time": round(word.start, 3), "end_time": round(word.end, 3)}
                               for word in words], **timings}
    return {"audio": encoded, "response_format": response_format, "words": [word.as_json() for word in words],
            **timings}


async def _captioned(body: CaptionedSpeechRequest, request: Request, caller: Caller, limit: RateLimitState | None,
                     kokoro: bool) -> Response:
    service: SpeechService = request.app.state.service
    request.state.speech["characters"] = len(body.input)
    headers, ask = limit.headers() if limit else {}, ask_of(body, caller, words=True, stream=body.stream)
    if ask.stream:
        if body.timestamps_format != "json":
            raise InvalidRequest("subtitles are made of the whole audio: send stream false for srt or vtt",
                                 "timestamps_format", ErrorCode.UNSUPPORTED_VALUE)
        stream = await service.answer(ask)
        request.state.speech["voice"] = stream.voice.name
        headers[WORD_TIMINGS_HEADER] = service.word_timing(stream.script)  # as planned: each line says its own

        async def lines() -> AsyncIterator[str]:
            try:
                async for data, seconds, timed in stream.encoded(body.response_format, body.sample_rate):
                    request.state.speech["audio_s"] = request.state.speech.get("audio_s", 0.0) + seconds
                    words = caption_words(stream.script, body.input, timed)
                    if data or words:
                        yield json.dumps(_answer(data, body.response_format, words, kokoro)) + "\n"
            except Exception as error:  # the status line is sent: the failure is the last line
                failure = stream_failure(error)
                request.state.speech["status"] = failure.status
                yield json.dumps(failure.body()) + "\n"
        return StreamingResponse(lines(), media_type=NDJSON, headers={"X-Chorus-Voice": stream.voice.name, **headers})
    spoken: SpokenAudio = await until_disconnect(request, service.answer(ask))
    request.state.speech.update(voice=spoken.voice, audio_s=spoken.duration_s, **asdict(spoken.timings))
    headers |= {"X-Chorus-Voice": spoken.voice, "X-Chorus-Audio-Duration": f"{spoken.duration_s:.3f}"}
    words = list(spoken.words or ())
    headers[WORD_TIMINGS_HEADER] = word_timings(words) or "none"
    if body.timestamps_format in SUBTITLE_TYPES:
        return Response(subtitles(words, body.timestamps_format), media_type=SUBTITLE_TYPES[body.timestamps_format],
                        headers=headers)
    return Response(json.dumps(_answer(spoken.data, body.response_format, words, kokoro)),
                    media_type="application/json", headers=headers)


@router.post("/v1/audio/speech/captioned", response_class=Response, responses=CAPTIONED_RESPONSES)
async def create_captioned_speech(body: CaptionedSpeechRequest, request: Request,
                                  admission: tuple[Caller, RateLimitState | None] = Depends(admitted)) -> Response:
    return await _captioned(body, request, *admission, kokoro=False)


@router.post("/dev/captioned_speech", response_class=Response, responses=CAPTIONED_RESPONSES)
async def create_captioned_speech_kokoro(body: CaptionedSpeechRequest, request: Request,
                                         admission: tuple[Caller, RateLimitState | None] = Depends(admitted)
                                         ) -> Response:
    """Kokoro-FastAPI's path and answer shape: {"audio", "audio_format", "timestamps": [{"word", "start_time",
    "end_time"}]}."""
    return await _captioned(body, request, *admission, kokoro=True)
