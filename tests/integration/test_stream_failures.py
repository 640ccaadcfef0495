"""A stream that fails after its headers (here: a sentence its engine cannot say) ends as its format allows, on
a real HTTP server: an SSE `error` event, an NDJSON error line, a WebSocket error event (the socket goes on), a
raw audio body cut (no chunked end, so clients read it as incomplete); each logged as one line, with no
traceback, and counted as failed."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from dataclasses import replace

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from app import create_app
from tests.fakes import POISON, SAMPLES_PER_TOKEN, FakeEngine
from tests.serve import metric, serve_in_thread, wait_until
from tts_core.config import Settings
from tts_core.engines.contract import Capabilities, EngineInput, EngineOutput

pytestmark = pytest.mark.slow  # a real server

TEXT = "Hello there, this is fine. Then boom goes this one."


class FailsOnBoom(FakeEngine):
    """Says every sentence but one holding "boom", on which it raises (the loop fails that item alone); times
    its words (a token per character, each of the sentence's first word)."""

    capabilities = Capabilities(times_words=True)

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        return [np.full(len(text), POISON if "boom" in text else 7, dtype=np.int64)]

    def tokenize_words(self, text: str, voice: str) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(tokens, np.zeros(tokens.size, np.int64)) for tokens in self.tokenize(text, voice)]

    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        return [replace(output, token_samples=np.full(item.length, SAMPLES_PER_TOKEN))
                for item, output in zip(batch, super().synthesize(batch), strict=True)]


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


ENGINE = FailsOnBoom()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("stream-failures"), batch_policy="sequential",
                        calibration_sizes=[1], model_aliases={}, voice_aliases={})
    with serve_in_thread(create_app(settings, engines=[ENGINE])) as base:
        yield base


@pytest.fixture
def logged():
    """Every record logged meanwhile, uvicorn's too (its loggers do not propagate to the root)."""
    records = Records()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    for logger in loggers:
        logger.addHandler(records)
    yield records.records
    for logger in loggers:
        logger.removeHandler(records)


def assert_one_line(records: list[logging.LogRecord]) -> None:
    said = [record for record in records if "failed after its headers" in record.getMessage()]
    assert len(said) == 1, [record.getMessage() for record in records]
    # the engine's exception is logged whole once, where it was raised (its text stays out of the answer); the
    # surfaces add no traceback of their own
    assert [record.name for record in records if record.exc_info] == ["tts_core.scheduler.one_shot"]
    assert not [record for record in records if "unhandled error" in record.getMessage()]
    # nor the server a line of its own (a raw stream cut on purpose: "ASGI callable returned without completing")
    assert not [record.getMessage() for record in records if record.name.startswith("uvicorn")
                and record.levelno >= logging.WARNING]


def failed_streams(base: str) -> float:
    return metric(base, r'tts_requests_total\{source="api",status="500"\}')


def speak_streamed(base: str, path: str = "/v1/audio/speech", **fields) -> tuple[int, bytes]:
    body = {"model": "fake", "voice": "fake-voice", "input": TEXT, **fields}
    with httpx.stream("POST", base + path, json=body, timeout=30) as response:
        return response.status_code, response.read()  # a cut body raises RemoteProtocolError here


def test_a_raw_audio_stream_is_cut_so_the_client_knows_it_is_incomplete(server, logged):
    failed = failed_streams(server)
    received = bytearray()
    body = {"model": "fake", "voice": "fake-voice", "input": TEXT, "stream": True, "response_format": "pcm"}
    with httpx.stream("POST", server + "/v1/audio/speech", json=body, timeout=30) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):  # no chunked end: not passed off as the whole speech
            for data in response.iter_bytes():
                received += data
    assert len(received) > 0  # the first sentence's audio came before the cut
    assert_one_line(logged)
    assert failed_streams(server) == failed + 1


def test_a_client_that_hangs_up_mid_stream_is_no_error(server, logged):
    """A client that leaves mid-stream is normal: counted as gone (499), and no line above info, no traceback (issue
    52: a cut stream logged an ASGI error line)."""
    gone = metric(server, r'tts_requests_total\{source="api",status="499"\}')
    ENGINE.cost = lambda size, padded: 0.05  # 40 sentences, 2 s: the client is gone long before the last
    try:
        body = {"model": "fake", "voice": "fake-voice", "input": "This one is fine. " * 40, "stream": True,
                "response_format": "pcm"}
        with httpx.stream("POST", server + "/v1/audio/speech", json=body, timeout=30) as response:
            assert response.status_code == 200 and next(response.iter_bytes())  # the first audio; then hang up
        assert wait_until(lambda: metric(server, r'tts_requests_total\{source="api",status="499"\}') == gone + 1)
    finally:
        ENGINE.cost = lambda size, padded: 0.0
    assert not [record.getMessage() for record in logged if record.levelno >= logging.WARNING or record.exc_info]


def test_server_sent_events_end_with_an_error_event(server, logged):
    status, body = speak_streamed(server, stream_format="sse")
    events = [json.loads(line.removeprefix("data: ")) for line in body.decode().split("\n\n") if line]
    assert status == 200 and events[0]["type"] == "speech.audio.delta" and base64.b64decode(events[0]["audio"])
    last = events[-1]
    assert last["type"] == "error" and "speech.audio.done" not in [event["type"] for event in events]
    assert (last["error"]["code"], last["error"]["type"]) == ("synthesis_failed", "server_error")
    assert last["error"]["message"]
    assert_one_line(logged)


def test_captioned_lines_end_with_an_error_line(server, logged):
    status, body = speak_streamed(server, "/v1/audio/speech/captioned", stream=True, response_format="pcm")
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert status == 200 and "audio" in lines[0]
    assert lines[-1]["error"]["code"] == "synthesis_failed"
    assert_one_line(logged)


def utterance(socket) -> tuple[list[dict], int]:
    """One utterance's events up to its done or error, and the bytes of audio sent before."""
    events, audio = [], 0
    while not events or events[-1]["type"] not in ("done", "error"):
        message = socket.recv(timeout=30)
        if isinstance(message, bytes):
            audio += len(message)
        else:
            events.append(json.loads(message))
    return events, audio


def test_a_websocket_utterance_ends_with_an_error_event_and_the_socket_goes_on(server, logged):
    with connect(server.replace("http://", "ws://") + "/v1/audio/speech/stream", open_timeout=30) as socket:
        socket.send(json.dumps({"text": TEXT, "voice": "fake-voice", "model": "fake"}))
        events, audio = utterance(socket)
        assert audio and events[-1]["type"] == "error" and events[-1]["id"] == 1
        assert events[-1]["error"]["code"] == "synthesis_failed"
        socket.send(json.dumps({"text": "And this is fine too."}))
        events, audio = utterance(socket)
        assert audio and events[-1] == {"type": "done", "id": 2, "audio_s": events[-1]["audio_s"]}
    assert_one_line(logged)
