"""Speech requests in, audio out: validation, chunking, submission to the batchers, reassembly.

The API and the UI both call `SpeechService.synthesize`; neither ever calls an engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import numpy as np

from . import gpu
from .access import Caller, Tier
from .audio import FORMATS, STREAMABLE, StreamEncoder, edge_faded, encode, join
from .batcher import Batcher
from .cache import AudioCache, CachedAudio
from .config import Settings
from .degrade import DegradeController
from .engines import Engine, EngineUnavailable, ModelSpec, Voice
from .errors import Conflict, InvalidRequest, Overloaded
from .metrics import Metrics
from .policy import make_policy
from .pool import ModelPool, PoolFull
from .queue import QueueFull, RequestQueue
from .request import SynthesisRequest
from .text import TextError, normalize, ramp_up, split_chunks

log = logging.getLogger(__name__)

MIN_SPEED, MAX_SPEED = 0.25, 4.0
STREAM_DUE_MARGIN = 0.8  # a stream's chunk is scheduled as if due at 80% of its estimated play time


def check_streamable(response_format: str) -> None:
    if response_format not in STREAMABLE:
        raise InvalidRequest(f"{response_format} cannot be streamed; use one of {', '.join(STREAMABLE)}",
                             "response_format", "unsupported_value")


@dataclass(frozen=True)
class Timings:
    queue_ms: float | None = None  # mean wait of the request's items in the queue
    synthesis_ms: float | None = None  # engine time of the batches its items ran in
    batch_size: int | None = None  # largest batch any of its items ran in

    @staticmethod
    def of(items: list[SynthesisRequest]) -> Timings:
        return Timings(round(1000 * sum(i.queue_s for i in items) / len(items), 2),
                       round(1000 * sum(i.batch_s for i in items), 2), max(i.batch_size for i in items))


@dataclass(frozen=True)
class Speech:
    audio: np.ndarray  # float32 mono
    sample_rate: int
    voice: str
    chunks: int
    timings: Timings = Timings()

    @property
    def duration_s(self) -> float:
        return self.audio.size / self.sample_rate


@dataclass(frozen=True)
class SpokenAudio:
    """Encoded speech, as the API and the UI answer it."""

    data: bytes
    content_type: str
    voice: str
    duration_s: float
    cache: str  # "hit", "miss" or "off"
    degraded: tuple[str, ...]  # degrade actions in force when it was served
    timings: Timings = Timings()


class SpeechService:
    def __init__(self, settings: Settings, models: Sequence[Engine | ModelSpec], metrics: Metrics,
                 degrade: DegradeController | None = None, cache: AudioCache | None = None):
        """models: loaded engines (always kept) or model specs (the pool loads them as configured)."""
        if not models:
            raise RuntimeError("no voices could be loaded")
        self.settings = settings
        self.metrics = metrics
        self.degrade = degrade or DegradeController()
        self.cache = cache or AudioCache(int(self.degrade.settings.cache_max_mb * 2**20))
        specs = [model if isinstance(model, ModelSpec) else ModelSpec.loaded(model) for model in models]
        self.pool = ModelPool(specs, self._make_batcher, metrics, settings.max_loaded_models,
                              settings.model_memory_mb * 2**20)
        self._index_voices()
        self.model_aliases = self._valid_aliases(settings.model_aliases, set(self.models), "model")
        self.voice_aliases = self._valid_aliases(settings.voice_aliases, set(self._voices), "voice")
        self.default_voice = (settings.default_voice if settings.default_voice in self._voices
                              else next(iter(self._voices)))

    def _make_batcher(self, engine: Engine) -> Batcher:
        settings, metrics = self.settings, self.metrics
        policy = make_policy(settings.batch_policy, settings.max_batch_size, settings.max_batch_tokens)
        queue = RequestQueue(settings.max_queue, settings.aging_horizon_s,
                             on_drop=lambda reason, count: metrics.dropped.labels(reason).inc(count),
                             fifo=settings.queue_order == "fifo")
        return Batcher(engine, policy, queue, metrics, settings.calibration_sizes, settings.min_free_mem_mb,
                       settings.empty_cache_every)

    def _index_voices(self) -> None:
        """Voice name -> (voice, name of the model speaking it), over the models offered now."""
        self._voices: dict[str, tuple[Voice, str]] = {}
        for name, slot in self.pool.slots.items():
            if not slot.retired:
                for voice in slot.spec.voices:
                    self._voices.setdefault(voice.name, (voice, name))
        self.models = sorted({voice.model for voice, _ in self._voices.values()})

    @staticmethod
    def _valid_aliases(aliases: dict[str, str], targets: set[str], kind: str) -> dict[str, str]:
        valid = {alias: target for alias, target in aliases.items() if target in targets}
        for alias in aliases.keys() - valid.keys():
            log.warning("ignoring %s alias %r: %r is not installed", kind, alias, aliases[alias])
        return valid

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self.pool.start()

    def stop(self) -> None:
        self.pool.stop()

    @property
    def batchers(self) -> dict[str, Batcher]:
        """The loaded models' batchers."""
        return self.pool.loaded()

    @property
    def ready(self) -> bool:
        """The pinned models are warm (others warm up when they are first loaded)."""
        return all(slot.batcher is not None and slot.batcher.ready.is_set()
                   for slot in self.pool.slots.values() if slot.spec.pinned)

    def reload_registry(self, specs: Sequence[ModelSpec]) -> dict[str, list[str]]:
        """Offer the registry's models as now configured: unchanged ones stay (loaded or not),
        removed or changed ones are unloaded once idle, new ones are added (pinned ones load now)."""
        registry = {name: slot for name, slot in self.pool.slots.items() if slot.spec.registry and not slot.retired}
        wanted = {(spec.name, spec.source): spec for spec in specs}
        kept = [name for name, slot in registry.items() if (name, slot.spec.source) in wanted]
        removed = [name for name in registry if name not in kept]
        added = [spec for spec in specs if spec.name not in kept]
        for spec in added:
            slot = self.pool.slots.get(spec.name)
            if slot is not None and (spec.name not in removed or (slot.batcher is not None and slot.batcher.busy)):
                raise Conflict(f"model {spec.name!r} is busy or still being unloaded; retry", "voices", "model_busy")
        for name in removed:
            self.pool.retire(name)
        self.pool.add(added)
        self._index_voices()
        return {"kept": kept, "removed": removed, "added": [spec.name for spec in added]}

    # --- catalogue -----------------------------------------------------------------------------

    def voices(self) -> list[Voice]:
        return [voice for voice, _ in self._voices.values()]

    def voices_with_engines(self) -> list[tuple[Voice, str]]:
        """Each voice with the name of the model (engine) that speaks it."""
        return list(self._voices.values())

    def queue_length(self) -> int:
        return sum(len(batcher.queue) for batcher in self.batchers.values())

    def status(self) -> dict:
        """What /api/v1/batch/status answers: the batchers now and over the recent window."""
        window = self.metrics.window()
        queued = self.queue_length()
        return {
            **window,
            "queue_length": queued,
            "pending_requests": queued + window["running_items"],
            "gpu_free_mem_mb": gpu.free_memory_mb(),
            "policy": self.settings.batch_policy,
            "max_batch_size": self.settings.max_batch_size,
            "ready": self.ready,
            "engines": {name: self._engine_status(slot.batcher, slot.spec.pinned)
                        for name, slot in self.pool.slots.items() if not slot.retired},
            "models_loaded": len(self.batchers),
            "model_memory_mb": round(self.pool.memory_bytes() / 2**20, 1),
        }

    @staticmethod
    def _engine_status(batcher: Batcher | None, pinned: bool) -> dict:
        if batcher is None:
            return {"loaded": False, "pinned": pinned, "queue_length": 0, "ready": False}
        return {"loaded": True, "pinned": pinned, "queue_length": len(batcher.queue),
                "ready": batcher.ready.is_set(), "policy": batcher.policy.describe(),
                "memory_token_budget": batcher.memory.tokens(), "out_of_memory": batcher.memory.out_of_memory_count}

    def resolve_model(self, name: str) -> str:
        model = self.model_aliases.get(name, name)
        if model not in self.models:
            known = ", ".join(self.models + sorted(self.model_aliases))
            raise InvalidRequest(f"model {name!r} does not exist; available: {known}", "model",
                                 "model_not_found")
        return model

    def resolve_voice(self, name: str, model: str | None = None) -> tuple[Voice, str]:
        """The voice and the name of the model that speaks it."""
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

    async def _batcher(self, model_name: str) -> Batcher:
        try:
            return await self.pool.batcher(model_name)
        except PoolFull as full:
            raise Overloaded(f"{full}; retry after 5 s", 5, "models_busy") from None
        except EngineUnavailable as error:
            raise Overloaded(f"{error}; retry after 30 s", 30, "model_unavailable") from None

    def resolve(self, voice: str | None, model: str | None = None) -> tuple[Voice, str]:
        """The voice a request names (or the default) and the name of its model. A model alias (OpenAI's
        names) accepts any voice; a model named as itself, only its own voices."""
        model_id = self.resolve_model(model) if model is not None else None
        return self.resolve_voice(voice or self.default_voice, None if model in self.model_aliases else model_id)

    def _prepare(self, text: str, voice: str | None, model: str | None, speed: float) -> tuple[str, Voice, str]:
        """Validate a request; returns the normalised text, the voice and its model's name."""
        voice_info, model_name = self.resolve(voice, model)
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise InvalidRequest(f"speed must be between {MIN_SPEED} and {MAX_SPEED}", "speed")
        limit = self.settings.max_chars
        if len(text) > limit:  # checked before normalising, which costs time on huge input
            raise InvalidRequest(f"input is {len(text)} characters long; the limit is {limit}", "input",
                                 "string_above_max_length")
        try:
            text = normalize(text)
        except TextError as error:
            raise InvalidRequest(str(error), "input") from None
        if len(text) > limit:
            raise InvalidRequest(f"input is {len(text)} characters long once normalised; the limit is {limit}",
                                 "input", "string_above_max_length")
        return text, voice_info, model_name

    async def synthesize(self, text: str, voice: str | None = None, model: str | None = None,
                         speed: float = 1.0, caller: Caller | None = None) -> Speech:
        text, voice_info, model_name = self._prepare(text, voice, model, speed)
        return await self._synthesize(text, voice_info, model_name, speed, caller)

    def validate(self, text: str, voice: str | None, model: str | None, speed: float,
                 caller: Caller | None) -> tuple[str, Voice, str]:
        """What a request is checked for whatever the load: voice, model, speed, text and the
        caller's tier limit. Returns the normalised text, the voice and its model's name."""
        text, voice_info, model_name = self._prepare(text, voice, model, speed)
        tier = caller.tier if caller else Tier()
        if len(text) > tier.max_chars:
            raise InvalidRequest(f"input is {len(text)} characters long; the {caller.tier_name} tier allows "
                                 f"{tier.max_chars}", "input", "tier_text_limit")
        return text, voice_info, model_name

    def _admit(self, text: str, voice: str | None, model: str | None, speed: float,
               caller: Caller | None) -> tuple[str, Voice, str]:
        """validate(), and the degrade actions that refuse work up front."""
        state, settings = self.degrade.state, self.degrade.settings
        tier = caller.tier if caller else Tier()
        if "shed" in state.actions and tier.sheddable:
            self.metrics.degrade_actions.labels("shed").inc()
            retry = max(5, self.batchers[next(iter(self.batchers))].retry_after_s())
            raise Overloaded(f"the server is under heavy load and is serving higher priorities only; "
                             f"retry after {retry} s", retry, "shed_low_priority")
        text, voice_info, model_name = self.validate(text, voice, model, speed, caller)
        if "cap_text" in state.actions and len(text) > settings.cap_text_chars:
            self.metrics.degrade_actions.labels("cap_text").inc()
            raise InvalidRequest(f"the server is under heavy load: texts are limited to "
                                 f"{settings.cap_text_chars} characters for now (this one has {len(text)})",
                                 "input", "degraded_text_limit")
        return text, voice_info, model_name

    async def speak(self, text: str, voice: str | None = None, model: str | None = None, speed: float = 1.0,
                    response_format: str = "mp3", caller: Caller | None = None) -> SpokenAudio:
        """Synthesize and encode, with the caller's tier, the degrade actions and the cache in the way."""
        text, voice_info, model_name = self._admit(text, voice, model, speed, caller)
        state, settings = self.degrade.state, self.degrade.settings
        use_cache = settings.cache_enabled or "cache_first" in state.actions
        key = (model_name, voice_info.name, speed, response_format, text)
        if use_cache and (hit := self.cache.get(key)) is not None:
            self.metrics.cache_lookups.labels("hit").inc()
            if "cache_first" in state.actions:
                self.metrics.degrade_actions.labels("cache_first").inc()
            return SpokenAudio(hit.data, hit.content_type, hit.voice, hit.duration_s, "hit", state.actions)
        if use_cache:
            self.metrics.cache_lookups.labels("miss").inc()
        speech = await self._synthesize(text, voice_info, model_name, speed, caller)
        data = await asyncio.to_thread(encode, speech.audio, speech.sample_rate, response_format)
        content_type = FORMATS[response_format].content_type
        if use_cache:
            self.cache.put(key, CachedAudio(data, content_type, speech.voice, speech.duration_s))
        return SpokenAudio(data, content_type, speech.voice, speech.duration_s, "miss" if use_cache else "off",
                           self.degrade.state.actions, speech.timings)

    async def speak_stream(self, text: str, voice: str | None = None, model: str | None = None,
                           speed: float = 1.0, response_format: str = "pcm", caller: Caller | None = None
                           ) -> SentenceStream:
        """stream_pieces for a streamed encoded response: the format is checked first."""
        check_streamable(response_format)
        return await self.stream_pieces(text, voice, model, speed, caller)

    async def stream_pieces(self, text: str, voice: str | None = None, model: str | None = None,
                            speed: float = 1.0, caller: Caller | None = None) -> SentenceStream:
        """Queue every sentence now and return their audio as a SentenceStream. Refusals (validation,
        limits, a full queue) raise here, before any audio exists."""
        started = time.monotonic()
        text, voice_info, model_name = self._admit(text, voice, model, speed, caller)
        items = await self._submit(text, voice_info, model_name, speed, caller, streaming=True)
        return SentenceStream(voice_info, voice_info.sample_rate, items, started, self.metrics)

    async def _submit(self, text: str, voice_info: Voice, model_name: str, speed: float,
                      caller: Caller | None, streaming: bool = False) -> list[SynthesisRequest]:
        """Chunk, tokenize and queue a text (loading its model first if need be); the items' futures
        resolve to their audio in order. A stream's first chunks are cut shorter, so its first audio
        comes sooner."""
        tier = caller.tier if caller else Tier()
        batcher = await self._batcher(model_name)
        engine = batcher.engine
        speed *= voice_info.speed  # the voice's default speed, times the request's
        chunks = split_chunks(text, self.settings.max_chunk_chars)
        if streaming and self.settings.stream_first_chunk_chars:
            chunks = ramp_up(chunks, self.settings.stream_first_chunk_chars, self.settings.max_chunk_chars)
        if not batcher.queue.has_room(len(chunks)):  # refuse before doing any work
            retry = batcher.retry_after_s()
            raise Overloaded(f"the server is at capacity; retry after {retry} s", retry)
        token_lists = await asyncio.to_thread(
            lambda: [tokens for chunk in chunks for tokens in engine.tokenize(chunk, voice_info.name)])
        token_lists = [tokens for tokens in token_lists if tokens.size]
        if not token_lists:
            raise InvalidRequest("input has nothing that can be spoken", "input")
        deadline = time.monotonic() + min(self.settings.request_timeout_s, tier.request_timeout_s)
        key = engine.batch_key(voice_info.name, speed)
        items = [SynthesisRequest(tokens=tokens, voice=voice_info.name, speed=speed, key=key, deadline=deadline,
                                  priority=tier.priority, tier=caller.tier_name if caller else "")
                 for tokens in token_lists]
        if streaming:  # each chunk is needed once the ones before it have played (estimated low)
            played = 0.0
            for item in items:
                item.due_s = STREAM_DUE_MARGIN * played
                item.deadline += item.due_s
                played += item.length * batcher.audio_s_per_token / speed
        share = None if tier.max_queue_share >= 1 else max(1, int(tier.max_queue_share * batcher.queue.max_size))
        for attempt in (1, 2):
            try:
                batcher.submit(items, share)
                break
            except QueueFull as full:
                if not batcher.queue.closed or attempt == 2:
                    raise full from None
                batcher = await self._batcher(model_name)  # it was unloaded just now: load it again
        self.metrics.characters.inc(len(text))
        return items

    async def _synthesize(self, text: str, voice_info: Voice, model_name: str, speed: float,
                          caller: Caller | None) -> Speech:
        items = await self._submit(text, voice_info, model_name, speed, caller)
        try:
            pieces = await asyncio.gather(*(asyncio.wrap_future(item.future) for item in items))
        except BaseException:  # caller gone, deadline or engine error: nothing else runs for it
            for item in items:
                item.future.cancel()
            raise
        audio = join(list(pieces), voice_info.sample_rate)
        self.metrics.audio_seconds.inc(audio.size / voice_info.sample_rate)
        return Speech(audio, voice_info.sample_rate, voice_info.name, len(items), Timings.of(items))


