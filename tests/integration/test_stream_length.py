"""A streamed answer is as long as the file of the same text (within 1%: a file is cut where its stream is), plain and
as server-sent events, on the bundled Piper voice (its durations made deterministic, so that two syntheses of one text
can be compared). A stream
of three sentences was 6% longer: its ramp cut the first sentence between words, and a voice says the words that end
an utterance slower. And a text in a script the voice cannot read is refused over HTTP, whatever the script."""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from bench.server import start_server
from tests.audio_check import duration

pytestmark = pytest.mark.slow  # a real server

THREE_SENTENCES = "The first sentence is here. A second one follows it. And the third sentence ends the text."
WITH_CLAUSES = ("When the rain stops, we will go out for a walk. The first sentence is here, and then it ends. "
                "And the third, the last one, closes the text.")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # the default stream ramp (TTS_STREAM_FIRST_CHUNK_CHARS 24): a stream's first piece is short
    process = start_server(tmp_path_factory.mktemp("stream-length"), calibration_sizes="1", piper_noise_scale="0",
                           piper_noise_w="0")
    yield process.base_url
    process.stop()


def speak(server: str, text: str, response_format: str, **streaming) -> httpx.Response:
    response = httpx.post(f"{server}/v1/audio/speech", timeout=60, json={
        "model": "tts-1", "voice": "alloy", "input": text, "response_format": response_format, **streaming})
    assert response.status_code == 200, response.text
    return response


def sse_audio(response: httpx.Response) -> bytes:
    events = [json.loads(line.removeprefix("data: ")) for line in response.text.splitlines() if line.startswith("data")]
    return b"".join(base64.b64decode(event["audio"]) for event in events if event["type"] == "speech.audio.delta")


@pytest.mark.parametrize("text", [THREE_SENTENCES, WITH_CLAUSES], ids=["sentences", "clauses"])
@pytest.mark.parametrize("response_format", ["pcm", "wav", "mp3"])
def test_file_stream_and_events_are_the_same_length(server, text, response_format):
    whole = duration(speak(server, text, response_format).content, response_format)
    streamed = duration(speak(server, text, response_format, stream=True).content, response_format)
    events = duration(sse_audio(speak(server, text, response_format, stream_format="sse")), response_format)
    assert whole > 4
    # a streamed mp3 has no header that tells its decoder the encoder's delay and padding to trim (about 68 ms)
    within = {"rel": 0.01, "abs": 0.1 if response_format == "mp3" else 0.0}
    assert streamed == pytest.approx(whole, **within) and events == pytest.approx(whole, **within), (
        whole, streamed, events)


@pytest.mark.parametrize("text, script", [("ᠮᠣᠩᠭᠣᠯ ᠬᠡᠯᠡ", "Mongolian"), ("བོད ཡིག", "Tibetan"),
                                          ("ᱚᱞ ᱪᱤᱠᱤ", "Ol Chiki"), ("مرحبا بالعالم", "Arabic")])
def test_a_text_in_a_script_the_voice_cannot_read_is_refused_naming_it(server, text, script):
    response = httpx.post(f"{server}/v1/audio/speech", timeout=60,
                          json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav"})
    assert response.status_code == 400, response.status_code
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_script", "input") and script in error["message"]
