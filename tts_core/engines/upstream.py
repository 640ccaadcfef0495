"""An upstream engine: another server's model behind Chorus, through its OpenAI-compatible speech API.

vLLM-Omni (Voxtral-4B-TTS, Qwen3-TTS, CosyVoice 3, Fish S2 Pro), Kokoro-FastAPI, Speaches or another Chorus
speak `POST /v1/audio/speech`. Chorus keeps its queue, tiers, limits, front end, cache and dashboard and sends
each piece of text there, one request a piece, as raw 16-bit PCM streamed as it is made
(`{"response_format": "pcm", "stream": true, "stream_format": "audio"}`: raw PCM from every version of
vLLM-Omni's API, from Kokoro-FastAPI, Speaches and Chorus). Raw PCM carries no rate: the registry's
`sample_rate` says it (24 kHz for most; 44.1 kHz for Fish S2 Pro). An upstream that answers a WAV instead has its
header read as one (tts_core.audio.pcm_stream). What an answer brings is bounded: audio by what its text can make,
an error's body by a few KB (docs/upstream.md#what-an-upstreams-answer-may-bring).

The engine says how to talk to the upstream (the body, the audio, what an answer's failure means); the upstream
strategy (tts_core.scheduler.upstream) decides how many requests are in flight and runs them. `audio` reads only
what loading set, so it runs on the strategy's I/O thread, many at once.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import numpy as np
import soundfile

from ..audio.pcm_stream import PcmStream, UnreadableAudio, is_wav
from ..audio.playable import resample
from .base import Engine, EngineUnavailable, UpstreamOptions, Voice, VoiceSpec
from .contract import Capabilities, EngineInput, EngineOutput, Shape

SPEECH_PATH = "/v1/audio/speech"
VOICES_PATH = "/v1/audio/voices"
CONNECT_TIMEOUT_S = 5.0
LIST_TIMEOUT_S = 10.0  # the voice list, read once at start-up
MESSAGE_CHARS = 300  # of an upstream's error text, as it is passed on
ERROR_BYTES = 4096  # of an error's body, read (one that never ends is not read whole)
# The most audio a piece may bring: a third of a second a character and 5 s more, at speed 1 (speech takes about
# a fifteenth of a second a character: five times that, and room for a short text's pauses)
MOST_S_PER_CHARACTER = 1 / 3
MOST_S_MORE = 5.0
# A Retry-After in seconds: digits (RFC 9110), also read with a fraction or an exponent, or as inf (which the
# strategy bounds); a sign, an underscore, nan or anything else is no Retry-After
DELAY_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:[eE]\+?[0-9]+)?|inf(?:inity)?)", re.IGNORECASE | re.ASCII)
NOT_AUDIO = ("application/json", "text/")  # content types (compared in lower case) that are never audio


class UpstreamFailed(RuntimeError):
    """The upstream could not answer: refused, hung, a 5xx, an unreadable body, a stream cut halfway, or a
    configuration it refuses (401, 403, 404). Its circuit breaker counts it, unless `busy`: the upstream
    said it is full for now (429, or 503 with Retry-After), which lowers the requests kept in flight."""

    def __init__(self, message: str, retry_after_s: float | None = None, busy: bool = False):
        super().__init__(message)
        self.retry_after_s, self.busy = retry_after_s, busy


class UpstreamRejected(RuntimeError):
    """The upstream refused this request (a 4xx other than those of UpstreamFailed): the caller's to fix, its
    message the upstream's."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def describe_upstream(model: str, voices: Sequence[VoiceSpec], name: str, options: UpstreamOptions
                      ) -> tuple[list[Voice], Capabilities]:
    """The voices the registry names on the upstream, and what it declares it can do: nothing is asked of it."""
    described = [Voice(voice.name, name, voice.language or options.language, options.sample_rate,
                       speed=voice.speed) for voice in voices]
    return described, Capabilities(Shape.UPSTREAM, clones=options.clones, max_running=options.max_in_flight,
                                   front_end=options.front_end)


