"""slowapi's Limiter counts the HTTP routes and the WebSocket against one budget per caller, on one
counter store, and its refusal answers in the error table's shape (a real server on 127.0.0.1)."""

import json
import time

import httpx
import pytest
from limits import parse
from slowapi import Limiter
from websockets.sync.client import connect

from access.control import NAMESPACE
from app import create_app
from tests.fakes import FakeEngine
from tests.serve import serve_in_thread
from tts_core.config import Settings

LIMIT = "3/minute"


@pytest.fixture
def served(tmp_path):
    settings = Settings(data_dir=tmp_path, calibration_sizes=[1], model_aliases={}, voice_aliases={},
                        operator_defaults={"tiers": {"free": {"rate_limit": LIMIT}}, "anonymous_tier": "free"})
    app = create_app(settings, engines=[FakeEngine()])
    with serve_in_thread(app) as base:
        yield app, base


def speak(base: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/audio/speech", timeout=30,
                      json={"model": "fake", "voice": "fake-voice", "input": "Hi.", "response_format": "wav"})


def spoken_over_websocket(base: str) -> dict:
    with connect(base.replace("http", "ws") + "/v1/audio/speech/stream") as socket:
        socket.send(json.dumps({"text": "Hello there."}))
        while True:
            message = socket.recv(timeout=30)
            if isinstance(message, str) and json.loads(message)["type"] in ("done", "error"):
                return json.loads(message)


def test_http_and_websocket_share_one_budget_and_slowapis_refusal_is_in_our_shape(served):
    app, base = served
    limiter = app.state.access.limiter
    assert isinstance(limiter, Limiter) and app.state.limiter is limiter
    first = speak(base)
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining"] == "2"
    assert spoken_over_websocket(base)["type"] == "done"  # the second of the caller's three
    # the WebSocket's utterance is in the counter slowapi keeps for the caller
    reset_at, remaining = limiter.limiter.get_window_stats(parse(LIMIT), NAMESPACE, "ip:127.0.0.1", "global")
    assert remaining == 1 and reset_at > time.time()
    assert speak(base).headers["x-ratelimit-remaining"] == "0"
    refused = speak(base)
    assert refused.status_code == 429
    assert refused.json() == {"error": {"message": refused.json()["error"]["message"], "type": "rate_limit_exceeded",
                                        "param": None, "code": "rate_limit_exceeded"}}
    assert "3 per 1 minute" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60 and refused.headers["x-ratelimit-remaining"] == "0"
    assert refused.headers["x-ratelimit-limit"] == "3" and int(refused.headers["x-ratelimit-reset"]) >= time.time()
    socket_refusal = spoken_over_websocket(base)  # the WebSocket is refused from the same budget
    assert socket_refusal["type"] == "error" and "rate limit" in json.dumps(socket_refusal)
