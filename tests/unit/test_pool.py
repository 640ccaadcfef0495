"""The model pool: lazy loading, LRU unloading by count and by memory, pinned models, reloads."""

import asyncio
import threading

import pytest

from tests.fakes import FakeEngine
from tts_core.config import Settings
from tts_core.engines import EngineUnavailable, ModelSpec, Voice
from tts_core.errors import Overloaded
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.service import SpeechService


class SizedEngine(FakeEngine):
    def __init__(self, name: str, megabytes: int = 100):
        super().__init__(name=name)
        self.megabytes = megabytes

    def voices(self):
        return [Voice(f"{self.name}-voice", "fake", "en", self.sample_rate)]

    def memory_bytes(self):
        return self.megabytes * 2**20


def spec(name: str, pinned: bool = False, megabytes: int = 100, loads: list | None = None,
         held: threading.Event | None = None, fails: bool = False, threads: list | None = None) -> ModelSpec:
    """A fake model; `held`: its load waits until that is set."""
    def load():
        if threads is not None:
            threads.append(threading.current_thread())
        if held is not None:
            assert held.wait(10)
        if fails:
            raise EngineUnavailable(f"model {name!r} could not be loaded: gone")
        if loads is not None:
            loads.append(name)
        return SizedEngine(name, megabytes)

    return ModelSpec(name, SizedEngine(name).voices(), load, pinned, source=("fake", name), registry=True)


def make_service(specs, **settings) -> SpeechService:
    service = SpeechService(Settings(batch_policy="sequential", calibration_sizes=[1], voice_aliases={},
                                     model_aliases={}, **settings), specs, Metrics())
    service.start()
    return service


def speak(service, voice: str):
    return asyncio.run(asyncio.wait_for(service.synthesize(Ask("hello", voice)), 10))


def test_models_load_when_first_asked_for_and_pinned_ones_at_start():
    loads = []
    service = make_service([spec("a", pinned=True, loads=loads), spec("b", loads=loads)])
    try:
        assert loads == ["a"] and set(service.loops) == {"a"}
        # listed before loading
        assert {voice.name for voice in service.catalogue.voice_list()} == {"a-voice", "b-voice"}
        speak(service, "b-voice")
        assert loads == ["a", "b"] and set(service.loops) == {"a", "b"}
        assert service.status()["engines"]["b"]["loaded"] is True
    finally:
        service.stop()


def test_models_load_on_threads_of_their_own_that_end_with_the_load():
    """A torch model loaded on a thread that lives on leaves an OpenMP team there, which slows the
    engine's steps on its own thread (ModelPool._start_load): neither a pinned model (loaded at start,
    the caller waiting) nor a lazy one loads on the caller's thread or on one that stays."""
    threads = []
    service = make_service([spec("a", pinned=True, threads=threads), spec("b", threads=threads)])
    try:
        speak(service, "b-voice")
        assert len(threads) == 2 and threading.current_thread() not in threads
        for thread in threads:
            thread.join(10)
            assert not thread.is_alive()
    finally:
        service.stop()


def test_the_least_recently_used_idle_model_is_unloaded_to_keep_the_count():
    loads = []
    service = make_service([spec("pin", pinned=True), spec("a", loads=loads), spec("b", loads=loads),
                            spec("c", loads=loads)], max_loaded_models=3)
    try:
        speak(service, "a-voice")
        speak(service, "b-voice")
        speak(service, "a-voice")  # b is now the least recently used
        speak(service, "c-voice")
        assert set(service.loops) == {"pin", "a", "c"}  # b went, the pinned one never goes
        assert service.metrics.model_evictions.labels("b", "count")._value.get() == 1
        speak(service, "b-voice")  # and comes back when asked for
        assert loads == ["a", "b", "c", "b"]
    finally:
        service.stop()