class SentenceStream:
    """The audio of one queued text, sentence by sentence, strictly in order, each piece ready to
    concatenate (edges faded, the pause in front). Closing it, or leaving a loop over it early,
    takes the sentences not yet synthesized out of the queue."""

    def __init__(self, voice: Voice, sample_rate: int, items: list[SynthesisRequest], started: float,
                 metrics: Metrics):
        self.voice, self.sample_rate, self.items = voice, sample_rate, items
        self._started, self._metrics = started, metrics

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        try:
            for index, item in enumerate(self.items):
                audio = await asyncio.wrap_future(item.future)
                if index == 0:
                    self._metrics.first_audio(time.monotonic() - self._started)
                self._metrics.audio_seconds.inc(audio.size / self.sample_rate)
                yield edge_faded(audio, self.sample_rate, index > 0)
            self._metrics.chunks_per_request.observe(len(self.items))
        finally:
            self.close()

    def close(self) -> None:
        for item in self.items:
            item.future.cancel()

    async def encoded(self, response_format: str) -> AsyncIterator[tuple[bytes, float]]:
        """The stream encoded as one file in a streamable format: (bytes, seconds of audio they
        add); the last pair flushes the encoder."""
        encoder = StreamEncoder(response_format, self.sample_rate)
        try:
            pieces = aiter(self)
            async for audio in pieces:
                data = await asyncio.to_thread(encoder.encode, audio)
                yield data, audio.size / self.sample_rate
            yield await asyncio.to_thread(encoder.finish), 0.0
        finally:
            self.close()

