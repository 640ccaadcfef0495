"""Hostile messages get an error in OpenAI's shape, never a crash: deeply nested JSON and messages
over TTS_MAX_BODY_BYTES on the WebSocket (the socket stays open), deeply nested HTTP bodies (400)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.faults.conftest import connect_as, receive_event, speak

MAX_BODY_BYTES = 1_048_576  # the default TTS_MAX_BODY_BYTES
DEEP = 10_000


@pytest.mark.parametrize("message, code", [
    ("[" * DEEP + "]" * DEEP, "invalid_json"),
    ('{"a": ' * DEEP + "1" + "}" * DEEP, "invalid_json"),
    ('{"text": ' + "[" * DEEP + "]" * DEEP + "}", "invalid_json"),
    (json.dumps({"text": "a" * MAX_BODY_BYTES}), "body_too_large"),
    # bytes count, not characters
    (json.dumps({"text": "é" * (MAX_BODY_BYTES // 2 + 1)}, ensure_ascii=False), "body_too_large"),
], ids=["deep list", "deep object", "deep field", "too many bytes", "too many bytes, fewer characters"])
def test_hostile_websocket_messages_get_an_error_event_and_the_socket_stays_open(hostile_server, message, code):
    with connect_as(hostile_server.base_url, "10.14.3.1") as socket:
        socket.send(message)
        event = receive_event(socket, 30)
        assert event["type"] == "error" and event["error"]["code"] == code, event
        assert event["error"]["type"] == "invalid_request_error" and event["error"]["message"]
        assert speak(socket)["type"] == "done"


def nested(kind: str, depth: int) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("path", ["/v1/audio/speech", "/v1/audio/jobs", "/v1/audio/speech/batch"])
@pytest.mark.parametrize("depth", [DEEP, 990, 500])
@pytest.mark.parametrize("kind", ["list", "dict"])
def test_deeply_nested_http_bodies_are_refused_with_400(hostile_server, path, depth, kind):
    value = nested(kind, depth)
    item = '{"model": "tts-1", "voice": "alloy", "input": ' + value + "}"
    for body in (value, item, '{"mode": "jobs", "items": [' + item + "]}"):
        response = httpx.post(hostile_server.base_url + path, content=body, timeout=30,
                              headers={"content-type": "application/json", "X-Forwarded-For": "10.14.3.2"})
        if path.endswith("/batch") and response.status_code == 202:  # the batch refuses the item alone
            [item] = response.json()["data"]
            assert item["error"]["type"] == "invalid_request_error"
            continue
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
