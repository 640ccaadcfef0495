"""The upstream engine's parts: the learned in-flight limit and the circuit breaker (pure, on given times), and
the engine against a plain listener on loopback (the body it sends, the audio it reads, what failures mean) and a
hostile one (an absurd Retry-After, an answer that never ends, a byte of audio, a WAV)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from email.utils import formatdate

import numpy as np
import pytest
import soundfile

from tests.faults.hostile_upstream import HostileUpstream, wav_of
from tests.listener import TONE, Answer, Listener
from tests.serve import wait_until
from tts_core.audio.playable import resample
from tts_core.engines.base import EngineUnavailable, UpstreamOptions, VoiceSpec
from tts_core.engines.contract import EngineInput
from tts_core.engines.upstream import (
    ERROR_BYTES,
    UpstreamEngine,
    UpstreamFailed,
    UpstreamRejected,
    listed_voices,
)
from tts_core.scheduler.in_flight import (
    FAILURES,
    MOST_COOL_DOWN_S,
    REPROBE_AFTER,
    SAMPLES,
    BreakerState,
    CircuitBreaker,
    InFlightLimit,
    bounded_retry_after,
)

# of the last 100 windows, those at the settled limit: all but the measurements of twice as many (each after
# REPROBE_AFTER windows, SAMPLES windows and the one that moves the limit)
SETTLED = 100 - -(-100 // REPROBE_AFTER) * (SAMPLES + 1)


def drive(limit: InFlightLimit, rate_of, windows: int = 300, bursts: int = 1) -> list[int]:
    """Windows of a second one after another at the limit in force, each request in flight making rate_of(n)
    audio seconds a second with n in flight, the audio arriving in one burst every `bursts` windows. Returns the
    limits seen."""
    seen = []
    for number in range(windows):
        count = limit.limit
        arrived = count * rate_of(count) * bursts if number % bursts == bursts - 1 else 0.0
        limit.observe(count, arrived, 1.0)
        seen.append(limit.limit)
    return seen


def batching(n: int) -> float:
    return 1.0 if n <= 8 else 8.0 / n  # each request as fast until 8 run at once, then they share


def test_an_upstream_that_batches_is_kept_full_and_one_that_serves_one_at_a_time_gets_one():
    seen = drive(InFlightLimit(most=32), batching)
    assert seen.index(8) <= 3 * SAMPLES + 1, seen[:20]  # 1, 2, 4, 8: a few windows at each
    assert seen[-100:].count(8) >= SETTLED, seen[-100:]  # and 16 now and then, measured again
    seen = drive(InFlightLimit(most=32), lambda n: 1.0 / n)  # one at a time: two in flight each take twice as long
    assert set(seen) <= {1, 2} and seen[-100:].count(1) >= SETTLED, seen
    assert drive(InFlightLimit(most=12), lambda n: 1.0)[-1] == 12  # 1, 2, 4, 8, then the most


def test_a_cold_start_costs_at_most_one_step_and_fewer_callers_than_the_limit_keep_it_where_they_are_served():
    limit = InFlightLimit(most=32)
    limit.observe(1, 0.1, 1.0)  # the first window paid for the connection (the strategy leaves such a one out)
    seen = drive(limit, lambda n: 1.0 / n)  # one at a time
    assert set(seen) <= {1, 2, 4} and max(seen[-100:].count(1), seen[-100:].count(2)) >= SETTLED, seen
    callers = InFlightLimit(most=32)  # 4 callers at most: more allowed in flight makes no more
    assert drive(callers, lambda n: 1.0 if n <= 4 else 4 / n)[-100:].count(4) >= SETTLED


def test_audio_that_arrives_in_bursts_is_measured_at_its_rate():
    """An upstream that sends a request's audio in bursts (most windows get none): the limit still finds 8."""
    seen = drive(InFlightLimit(most=32), batching, windows=600, bursts=3)
    assert seen[-100:].count(8) >= SETTLED, seen[-100:]


def test_a_busy_upstream_halves_the_limit_and_it_is_learned_back():
    limit = InFlightLimit(most=32)
    drive(limit, batching)
    limit.busy()
    assert limit.limit == 4
    assert drive(limit, batching, windows=400)[-100:].count(8) >= SETTLED


