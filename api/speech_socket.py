"""WebSocket speech: GET /v1/audio/speech/stream (and /stream).

The client sends JSON messages; text may come in several of them and is spoken when a message
says `flush` (the default). The server answers each utterance with a `started` event, binary
audio frames (one streamable file per utterance), a `progress` event per sentence and a `done`
event. Anything wrong with a message (malformed, nested too deeply, over TTS_MAX_BODY_BYTES, of
the wrong type) is answered with an `error` event; the socket stays open. A caller may hold
TTS_WS_MAX_PER_CALLER sockets open, and all callers TTS_WS_MAX_CONNECTIONS; one with no client message and
nothing spoken for TTS_WS_IDLE_TIMEOUT_S is closed (1001). A web page may open one only from the server's own
origin or one in TTS_ALLOWED_ORIGINS (403 otherwise). The caller's key is checked again for each message: once
it is revoked, the socket's work ends with an `error` event (invalid_api_key) and the socket closes (1008).

    {"text": "Hello", "flush": false}       buffer text
    {"text": " world.", "voice": "alloy"}   buffer, then speak the buffer with this voice
    {"voice": "...", "speed": 1.2, "model": "...", "response_format": "pcm"}   set for what follows
    {"normalize": false} or {"normalization_options": {...}}   as in /v1/audio/speech, for what follows
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from tts_core.audio.encoding import FORMATS
from tts_core.config import Settings
from tts_core.errors import ChorusError, ErrorCode, InvalidRequest, Overloaded, Unauthorized
from tts_core.request.access import Caller
from tts_core.request.ask import Ask
from tts_core.request.script import Reading
from tts_core.service import CLIENT_GONE, SentenceStream, SpeechService, Tally, check_format
from tts_core.text.frontend import NormalizationOptions, requested

from .errors import invalid_input, stream_failure
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
    sample_rate: int | None = None  # None: the format's own (pcm: 24 kHz), else the voice's
    normalize: bool = True
    normalization_options: NormalizationOptions | None = None
    buffer: list[str] = field(default_factory=list)

    def apply(self, message: SocketMessage) -> str | None:
        """Take a message's settings and text; returns the text to speak now, if it says flush."""
        for name in ("voice", "model", "speed", "response_format", "sample_rate", "normalize",
                     "normalization_options"):
            if (value := getattr(message, name)) is not None:
                setattr(self, name, value)
        if message.text:
            self.buffer.append(message.text)
        if not message.flush:
            return None
        text, self.buffer = "".join(self.buffer), []
        return text

    def normalization(self) -> NormalizationOptions:
        return requested(self.normalization_options, self.normalize)

    @property
    def buffered_chars(self) -> int:
        return sum(len(part) for part in self.buffer)


@dataclass
class Utterance:
    id: int
    stream: SentenceStream
    ask: Ask
    tally: Tally


def _error_event(error: ChorusError, utterance: int | None = None) -> dict:
    """OpenAI's error shape as an event; a refusal that may pass later says when, as HTTP's Retry-After does."""
    retry = {"retry_after_s": error.retry_after_s} if error.retry_after_s is not None else {}
    return {"type": "error", **({"id": utterance} if utterance is not None else {}), **error.body(), **retry}


def origin_allowed(origin: str | None, host: str | None, allowed: list[str]) -> bool:
    """Whether a web page from `origin` may use the socket, which then speaks (and spends the limits) of whoever
    visits it: the server's own pages (Origin's host and port are the Host header's) and those of the origins
    in TTS_ALLOWED_ORIGINS ("*": any). A client that sends no Origin is not a browser page: allowed."""
    if origin is None:
        return True
    origin = origin.strip().rstrip("/").lower()
    if "*" in allowed or origin in (entry.strip().rstrip("/").lower() for entry in allowed):
        return True
    return bool(host) and urlsplit(origin).netloc == host.strip().lower()


@router.websocket("/v1/audio/speech/stream")
@router.websocket("/stream")
async def speech_socket(socket: WebSocket) -> None:
    access, open_sockets = socket.app.state.access, socket.app.state.open_sockets
    origin = socket.headers.get("origin")
    if not origin_allowed(origin, socket.headers.get("host"), socket.app.state.settings.allowed_origins):
        log.info("websocket refused: Origin %r is neither this server's nor in TTS_ALLOWED_ORIGINS", origin)
        await socket.close(code=1008)  # before accepting: the handshake is answered 403
        return
    await socket.accept()
    token = socket.query_params.get("api_key")
    authorization = f"Bearer {token}" if token else socket.headers.get("authorization")
    peer = socket.client.host if socket.client else None
    forwarded_for = socket.headers.get("x-forwarded-for")

    def identify() -> Caller:
        return access.identify(authorization, peer, forwarded_for)

    try:
        caller = identify()
        open_sockets.open(caller.identity)
    except ChorusError as refusal:
        await socket.send_json(_error_event(refusal))
        await socket.close(code=1008)
        return
    try:
        await SpeechConnection(socket, caller, identify).serve()
    finally:
        open_sockets.close(caller.identity)


