"""Streaming over HTTP: chunked audio and server-sent events, on a deterministic real voice."""

import base64
import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from bench.server import start_server
from tests.audio_check import duration
from tests.serve import metric, wait_until

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TEXT = ("Streaming sends the first sentence as soon as it is ready. The second one follows. "
        "And then a third, a little longer than the others, closes the text.")


@pytest.fixture(scope="module")
def sentence_server(tmp_path_factory):
    # Deterministic durations, and streams cut at sentences only, as the whole is: the same audio.
    process = start_server(tmp_path_factory.mktemp("stream"), calibration_sizes="1", stream_first_chunk_chars="0",
                           piper_noise_scale="0", piper_noise_w="0")
    yield process.base_url
    process.stop()


@pytest.fixture(scope="module")
def ramp_server(tmp_path_factory):
    """Streams ramped up from a short first piece (the default), with Piper's durations deterministic so that two
    syntheses of one text can be compared."""
    process = start_server(tmp_path_factory.mktemp("ramp"), calibration_sizes="1", piper_noise_scale="0",
                           piper_noise_w="0")
    yield process.base_url
    process.stop()


RAMPED = " ".join(f"Sentence number {n} is long enough, so the stream cuts it into a few pieces." for n in range(6))


def body(text: str = TEXT, **extra) -> dict:
    return {"model": "tts-1", "voice": "alloy", "input": text, **extra}