def test_the_breaker_opens_after_failures_in_a_row_probes_once_and_doubles_its_cool_down():
    breaker, now = CircuitBreaker(), 100.0
    for _ in range(FAILURES - 1):
        breaker.failed(now)
    assert breaker.allows(now)
    breaker.failed(now)
    assert breaker.state_now(now) is BreakerState.OPEN and not breaker.allows(now + 1.9)
    assert breaker.retry_after_s(now + 0.5) == pytest.approx(1.5)
    assert breaker.allows(now + 2.0)  # the probe
    assert not breaker.allows(now + 2.0)  # one at a time
    breaker.failed(now + 3.0)  # the probe failed: open again, twice as long
    assert breaker.retry_after_s(now + 3.0) == pytest.approx(4.0)
    assert breaker.allows(now + 7.0)
    breaker.succeeded()
    assert breaker.state_now(now + 7.0) is BreakerState.CLOSED and breaker.allows(now + 7.0)


def test_a_breaker_open_more_than_1024_times_in_a_row_stays_bounded_and_closes_once_the_upstream_answers():
    breaker, now = CircuitBreaker(most_cool_down_s=1.0), 0.0
    for _ in range(FAILURES):
        breaker.failed(now)
    for _ in range(1100):  # each probe fails: 2 ** 1024 is past a float, where the cool-down once raised
        now += 1.0
        assert breaker.allows(now) and not breaker.allows(now)
        breaker.failed(now)
        assert breaker.state is BreakerState.OPEN and breaker.retry_after_s(now) == 1.0
    assert breaker.opened == 1101
    now += 1.0
    assert breaker.allows(now)
    breaker.succeeded()
    assert breaker.state_now(now) is BreakerState.CLOSED and breaker.allows(now)


def test_a_probe_that_ends_saying_nothing_gives_its_slot_to_the_next_request():
    breaker = CircuitBreaker()
    for _ in range(FAILURES):
        breaker.failed(0.0)
    assert breaker.allows(2.0) and not breaker.allows(2.0)  # the probe is out
    breaker.probe_ended()  # its caller left (or settling it raised): no answer either way
    assert breaker.state_now(2.0) is BreakerState.HALF_OPEN and breaker.allows(2.0)


def test_the_upstreams_retry_after_lengthens_the_cool_down():
    breaker = CircuitBreaker()
    for _ in range(FAILURES):
        breaker.failed(0.0, retry_after_s=30)
    assert breaker.retry_after_s(0.0) == 30


@pytest.mark.parametrize("retry_after_s", [float("inf"), 31_536_000, 1e9])
def test_an_absurd_retry_after_opens_the_breaker_for_a_minute_at_most_and_a_healthy_upstream_is_used_again(
        retry_after_s):
    breaker = CircuitBreaker()
    for _ in range(FAILURES):
        breaker.failed(0.0, retry_after_s)
    assert breaker.retry_after_s(0.0) == MOST_COOL_DOWN_S
    assert not breaker.allows(MOST_COOL_DOWN_S - 0.1)
    assert breaker.allows(MOST_COOL_DOWN_S)  # the probe
    breaker.succeeded()
    assert breaker.state_now(MOST_COOL_DOWN_S) is BreakerState.CLOSED


def test_an_upstreams_max_cool_down_bounds_its_breaker_and_the_retry_after_it_can_make():
    breaker = CircuitBreaker(most_cool_down_s=3.0)
    for _ in range(FAILURES):
        breaker.failed(0.0, retry_after_s=31_536_000)
    assert breaker.retry_after_s(0.0) == 3.0 and not breaker.allows(2.9) and breaker.allows(3.0)
    for opened in range(3):  # the probe fails again and again: twice as long each time, up to the bound
        breaker.failed(10.0 * opened)
        assert breaker.retry_after_s(10.0 * opened) == min(3.0, 2.0 * 2 ** (opened + 1))
        assert breaker.allows(10.0 * opened + 3.0)
    assert bounded_retry_after(float("inf"), 3.0) == 3.0 and bounded_retry_after(1.5, 3.0) == 1.5


@pytest.mark.parametrize("seconds, bounded", [(float("inf"), MOST_COOL_DOWN_S), (1e9, MOST_COOL_DOWN_S),
                                              (float("nan"), 0.0), (-5.0, 0.0), (None, 0.0), (7.5, 7.5)])