def _invalid_message(invalid: ValidationError) -> ChorusError:
    first = invalid.errors()[0]
    if first["type"] == "json_invalid":  # malformed, or nested past the parser's depth limit
        reason = first.get("ctx", {}).get("error", "malformed")
        return InvalidRequest(f"the message is not valid JSON: {reason}", None, ErrorCode.INVALID_JSON)
    return invalid_input(invalid.errors(), model=SocketMessage)


class SpeechSockets:
    """The speech WebSockets open: on SIGTERM the server waits (a bounded time) for the utterances they have
    begun or queued to be sent whole, `done` event included, as it does for HTTP streams, before it closes them
    (1012); meanwhile they take no new utterance (an `error` event says the server is stopping)."""

    def __init__(self):
        self.open: set[SpeechConnection] = set()
        self.stopping = False
        self._changed = asyncio.Event()  # an utterance has ended, or a socket has closed

    def changed(self) -> None:
        self._changed.set()

    async def finish_utterances(self, timeout_s: float) -> int:
        """Stop taking utterances, and wait until those accepted have been sent or `timeout_s` has passed;
        returns how many sockets are still speaking."""
        self.stopping = True
        deadline = time.monotonic() + timeout_s
        while (speaking := sum(1 for connection in self.open if connection.speaking)) and \
                (left_s := deadline - time.monotonic()) > 0:
            self._changed.clear()
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left_s)
        return speaking


def _stopping_error() -> ChorusError:
    return Overloaded("the server is stopping: send this utterance again, to another server or once it is back", 1,
                      ErrorCode.MODEL_STOPPED)


