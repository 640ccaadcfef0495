"""Wyoming (Home Assistant, Rhasspy): speech as the Wyoming protocol's events over TCP, served by the same
process as the HTTP API when TTS_WYOMING_PORT is set (on TTS_HOST).

    describe                  -> info: every voice, with its language and speaker
    synthesize {text, voice}  -> audio-start, audio-chunk (as the pieces are made), audio-stop
    synthesize-start {voice}, synthesize-chunk {text}..., synthesize-stop
                              -> each run of complete sentences spoken as soon as it has arrived (audio-start,
                                 audio-chunk..., audio-stop), the rest at synthesize-stop, then synthesize-stopped

Inside a stream the client also sends the whole text as one `synthesize`, for servers that cannot stream
(the protocol asks it to): it is not spoken twice. Speech goes through the service as every surface's does:
the same queue, batcher, admission and metrics. Wyoming has no authentication: its callers are counted by
address ("wyoming:<address>") in TTS_WYOMING_TIER (default: the anonymous tier), one rate-limit hit per
synthesize or stream. A refusal, or an event that cannot be used, is answered with an `error` event (text,
code) and the connection stays open; events meant for other services (Wyoming carries many) are ignored.

Anyone who can reach the port may connect, so what a connection holds is bounded: an event whose lengths are not
whole numbers of bytes within TTS_MAX_BODY_BYTES, or whose header line is over 64 KiB, is answered with an `error`
event and the connection closed (where the next event starts is unknown); a connection with no whole event
arriving, or not reading what it is sent, for TTS_WYOMING_IDLE_TIMEOUT_S is closed; an address may hold
TTS_WYOMING_MAX_PER_CALLER connections, and all of them TTS_WYOMING_MAX_CONNECTIONS (an `error` event, then
closed, beyond).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from access.control import AccessControl
from tts_core.audio.encoding import pcm16
from tts_core.config import Settings
from tts_core.errors import ChorusError, ErrorCode, InvalidRequest, SynthesisError
from tts_core.request.access import Caller
from tts_core.request.ask import Ask
from tts_core.request.script import Reading
from tts_core.service import CLIENT_GONE, SpeechService, Tally
from tts_core.text.chunks import complete_sentences

from .connections import OpenSockets

log = logging.getLogger(__name__)

SAMPLES_PER_CHUNK = 1024  # as wyoming-piper sends them: a satellite plays each chunk as it comes
WIDTH, CHANNELS = 2, 1  # 16-bit mono
ATTRIBUTION = Attribution(name="Chorus", url="")


def error_event(error: ChorusError) -> Event:
    """The one mapping of a refusal or failure to what a Wyoming client sees."""
    return Error(text=error.message, code=error.code).event()


# Refusals after which where the next event starts is unknown: answered, then the connection is closed
UNREADABLE = (ErrorCode.EVENT_TOO_LARGE, ErrorCode.INVALID_EVENT_LENGTH)


async def read_event(reader: asyncio.StreamReader, max_bytes: int) -> Event | None:
    """The next event (None once the client has gone), read as the wyoming package reads one but bounded,
    since anyone may connect: InvalidRequest "invalid_event" for a line that is not an event, or data that is
    not a JSON object (the next line may be an event); one of UNREADABLE for a header line over the reader's
    limit, lengths that are not whole numbers of bytes (1e999, -1, "12") and data and payload over max_bytes."""
    try:
        line = await reader.readline()
    except ValueError:  # over the reader's 64 KiB limit: asyncio has dropped part of it
        raise InvalidRequest("an event's header line is longer than 64 KiB", None, ErrorCode.EVENT_TOO_LARGE) from None
    if not line:
        return None
    try:
        header = json.loads(line)
        kind, data = header["type"], header.get("data") or {}
        if not isinstance(kind, str) or not isinstance(data, dict):
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # RecursionError: nested too deep
        raise InvalidRequest("not a Wyoming event: send a JSON line with a type", None,
                             ErrorCode.INVALID_EVENT) from None
    lengths = header.get("data_length") or 0, header.get("payload_length") or 0
    if not all(type(length) is int and length >= 0 for length in lengths):
        raise InvalidRequest("an event's data_length and payload_length must be whole numbers of bytes", None,
                             ErrorCode.INVALID_EVENT_LENGTH)
    if sum(lengths) > max_bytes:
        raise InvalidRequest(f"the event is larger than {max_bytes} bytes", None, ErrorCode.EVENT_TOO_LARGE)
    more = await reader.readexactly(lengths[0]) if lengths[0] else None
    payload = await reader.readexactly(lengths[1]) if lengths[1] else None  # read before any refusal: in step
    if more is not None:
        try:
            more = json.loads(more)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
            more = None
        if not isinstance(more, dict):
            raise InvalidRequest("an event's data must be a JSON object", None, ErrorCode.INVALID_EVENT)
        data.update(more)
    return Event(type=kind, data=data, payload=payload)


@dataclass
class Stream:
    """A synthesize-start ... synthesize-stop stream: its voice and the text not yet spoken."""

    voice: str | None
    request: Tally  # the stream, from synthesize-start to synthesize-stop, as it is accounted
    refused: bool = False  # its start was refused: its text is dropped, its stop still answered
    text: str = ""


class WyomingServer:
    """The Wyoming TCP server, started and stopped with the app."""

    def __init__(self, service: SpeechService, access: AccessControl, settings: Settings):
        self.service, self.access, self.settings = service, access, settings
        self.host, self.port, self.tier = settings.host, settings.wyoming_port, settings.wyoming_tier
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self.open_connections = OpenSockets("Wyoming connections", settings.wyoming_max_per_caller,
                                            settings.wyoming_max_connections)

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as error:  # the port is taken, or the address is not this machine's
            raise RuntimeError(f"TTS_WYOMING_PORT: cannot listen on {self.host}:{self.port}: "
                               f"{error.strerror or error}") from None
        tier = self.caller("").tier_name
        if self.tier not in (None, tier):
            log.warning("TTS_WYOMING_TIER %r is not an operator tier; Wyoming callers get %r", self.tier, tier)
        log.info("Wyoming server on tcp://%s:%d (no authentication; callers get the %r tier)",
                 self.host, self.port, tier)

    async def stop(self) -> None:
        """Stop listening and end the connections (their queued sentences leave the queue)."""
        if self._server is None:
            return
        self._server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        connection = WyomingConnection(reader, writer, self)
        try:
            try:
                self.open_connections.open(connection.caller_name)
            except ChorusError as refusal:  # over a cap: said, then closed
                log.info("Wyoming connection from %s refused: %s", connection.address, refusal.message)
                await connection.write_event(error_event(refusal))
                return
            try:
                await connection.run()
            finally:
                self.open_connections.close(connection.caller_name)
        except (asyncio.CancelledError, ConnectionError):  # stop(), or a refused client gone: nothing awaits this
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    def caller(self, address: str) -> Caller:
        """Looked up at each request: the operator's tiers may change while a connection is open."""
        operator = self.access.operator()
        name = self.tier if self.tier in operator.tiers else operator.anonymous_tier
        return Caller(caller_name(address), name, operator.tiers[name])

    def info(self, caller: Caller) -> Info:
        voices = [TtsVoice(name=voice.name, attribution=ATTRIBUTION, installed=True, version=None,
                           description=f"{voice.name} ({voice.model}, {voice.sample_rate} Hz)",
                           languages=[voice.language],
                           speakers=[TtsVoiceSpeaker(name=voice.speaker)] if voice.speaker else None)
                  for voice in self.service.catalogue_now().voice_list(caller.identity)]
        return Info(tts=[TtsProgram(name="chorus", attribution=ATTRIBUTION, installed=True, version=None,
                                    description="Chorus text to speech", voices=voices,
                                    supports_synthesize_streaming=True)])


