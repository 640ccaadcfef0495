"""Speech requests in, audio out: validation, chunking, submission to the batchers, reassembly.

The API and the UI both call `SpeechService.synthesize`; neither ever calls an engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np

from .audio import join
from .batcher import Batcher
from .config import Settings
from .engines.base import Engine, Voice
from .metrics import Metrics
from .policy import make_policy
from .queue import QueueFull, RequestQueue
from .request import SynthesisRequest
from .text import TextError, normalize, split_chunks

log = logging.getLogger(__name__)

MIN_SPEED, MAX_SPEED = 0.25, 4.0


class InvalidRequest(ValueError):
    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


class Overloaded(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"the server is at capacity; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Speech:
    audio: np.ndarray  # float32 mono
    sample_rate: int
    voice: str
    chunks: int

    @property
    def duration_s(self) -> float:
        return self.audio.size / self.sample_rate


class SpeechService:
    def __init__(self, settings: Settings, engines: list[Engine], metrics: Metrics):
        if not engines:
            raise RuntimeError("no voices could be loaded")
        self.settings = settings
        self.metrics = metrics
        self.batchers: dict[str, Batcher] = {}
        self._voices: dict[str, tuple[Voice, Engine]] = {}
        for engine in engines:
            policy = make_policy(settings.batch_policy, settings.max_batch_size, settings.max_batch_tokens)
            queue = RequestQueue(settings.max_queue, settings.aging_horizon_s, settings.max_chunk_chars,
                                 on_drop=lambda reason, count: metrics.dropped.labels(reason).inc(count))
            self.batchers[engine.name] = Batcher(engine, policy, queue, metrics, settings.calibration_sizes)
            for voice in engine.voices():
                self._voices.setdefault(voice.name, (voice, engine))
        self.models = sorted({voice.model for voice, _ in self._voices.values()})
        self.model_aliases = self._valid_aliases(settings.model_aliases, set(self.models), "model")
        self.voice_aliases = self._valid_aliases(settings.voice_aliases, set(self._voices), "voice")
        self.default_voice = (settings.default_voice if settings.default_voice in self._voices
                              else next(iter(self._voices)))

    @staticmethod
    def _valid_aliases(aliases: dict[str, str], targets: set[str], kind: str) -> dict[str, str]:
        valid = {alias: target for alias, target in aliases.items() if target in targets}
        for alias in aliases.keys() - valid.keys():
            log.warning("ignoring %s alias %r: %r is not installed", kind, alias, aliases[alias])
        return valid

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        for batcher in self.batchers.values():
            batcher.start()

    def stop(self) -> None:
        for batcher in self.batchers.values():
            batcher.stop()

    @property
    def ready(self) -> bool:
        return all(batcher.ready.is_set() for batcher in self.batchers.values())

    # --- catalogue -----------------------------------------------------------------------------

    def voices(self) -> list[Voice]:
        return [voice for voice, _ in self._voices.values()]

    def queue_length(self) -> int:
        return sum(len(batcher.queue) for batcher in self.batchers.values())

    def resolve_model(self, name: str) -> str:
        model = self.model_aliases.get(name, name)
        if model not in self.models:
            known = ", ".join(self.models + sorted(self.model_aliases))
            raise InvalidRequest(f"model {name!r} does not exist; available: {known}", "model",
                                 "model_not_found")
        return model

    def resolve_voice(self, name: str, model: str | None = None) -> tuple[Voice, Engine]:
        found = self._voices.get(self.voice_aliases.get(name, name))
        if found is None:
            known = ", ".join(sorted(self._voices) + sorted(self.voice_aliases))
            raise InvalidRequest(f"voice {name!r} does not exist; available: {known}", "voice",
                                 "voice_not_found")
        if model is not None and found[0].model != model:
            raise InvalidRequest(f"voice {name!r} belongs to model {found[0].model!r}, not {model!r}",
                                 "voice", "voice_model_mismatch")
        return found

    # --- synthesis -----------------------------------------------------------------------------

    async def synthesize(self, text: str, voice: str | None = None, model: str | None = None,
                         speed: float = 1.0, priority: int = 0) -> Speech:
        model_id = self.resolve_model(model) if model is not None else None
        voice_info, engine = self.resolve_voice(voice or self.default_voice, model_id)
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise InvalidRequest(f"speed must be between {MIN_SPEED} and {MAX_SPEED}", "speed")
        try:
            text = normalize(text)
        except TextError as error:
            raise InvalidRequest(str(error), "input") from None
        if len(text) > self.settings.max_chars:
            raise InvalidRequest(f"input is {len(text)} characters long; the limit is "
                                 f"{self.settings.max_chars}", "input", "string_above_max_length")
        batcher = self.batchers[engine.name]
        chunks = split_chunks(text, self.settings.max_chunk_chars)
        if not batcher.queue.has_room(len(chunks)):  # refuse before doing any work
            raise Overloaded(batcher.retry_after_s())
        token_lists = await asyncio.to_thread(
            lambda: [tokens for chunk in chunks for tokens in engine.tokenize(chunk, voice_info.name)])
        token_lists = [tokens for tokens in token_lists if tokens.size]
        if not token_lists:
            raise InvalidRequest("input has nothing that can be spoken", "input")
        deadline = time.monotonic() + self.settings.request_timeout_s
        key = engine.batch_key(voice_info.name, speed)
        items = [SynthesisRequest(tokens=tokens, voice=voice_info.name, speed=speed, key=key,
                                  deadline=deadline, priority=priority) for tokens in token_lists]
        try:
            batcher.submit(items)
        except QueueFull as full:
            raise Overloaded(full.retry_after_s) from None
        try:
            pieces = await asyncio.gather(*(asyncio.wrap_future(item.future) for item in items))
        except BaseException:  # caller gone, deadline or engine error: nothing else runs for it
            for item in items:
                item.future.cancel()
            raise
        audio = join(list(pieces), engine.sample_rate)
        self.metrics.characters.inc(len(text))
        self.metrics.audio_seconds.inc(audio.size / engine.sample_rate)
        return Speech(audio, engine.sample_rate, voice_info.name, len(items))