def test_what_an_upstreams_retry_after_can_make_callers_wait_is_bounded(seconds, bounded):
    assert bounded_retry_after(seconds) == bounded


@pytest.fixture
def listener():
    listening = Listener()
    yield listening
    listening.close()


def engine_for(url: str, **options) -> UpstreamEngine:
    spec = UpstreamOptions(url, **options)
    return UpstreamEngine("Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", [VoiceSpec("vivian", upstream=spec)], "qwen3", spec)


def speak(engine: UpstreamEngine, text: str = "Hello there.", speed: float = 1.0) -> np.ndarray:
    return engine.synthesize([EngineInput(engine.tokenize(text, "vivian")[0], "vivian", speed)])[0].audio


def test_the_body_is_vllm_omnis_speech_request_and_the_audio_arrives_whole(listener, monkeypatch):
    monkeypatch.setenv("QWEN_KEY", "sk-upstream")
    engine = engine_for(listener.url, api_key_env="QWEN_KEY",
                        extra_body=json.dumps({"task_type": "CustomVoice", "language": "English",
                                               "max_new_tokens": 2048}))
    audio = speak(engine, "Grüße, 3 cats.")
    expected = np.frombuffer(TONE, dtype="<i2").astype(np.float32) / 32768
    np.testing.assert_array_equal(audio, expected)  # odd-sized chunks split samples: none is lost or shifted
    sent = listener.requests[-1]
    assert (sent.method, sent.path) == ("POST", "/v1/audio/speech")
    assert sent.headers["authorization"] == "Bearer sk-upstream"
    assert sent.headers["content-type"] == "application/json"
    assert sent.body == {"model": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "input": "Grüße, 3 cats.", "voice": "vivian",
                         "response_format": "pcm", "stream": True, "stream_format": "audio",
                         "task_type": "CustomVoice", "language": "English", "max_new_tokens": 2048}
    speak(engine, speed=1.5)
    assert listener.requests[-1].body["speed"] == 1.5


