import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.audio_check import decode, duration

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}
SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs away."


def assert_plausible_speech(samples: np.ndarray, rate: int, text: str) -> None:
    seconds = samples.size / rate
    assert 0.035 * len(text) < seconds < 0.12 * len(text), f"{seconds:.2f} s for {len(text)} characters"
    assert np.sqrt(np.mean(samples ** 2)) > 0.02, "near silence"


@pytest.mark.parametrize("response_format", list(CONTENT_TYPES))
def test_every_format_decodes_to_speech_of_plausible_length(speak, response_format):
    response = speak(SENTENCE, response_format)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == CONTENT_TYPES[response_format]
    samples, rate = decode(response.content, response_format)
    assert_plausible_speech(samples, rate, SENTENCE)
    if response_format in ("pcm", "opus"):
        assert rate in (24000, 48000)


def test_pcm_is_24khz_16bit_mono_without_header(speak):
    pcm, wav = speak(SENTENCE, "pcm").content, speak(SENTENCE, "wav").content
    assert len(pcm) % 2 == 0 and not pcm.startswith(b"RIFF")
    # Same text, same voice: about the same duration (noise in the duration model varies it).
    assert len(pcm) / 2 / 24000 == pytest.approx(duration(wav, "wav"), rel=0.2)


def test_speed_changes_duration(speak):
    slow = duration(speak(SENTENCE, "wav", speed=0.5).content, "wav")
    fast = duration(speak(SENTENCE, "wav", speed=2.0).content, "wav")
    assert slow > 2.5 * fast


def test_voice_object_and_native_names_are_accepted(speak, server):
    assert speak("Hello there.", voice={"id": "alloy"}).status_code == 200
    body = {"model": "piper", "input": "Hello there.", "voice": "en_US-joe-medium"}
    assert httpx.post(f"{server}/v1/audio/speech", json=body, timeout=60).status_code == 200


WORD_COUNTS = (2, 4, 7, 12, 20, 33)


def text_of(words: int, seed: int) -> str:
    vocabulary = ("river stone window garden music paper yellow morning quiet letter table "
                  "orange silver market winter bridge candle forest pocket simple").split()
    rng = random.Random(seed)
    return " ".join(rng.choice(vocabulary) for _ in range(words)).capitalize() + "."


def test_32_concurrent_mixed_requests_each_get_their_own_audio(speak, server):
    texts = [text_of(words, seed) for seed, words in enumerate(WORD_COUNTS)]
    solo = {text: duration(speak(text).content, "wav") for text in texts}
    jobs = [texts[i % len(texts)] for i in range(32)]
    random.Random(1).shuffle(jobs)
    with ThreadPoolExecutor(32) as pool:
        responses = list(pool.map(speak, jobs))
    for text, response in zip(jobs, responses):
        assert response.status_code == 200, response.text
        got = duration(response.content, "wav")
        closest = min(solo, key=lambda other: abs(solo[other] - got))
        assert closest == text, f"{got:.2f} s matches {closest!r}, not {text!r} ({solo[text]:.2f} s)"
    status = httpx.get(f"{server}/api/v1/batch/status").json()
    assert status["batches_in_window"] >= 1 and status["queue_length"] == 0


def test_openai_client_works_unchanged(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="x")
    response = client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE, response_format="wav")
    samples, rate = decode(response.content, "wav")
    assert_plausible_speech(samples, rate, SENTENCE)
    mp3 = client.audio.speech.create(model="gpt-4o-mini-tts", voice="nova", input="Hi there.")
    assert decode(mp3.content, "mp3")[0].size > 0
    assert {"tts-1", "piper"} <= {model.id for model in client.models.list()}


@pytest.mark.parametrize("text", ["😀 🎉", "....", "12345678901234567890", "a" * 900, "Ünïcödé façade — naïve café.",
                                  "日本語のテキスト", "(((((nested)))))", "Hello,,,,,,,,,,,,world!!!!!!!!"])
def test_odd_text_gets_speech_or_a_clear_400(speak, text):
    response = speak(text)
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["error"]["param"] == "input"
    else:
        assert duration(response.content, "wav") > 0.1
