import asyncio
import threading
from dataclasses import replace

import pytest

from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine
from tests.serve import wait_until
from tts_core.config import Settings
from tts_core.errors import InvalidRequest, Overloaded
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.request.script import Reading
from tts_core.service import SpeechService
from tts_core.text.frontend import NormalizationOptions


class CountingEngine(FakeEngine):
    tokenized = 0

    def tokenize(self, text, voice):
        self.tokenized += 1
        return super().tokenize(text, voice)


@pytest.fixture
def service():
    settings = Settings(max_queue=4, max_chars=200, batch_policy="sequential",
                        voice_aliases={"alloy": "fake-voice", "ghost": "missing"},
                        model_aliases={"tts-1": "fake"})
    engine = CountingEngine()
    service = SpeechService(settings, [engine], Metrics())
    service.start()
    assert service.loops["fake"].calibrated.wait(10)  # warm-up runs the engine: before a test holds it
    yield service
    service.stop()


def test_sentences_are_scheduled_separately_and_joined_in_order(service):
    speech = asyncio.run(service.synthesize(Ask("One two. Three four five.", "alloy", model="tts-1")))
    assert speech.chunks == 2
    pause = int(0.12 * speech.sample_rate)
    assert speech.audio.size == (len("One two.") + len("Three four five.")) * SAMPLES_PER_TOKEN + pause


def test_aliases_resolve_and_broken_aliases_are_dropped(service):
    assert service.catalogue.resolve_voice("alloy")[0].name == "fake-voice"
    assert "ghost" not in service.catalogue.voice_aliases
    with pytest.raises(InvalidRequest) as raised:
        service.catalogue.resolve_voice("ghost")
    assert raised.value.param == "voice" and "fake-voice" in raised.value.message
    with pytest.raises(InvalidRequest) as raised:
        service.catalogue.resolve_model("tts-2")
    assert raised.value.param == "model"


@pytest.mark.parametrize("text, speed, param", [
    ("   ", 1.0, "input"), ("x" * 201, 1.0, "input"), ("bell\x07", 1.0, "input"), ("ok", 5.0, "speed"),
])
def test_invalid_requests_name_the_field(service, text, speed, param):
    with pytest.raises(InvalidRequest) as raised:
        asyncio.run(service.synthesize(Ask(text, "alloy", model="tts-1", speed=speed)))
    assert raised.value.param == param


def test_full_queue_is_refused_before_any_work(service):
    engine = service.loops["fake"].engine
    engine.gate.clear()  # hold the engine so the queue fills
    engine.calls_started = threading.Semaphore(0)  # count the calls from here on

    async def scenario():
        as_written = NormalizationOptions(normalize=False)  # "|" is the fake engine's sentence break: keep it
        # 1 runs, 3 queue
        running = asyncio.ensure_future(service.synthesize(Ask("a|b|c|d", "alloy", reading=Reading(as_written))))
        assert await asyncio.to_thread(engine.calls_started.acquire, True, 5)  # "a" runs
        filling = asyncio.ensure_future(service.synthesize(Ask("e", "alloy")))  # the 4th queued item
        assert await asyncio.to_thread(wait_until, lambda: service.queue_length() == 4, 5)
        before = engine.tokenized
        with pytest.raises(Overloaded) as raised:
            await service.synthesize(Ask("one more", "alloy"))
        assert raised.value.retry_after_s >= 1
        assert engine.tokenized == before  # refused before tokenizing
        engine.gate.set()
        await asyncio.gather(running, filling)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_front_end_runs_for_the_voices_language_and_the_cache_keys_on_what_is_said(service):
    def speak(text, **options):
        return asyncio.run(service.answer(Ask(text, "alloy", model="tts-1", response_format="wav",
                                              reading=Reading(NormalizationOptions(**options)))))

    plain = speak("It costs $5.")
    assert plain.cache == "miss" and plain.duration_s == len("It costs five dollars.") * SAMPLES_PER_TOKEN / 16000
    assert speak("It costs **$5**.").cache == "hit"  # another input that says the same
    written = speak("It costs $5.", currency_normalization=False)
    assert written.cache == "miss" and written.duration_s == len("It costs $5.") * SAMPLES_PER_TOKEN / 16000
    with pytest.raises(InvalidRequest) as raised:
        speak("😀\n```\ncode\n```")
    assert raised.value.param == "input" and "nothing to speak" in raised.value.message
    assert raised.value.code == "empty_input"


@pytest.mark.parametrize("text", ["", "   ", "😀", "<speak><break time='1s'/></speak>"])
def test_empty_blank_and_nothing_to_say_share_one_code(service, text):
    with pytest.raises(InvalidRequest) as raised:
        service.validate(Ask(text, "alloy", model="tts-1"))
    assert (raised.value.status, raised.value.param, raised.value.code) == (400, "input", "empty_input")


def test_a_text_the_voice_cannot_speak_names_its_language_and_the_voices_that_can():
    english, chinese = FakeEngine(), FakeEngine(name="fake-zh", voice="zh-voice", language="zh")
    service = SpeechService(Settings(voice_aliases={}, model_aliases={}), [english, chinese], Metrics())
    with pytest.raises(InvalidRequest) as raised:
        service.validate(Ask("你好，世界。", "fake-voice"))
    error = raised.value
    assert (error.status, error.param, error.code) == (400, "input", "unsupported_script")
    assert "Chinese characters" in error.message and "language en" in error.message and "zh-voice" in error.message
    assert service.validate(Ask("你好，世界。", "zh-voice")).passages  # the voice that can, does