class SpeechConnection:
    """One speech WebSocket: reads the client's messages, queues its utterances, sends their audio."""

    def __init__(self, socket: WebSocket, caller: Caller, identify: Callable[[], Caller]):
        self.socket, self.caller, self.identify = socket, caller, identify
        self.service: SpeechService = socket.app.state.service
        self.access = socket.app.state.access
        self.settings: Settings = socket.app.state.settings
        self.session = Session()
        self.pending: asyncio.Queue[Utterance] = asyncio.Queue(MAX_PENDING)
        self.ids = itertools.count(1)
        self.speaking = 0  # utterances accepted and not yet ended: the socket is not idle while one is
        self.active_at = time.monotonic()  # the client's last message, or the end of the last utterance
        self.sockets: SpeechSockets = socket.app.state.speech_sockets

    async def serve(self) -> None:
        self.sockets.open.add(self)
        try:
            await self._serve()
        finally:
            self.sockets.open.discard(self)
            self.sockets.changed()

    async def _serve(self) -> None:
        writer = asyncio.ensure_future(self._write())
        revoked: Unauthorized | None = None
        try:
            if (message := await self._read_query()) is not None:  # settings; text there is spoken at once
                await self._take(message)
            while not writer.done():
                received = await self._next_message()
                if received is None:
                    idle_s = self.settings.ws_idle_timeout_s
                    await self.socket.close(code=1001, reason=f"idle for {idle_s:g} s: no message, nothing spoken")
                    break
                if received["type"] == "websocket.disconnect":
                    break
                if (message := await self._read(received)) is not None:
                    await self._take(message)
        except WebSocketDisconnect:
            pass
        except Unauthorized as refusal:
            revoked = refusal
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            while not self.pending.empty():  # accepted but never started: out of the queue, counted as given up
                utterance = self.pending.get_nowait()
                utterance.stream.close()
                utterance.tally.end(CLIENT_GONE)
        if revoked is not None:  # said once nothing else is being sent
            log.info("websocket of %s closed: its API key was revoked", self.caller.identity)
            with suppress(WebSocketDisconnect):  # the client may have left meanwhile
                await self._refuse(revoked)
                await self.socket.close(code=1008, reason="API key revoked")

    async def _next_message(self) -> dict | None:
        """The client's next message; None once the socket has been idle for ws_idle_timeout_s."""
        receiving = asyncio.ensure_future(self.socket.receive())
        try:
            while not receiving.done():
                idle_s = 0.0 if self.speaking else time.monotonic() - self.active_at
                if idle_s >= self.settings.ws_idle_timeout_s:
                    return None
                await asyncio.wait({receiving}, timeout=self.settings.ws_idle_timeout_s - idle_s)
            self.active_at = time.monotonic()
            return receiving.result()
        finally:
            receiving.cancel()  # nothing to cancel once it is done

    async def _refuse(self, error: ChorusError, utterance: int | None = None) -> None:
        await self.socket.send_json(_error_event(error, utterance))

    async def _read_query(self) -> SocketMessage | None:
        """Settings from the query string (browsers cannot send headers); its text is spoken at once."""
        query = self.socket.query_params
        first = {name: query[name] for name in ("text", "input", "voice", "model", "speed", "response_format",
                                                "sample_rate", "normalize") if name in query}
        if not first:
            return None
        first["flush"] = "text" in first or "input" in first
        try:
            return SocketMessage.model_validate(first, strict=False)  # query values are strings: "1.5" is a speed
        except ValidationError as invalid:
            return await self._refuse(invalid_input(invalid.errors(), model=SocketMessage))

    async def _read(self, received: dict) -> SocketMessage | None:
        """A client message, validated; None (after an error event) when it cannot be used."""
        text, limit = received.get("text"), self.settings.max_body_bytes
        if text is None:
            return await self._refuse(InvalidRequest(
                "send JSON text messages; binary messages are not understood", None, ErrorCode.BINARY_MESSAGE))
        if len(text) > limit or len(text.encode()) > limit:  # the first test spares encoding a huge message
            return await self._refuse(InvalidRequest(f"the message is larger than {limit} bytes", None,
                                                     ErrorCode.BODY_TOO_LARGE))
        try:  # pydantic's parser bounds nesting; json.loads would raise RecursionError
            return SocketMessage.model_validate_json(text)
        except ValidationError as invalid:
            return await self._refuse(_invalid_message(invalid))

    async def _take(self, message: SocketMessage) -> None:
        """Apply one client message; queue an utterance when it flushes. Unauthorized once the socket's key is
        revoked: the socket's work ends (serve)."""
        try:  # the keys are held in memory (access/control.py), refreshed as they change: no storage call here
            self.caller = self.identify()
        except Unauthorized:
            self.service.tally("websocket", self.caller.identity, len(message.text or "")).end(Unauthorized.status)
            raise
        session, max_chars = self.session, self.settings.max_chars
        if session.buffered_chars + len(message.text or "") > max_chars:
            return await self._refuse(InvalidRequest(
                f"buffered text would exceed {max_chars} characters; flush first", "text",
                ErrorCode.STRING_ABOVE_MAX_LENGTH))
        try:  # a format, voice or model that cannot serve is refused before it becomes the session's
            if message.response_format is not None or message.sample_rate is not None:
                check_format(message.response_format or session.response_format,
                             message.sample_rate or session.sample_rate, streamed=True)
            self.service.catalogue_now().resolve(message.voice or session.voice, message.model or session.model,
                                                 self.caller.identity)
        except ChorusError as error:
            return await self._refuse(error)
        text = session.apply(message)
        if text is None:
            return
        if self.sockets.stopping:
            return await self._refuse(_stopping_error())
        utterance_id, tally = next(self.ids), self.service.tally("websocket", self.caller.identity, len(text))
        # the buffer is cut at sentences as text arrives, so it is plain text (an SSML document may be cut)
        ask = Ask(text, session.voice, session.model, session.speed, session.response_format, session.sample_rate,
                  Reading(session.normalization(), "text"), stream=True, caller=self.caller)
        try:
            await self.access.hit(self.caller)
            stream = await self.service.answer(ask, tally)
        except ChorusError as refusal:
            tally.end(refusal.status)
            return await self._refuse(refusal, utterance_id)
        self.speaking += 1
        await self.pending.put(Utterance(utterance_id, stream, ask, tally))

    async def _write(self) -> None:
        """Send the queued utterances, one after the other, each as it is synthesized."""
        while True:
            utterance = await self.pending.get()
            try:
                await self._send(utterance)
            finally:
                self.speaking -= 1
                self.active_at = time.monotonic()
                self.sockets.changed()

    async def _send(self, utterance: Utterance) -> None:
        stream, status, audio_s = utterance.stream, CLIENT_GONE, 0.0  # gone unless it ends: the client left first
        response_format, sample_rate = utterance.ask.response_format, utterance.ask.sample_rate
        output_rate = FORMATS[response_format].rate(stream.sample_rate, sample_rate)
        socket = self.socket
        try:
            await socket.send_json({"type": "started", "id": utterance.id, "voice": stream.voice.name,
                                    "response_format": response_format, "sample_rate": output_rate,
                                    "sentences": len(stream.items)})
            sentence = 0
            async for data, seconds, _ in stream.encoded(response_format, sample_rate):
                if data:
                    await socket.send_bytes(data)
                if seconds:
                    sentence, audio_s = sentence + 1, audio_s + seconds
                    await socket.send_json({"type": "progress", "id": utterance.id, "sentence": sentence,
                                            "sentences": len(stream.items), "audio_s": round(audio_s, 3)})
            await socket.send_json({"type": "done", "id": utterance.id, "audio_s": round(audio_s, 3)})
            status = 200
        except WebSocketDisconnect:  # the client left while this was being sent (status 499): not a failure
            log.info("websocket utterance %s: the client left before it was sent whole", utterance.id)
            raise
        except Exception as error:  # this utterance's error event; the socket goes on with the next
            failure = stream_failure(error, f"websocket utterance {utterance.id}")
            status = failure.status
            await self._refuse(failure, utterance.id)
        finally:
            stream.close()
            utterance.tally.audio_s = audio_s
            utterance.tally.end(status)