def test_a_missing_key_variable_stops_the_load_with_its_name(listener, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(Exception, match="NO_SUCH_KEY"):
        engine_for(listener.url, api_key_env="NO_SUCH_KEY")


@pytest.mark.parametrize("answer, kind, says", [
    (Answer("status", 400, b'{"error": {"message": "Instructions too long", "type": "BadRequestError", '
                           b'"param": null, "code": 400}}'), UpstreamRejected, "Instructions too long"),
    (Answer("status", 400, b'{"detail": {"error": "validation_error", "message": "Voice \'x\' not found"}}'),
     UpstreamRejected, "Voice 'x' not found"),
    (Answer("status", 422, b'{"detail": [{"loc": ["body", "speed"], "msg": "Input should be less than 4"}]}'),
     UpstreamRejected, "less than 4"),
    (Answer("status", 401, b'{"error": "Unauthorized"}'), UpstreamFailed, "401: Unauthorized"),
    (Answer("status", 404, b'{"detail": "Model not installed"}'), UpstreamFailed, "Model not installed"),
    (Answer("status", 500, b"Internal Server Error"), UpstreamFailed, "500: Internal Server Error"),
    (Answer("json200"), UpstreamFailed, "not audio"),
    (Answer("cut"), UpstreamFailed, "cut the audio halfway"),
    (Answer("hang"), UpstreamFailed, "did not answer within 0.5 s"),
    # a wait that is not ahead is no Retry-After: the 503 counts as the failure it is (the breaker can open)
    (Answer("status", 503, b"{}", headers={"Retry-After": "-5"}), UpstreamFailed, "503"),
])
def test_each_failure_says_what_it_is(listener, answer, kind, says):
    listener.answer = answer
    with pytest.raises(kind, match=says.replace("(", r"\(")) as raised:
        speak(engine_for(listener.url, timeout_s=0.5))
    assert not getattr(raised.value, "busy", False)


@pytest.mark.parametrize("answer", [Answer("status", 429, b'{"error": {"message": "slow down"}}'),
                                    Answer("status", 503, b"{}", headers={"Retry-After": "7"})])
def test_a_full_upstream_is_busy_not_broken(listener, answer):
    listener.answer = answer
    with pytest.raises(UpstreamFailed) as raised:
        speak(engine_for(listener.url))
    assert raised.value.busy
    assert raised.value.retry_after_s == (7 if answer.status == 503 else None)


def test_an_upstream_that_is_not_there_is_refused_at_once(listener):
    url = listener.url
    listener.close()
    with pytest.raises(UpstreamFailed, match="could not be reached"):
        speak(engine_for(url))


def test_a_cloned_voice_sends_its_clip_as_a_data_url_and_its_words(listener):
    engine = engine_for(listener.url, clones=True)
    clip = np.sin(np.arange(3 * 16000) / 16000 * 2 * np.pi * 200).astype(np.float32) * 0.5
    engine.add_voice("mine", engine.voice_prompt_from_audio(clip, 16000), "Three seconds of a tone.")
    assert "mine" in [voice.name for voice in engine.voices()]
    body = engine.request_body(EngineInput(engine.tokenize("Hello.", "mine")[0], "mine"))
    assert "voice" not in body and body["ref_text"] == "Three seconds of a tone."
    audio, rate = soundfile.read(io.BytesIO(base64.b64decode(body["ref_audio"].removeprefix("data:audio/wav;base64,"))))
    assert rate == 24000 and len(audio) == 3 * 24000  # at the upstream's rate
    engine.remove_voice("mine")
    assert "mine" not in [voice.name for voice in engine.voices()]
    assert engine.request_body(EngineInput(engine.tokenize("Hello.", "mine")[0], "mine"))["voice"] == "mine"


@pytest.mark.parametrize("declared", [True, False])
def test_instructions_go_only_to_an_upstream_that_takes_them(listener, declared):
    engine = engine_for(listener.url, instructions=declared)
    body = engine.request_body(EngineInput(engine.tokenize("Hello.", "vivian")[0], "vivian", 1.0, "Softly."))
    assert body.get("instructions") == ("Softly." if declared else None)


@pytest.mark.parametrize("listed, model, names", [
    ({"voices": ["aiden", "vivian"], "uploaded_voices": [{"name": "anna", "consent": "yes"}]}, "qwen3",
     ["aiden", "vivian", "anna"]),  # vLLM-Omni
    ({"voices": [{"id": "af_heart", "name": "af_heart"}, {"id": "am_adam", "name": "am_adam"}]}, "kokoro",
     ["af_heart", "am_adam"]),  # Kokoro-FastAPI
    ({"voices": ["af_heart", "am_adam"]}, "kokoro", ["af_heart", "am_adam"]),  # Kokoro-FastAPI, legacy
    ({"voices": [{"name": "Heart", "id": "af_heart", "language": "en", "gender": "female"}], "object": "list"},
     "speaches-ai/Kokoro-82M-v1.0-ONNX", ["af_heart"]),  # Speaches
    ({"data": [{"id": "joe", "model": "piper"}, {"id": "anna", "model": "pocket"}]}, "piper", ["joe"]),  # Chorus
])
def test_the_upstreams_voice_list_is_read_in_each_servers_shape(listed, model, names):
    listener = Listener(voices=listed)
    try:
        assert listed_voices(UpstreamOptions(listener.url), model) == names
    finally:
        listener.close()


def test_a_voice_list_that_cannot_be_read_says_why():
    listener = Listener()  # no voice list: 404
    try:
        with pytest.raises(EngineUnavailable, match="its voice list answered 404: Not Found"):
            listed_voices(UpstreamOptions(listener.url), "kokoro")
    finally:
        listener.close()
    with pytest.raises(EngineUnavailable, match="its voice list could not be read"):
        listed_voices(UpstreamOptions(listener.url), "kokoro")  # nothing listens there now


@pytest.fixture
def hostile():
    upstream = HostileUpstream()
    yield upstream
    upstream.close()


@pytest.mark.parametrize("said, seconds", [("inf", float("inf")), ("1e9", 1e9), ("nan", None), ("-3", None),
                                           ("soon", None), ("http-date", 30), ("5_0", None), ("+5", None),
                                           ("past-date", None), ("12", 12)])
def test_each_form_of_retry_after_is_read_as_seconds_or_none(hostile, said, seconds):
    if said == "http-date":
        said = formatdate(time.time() + 30, usegmt=True)
    if said == "past-date":
        said = formatdate(time.time() - 30, usegmt=True)
    hostile.answer = Answer("status", 429, b"{}", headers={"Retry-After": said})
    with pytest.raises(UpstreamFailed) as raised:
        speak(engine_for(hostile.url))
    assert raised.value.busy
    assert raised.value.retry_after_s == (pytest.approx(seconds, abs=2) if seconds is not None else None)


def test_an_upstream_that_never_stops_sending_is_cut_off_at_what_the_text_can_make(hostile):
    engine = engine_for(hostile.url)
    text = "Hello there."  # 12 characters: at most 9 s of audio
    most = engine.most_samples(EngineInput(engine.tokenize(text, "vivian")[0], "vivian"))
    assert most == 9 * 24000
    slow, fast = (engine.most_samples(EngineInput(engine.tokenize(text, "vivian")[0], "vivian", speed))
                  for speed in (0.5, 2.0))
    assert (slow, fast) == (2 * most, most)  # (an upstream may ignore a faster speed)
    hostile.answer = Answer("endless")

    async def passed_on() -> int:
        samples = 0
        async with engine.client() as client:
            with pytest.raises(UpstreamFailed, match="more than the 9 s of audio that 12 characters can make"):
                async for piece in engine.audio(client, EngineInput(engine.tokenize(text, "vivian")[0], "vivian")):
                    samples += piece.size
        return samples

    assert asyncio.run(passed_on()) == most  # the bound, and not a sample more
    assert wait_until(lambda: hostile.streaming == 0, 10)  # the connection was closed: it stopped
    assert hostile.sent < 2 * most + 32 * 2**20  # what it read, and what the sockets' buffers held
    hostile.answer = Answer()
    assert speak(engine, text).size == 24000


def test_an_error_whose_body_never_ends_is_read_only_as_far_as_its_message(hostile):
    hostile.answer = Answer("endless_error", 500)
    with pytest.raises(UpstreamFailed, match="upstream answered 500: xxx") as raised:
        speak(engine_for(hostile.url))
    assert len(str(raised.value)) < ERROR_BYTES
    assert wait_until(lambda: hostile.streaming == 0, 10)
    assert hostile.sent < 32 * 2**20


def answering(body: bytes, kind: str = "audio/wav") -> Answer:
    return Answer("body", 200, body, {"content-type": kind})


@pytest.mark.parametrize("body", [b"", b"\x01", wav_of(np.zeros(0, np.int16), 24000)])
def test_an_answer_with_no_whole_sample_is_an_upstream_failure(hostile, body):
    hostile.answer = answering(body, "audio/wav" if body[:4] == b"RIFF" else "audio/pcm")
    with pytest.raises(UpstreamFailed, match="no audio"):
        speak(engine_for(hostile.url))


def test_a_wav_answer_has_its_header_read_as_a_header(hostile):
    tone = np.frombuffer(TONE, "<i2")
    expected = tone.astype(np.float32) / 32768
    engine = engine_for(hostile.url)
    hostile.answer = answering(wav_of(tone, 24000))
    np.testing.assert_array_equal(speak(engine), expected)  # no 44 bytes of header played as 22 samples
    hostile.answer = answering(wav_of(tone, 24000, streamed=False), "application/octet-stream")
    np.testing.assert_array_equal(speak(engine), expected)  # known by its first bytes
    at_16k = resample(expected, 24000, 16000)
    hostile.answer = answering(wav_of(at_16k, 16000, "FLOAT"))
    audio = speak(engine)  # float samples at the WAV's own rate, read at the registry's
    assert abs(audio.size - 24000) <= 32 and np.abs(audio[1000:20000] - expected[1000:20000]).max() < 0.05
    hostile.answer = answering(wav_of(tone.reshape(-1, 2), 24000))
    assert speak(engine).size == 12000  # two channels, read as one


@pytest.mark.parametrize("kind", ["text/html", "TEXT/HTML", "Application/JSON; charset=utf-8"])
def test_an_answer_typed_as_text_is_not_played_as_audio_whatever_its_case(hostile, kind):
    hostile.answer = answering(b"<html>" + bytes(4800), kind)
    with pytest.raises(UpstreamFailed, match="not audio"):
        speak(engine_for(hostile.url))


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_24", "ULAW"])
def test_a_wav_in_a_format_that_cannot_be_read_is_refused(hostile, subtype):
    hostile.answer = answering(wav_of(np.zeros(2400, np.float32), 24000, subtype))
    with pytest.raises(UpstreamFailed, match="cannot be read"):
        speak(engine_for(hostile.url))
