"""Kokoro voices (a tiny random Kokoro, bench/random_kokoro.py) from the registry, served by a real server next to
the bundled Piper voice: speech in every format, streams, mixes wherever a voice is named, captions, and bad
mixes answered 400."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from wyoming.tts import Synthesize, SynthesizeVoice

from bench.random_kokoro import save_random_kokoro
from bench.server import free_port, start_server
from tests.audio_check import decode, duration
from tests.integration.test_wyoming import talk, utterance

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

WYOMING_PORT = free_port()
FORMATS = {"mp3": 24000, "opus": 48000, "aac": 24000, "flac": 24000, "wav": 24000, "pcm": 24000}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kokoro")
    model = save_random_kokoro(folder / "tiny-kokoro", tiny=True)
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  '*': {{engine: kokoro, model: '{model}', pinned: true}}\n")
    process = start_server(folder / "data", voices_file=str(registry), device="cpu", calibration_sizes="1",
                           wyoming_port=str(WYOMING_PORT))
    yield process.base_url
    process.stop()


def speech(server: str, voice: str, text: str = "Hello from Kokoro.", **extra) -> httpx.Response:
    return httpx.post(f"{server}/v1/audio/speech", timeout=120, json={
        "model": "tts-1", "voice": voice, "input": text, "response_format": "wav", **extra})


def test_its_voices_are_listed_with_language_gender_and_mixing(server):
    voices = {voice["id"]: voice for voice in httpx.get(f"{server}/v1/audio/voices").json()["data"]}
    assert {"af_heart", "af_bella", "am_adam", "bf_emma", "ff_siwis"} <= set(voices)
    assert voices["am_adam"]["language"] == "en-US" and voices["am_adam"]["gender"] == "male"
    assert voices["ff_siwis"]["language"] == "fr-FR" and voices["bf_emma"]["gender"] == "female"
    assert voices["af_heart"]["engine"] == "tiny-kokoro" and voices["af_heart"]["model"] == "kokoro"
    assert voices["af_heart"]["capabilities"]["mixing"] and voices["af_heart"]["capabilities"]["word_timestamps"]
    assert not voices["en_US-joe-medium"]["capabilities"]["mixing"]
    french = httpx.get(f"{server}/v1/audio/voices", params={"language": "fr"}).json()["data"]
    assert [voice["id"] for voice in french] == ["ff_siwis"]


@pytest.mark.parametrize("response_format", list(FORMATS))
def test_speech_in_every_format(server, response_format):
    response = speech(server, "af_heart", "Speech in every format.", response_format=response_format)
    assert response.status_code == 200 and response.headers["x-chorus-voice"] == "af_heart"
    samples, rate = decode(response.content, response_format)
    assert rate == FORMATS[response_format] and samples.size > 0.5 * rate


def test_a_stream_says_what_the_whole_file_says(server):
    """(Its first piece is cut short, so that it starts soon: the pieces' pauses differ a little from the whole's.)"""
    text = "A first sentence for the stream. And a second one after it."
    whole = speech(server, "am_adam", text)
    with httpx.stream("POST", f"{server}/v1/audio/speech", timeout=120, json={
            "model": "tts-1", "voice": "am_adam", "input": text, "response_format": "wav", "stream": True}) as streamed:
        assert streamed.status_code == 200
        pieces = b"".join(streamed.iter_bytes())
    assert duration(pieces, "wav") == pytest.approx(duration(whole.content, "wav"), rel=0.1)


def test_a_mix_speaks_wherever_a_voice_is_named(server):
    text = "Two voices at once."
    mixed = speech(server, "af_heart(2)+am_adam", text)
    assert mixed.status_code == 200 and mixed.headers["x-chorus-voice"] == "af_heart(2)+am_adam"
    parts = [decode(speech(server, voice, text).content, "wav")[0] for voice in ("af_heart", "am_adam")]
    audio = decode(mixed.content, "wav")[0]
    assert all(part.shape != audio.shape or np.abs(part - audio).max() > 0.01 for part in parts)
    same = decode(speech(server, "af_heart (2) + am_adam(1)", text).content, "wav")[0]  # the same mix, spaced
    assert np.array_equal(same, audio)
    odd = speech(server, "af_heart(0.0001234)+am_adam(999.9996)")  # weights read to three decimals
    assert odd.status_code == 400 and "weight from 0.001 to 1000" in odd.json()["error"]["message"]
    weighted = speech(server, "af_heart(0.0016)+am_adam(999.9994)")
    assert weighted.headers["x-chorus-voice"] == "af_heart(0.002)+am_adam(999.999)"
    ssml = (f'<speak>Piper first. <voice name="af_heart+am_adam">{text}</voice></speak>')
    assert speech(server, "en_US-joe-medium", ssml).status_code == 200
    async def wyoming(client):
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="af_heart(2)+am_adam")).event())
        return await utterance(client)

    start, pcm = talk(WYOMING_PORT, wyoming)
    assert start.rate == 24000 and len(pcm) // 2 == audio.size
    zipped = httpx.post(f"{server}/v1/audio/speech/batch", timeout=120, json={"items": [
        {"model": "tts-1", "voice": "af_bella+af_heart", "input": text, "response_format": "wav"}]})
    assert zipped.status_code == 200 and zipped.content[:2] == b"PK"


@pytest.mark.parametrize(("voice", "message"), [
    ("af_heart+af_nobody", "'af_nobody' is not a voice"),
    ("af_heart(0)+am_adam", "'af_heart(0)' is not a voice or a voice with a weight from 0.001 to 1000"),
    ("af_heart(1" + "0" * 100 + ")+am_adam", "is not a voice or a voice with a weight from 0.001 to 1000"),
    ("af_heart+en_US-joe-medium", "mixes voices of several models"),
    ("en_US-joe-medium+en_US-joe-medium", "does not mix voices"),
    ("af_nobody", "voice 'af_nobody' does not exist"),
])
def test_a_bad_mix_or_an_unknown_voice_is_a_400_naming_it(server, voice, message):
    response = speech(server, voice)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"] and error["param"] == "voice" and error["code"] == "voice_not_found"


def test_captions_are_in_order_and_within_the_audio(server):
    text = "Every word here gets its own time."
    response = httpx.post(f"{server}/v1/audio/speech/captioned", timeout=120, json={
        "model": "tts-1", "voice": "af_bella", "input": text, "response_format": "wav"})
    assert response.status_code == 200, response.text
    answer = response.json()
    words = answer["words"]
    assert [word["word"] for word in words] == [word.strip(".") for word in text.split()]
    starts = [word["start"] for word in words]
    assert starts == sorted(starts) and all(word["start"] < word["end"] for word in words)
    assert words[-1]["end"] <= duration(base64.b64decode(answer["audio"]), "wav") + 0.001
    subtitles = httpx.post(f"{server}/v1/audio/speech/captioned", timeout=120, json={
        "model": "tts-1", "voice": "af_bella+am_adam", "input": text, "timestamps_format": "vtt"})
    assert subtitles.status_code == 200 and subtitles.text.startswith("WEBVTT")
    assert all(word.strip(".") in subtitles.text for word in text.split())