def caller_name(address: str) -> str:
    return f"wyoming:{address}"


class WyomingConnection(AsyncEventHandler):
    """One client's connection: its events in order, each answered before the next is read."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: WyomingServer):
        super().__init__(reader, writer)
        self.server, self.service = server, server.service
        peer = writer.get_extra_info("peername")
        self.address = peer[0] if peer else "unknown"
        self.caller_name = caller_name(self.address)
        self.idle_timeout_s = server.settings.wyoming_idle_timeout_s
        self.stream: Stream | None = None

    async def run(self) -> None:
        """Events until the client leaves, sends one that cannot be read past or stays idle; a lost client ends it
        quietly."""
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout_s):  # the whole event: trickling bytes is idle too
                        event = await read_event(self.reader, self.server.settings.max_body_bytes)
                except InvalidRequest as unreadable:
                    await self.write_event(error_event(unreadable))
                    if unreadable.code in UNREADABLE:
                        break
                    continue
                except asyncio.IncompleteReadError:
                    break
                except TimeoutError:  # idle, or gone without closing (half-open)
                    log.info("Wyoming connection from %s closed: no whole event for %g s", self.address,
                             self.idle_timeout_s)
                    break
                if event is None:
                    break
                await self.handle_event(event)
        except ConnectionError:
            pass
        finally:
            if self.stream is not None:  # left mid-stream
                self.stream.request.end(CLIENT_GONE)

    async def write_event(self, event: Event) -> None:
        """One event, or ConnectionAbortedError (a ConnectionError: the client is gone) when the client has not
        taken its bytes within the idle timeout: it reads nothing, or is gone without closing (half-open)."""
        try:
            async with asyncio.timeout(self.idle_timeout_s):
                await super().write_event(event)
        except TimeoutError:
            log.info("Wyoming connection from %s closed: it read nothing for %g s", self.address,
                     self.idle_timeout_s)
            raise ConnectionAbortedError("the client reads nothing") from None

    async def handle_event(self, event: Event) -> bool:
        try:
            await self._handle(event)
        except ChorusError as refusal:
            await self.write_event(error_event(refusal))
        except ConnectionError:
            raise
        except Exception:
            log.exception("Wyoming event %r failed", event.type)
            await self.write_event(error_event(SynthesisError("internal error", code=ErrorCode.INTERNAL_ERROR)))
        return True

    async def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self.write_event(self.server.info(self.server.caller(self.address)).event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=event.data.get("text")).event())
        elif Synthesize.is_type(event.type):
            if self.stream is None:  # inside a stream it is the stream's text again
                await self._synthesize(event)
        elif SynthesizeStart.is_type(event.type):
            await self._start(event)
        elif SynthesizeChunk.is_type(event.type):
            await self._chunk(event)
        elif SynthesizeStop.is_type(event.type):
            await self._stop()

    async def _synthesize(self, event: Event) -> None:
        request = self._tally()
        try:
            text = _text(event)
            request.characters = len(text)
            voice = self._voice(event)
            await self.server.access.hit(self.server.caller(self.address))
            await self._speak(text, voice, request, "auto")  # a text that is an SSML document is read as one
        except ChorusError as refusal:
            request.failed(refusal.status)
            raise
        finally:
            request.end()

    async def _start(self, event: Event) -> None:
        if self.stream is not None:  # a new stream before the last one stopped: that one is given up
            self.stream.request.end(CLIENT_GONE)
        self.stream = Stream(None, self._tally())
        try:
            voice = self._voice(event)
            self.service.catalogue_now().resolve(voice, None, self.server.caller(self.address).identity)
            await self.server.access.hit(self.server.caller(self.address))
        except ChorusError as refusal:
            self.stream.refused = True
            self.stream.request.failed(refusal.status)
            raise
        self.stream.voice = voice

    async def _chunk(self, event: Event) -> None:
        stream = self.stream
        if stream is None:
            raise InvalidRequest("synthesize-chunk outside a stream: send synthesize-start first", None,
                                 ErrorCode.NO_STREAM)
        text = _text(event)
        if stream.refused:
            return
        stream.request.characters += len(text)
        complete, stream.text = complete_sentences(stream.text + text)
        if len(stream.text) >= self.server.settings.max_chars:  # no sentence end in sight: speak it anyway
            complete, stream.text = complete + stream.text, ""
        await self._speak_in_stream(complete)

    async def _stop(self) -> None:
        stream = self.stream
        if stream is None:
            raise InvalidRequest("synthesize-stop outside a stream: send synthesize-start first", None,
                                 ErrorCode.NO_STREAM)
        if not stream.refused:
            await self._speak_in_stream(stream.text)
        self.stream = None
        stream.request.end()
        await self.write_event(SynthesizeStopped().event())

    async def _speak_in_stream(self, text: str) -> None:
        """Sentences of the stream: a refusal is answered and the stream goes on."""
        if not text.strip():
            return
        try:
            await self._speak(text, self.stream.voice, self.stream.request, "text")
        except ChorusError as refusal:
            self.stream.request.failed(refusal.status)
            await self.write_event(error_event(refusal))

    async def _speak(self, text: str, voice: str | None, request: Tally, input_type: str) -> None:
        """audio-start, the audio as it is made, audio-stop. Refusals raise before audio-start; a failure
        after it is answered with an error event, and audio-stop still closes the audio."""
        ask = Ask(text, voice, response_format="pcm", reading=Reading(input_type=input_type), stream=True,
                  caller=self.server.caller(self.address))
        stream = await self.service.answer(ask, request)
        rate = stream.sample_rate
        try:
            await self.write_event(AudioStart(rate=rate, width=WIDTH, channels=CHANNELS).event())
            try:
                async for piece in stream:
                    request.audio_s += piece.size / rate
                    data, step = pcm16(piece), SAMPLES_PER_CHUNK * WIDTH * CHANNELS
                    for start in range(0, len(data), step):
                        await self.write_event(AudioChunk(rate=rate, width=WIDTH, channels=CHANNELS,
                                                          audio=data[start:start + step]).event())
            except ChorusError as failure:
                request.failed(failure.status)
                await self.write_event(error_event(failure))
            await self.write_event(AudioStop().event())
        except ConnectionError:
            request.failed(CLIENT_GONE)
            raise
        finally:
            stream.close()

    def _voice(self, event: Event) -> str | None:
        """The voice an event asks for: by name (a speaker is each voice's own), else the default voice if it
        speaks the language asked for, else the first that does (the catalogue's voice for a language); None: the
        default voice."""
        voice = event.data.get("voice") or {}
        if not isinstance(voice, dict) or not all(isinstance(value, str) for value in voice.values()):
            raise InvalidRequest(f"a {event.type} event's voice must be an object of strings", "voice",
                                 ErrorCode.INVALID_EVENT)
        if voice.get("name") or not voice.get("language"):
            return voice.get("name") or None
        caller = self.server.caller(self.address).identity
        return self.service.catalogue_now().voice_for_language(voice["language"], None, caller)[0].name

    def _tally(self) -> Tally:
        """One synthesize, or one stream from synthesize-start to synthesize-stop, as it is accounted."""
        return self.service.tally("wyoming", self.caller_name)


def _text(event: Event) -> str:
    text = event.data.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"a {event.type} event needs a text (a string)", "text", ErrorCode.INVALID_EVENT)
    return text