def test_a_busy_model_is_not_unloaded_and_a_full_pool_answers_503():
    held = spec("a")
    service = make_service([spec("pin", pinned=True), held, spec("b")], max_loaded_models=2)
    try:
        speak(service, "a-voice")
        engine = service.loops["a"].engine
        engine.gate.clear()  # a's next synthesis blocks: a is busy
        engine.calls_started = threading.Semaphore(0)  # count the calls from here on

        async def scenario():
            busy = asyncio.ensure_future(service.synthesize(Ask("hold", "a-voice")))
            assert await asyncio.to_thread(engine.calls_started.acquire, True, 5)  # a is busy now
            with pytest.raises(Overloaded) as raised:
                await service.synthesize(Ask("hello", "b-voice"))
            assert raised.value.code == "models_busy"
            engine.gate.set()
            await busy

        asyncio.run(asyncio.wait_for(scenario(), 10))
    finally:
        service.stop()


def test_the_memory_budget_unloads_idle_models_beyond_it():
    service = make_service([spec("a", megabytes=300), spec("b", megabytes=300), spec("c", megabytes=300)],
                           model_memory_mb=700)
    try:
        for voice in ("a-voice", "b-voice", "c-voice"):
            speak(service, voice)
        assert set(service.loops) == {"b", "c"} and service.pool.memory_bytes() == 600 * 2**20
    finally:
        service.stop()


def test_one_load_serves_every_caller_waiting_for_it_and_others_are_not_held_up():
    loads, held = [], threading.Event()
    service = make_service([spec("fast", pinned=True), spec("slow", loads=loads, held=held)])
    try:
        async def scenario():
            waiting = [asyncio.ensure_future(service.synthesize(Ask("hi", "slow-voice"))) for _ in range(3)]
            await asyncio.wait_for(service.synthesize(Ask("hi", "fast-voice")), 5)  # served while slow still loads
            assert not any(request.done() for request in waiting)
            held.set()
            await asyncio.gather(*waiting)

        asyncio.run(asyncio.wait_for(scenario(), 10))
        assert loads == ["slow"]
    finally:
        held.set()
        service.stop()


def test_a_model_that_fails_to_load_answers_503_naming_it():
    service = make_service([spec("pin", pinned=True), spec("broken", fails=True)])
    try:
        with pytest.raises(Overloaded) as raised:
            speak(service, "broken-voice")
        assert raised.value.code == "model_unavailable" and "broken" in str(raised.value)
        assert service.metrics.model_loads.labels("broken", "failed")._value.get() == 1
    finally:
        service.stop()


def test_reloading_the_registry_keeps_unchanged_models_adds_new_and_removes_gone_ones():
    service = make_service([spec("pin", pinned=True), spec("a"), spec("b")])
    try:
        speak(service, "a-voice")
        a_loop = service.loops["a"]
        summary = service.reload_registry([spec("pin", pinned=True), spec("a"), spec("c", pinned=True)])
        assert summary == {"kept": ["pin", "a"], "removed": ["b"], "added": ["c"]}
        assert service.loops["a"] is a_loop and "c" in service.loops  # pinned: loaded at once
        assert {voice.name for voice in service.catalogue.voice_list()} == {"pin-voice", "a-voice", "c-voice"}
        with pytest.raises(Exception, match="does not exist"):
            speak(service, "b-voice")
    finally:
        service.stop()


class SlowVoices(list):
    """A model's voice list that runs `meanwhile` at each voice it gives (a reader's turn while a reload reads it)."""

    def __init__(self, voices, meanwhile):
        super().__init__(voices)
        self.meanwhile = meanwhile

    def __iter__(self):
        for voice in super().__iter__():
            self.meanwhile()
            yield voice


def test_a_reload_never_hides_a_valid_voice_from_requests_meanwhile():
    service = make_service([spec("pin", pinned=True), spec("a")])
    try:
        failures, done = [], threading.Event()

        def read() -> None:
            try:
                service.catalogue.resolve_voice("a-voice")
            except Exception as error:  # the old index was cleared and refilled in place
                failures.append(error)

        def reader():  # requests on other threads, all through the reload
            while not done.is_set():
                read()

        slow = spec("b")
        slow.voices = SlowVoices(slow.voices * 4, meanwhile=read)  # and one at each voice the reload reads
        thread = threading.Thread(target=reader)
        thread.start()
        try:
            service.reload_registry([spec("pin", pinned=True), spec("a"), slow])
        finally:
            done.set()
            thread.join(10)
        assert not failures and "b-voice" in service.catalogue.voices
    finally:
        service.stop()
