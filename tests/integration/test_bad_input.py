"""Every bad input gets a 4xx with the OpenAI error JSON naming the field; the server keeps serving."""

import httpx
import pytest

from tests.integration.conftest import MAX_CHARS

GOOD = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}


@pytest.mark.parametrize("change, status, param", [
    ({"input": ""}, 400, "input"),
    ({"input": "   \n\t "}, 400, "input"),
    ({"input": "x" * (MAX_CHARS + 1)}, 400, "input"),
    ({"input": "Hello\x00 world"}, 400, "input"),
    ({"input": "Ring\x07 the bell"}, 400, "input"),
    ({"voice": "nobody"}, 400, "voice"),
    ({"voice": "../../etc/passwd"}, 400, "voice"),
    ({"model": "tts-9"}, 400, "model"),
    ({"response_format": "ogg-vorbis"}, 400, "response_format"),
    ({"speed": 0.1}, 400, "speed"),
    ({"speed": 4.5}, 400, "speed"),
    ({"speed": "fast"}, 400, "speed"),
    ({"input": 42}, 400, "input"),
    ({"voice": None}, 400, "voice"),
    ({"stream_format": "video"}, 400, "stream_format"),
    ({"stream": True, "response_format": "flac"}, 400, "response_format"),
])
def test_bad_fields(server, change, status, param):
    response = httpx.post(f"{server}/v1/audio/speech", json={**GOOD, **change}, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize("missing", ["model", "input", "voice"])
def test_missing_fields(server, missing):
    body = {key: value for key, value in GOOD.items() if key != missing}
    response = httpx.post(f"{server}/v1/audio/speech", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == missing


@pytest.mark.parametrize("content", [b'{"model": "tts-1", "input": ', b"not json", b"", b"[1, 2]"])
def test_malformed_bodies(server, content):
    response = httpx.post(f"{server}/v1/audio/speech", content=content,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    assert "error" in response.json()


def test_huge_body_is_refused_without_reading_it(server):
    response = httpx.post(f"{server}/v1/audio/speech", json={**GOOD, "input": "a " * 600_000}, timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


def test_huge_chunked_body_is_refused(server):
    def chunks():
        yield b'{"model": "tts-1", "voice": "alloy", "input": "'
        for _ in range(200):
            yield b"a" * 10_000
        yield b'"}'

    response = httpx.post(f"{server}/v1/audio/speech", content=chunks(),
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 413


def test_unknown_route_and_method_use_the_error_model(server):
    assert httpx.get(f"{server}/v1/audio/speech").json()["error"]["type"] == "invalid_request_error"
    response = httpx.get(f"{server}/v1/models/tts-9")
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_server_keeps_serving_after_bad_input(server, speak):
    httpx.post(f"{server}/v1/audio/speech", content=b"\xff\xfe garbage", timeout=30)
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    assert speak("Still here.").status_code == 200
