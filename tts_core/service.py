"""Speech requests in, audio out: the one door the API, the UI and the jobs use (none of them ever
calls an engine).

The request's way, one room each:
  voices/catalogue.py     which voices and models exist and what a request's names mean
  request/admission.py    validation, tier limits and degrade-mode refusals (those that need none of the text read
                          first: a stream's first sentence is then read ahead of the rest)
  request/dispatch.py     pieces queued on the model's engine loop (the queue refuses waits past the target), audio
                          back
  request/assembly.py     the pieces placed into the answer, one way for a file and a stream
  this module             the cache and encoding; lifecycle and status
and beside it, voices/cloning.py: voices made from callers' clips, given to their engines as they load.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

import numpy as np
from prometheus_client import CollectorRegistry

from .audio.cache import AudioCache, CachedAudio, CacheUse
from .audio.encoding import FORMATS, STREAMABLE, encode, unsupported_rate
from .audio.word_timing import NATIVE, combined
from .config import Settings
from .degrade import DegradeController
from .engines import Capabilities, Engine, ModelSpec
from .engines.contract import EngineOutput
from .errors import ChorusError, Conflict, ErrorCode, InvalidRequest
from .ops import gpu
from .ops.metrics import Metrics
from .request.access import Caller
from .request.admission import Admission
from .request.ask import Ask
from .request.assembly import Assembly, SentenceStream
from .request.captions import CaptionWord, Timed, caption_words
from .request.dialogue import (
    Dialogue,
    DialogueStream,
    TurnProgress,
    TurnSpan,
    captions,
    compile_dialogue,
    recording,
)
from .request.dispatch import Scheduler
from .request.operating import DegradeAction, DegradeState
from .request.script import Script
from .scheduler.calibration import CalibrationStore
from .scheduler.engine_loop import EngineLoop, LoopStatus
from .scheduler.pool import ModelPool
from .scheduler.queue import RequestQueue, WaitTarget
from .scheduler.records import QueuedItem
from .scheduler.strategies import make_engine_loop
from .voices.catalogue import Catalogue
from .voices.cloning import ClonedVoice, ClonedVoices, Cloner

log = logging.getLogger(__name__)


def check_format(response_format: str, sample_rate: int | None = None, streamed: bool = False) -> None:
    """A format (and rate) the answer can be encoded in, streamed if asked."""
    if streamed and response_format not in STREAMABLE:
        raise InvalidRequest(f"{response_format} cannot be streamed; use one of {', '.join(STREAMABLE)}",
                             "response_format", ErrorCode.UNSUPPORTED_VALUE)
    if (why := unsupported_rate(response_format, sample_rate)) is not None:
        raise InvalidRequest(why, "sample_rate", ErrorCode.UNSUPPORTED_VALUE)


@dataclass(frozen=True)
class Timings:
    queue_ms: float | None = None  # mean wait of the request's items in the queue
    synthesis_ms: float | None = None  # engine time of the batches its items ran in
    batch_size: int | None = None  # largest batch any of its items ran in

    @staticmethod
    def of(items: list[QueuedItem]) -> Timings:
        return Timings(round(1000 * sum(i.queue_s for i in items) / len(items), 2),
                       round(1000 * sum(i.batch_s for i in items), 2), max(i.batch_size for i in items))


@dataclass(frozen=True)
class Speech:
    audio: np.ndarray  # float32 mono
    sample_rate: int
    voice: str
    chunks: int
    timings: Timings = Timings()
    timed_words: tuple[Timed, ...] = ()  # the words of items queued with their words, timed in the audio

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
    cache: CacheUse
    degraded: tuple[DegradeAction, ...]  # degrade actions in force when it was served
    timings: Timings = Timings()
    words: tuple[CaptionWord, ...] | None = None  # asked for: when each word of the input is spoken
    turns: tuple[TurnSpan, ...] = ()  # a dialogue's (not cached): who speaks when


class RequestLog(Protocol):
    """Where answered requests are written (storage.request_log.RequestLogWriter), as app.py gives it."""

    def record(self, *, client: str, source: str, status: int, voice: str | None = None, characters: int = 0,
               queue_ms: float | None = None, synthesis_ms: float | None = None, batch_size: int | None = None
               ) -> None: ...


CLIENT_GONE = 499  # the caller left before the whole answer was sent


def ended_status(error: BaseException | None) -> int:
    """The status a request that ended with this error is accounted with."""
    if error is None:
        return 200
    if isinstance(error, ChorusError):
        return error.status
    if isinstance(error, asyncio.CancelledError | GeneratorExit):  # the caller left (or stopped it)
        return CLIENT_GONE
    return 500


@dataclass(eq=False)
class Tally:
    """One request as it is accounted: its surface's name and client, what it asked and got, and how it ended (the
    first refusal or failure, if any). `SpeechService.tally` makes one; `end` counts, times and logs it, once.
    Used as a context manager, it ends when the block does, with the status of the error that ended it."""

    source: str
    client: str
    record: Callable[[Tally], None]
    started: float = field(default_factory=time.perf_counter)
    characters: int = 0
    voice: str | None = None
    audio_s: float = 0.0
    timings: Timings = Timings()
    status: int = 200
    ended: bool = False

    def answered(self, answer: SpokenAudio | SentenceStream | DialogueStream) -> None:
        if isinstance(answer, SpokenAudio):
            self.voice, self.audio_s, self.timings = answer.voice, answer.duration_s, answer.timings
        elif isinstance(answer, SentenceStream):
            self.voice = answer.voice.name

    def failed(self, status: int) -> None:
        if self.status == 200:
            self.status = status

    def end(self, status: int | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        if status is not None:
            self.status = status
        self.record(self)

    def __enter__(self) -> Tally:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.end(ended_status(error) if error is not None else None)


class SpeechService:
    def __init__(self, settings: Settings, models: Sequence[Engine | ModelSpec], metrics: Metrics,
                 degrade: DegradeController | None = None, cache: AudioCache | None = None,
                 clones: Sequence[ClonedVoice] = (),
                 make_scheduler: Callable[[Settings, ModelPool, Metrics], Scheduler] = Scheduler,
                 request_log: RequestLog | None = None, calibrations: CalibrationStore | None = None):
        """models: loaded engines (always kept) or model specs (the pool loads them as configured);
        clones: the cloned voices stored (given to their models as they load); make_scheduler: where passages
        are queued (here, on the pool's engine loops, unless a deployment places them elsewhere); request_log: where
        answered requests are written (none: only counted); calibrations: where the models' calibration
        sweeps are kept across restarts (none: swept at each start)."""
        if not models:
            raise RuntimeError("no voices could be loaded")
        self.settings = settings
        self.metrics = metrics
        self.request_log = request_log
        self.calibrations = calibrations
        self.degrade = degrade or DegradeController()
        self.cache = cache or AudioCache(int(self.degrade.settings.cache_max_mb * 2**20))
        specs = [model if isinstance(model, ModelSpec) else ModelSpec.loaded(model) for model in models]
        self.clones = ClonedVoices(clones)  # before the pool: pinned models load (and get theirs) in it
        self.pool = ModelPool(specs, self._make_loop, metrics, settings.max_loaded_models,
                              settings.model_memory_mb * 2**20)
        self.catalogue = Catalogue.build(specs, settings, self.clones.all())
        self.cloner = Cloner(self.pool, self.clones, self.publish_catalogue, self.cache)
        self.admission = Admission(settings, self.degrade, metrics)
        self.scheduler = make_scheduler(settings, self.pool, metrics)
        self._reloading = threading.Lock()  # one registry reload or catalogue rebuild at a time

    def _make_loop(self, engine: Engine) -> EngineLoop:
        """The engine's loop, with the strategy for its shape: one-shot batches, or continuous batching of a
        stepped (autoregressive) engine. Called once the model has loaded, before its loop starts: it gets
        its cloned voices here."""
        self.clones.give_to(engine)
        settings, metrics = self.settings, self.metrics
        queue = RequestQueue(settings.max_queue, settings.aging_horizon_s,
                             on_drop=lambda reason, count: metrics.dropped.labels(reason).inc(count),
                             order=settings.queue_order, max_per_caller=settings.max_queue_per_caller)
        return make_engine_loop(engine, queue, metrics, settings.batch_policy, settings.max_batch_size,
                                settings.max_batch_tokens, settings.calibration_sizes, settings.min_free_mem_mb,
                                settings.empty_cache_every, settings.cpu_cache_mb, settings.engine_instances,
                                settings.codec_stage, self.degrade.precision_off, self.calibrations)

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self.pool.start()

    def stop(self) -> None:
        self.pool.stop()
        self.scheduler.close()

    @property
    def loops(self) -> dict[str, EngineLoop]:
        """The loaded models' loops."""
        return self.pool.loaded()

    @property
    def ready(self) -> bool:
        """The pinned models serve as they will go on serving: warmed up and calibrated (a model pinned later, by a
        registry reload, counts once it is calibrated too). What GET /ready answers 200 for."""
        return self._pinned_all(lambda loop: loop.ready.is_set() and loop.calibrated.is_set())

    @property
    def calibrated(self) -> bool:
        """The pinned models are calibrated (their sweeps have run, or kept calibrations were reused)."""
        return self._pinned_all(lambda loop: loop.calibrated.is_set())

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until the pinned models are ready (the ones loaded at start: they have their loops by now)."""
        loops = [slot.loop for slot in self.pool.slots().values() if slot.spec.pinned and slot.loop]
        return all(loop.ready.wait(timeout_s) and loop.calibrated.wait(timeout_s) for loop in loops)

    def _pinned_all(self, check) -> bool:
        return all(slot.loop is not None and check(slot.loop)
                   for slot in self.pool.slots().values() if slot.spec.pinned)

    def reload_registry(self, specs: Sequence[ModelSpec]) -> dict[str, list[str]]:
        """Offer the registry's models as now configured: unchanged ones stay (loaded or not),
        removed or changed ones are unloaded once idle, new ones are added (pinned ones load now).
        The new catalogue replaces the old in one assignment."""
        with self._reloading:
            return self._reload(specs)

    def _reload(self, specs: Sequence[ModelSpec]) -> dict[str, list[str]]:
        slots = self.pool.slots()
        registry = {name: slot for name, slot in slots.items() if slot.spec.registry and not slot.retired}
        wanted = {(spec.name, spec.source): spec for spec in specs}
        kept = [name for name, slot in registry.items() if (name, slot.spec.source) in wanted]
        removed = [name for name in registry if name not in kept]
        added = [spec for spec in specs if spec.name not in kept]
        for spec in added:
            slot = slots.get(spec.name)
            if slot is not None and (spec.name not in removed or (slot.loop is not None and slot.loop.busy)):
                raise Conflict(f"model {spec.name!r} is busy or still being unloaded; retry", "voices",
                               ErrorCode.MODEL_BUSY)
        for name in removed:
            self.pool.retire(name)
        self.pool.add(added)
        self._rebuild_catalogue()
        return {"kept": kept, "removed": removed, "added": [spec.name for spec in added]}

    def publish_catalogue(self) -> None:
        """A new catalogue of the models and cloned voices offered now, swapped in whole (blocking: it
        waits for a registry reload in progress)."""
        with self._reloading:
            self._rebuild_catalogue()

    def _rebuild_catalogue(self) -> None:
        specs = [slot.spec for slot in self.pool.slots().values() if not slot.retired]
        self.catalogue = Catalogue.build(specs, self.settings, self.clones.all())

    # --- what the surfaces read ----------------------------------------------------------------

    def catalogue_now(self) -> Catalogue:
        """The voices, models, aliases and capabilities offered now: an immutable snapshot (a registry reload or a
        cloned voice swaps in a new one)."""
        return self.catalogue

    def times_words(self, voice: str, caller: str | None = None) -> bool:
        """Whether the voice's model times its words (its declared capabilities); InvalidRequest for a voice the
        caller cannot use."""
        catalogue = self.catalogue
        _, model = catalogue.resolve_voice(voice, None, caller)
        return catalogue.capabilities.get(model, Capabilities()).times_words

    def word_timing(self, script: Script) -> str:
        """How a script's words will be timed, as its stream's header says before any are (tts_core.audio.word_timing:
        native where each passage's model times them, else aligned or estimated; a piece's own may still fall back
        to estimated)."""
        catalogue = self.catalogue
        return combined([NATIVE if catalogue.capabilities.get(passage.model, Capabilities()).times_words
                         else self.scheduler.word_timer.way_for(passage.voice.language)
                         for passage in script.passages]) or NATIVE

    def cloning_models(self) -> list[str]:
        """The models that can clone a voice here (none where this process's engines run elsewhere)."""
        return self.cloner.models()

    def cloning_refusal(self) -> str | None:
        """Why this process makes no clones, if it makes none (its engines run elsewhere)."""
        return self.cloner.refusal

    def degrade_state(self) -> DegradeState:
        return self.degrade.state

    def metrics_registry(self) -> CollectorRegistry:
        """The Prometheus metrics, as /metrics exports them."""
        return self.metrics.registry

    # --- status --------------------------------------------------------------------------------

    def loop_statuses(self) -> dict[str, LoopStatus]:
        """Each loaded model's loop as it is now (EngineLoop.status), without the window's figures."""
        return {name: loop.status() for name, loop in self.loops.items()}

    def queue_length(self) -> int:
        return sum(loop.queue_length for loop in self.scheduler.loads().values())

    def queue_pressure(self) -> tuple[float, float]:
        """The predicted wait of a typical sentence from a new caller, and the wait target in force, on the
        model where the one is the largest share of the other."""
        target = self.admission.wait_target()
        pressures = [loop.pressure(target) for loop in self.scheduler.loads().values()]
        return max(pressures, key=lambda pressure: pressure[0] / pressure[1], default=(0.0, target.usual_s))

    def queue_wait_s(self) -> float:
        """The predicted wait of a typical sentence from a new default-priority caller, on the busiest
        model (0 when idle)."""
        return max((loop.predicted_wait() for loop in self.scheduler.loads().values()), default=0.0)

    def status(self) -> dict:
        """What /api/v1/batch/status answers: the loops now and over the recent window."""
        window = self.metrics.window()
        queued, loads = self.queue_length(), self.scheduler.loads()
        return {
            **window,
            "queue_length": queued,
            "pending_requests": queued + window["running_items"],
            "queue_wait_s": round(self.queue_wait_s(), 3),
            "gpu_free_mem_mb": gpu.free_memory_mb(),
            "policy": self.settings.batch_policy,
            "max_batch_size": self.settings.max_batch_size,
            "ready": self.ready,
            "calibrated": self.calibrated,
            "engines": {name: self._engine_status(loads.get(name), slot.spec.pinned)
                        for name, slot in self.pool.slots().items() if not slot.retired},
            "models_loaded": len(self.loops),
            "model_memory_mb": round(self.pool.memory_bytes() / 2**20, 1),
        }

    @staticmethod
    def _engine_status(loop: EngineLoop | None, pinned: bool) -> dict:
        if loop is None:
            return {"loaded": False, "pinned": pinned, "queue_length": 0, "ready": False}
        return {"loaded": True, "pinned": pinned, **loop.status().to_json()}

    # --- accounting: every surface's requests, counted, timed and logged alike -----------------------

    def tally(self, source: str, client: str, characters: int = 0) -> Tally:
        """A request's accounting, from now until its surface ends it."""
        return Tally(source, client, self._record, characters=characters)

    def _record(self, tally: Tally) -> None:
        self.account(tally.source, tally.client, tally.status, tally.started, characters=tally.characters,
                     voice=tally.voice, audio_s=tally.audio_s, **asdict(tally.timings))

    def account(self, source: str, client: str, status: int, started: float, characters: int = 0,
                voice: str | None = None, audio_s: float = 0.0, queue_ms: float | None = None,
                synthesis_ms: float | None = None, batch_size: int | None = None) -> None:
        """One answered request: `started` is its time.perf_counter() when it was accepted; status 499 when the
        caller left before the whole answer was sent."""
        self.metrics.request_answered(source, status, time.perf_counter() - started, audio_s)
        if self.request_log is not None:
            self.request_log.record(client=client, source=source, status=status, voice=voice, characters=characters,
                                    queue_ms=queue_ms, synthesis_ms=synthesis_ms, batch_size=batch_size)

    def job_finished(self, status: str) -> None:
        """A job ended (succeeded, failed or cancelled): counted."""
        self.metrics.jobs_finished.labels(status).inc()

    def jobs_waiting(self, queued: int, running: int, oldest_queued_s: float | None) -> None:
        """The job backlog as the job runner counted it now (the dashboard's)."""
        self.metrics.jobs_state(queued, running, oldest_queued_s)

    # --- answering -----------------------------------------------------------------------------

    async def answer(self, ask: Ask, tally: Tally | None = None, on_turn: Callable[[int], None] | None = None
                     ) -> SpokenAudio | SentenceStream | DialogueStream:
        """The one way a request is answered, from any surface: its format checked, the request validated and
        admitted (tier limits, degrade mode), queued and assembled; whole and encoded (through the cache), or as
        a stream (`stream.encoded(ask.response_format, ask.sample_rate)`) whose refusals raise here, before any
        audio exists. The tally, if given, learns the voice (and a whole answer's audio and timings); `on_turn`, a
        whole dialogue's turns made so far, as each is made (a job's progress)."""
        check_format(ask.response_format, ask.sample_rate, streamed=ask.stream)
        if ask.dialogue:
            answered = await (self._stream_dialogue(ask) if ask.stream else self._speak_dialogue(ask, on_turn))
        else:
            answered = await (self._stream_pieces(ask) if ask.stream else self._speak(ask))
        if tally is not None:
            tally.answered(answered)
        return answered

    def validate(self, ask: Ask) -> Script:
        """What a request is checked for whatever the load: what it says, in which voices (a job's, before it is
        queued; the UI's, as it is typed). Blocking (the front end's work grows with the text)."""
        return self.admission.validate(self.catalogue, ask.text, ask.voice, ask.model, ask.speed, ask.caller,
                                       ask.reading)

    async def synthesize(self, ask: Ask) -> Speech:
        """The raw speech of a text, for tools and tests (validated, not admitted through degrade mode, not
        cached, not encoded)."""
        script = await self.scheduler.read(self.validate, ask)
        items = await self.scheduler.submit(script, ask.caller)
        return await self._joined(script, items)

    async def _admit(self, ask: Ask) -> Script:
        """Admission.admit (validation, degrade mode's refusals, word timings where asked for) on the text reader:
        the event loop only routes."""
        return await self.scheduler.read(self.admission.admit, self.catalogue, ask.text, ask.voice, ask.model,
                                         ask.speed, ask.caller, ask.reading, ask.words)

    async def _joined(self, script: Script, items: list[QueuedItem]) -> Speech:
        outputs = await self.scheduler.collect(items, None)  # (the assembly brings them to the answer's rate)
        return await asyncio.to_thread(self._speech, script, items, outputs)

    def _speech(self, script: Script, items: list[QueuedItem], outputs: list[EngineOutput]) -> Speech:
        audio, timed = Assembly(script, items).whole(outputs)
        self.metrics.audio_seconds.inc(audio.size / script.voice.sample_rate)
        return Speech(audio, script.voice.sample_rate, script.voice.name, len(items), Timings.of(items), tuple(timed))

    async def _speak(self, ask: Ask) -> SpokenAudio:
        """Synthesize and encode (at sample_rate, if asked), with the caller's tier, the degrade actions, the
        queue's wait target and the cache in the way; with `words`, when each word of the input is spoken
        (not cached)."""
        response_format, sample_rate, words = ask.response_format, ask.sample_rate, ask.words
        script = await self._admit(ask)
        state, settings = self.degrade.state, self.degrade.settings
        use_cache = not words and (settings.cache_enabled or DegradeAction.CACHE_FIRST in state.actions)
        # keyed on what is said: inputs (or normalization options) that say the same share their audio
        key = (script.model, ask.speed, response_format, sample_rate, script.key)
        if use_cache and (hit := self.cache.get(key)) is not None:
            self.metrics.cache_lookups.labels(CacheUse.HIT).inc()
            if DegradeAction.CACHE_FIRST in state.actions:
                self.metrics.degrade_actions.labels(DegradeAction.CACHE_FIRST).inc()
            return SpokenAudio(hit.data, hit.content_type, hit.voice, hit.duration_s, CacheUse.HIT, state.actions)
        if use_cache:
            self.metrics.cache_lookups.labels(CacheUse.MISS).inc()
        items = await self.scheduler.submit(script, ask.caller, target=self.admission.wait_target(), words=words)
        speech = await self._joined(script, items)
        data = await asyncio.to_thread(encode, speech.audio, speech.sample_rate, response_format, sample_rate)
        content_type = FORMATS[response_format].content_type
        if use_cache:
            self.cache.put(key, CachedAudio(data, content_type, speech.voice, speech.duration_s))
        captions = None
        if words:
            captions = tuple(await asyncio.to_thread(caption_words, script, ask.text, list(speech.timed_words)))
        cache_use = CacheUse.MISS if use_cache else CacheUse.OFF
        return SpokenAudio(data, content_type, speech.voice, speech.duration_s, cache_use, self.degrade.state.actions,
                           speech.timings, captions)

    async def _stream_pieces(self, ask: Ask) -> SentenceStream:
        """Queue every sentence now and return their audio as a SentenceStream (with `words`, each piece's
        words timed: SentenceStream.timed). Refusals (validation, limits, the queue's wait) raise here,
        before any audio exists. The first piece is queued as soon as the first sentence is read (after the
        refusals that need none of the text read), and is synthesized while the rest of the text is read."""
        started, target = time.monotonic(), self.admission.wait_target()
        lead = await self.scheduler.read(self.admission.lead, self.catalogue, ask.text, ask.voice, ask.model,
                                         ask.speed, ask.caller, ask.reading, ask.words)
        script, items = await self.scheduler.submit_stream(lead, lambda: self._admit(ask), ask.caller, target,
                                                           ask.words)
        return SentenceStream(script, items, started, self.metrics, self.settings.request_timeout_s)

    # --- dialogue: several speakers' turns, one recording (tts_core.request.dialogue) ----------------------------

    async def dialogue_turns(self, ask: Ask) -> int:
        """A dialogue checked as `answer` checks it (its script, voices and limits, degrade mode's refusals), queueing
        nothing: its number of turns (a dialogue job's, checked when it is submitted, counts its progress in them)."""
        return len((await self._admit_dialogue(ask)).turns)

    async def _admit_dialogue(self, ask: Ask) -> Dialogue:
        """The script checked and compiled (every turn as the speech API checks a text) on the text reader."""
        return await self.scheduler.read(compile_dialogue, self.admission, self.catalogue, ask.script, ask.voices,
                                         ask.model, ask.speed, ask.caller, ask.reading, ask.words)

    async def _speak_dialogue(self, ask: Ask, on_turn: Callable[[int], None] | None = None) -> SpokenAudio:
        """A dialogue as one encoded recording, its turns queued at once (batched with everyone's work) and joined
        at one level; cached on the whole script, as _speak caches a text (not with `words`). `on_turn(turns made so
        far)` is called on the event loop as each turn's audio is made (a job's progress)."""
        response_format, sample_rate, words = ask.response_format, ask.sample_rate, ask.words
        dialogue = await self._admit_dialogue(ask)
        actions = self.degrade.state.actions
        use_cache = not words and (self.degrade.settings.cache_enabled or DegradeAction.CACHE_FIRST in actions)
        key = (dialogue.script.model, response_format, sample_rate, dialogue.key)
        if use_cache and (hit := self.cache.get(key)) is not None:
            self.metrics.cache_lookups.labels(CacheUse.HIT).inc()
            if DegradeAction.CACHE_FIRST in actions:
                self.metrics.degrade_actions.labels(DegradeAction.CACHE_FIRST).inc()
            return SpokenAudio(hit.data, hit.content_type, hit.voice, hit.duration_s, CacheUse.HIT, actions)
        if use_cache:
            self.metrics.cache_lookups.labels(CacheUse.MISS).inc()
        items = await self._queue_dialogue(dialogue, ask.caller, False, words)
        if on_turn is not None:
            TurnProgress(dialogue, items, on_turn)
        outputs = await self.scheduler.collect(items, dialogue.script.voice.sample_rate)
        made = await asyncio.to_thread(recording, dialogue, items, outputs)
        self.metrics.audio_seconds.inc(made.duration_s)
        data = await asyncio.to_thread(encode, made.audio, made.sample_rate, response_format, sample_rate)
        content_type, voice = FORMATS[response_format].content_type, ",".join(sorted({v.name for v in dialogue.voices}))
        if use_cache:
            self.cache.put(key, CachedAudio(data, content_type, voice, made.duration_s))
        said = tuple(await asyncio.to_thread(captions, dialogue, made.timed)) if words else None
        return SpokenAudio(data, content_type, voice, made.duration_s, CacheUse.MISS if use_cache else CacheUse.OFF,
                           self.degrade.state.actions, Timings.of(items), said, made.turns)

    async def _stream_dialogue(self, ask: Ask) -> DialogueStream:
        """A dialogue streamed turn by turn; refusals raise here, before any audio exists."""
        started = time.monotonic()
        dialogue = await self._admit_dialogue(ask)
        items = await self._queue_dialogue(dialogue, ask.caller, True, ask.words)
        return DialogueStream(dialogue, items, started, self.metrics, self.settings.request_timeout_s)

    async def _queue_dialogue(self, dialogue: Dialogue, caller: Caller | None, streaming: bool, words: bool
                              ) -> list[QueuedItem]:
        """Every turn queued at once, the wait target checked on the first turn's (as a long text's on its first
        piece's): the later turns wait behind the dialogue's own earlier ones, no reason to refuse it. They are
        still refused if the queue has no room for them or their wait is past their deadline."""
        script = dialogue.script
        first = await self.scheduler.submit(replace(script, passages=script.passages[:1]), caller, streaming,
                                            self.admission.wait_target(), words)
        if len(script.passages) == 1:
            return first
        try:
            rest = await self.scheduler.submit(replace(script, passages=script.passages[1:]), caller, streaming,
                                               WaitTarget(), words)
        except BaseException:
            for item in first:
                item.abandon()
            raise
        for item in rest:  # numbered from the second passage
            item.passage += 1
        return first + rest