def test_a_text_that_says_more_than_the_spoken_limit_is_refused_before_any_work():
    engine = CountingEngine()
    service = SpeechService(Settings(max_spoken_chars=100, voice_aliases={}, model_aliases={}), [engine], Metrics())
    digits = "9" * 30  # 30 characters, said one by one: "nine nine ..." (149)
    with pytest.raises(InvalidRequest) as raised:
        asyncio.run(service.synthesize(Ask(f"Total: {digits}.", "fake-voice")))
    assert raised.value.code == "spoken_text_above_max_length" and raised.value.param == "input"
    assert "the limit is 100" in raised.value.message and raised.value.retry_after_s is None
    assert engine.tokenized == 0
    ssml = f'<speak><say-as interpret-as="cardinal">{digits}</say-as></speak>'
    with pytest.raises(InvalidRequest, match="once its numbers"):
        asyncio.run(service.synthesize(Ask(ssml, "fake-voice")))


class ThreadRecordingEngine(FakeEngine):
    """Records the threads its tokenize runs on."""

    def __init__(self):
        super().__init__()
        self.tokenized_on: set[str] = set()

    def tokenize(self, text, voice):
        self.tokenized_on.add(threading.current_thread().name)
        return super().tokenize(text, voice)


def test_texts_are_read_off_the_event_loop_one_at_a_time(monkeypatch):
    """Normalizing, cutting and tokenizing run on the scheduler's text reader, never on the event loop's thread."""
    import tts_core.request.admission as admission

    normalized_on: set[str] = set()
    normalize = admission.normalize_text

    def recording_normalize(*args, **kwargs):
        normalized_on.add(threading.current_thread().name)
        return normalize(*args, **kwargs)

    monkeypatch.setattr(admission, "normalize_text", recording_normalize)
    engine = ThreadRecordingEngine()
    service = SpeechService(Settings(batch_policy="sequential"), [engine], Metrics())
    service.start()
    assert service.loops["fake"].calibrated.wait(10)
    engine.tokenized_on.clear()  # warm-up's own inputs
    try:
        async def speak_and_stream() -> str:
            await service.answer(Ask("One two. Three four five.", "fake-voice", model="fake", response_format="wav"))
            stream = await service.answer(Ask("Six seven. Eight.", "fake-voice", model="fake", response_format="pcm",
                                              stream=True))
            assert [piece async for piece in stream]
            return threading.current_thread().name

        loop_thread = asyncio.run(speak_and_stream())
    finally:
        service.stop()
    readers = {name.rsplit("_", 1)[0] for name in normalized_on | engine.tokenized_on}
    assert readers == {"text-reader"} and loop_thread not in normalized_on | engine.tokenized_on


def test_what_a_model_cannot_do_is_refused_from_its_spec_before_any_load():
    """A speed asked of a voice whose model has no speaking-rate control: refused without loading it (nor any
    other)."""
    from tts_core.engines import ModelSpec

    def load():
        raise AssertionError("a refusal must not load the model")

    voices = [replace(voice, speed_control=False) for voice in FakeEngine(name="later", voice="later-voice").voices()]
    unloaded = ModelSpec("later", voices, load, pinned=False, source=("later",))
    service = SpeechService(Settings(batch_policy="sequential"), [FakeEngine(), unloaded], Metrics())
    service.start()
    try:
        with pytest.raises(InvalidRequest) as refused:
            asyncio.run(service.answer(Ask("Hello there.", "later-voice", speed=1.5, response_format="wav",
                                           words=True)))
        assert refused.value.code == "unsupported_value" and "later" not in service.loops
    finally:
        service.stop()


def test_each_request_is_accounted_once_with_how_it_ended(tmp_path):
    """The service accounts every surface's requests alike (the metrics and the request log app.py gives it): a
    whole answer with its voice and timings, a refusal with its status, a caller gone as 499; a tally ends once."""
    from storage import Storage, sqlite_url
    from storage.request_log import RequestLogWriter

    storage = Storage(sqlite_url(tmp_path / "log.db"))
    storage.migrate()
    request_log = RequestLogWriter(storage)
    service = SpeechService(Settings(batch_policy="sequential", voice_aliases={}, model_aliases={}), [FakeEngine()],
                            Metrics(), request_log=request_log)
    service.start()
    try:
        async def scenario():
            with service.tally("ui", "ip:a", 6) as answered:
                await service.answer(Ask("Hello.", "fake-voice", response_format="wav"), answered)
            with pytest.raises(InvalidRequest), service.tally("ui", "ip:b", 1) as refused:
                await service.answer(Ask("x", "no-such-voice"), refused)
            with pytest.raises(asyncio.CancelledError), service.tally("websocket", "ip:c"):
                raise asyncio.CancelledError
            return answered, refused
        answered, refused = asyncio.run(scenario())
        answered.end(500)  # already ended: nothing more is recorded
        request_log.flush()
        rows = {row["client"]: row for row in storage.request_log.recent(10)}
        assert len(rows) == 3 and (rows["ip:a"]["status"], rows["ip:a"]["voice"]) == (200, "fake-voice")
        assert rows["ip:a"]["characters"] == 6 and rows["ip:a"]["batch_size"] == 1 and answered.audio_s > 0
        assert rows["ip:b"]["status"] == 400 and refused.status == 400 and rows["ip:c"]["source"] == "websocket"
        assert rows["ip:c"]["status"] == 499
        counted = service.metrics_registry().get_sample_value
        assert counted("tts_requests_total", {"source": "ui", "status": "200"}) == 1
        assert counted("tts_requests_total", {"source": "websocket", "status": "499"}) == 1
    finally:
        service.stop()