class UpstreamEngine(Engine):
    """A model on another server. Its input ids are the text's code points (the upstream reads text, and the
    queue's costs and predictions count characters); `synthesize` runs its inputs at once, for the warm-up and
    the contract's whole-text check."""

    def __init__(self, model: str, voices: Sequence[VoiceSpec], name: str, options: UpstreamOptions):
        self.name, self.model, self.options = name, model, options
        self.sample_rate = options.sample_rate
        self._voices, self.capabilities = describe_upstream(model, voices, name, options)
        self._upstream_voice = {voice.name: voice.upstream_voice or voice.name for voice in voices}
        self._language = voices[0].language or options.language if voices else options.language
        self._clones: dict[str, dict[str, str]] = {}  # a cloned voice -> what each request of it sends
        self._headers = {"Accept": "application/octet-stream", **key_header(options, name)}
        self._extra_body = json.loads(options.extra_body)

    @property
    def max_running(self) -> int:
        """The most requests in flight at once (the strategy learns how many within it)."""
        return self.options.max_in_flight

    def voices(self) -> list[Voice]:
        return list(self._voices)

    # --- cloning per request (an upstream that declares `clones`) ---------------------------------------------

    def voice_prompt_from_audio(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """The clip itself, at the upstream's rate: it is what each request of the voice sends."""
        return resample(audio, sample_rate, self.sample_rate)

    def add_voice(self, name: str, latents: np.ndarray, transcript: str | None = None) -> Voice:
        """Offer a cloned voice: its requests send the clip as a WAV data URL (`ref_audio`) and what it says
        (`ref_text`), as vLLM-Omni's speech API takes them. Any thread may call it (the table is swapped whole)."""
        wav = io.BytesIO()
        soundfile.write(wav, np.asarray(latents, dtype=np.float32).reshape(-1), self.sample_rate, format="WAV",
                        subtype="PCM_16")
        sent = {"ref_audio": "data:audio/wav;base64," + base64.b64encode(wav.getvalue()).decode("ascii")}
        if transcript:
            sent["ref_text"] = transcript
        voice = Voice(name, self.name, self._language, self.sample_rate)
        self._clones = {**self._clones, name: sent}
        self._voices = [known for known in self._voices if known.name != name] + [voice]
        return voice

    def remove_voice(self, name: str) -> None:
        self._clones = {known: sent for known, sent in self._clones.items() if known != name}
        self._voices = [known for known in self._voices if known.name != name]

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        text = text.strip()
        return [np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)] if text else []

    def batch_key(self, voice: str, speed: float) -> tuple:
        """Every request is its own at the upstream: any queued item may go next."""
        return (self.name,)

    def text_of(self, item: EngineInput) -> str:
        return item.tokens.astype(np.uint32).tobytes().decode("utf-32-le")

    def request_body(self, item: EngineInput) -> dict[str, Any]:
        """What one piece sends: the fields OpenAI's speech API and vLLM-Omni's document, then extra_body's."""
        body: dict[str, Any] = {"model": self.model, "input": self.text_of(item),
                                "voice": self._upstream_voice.get(item.voice, item.voice),
                                "response_format": "pcm", "stream": True, "stream_format": "audio"}
        if item.speed != 1.0:  # (vLLM-Omni refuses a speed with a stream: leave it out where it is 1)
            body["speed"] = item.speed
        if item.instructions and self.options.instructions:
            body["instructions"] = item.instructions
        if (cloned := self._clones.get(item.voice)) is not None:  # its clip and words speak for the voice
            del body["voice"]
            body.update(cloned)
        return {**body, **self._extra_body}

    def client(self) -> httpx.AsyncClient:
        """A connection pool to the upstream, for one event loop. Reads wait up to timeout_s for the next bytes;
        each request's whole time is bounded by its caller's deadline (the strategy's)."""
        timeout = httpx.Timeout(self.options.timeout_s, connect=min(CONNECT_TIMEOUT_S, self.options.timeout_s))
        limits = httpx.Limits(max_connections=self.options.max_in_flight, max_keepalive_connections=8)
        return httpx.AsyncClient(base_url=self.options.url, headers=self._headers, timeout=timeout, limits=limits)

    def most_samples(self, item: EngineInput) -> int:
        """The most audio the input can make: an upstream that sends more (one that never stops) is cut off there
        rather than fill memory. A speed below 1 asks for longer audio; one above may be ignored by the upstream,
        so it does not shorten the bound."""
        seconds = (item.length * MOST_S_PER_CHARACTER + MOST_S_MORE) / min(1.0, item.speed)
        return math.ceil(seconds * self.sample_rate)

    async def audio(self, client: httpx.AsyncClient, item: EngineInput) -> AsyncIterator[np.ndarray]:
        """The input's audio as it arrives (float32 pieces); raises UpstreamFailed or UpstreamRejected."""
        most, received = self.most_samples(item), 0
        try:
            async with client.stream("POST", SPEECH_PATH, json=self.request_body(item)) as response:
                if response.status_code != 200:
                    raise _failure(response.status_code, await _error_body(response), response.headers)
                kind = response.headers.get("content-type", "").strip().lower()  # (types are case-insensitive)
                if kind.startswith(NOT_AUDIO):
                    raise UpstreamFailed(f"upstream answered {kind!r}, not audio")
                stream = None
                async for data in response.aiter_bytes():
                    received += len(data)
                    if stream is None:  # (a WAV is known by its type, or by its first bytes)
                        stream = PcmStream(self.sample_rate, wav="wav" in kind or is_wav(data))
                    piece, over = stream.read(data), stream.samples - most
                    if piece.size > max(0, over):  # (no more than the bound is passed on)
                        yield piece[:piece.size - max(0, over)]
                    if over > 0:  # leaving the block closes the connection: the upstream stops
                        raise UpstreamFailed(f"upstream sent more than the {most / self.sample_rate:.0f} s of audio "
                                             f"that {item.length} characters can make; stopped there")
                if stream is not None and (piece := stream.finish()).size:
                    yield piece
        except httpx.TimeoutException as error:
            raise UpstreamFailed(f"upstream did not answer within {self.options.timeout_s:g} s "
                                 f"({type(error).__name__})") from None
        except (httpx.TransportError, httpx.StreamError) as error:
            where = "cut the audio halfway" if received else "could not be reached"
            raise UpstreamFailed(f"upstream {where}: {type(error).__name__}: {error}") from None
        except UnreadableAudio as error:
            raise UpstreamFailed(f"upstream answered audio that cannot be read: {error}") from None
        if stream is None or not stream.samples:
            raise UpstreamFailed(f"upstream answered with no audio ({received} bytes, not one whole sample)"
                                 if received else "upstream answered with no audio")

    async def whole(self, client: httpx.AsyncClient, item: EngineInput) -> EngineOutput:
        """The input's audio, once all of it has arrived."""
        return EngineOutput(np.concatenate([piece async for piece in self.audio(client, item)]))

    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        """Each input's whole audio, all of them in flight at once (on a loop of this call's own)."""
        async def run() -> list[EngineOutput]:
            async with self.client() as client:
                return list(await asyncio.gather(*(self.whole(client, item) for item in batch)))

        return asyncio.run(run()) if batch else []


