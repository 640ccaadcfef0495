"""WebSocket speech: GET /v1/audio/speech/stream (and /stream).

The client sends JSON messages; text may come in several of them and is spoken when a message
says `flush` (the default). The server answers each utterance with a `started` event, binary
audio frames (one streamable file per utterance), a `progress` event per sentence and a `done`
event. Anything wrong with a message is answered with an `error` event; the socket stays open.

    {"text": "Hello", "flush": false}       buffer text
    {"text": " world.", "voice": "alloy"}   buffer, then speak the buffer with this voice
    {"voice": "...", "speed": 1.2, "model": "...", "response_format": "pcm"}   set for what follows
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from dataclasses import dataclass, field

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from tts_core.access import Caller
from tts_core.audio import FORMATS
from tts_core.errors import ChorusError, InvalidRequest, SynthesisError
from tts_core.service import SentenceStream, SpeechService, check_streamable

from .errors import invalid_input
from .schemas import SocketMessage

log = logging.getLogger(__name__)
router = APIRouter(tags=["speech"])

MAX_PENDING = 8  # utterances queued on one socket before it stops reading (backpressure)


@dataclass
class Session:
    """What one socket has set: the voice and format of what follows, and the text not yet spoken."""

    voice: str | None = None
    model: str | None = None
    speed: float = 1.0
    response_format: str = "pcm"
    buffer: list[str] = field(default_factory=list)

    def apply(self, message: SocketMessage) -> str | None:
        """Take a message's settings and text; returns the text to speak now, if it says flush."""
        for name in ("voice", "model", "speed", "response_format"):
            if (value := getattr(message, name)) is not None:
                setattr(self, name, value)
        if message.text:
            self.buffer.append(message.text)
        if not message.flush:
            return None
        text, self.buffer = "".join(self.buffer), []
        return text

    @property
    def buffered_chars(self) -> int:
        return sum(len(part) for part in self.buffer)


@dataclass
class Utterance:
    id: int
    stream: SentenceStream
    response_format: str
    accepted_at: float
    characters: int


def _account(socket: WebSocket, caller: Caller, status: int, accepted_at: float, characters: int,
             voice: str | None = None, audio_s: float = 0.0) -> None:
    """Metrics and the request log, as the HTTP routes get them from RequestAccounting."""
    seconds = time.perf_counter() - accepted_at
    socket.app.state.service.metrics.request_answered("websocket", status, seconds, audio_s)
    if (request_log := socket.app.state.request_log) is not None:
        request_log.record(client=caller.identity, source="websocket", status=status, voice=voice,
                           characters=characters)


def _error_event(error: ChorusError, utterance: int | None = None) -> dict:
    return {"type": "error", **({"id": utterance} if utterance is not None else {}), **error.body()}


@router.websocket("/v1/audio/speech/stream")
@router.websocket("/stream")
async def speech_socket(socket: WebSocket) -> None:
    service: SpeechService = socket.app.state.service
    access = socket.app.state.access
    query = socket.query_params
    await socket.accept()
    token = query.get("api_key")
    authorization = f"Bearer {token}" if token else socket.headers.get("authorization")
    peer = socket.client.host if socket.client else None
    try:
        caller = access.identify(authorization, peer, socket.headers.get("x-forwarded-for"))
    except ChorusError as error:
        await socket.send_json(_error_event(error))
        await socket.close(code=1008)
        return
    session = Session()
    first = {name: query[name] for name in ("text", "input", "voice", "model", "speed", "response_format")
             if name in query}
    pending: asyncio.Queue[Utterance] = asyncio.Queue(MAX_PENDING)
    writer = asyncio.ensure_future(_write(socket, caller, pending))
    ids = itertools.count(1)
    try:
        if first:  # settings in the query; text there is spoken at once
            first["flush"] = "text" in first or "input" in first
            await _take(socket, service, access, caller, session, first, pending, ids)
        while not writer.done():
            message = await socket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("text") is None:
                await socket.send_json(_error_event(InvalidRequest(
                    "send JSON text messages; binary messages are not understood", None, "binary_message")))
                continue
            try:
                raw = json.loads(message["text"])
            except ValueError:
                await socket.send_json(_error_event(InvalidRequest("the message is not valid JSON", None,
                                                                   "invalid_json")))
                continue
            await _take(socket, service, access, caller, session, raw, pending, ids)
    except WebSocketDisconnect:
        pass
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        while not pending.empty():  # accepted but never started: out of the queue, and counted as given up
            utterance = pending.get_nowait()
            utterance.stream.close()
            _account(socket, caller, 499, utterance.accepted_at, utterance.characters, utterance.stream.voice.name)


async def _take(socket: WebSocket, service: SpeechService, access, caller: Caller, session: Session,
                raw: object, pending: asyncio.Queue, ids) -> None:
    """Apply one client message; queue an utterance when it flushes."""
    try:
        message = SocketMessage.model_validate(raw)
    except ValidationError as invalid:
        await socket.send_json(_error_event(invalid_input(invalid.errors())))
        return
    if session.buffered_chars + len(message.text or "") > service.settings.max_chars:
        await socket.send_json(_error_event(InvalidRequest(
            f"buffered text would exceed {service.settings.max_chars} characters; flush first",
            "text", "string_above_max_length")))
        return
    try:  # a format, voice or model that cannot serve is refused before it becomes the session's
        if message.response_format is not None:
            check_streamable(message.response_format)
        service.catalogue.resolve(message.voice or session.voice, message.model or session.model)
    except ChorusError as error:
        await socket.send_json(_error_event(error))
        return
    text = session.apply(message)
    if text is None:
        return
    utterance_id, accepted_at = next(ids), time.perf_counter()
    try:
        await access.hit(caller)
        stream = await service.stream_pieces(text, session.voice, session.model, session.speed, caller)
    except ChorusError as refusal:
        _account(socket, caller, refusal.status, accepted_at, len(text))
        await socket.send_json(_error_event(refusal, utterance_id))
        return
    await pending.put(Utterance(utterance_id, stream, session.response_format, accepted_at, len(text)))


async def _write(socket: WebSocket, caller: Caller, pending: asyncio.Queue) -> None:
    """Send the queued utterances, one after the other, each as it is synthesized."""
    while True:
        utterance = await pending.get()
        stream, status, audio_s = utterance.stream, 499, 0.0  # 499 unless it ends: the client left first
        output_rate = FORMATS[utterance.response_format].sample_rate or stream.sample_rate
        try:
            await socket.send_json({"type": "started", "id": utterance.id, "voice": stream.voice.name,
                                    "response_format": utterance.response_format, "sample_rate": output_rate,
                                    "sentences": len(stream.items)})
            sentence = 0
            async for data, seconds in stream.encoded(utterance.response_format):
                if data:
                    await socket.send_bytes(data)
                if seconds:
                    sentence, audio_s = sentence + 1, audio_s + seconds
                    await socket.send_json({"type": "progress", "id": utterance.id, "sentence": sentence,
                                            "sentences": len(stream.items), "audio_s": round(audio_s, 3)})
            await socket.send_json({"type": "done", "id": utterance.id, "audio_s": round(audio_s, 3)})
            status = 200
        except ChorusError as failure:
            status = failure.status
            await socket.send_json(_error_event(failure, utterance.id))
        except Exception as error:
            status = 500
            log.exception("websocket utterance %s failed", utterance.id)
            await socket.send_json(_error_event(SynthesisError(f"synthesis failed: {error}", code="internal_error"),
                                                utterance.id))
        finally:
            stream.close()
            _account(socket, caller, status, utterance.accepted_at, utterance.characters, stream.voice.name,
                     audio_s)
