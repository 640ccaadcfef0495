"""Streaming over HTTP: chunked audio and server-sent events, on a deterministic real voice."""

import base64
import json
import time

import httpx
import pytest

from bench.server import start_server
from tests.audio_check import duration
from tests.serve import metric, wait_until

TEXT = ("Streaming sends the first sentence as soon as it is ready. The second one follows. "
        "And then a third, a little longer than the others, closes the text.")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = start_server(tmp_path_factory.mktemp("stream"), calibration_sizes="1",
                           piper_noise_scale="0", piper_noise_w="0")  # deterministic durations
    yield process.base_url
    process.stop()


def body(text: str = TEXT, **extra) -> dict:
    return {"model": "tts-1", "voice": "alloy", "input": text, **extra}


@pytest.mark.parametrize("response_format", ["pcm", "wav", "mp3", "opus", "aac"])
def test_streamed_audio_decodes_to_the_same_duration_as_the_whole(server, response_format):
    whole = httpx.post(f"{server}/v1/audio/speech", json=body(response_format=response_format), timeout=60)
    chunks, first_chunk_at, started = [], None, time.perf_counter()
    with httpx.stream("POST", f"{server}/v1/audio/speech", timeout=60,
                      json=body(response_format=response_format, stream=True)) as response:
        assert response.status_code == 200
        assert response.headers.get("transfer-encoding") == "chunked"
        for chunk in response.iter_bytes():
            first_chunk_at = first_chunk_at or time.perf_counter() - started
            chunks.append(chunk)
    total = time.perf_counter() - started
    streamed = b"".join(chunks)
    # MP3 and AAC streams carry no gapless header, so decoders keep the encoder's padding: allow
    # two codec frames (2 x 1152 samples at 22.05 kHz) there, 60 ms elsewhere.
    tolerance = 0.11 if response_format in ("mp3", "aac") else 0.06
    assert duration(streamed, response_format) == pytest.approx(duration(whole.content, response_format),
                                                                abs=tolerance)
    assert first_chunk_at < total


def test_server_sent_events_carry_the_whole_audio(server):
    whole = httpx.post(f"{server}/v1/audio/speech", json=body(response_format="pcm"), timeout=60).content
    with httpx.stream("POST", f"{server}/v1/audio/speech", timeout=60,
                      json=body(response_format="pcm", stream_format="sse")) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"type": "speech.audio.done"}
    deltas = [event for event in events if event["type"] == "speech.audio.delta"]
    assert len(deltas) >= 3
    audio = b"".join(base64.b64decode(event["audio"]) for event in deltas)
    assert len(audio) / 2 / 24000 == pytest.approx(len(whole) / 2 / 24000, abs=0.06)


def test_time_to_first_audio_is_measured(server):
    httpx.post(f"{server}/v1/audio/speech", json=body(stream=True), timeout=60)
    text = httpx.get(f"{server}/metrics").text
    assert "tts_time_to_first_audio_seconds_count" in text and "tts_chunks_per_request_count" in text


def test_client_leaving_mid_stream_drops_the_rest(server):
    dropped = r'tts_dropped_items_total\{reason="cancelled"\}'
    before = metric(server, dropped)
    long_text = " ".join(f"Sentence {n} of a stream nobody finishes." for n in range(40))
    with httpx.stream("POST", f"{server}/v1/audio/speech", timeout=60, json=body(long_text, stream=True,
                                                                                 response_format="pcm")) as response:
        next(response.iter_bytes())  # the first audio arrived; now leave
    assert wait_until(lambda: httpx.get(f"{server}/api/v1/batch/status").json()["queue_length"] == 0, 10)
    assert metric(server, dropped) - before >= 25