@pytest.mark.parametrize("response_format", ["pcm", "wav", "mp3", "opus", "aac"])
def test_streamed_audio_decodes_to_the_same_duration_as_the_whole(sentence_server, response_format):
    whole = httpx.post(f"{sentence_server}/v1/audio/speech", json=body(response_format=response_format), timeout=60)
    chunks, first_chunk_at, started = [], None, time.perf_counter()
    with httpx.stream("POST", f"{sentence_server}/v1/audio/speech", timeout=60,
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


def test_server_sent_events_carry_the_whole_audio(sentence_server):
    whole = httpx.post(f"{sentence_server}/v1/audio/speech", json=body(response_format="pcm"), timeout=60).content
    with httpx.stream("POST", f"{sentence_server}/v1/audio/speech", timeout=60,
                      json=body(response_format="pcm", stream_format="sse")) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [event for event in events if event["type"] == "speech.audio.delta"]
    assert len(deltas) >= 3
    audio = b"".join(base64.b64decode(event["audio"]) for event in deltas)
    usage = events[-1].pop("usage")
    assert events[-1] == {"type": "speech.audio.done"}  # with OpenAI's usage: characters in, 20 ms frames out
    assert usage["input_tokens"] == len(body()["input"])
    assert usage["output_tokens"] == round(len(audio) / 2 / 24000 * 50)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert len(audio) / 2 / 24000 == pytest.approx(len(whole) / 2 / 24000, abs=0.06)


def test_time_to_first_audio_is_measured(sentence_server):
    httpx.post(f"{sentence_server}/v1/audio/speech", json=body(stream=True), timeout=60)
    text = httpx.get(f"{sentence_server}/metrics").text
    assert "tts_time_to_first_audio_seconds_count" in text and "tts_chunks_per_request_count" in text


def test_client_leaving_mid_stream_drops_the_rest(sentence_server):
    dropped = r'tts_dropped_items_total\{reason="cancelled"\}'
    before = metric(sentence_server, dropped)
    long_text = " ".join(f"Sentence {n} of a stream nobody finishes." for n in range(40))
    with httpx.stream("POST", f"{sentence_server}/v1/audio/speech", timeout=60, json=body(long_text, stream=True,
                                                                                 response_format="pcm")) as response:
        next(response.iter_bytes())  # the first audio arrived; now leave
    assert wait_until(lambda: httpx.get(f"{sentence_server}/api/v1/batch/status").json()["queue_length"] == 0, 10)
    assert metric(sentence_server, dropped) - before >= 25


# --- WebSocket ------------------------------------------------------------------------------------

def socket_url(server: str, path: str = "/v1/audio/speech/stream") -> str:
    return server.replace("http://", "ws://") + path


def receive_utterance(socket) -> tuple[list[dict], bytes]:
    """Events and audio of one utterance, up to its done (or error) event."""
    events, audio = [], b""
    while True:
        message = socket.recv(timeout=60)
        if isinstance(message, bytes):
            audio += message
            continue
        events.append(json.loads(message))
        if events[-1]["type"] in ("done", "error"):
            return events, audio


def test_websocket_carries_the_whole_audio_from_text_in_several_messages(sentence_server):
    whole = httpx.post(f"{sentence_server}/v1/audio/speech", json=body(response_format="wav"), timeout=60).content
    first, rest = TEXT[:40], TEXT[40:]
    with connect(socket_url(sentence_server)) as socket:
        socket.send(json.dumps({"text": first, "flush": False, "voice": "alloy"}))
        socket.send(json.dumps({"text": rest, "response_format": "wav"}))
        events, audio = receive_utterance(socket)
    assert [event["type"] for event in events] == ["started", "progress", "progress", "progress", "done"]
    assert events[0]["voice"] == "en_US-joe-medium" and events[0]["sentences"] == 3
    assert duration(audio, "wav") == pytest.approx(duration(whole, "wav"), abs=0.06)
    assert events[-1]["audio_s"] == pytest.approx(duration(whole, "wav"), abs=0.06)


def test_websocket_at_stream_with_query_text_speaks_at_once_then_takes_more(sentence_server):
    with connect(socket_url(sentence_server, "/stream?text=Hello%20from%20the%20query.&voice=alloy")) as socket:
        events, audio = receive_utterance(socket)
        assert events[-1]["type"] == "done" and len(audio) / 2 / 24000 > 0.5  # pcm by default
        socket.send(json.dumps({"text": "And a second one.", "response_format": "mp3"}))
        events, audio = receive_utterance(socket)
        assert events[-1]["type"] == "done" and events[-1]["id"] == 2
        assert duration(audio, "mp3") == pytest.approx(events[-1]["audio_s"], abs=0.11)


@pytest.mark.parametrize("message, param", [
    ("not json", None),
    (json.dumps(["a list"]), None),
    (json.dumps({"text": 5}), "text"),
    (json.dumps({"text": "hi", "speed": 99}), "speed"),
    (json.dumps({"text": "hi", "response_format": "flac"}), "response_format"),
    (json.dumps({"text": "hi", "voice": "nobody"}), "voice"),
    (json.dumps({"text": "hi", "unknown": 1}), "unknown"),
    (json.dumps({"text": "   "}), "input"),
    (b"\x00binary", None),
])
def test_bad_websocket_messages_get_an_error_event_and_the_socket_stays_open(sentence_server, message, param):
    with connect(socket_url(sentence_server)) as socket:
        socket.send(message)
        event = json.loads(socket.recv(timeout=30))
        assert event["type"] == "error" and event["error"]["type"] == "invalid_request_error"
        assert event["error"]["param"] == param and event["error"]["message"]
        socket.send(json.dumps({"text": "Still here."}))
        events, audio = receive_utterance(socket)
        assert events[-1]["type"] == "done" and audio


def test_websocket_client_leaving_drops_the_rest(sentence_server):
    dropped = r'tts_dropped_items_total\{reason="cancelled"\}'
    before = metric(sentence_server, dropped)
    long_text = " ".join(f"Sentence {n} of a socket nobody finishes." for n in range(40))
    with connect(socket_url(sentence_server)) as socket:
        socket.send(json.dumps({"text": long_text}))
        while not isinstance(socket.recv(timeout=30), bytes):
            pass  # the first audio arrived; now leave
    assert wait_until(lambda: httpx.get(f"{sentence_server}/api/v1/batch/status").json()["queue_length"] == 0, 10)
    assert metric(sentence_server, dropped) - before >= 25


def test_streams_start_with_a_short_chunk_and_still_carry_every_word(ramp_server):
    """With the default ramp, the first chunk is the first clause; the stream is the whole text, cut into more
    pieces (at clauses only: never between words), and as long as the whole file: a cut adds no pause."""
    whole = httpx.post(f"{ramp_server}/v1/audio/speech", json=body(RAMPED, response_format="pcm"), timeout=60).content
    with connect(socket_url(ramp_server)) as socket:
        socket.send(json.dumps({"text": RAMPED}))
        events, audio = receive_utterance(socket)
    progress = [event for event in events if event["type"] == "progress"]
    assert len(progress) - 6 >= 1 and progress[0]["audio_s"] < 2.5  # cut into more pieces; the first clause first
    assert len(audio) == pytest.approx(len(whole), rel=0.02)


@pytest.mark.parametrize("response_format", ["pcm", "wav", "mp3", "opus", "aac", "sse"])
def test_a_ramped_stream_is_as_long_as_the_whole_file(ramp_server, response_format):
    encoding = "pcm" if response_format == "sse" else response_format
    whole = httpx.post(f"{ramp_server}/v1/audio/speech", json=body(RAMPED, response_format=encoding), timeout=60)
    streaming = {"stream_format": "sse"} if response_format == "sse" else {"stream": True}
    streamed = httpx.post(f"{ramp_server}/v1/audio/speech", timeout=60,
                          json=body(RAMPED, response_format=encoding, **streaming))
    assert whole.status_code == streamed.status_code == 200
    if response_format == "sse":
        events = [json.loads(line[len("data: "):]) for line in streamed.text.splitlines() if line.startswith("data: ")]
        data = b"".join(base64.b64decode(event["audio"]) for event in events if event["type"] == "speech.audio.delta")
    else:
        data = streamed.content
    whole_s, streamed_s = duration(whole.content, encoding), duration(data, encoding)
    assert whole_s > 20 and streamed_s == pytest.approx(whole_s, rel=0.02), (streamed_s, whole_s)
