"""Request accounting: every answer is counted with the status the caller really got (499 when it
left first), from the API, the WebSocket and the UI, and streams report their audio seconds."""

import json
import re
import socket
import threading

import httpx
import pytest
from gradio_client import Client
from websockets.sync.client import connect

from app import create_app
from tests.fakes import FakeEngine
from tests.serve import metric, serve_in_thread, wait_until
from tts_core.config import Settings


@pytest.fixture
def world(tmp_path):
    engine = FakeEngine()  # its gate holds calls, so a client can leave mid-request
    settings = Settings(data_dir=tmp_path, batch_policy="sequential", calibration_sizes=[1], model_aliases={},
                        voice_aliases={}, operator_defaults={"anonymous_tier": "enterprise"})
    app = create_app(settings, engines=[engine])
    with serve_in_thread(app) as base:
        engine.calls_started = threading.Semaphore(0)  # count calls after warm-up only
        yield base, app.state.service.metrics, engine


def answered(base: str, source: str, status: int) -> float:
    return metric(base, rf'tts_requests_total\{{source="{source}",status="{status}"\}}')


def body(**extra) -> dict:
    return {"model": "fake", "voice": "fake-voice", "input": "One sentence. And a second one.", **extra}


@pytest.mark.parametrize("extra", [{"stream": True, "response_format": "pcm"},
                                   {"stream_format": "sse", "response_format": "pcm"}])
def test_streams_report_their_audio_seconds(world, extra):
    base, metrics, _ = world
    response = httpx.post(f"{base}/v1/audio/speech", json=body(**extra), timeout=30)
    assert response.status_code == 200
    assert wait_until(lambda: metrics.audio_throughput() > 0)


def test_a_stream_the_client_leaves_is_counted_as_499(world):
    base, _, engine = world
    engine.gate.clear()  # the stream's first piece never comes while the client is there
    host, port = base.removeprefix("http://").split(":")
    payload = json.dumps(body(stream=True, response_format="pcm")).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        assert engine.calls_started.acquire(timeout=10)
        headers = sock.recv(4096)  # the 200 status line and headers come at once; then the client leaves
        assert b" 200 " in headers.split(b"\r\n")[0]
    engine.gate.set()
    assert wait_until(lambda: answered(base, "api", 499) == 1, 15)
    assert answered(base, "api", 200) == 0


def test_websocket_utterances_cut_off_or_never_started_are_counted_as_499(world):
    base, _, engine = world
    engine.gate.clear()
    with connect(base.replace("http", "ws") + "/v1/audio/speech/stream") as ws:
        ws.send(json.dumps({"text": "First utterance.", "voice": "fake-voice"}))
        ws.send(json.dumps({"text": "Second utterance, still pending.", "voice": "fake-voice"}))
        assert json.loads(ws.recv())["type"] == "started"
        assert engine.calls_started.acquire(timeout=10)
    engine.gate.set()
    assert wait_until(lambda: answered(base, "websocket", 499) == 2, 15)
    assert answered(base, "websocket", 200) == 0


def test_ui_errors_are_counted_with_their_status(world):
    base, _, _ = world
    client = Client(f"{base}/", verbose=False)
    with pytest.raises(Exception, match="empty"):
        client.predict("   ", "fake-voice", 1.0, "wav", api_name="/synthesize")
    assert wait_until(lambda: answered(base, "ui", 400) == 1)
    assert answered(base, "ui", 200) == 0


def test_the_counts_are_by_real_outcome(world):
    base, _, _ = world
    assert httpx.post(f"{base}/v1/audio/speech", json=body(response_format="wav"), timeout=30).status_code == 200
    assert wait_until(lambda: answered(base, "api", 200) == 1)
    text = httpx.get(f"{base}/metrics").text
    assert not re.search(r'tts_requests_total\{source="api",status="499"\} [1-9]', text)