def key_header(options: UpstreamOptions, name: str) -> dict[str, str]:
    """The upstream's key as a Bearer token, from the variable the registry names (none when it names none)."""
    if not options.api_key_env:
        return {}
    key = os.environ.get(options.api_key_env)
    if not key:
        raise EngineUnavailable(f"upstream {name} ({options.url}): the variable {options.api_key_env} that should "
                                "hold its API key is not set")
    return {"Authorization": f"Bearer {key}"}


def listed_voices(options: UpstreamOptions, model: str) -> list[str]:
    """The voices the upstream lists at GET {url}/v1/audio/voices, asked once as the registry is read. The shapes
    it is answered in: vLLM-Omni's {"voices": [names], "uploaded_voices": [{"name"}]}, Kokoro-FastAPI's
    {"voices": [{"id", "name"}]} (or names), Speaches' {"voices": [{"id", "name", ...}]}, and Chorus's and
    OpenAI-style {"data": [{"id", "model"}]} (of those that say their model, this model's only)."""
    where = f"upstream {model} ({options.url})"
    try:
        response = httpx.get(options.url + VOICES_PATH, headers=key_header(options, model),
                             timeout=httpx.Timeout(LIST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
    except httpx.HTTPError as error:
        raise EngineUnavailable(f"{where}: its voice list could not be read ({error or type(error).__name__}); "
                                "start Chorus once it answers, or name its voices in the registry") from None
    if response.status_code != 200:
        raise EngineUnavailable(f"{where}: its voice list answered {response.status_code}: "
                                f"{_message(response.content)}; name its voices in the registry")
    try:
        data = response.json()
    except ValueError:
        raise EngineUnavailable(f"{where}: its voice list is not JSON; name its voices in the registry") from None
    if isinstance(data, dict):
        rows = [*(data.get("data") or []), *(data.get("voices") or []), *(data.get("uploaded_voices") or [])]
    else:
        rows = data if isinstance(data, list) else []
    names = []
    for row in rows:
        if isinstance(row, dict) and row.get("model") not in (None, model):
            continue
        name = row if isinstance(row, str) else (row.get("id") or row.get("name")) if isinstance(row, dict) else None
        if isinstance(name, str) and name not in names:
            names.append(name)
    return names


def _failure(status: int, body: bytes, headers: httpx.Headers) -> Exception:
    """What an upstream's answer other than 200 means (docs/upstream.md#faults)."""
    message = f"upstream answered {status}: {_message(body)}"
    retry_after = _seconds(headers.get("retry-after"))
    if status == 429 or (status == 503 and retry_after is not None):
        return UpstreamFailed(message, retry_after, busy=True)
    if status >= 500 or status in (401, 403, 404, 407):  # its fault, or its configuration (a key, a model name)
        return UpstreamFailed(message, retry_after)
    return UpstreamRejected(message, status)


def _message(body: bytes) -> str:
    """The error's text in the shapes upstreams answer with: OpenAI's and vLLM's error.message, vLLM's 401
    {"error": "..."}, Kokoro-FastAPI's detail.message, FastAPI's detail (a string, or validation errors)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:MESSAGE_CHARS] or "(no body)"
    for path in (("error", "message"), ("error",), ("detail", "message"), ("detail", 0, "msg"), ("detail",),
                 ("message",)):
        value: Any = data
        for step in path:
            if isinstance(step, int):
                value = value[step] if isinstance(value, list) and len(value) > step else None
            else:
                value = value.get(step) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            return value[:MESSAGE_CHARS]
    return json.dumps(data)[:MESSAGE_CHARS]


async def _error_body(response: httpx.Response) -> bytes:
    """The first ERROR_BYTES of an error's body: enough for its message, and an endless one is not read whole."""
    body = b""
    async for data in response.aiter_bytes():
        body += data
        if len(body) >= ERROR_BYTES:
            break
    return body[:ERROR_BYTES]


def _seconds(value: str | None) -> float | None:
    """A Retry-After's seconds (RFC 9110's delay-seconds, digits; or an HTTP date); None when it says none, or
    says a wait that is not ahead (a negative number, a date past): the answer then counts as the failure it is.
    Not bounded here: the strategy bounds what the breaker and callers make of it."""
    if value is None:
        return None
    value = value.strip()
    if DELAY_SECONDS.fullmatch(value):  # (not float()'s grammar: "5_0" is not 50, "-5" is not a wait)
        return float(value)
    try:
        seconds = parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None  # neither: the breaker's own cool-down applies
    return seconds if seconds > 0 else None
