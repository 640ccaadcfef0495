"""Every bad input gets a 4xx with the OpenAI error JSON naming the field; the server keeps serving."""

import json

import httpx
import pytest
from websockets.sync.client import connect

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
    # types are strict, as OpenAI's are: no booleans or strings for numbers, nothing but booleans for flags
    ({"speed": True}, 400, "speed"),
    ({"speed": "1.5"}, 400, "speed"),
    ({"stream": "yes"}, 400, "stream"),
    ({"stream": 1}, 400, "stream"),
])
def test_bad_fields(server, change, status, param):
    response = httpx.post(f"{server}/v1/audio/speech", json={**GOOD, **change}, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]
    assert not any(words in error["message"] for words in PYDANTIC_WORDS), error["message"]


# what pydantic says, which a person reads without knowing it: the field's name is the subject instead
PYDANTIC_WORDS = ("Input should", "String should", "None", "dictionary", "Field required", "less than or equal")


@pytest.mark.parametrize("content, content_type, said", [
    (b"", "application/json", "the request body is empty: send a JSON object"),
    (b"", None, "the request body is empty: send a JSON object"),
    (json.dumps(GOOD).encode(), "text/plain",
     "the request body is not JSON: send a JSON object with Content-Type: application/json"),
    (b"[1, 2]", "application/json", "the request body must be a JSON object (of fields), not an array"),
    (json.dumps({**GOOD, "speed": float("nan")}).encode(), "application/json",
     "speed must be a number between 0.25 and 4"),
    (json.dumps({**GOOD, "speed": float("inf")}).encode(), "application/json",
     "speed must be a number between 0.25 and 4"),
    (json.dumps({**GOOD, "speed": "fast"}).encode(), "application/json", "speed must be a number between 0.25 and 4"),
    (json.dumps({**GOOD, "stream": "yes"}).encode(), "application/json", "stream must be true or false"),
])
def test_refusals_say_in_plain_words_what_was_wrong(server, content, content_type, said):
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(f"{server}/v1/audio/speech", content=content, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == said


@pytest.mark.parametrize("text", ["", "   \n\t ", "😀🎉", "| | |\n|---|---|"])
def test_inputs_that_say_nothing_share_one_code(server, text):
    response = httpx.post(f"{server}/v1/audio/speech", json={**GOOD, "input": text}, timeout=30)
    assert response.status_code == 400 and "retry-after" not in response.headers
    assert response.json()["error"]["code"] == "empty_input" and response.json()["error"]["param"] == "input"


def test_a_text_in_a_script_the_voice_cannot_speak_is_refused_naming_its_language(server, speak):
    response = httpx.post(f"{server}/v1/audio/speech", json={**GOOD, "input": "你好，世界。"}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_script" and "Chinese characters" in error["message"]
    assert "'en_US-joe-medium' (language en-us)" in error["message"]  # the bundled voice, English
    assert "no voice here can" in error["message"]
    # mixed with English, the letters it cannot speak are left out, not read as their names
    mixed, alone = speak("Hello 你好 world.", response_format="pcm"), speak("Hello world.", response_format="pcm")
    assert mixed.status_code == 200 and abs(len(mixed.content) - len(alone.content)) <= 0.1 * len(alone.content)


def test_integers_are_numbers(speak):
    assert speak("Hello.", speed=1).status_code == 200  # OpenAI takes 1 for 1.0


def test_jobs_and_batch_items_are_strict_too(server):
    job = httpx.post(f"{server}/v1/audio/jobs", json={**GOOD, "priority": True}, timeout=30)
    assert job.status_code == 400 and job.json()["error"]["param"] == "priority"
    batch = httpx.post(f"{server}/v1/audio/speech/batch", timeout=30,
                       json={"mode": "jobs", "items": [{**GOOD, "speed": True}, {**GOOD, "stream": "no"}]})
    assert [item["error"]["param"] for item in batch.json()["data"]] == ["speed", "stream"]


@pytest.mark.parametrize("message, param", [
    ({"text": "Hi.", "speed": True}, "speed"),
    ({"text": "Hi.", "speed": "1.5"}, "speed"),
    ({"text": "Hi.", "flush": "yes"}, "flush"),
    ({"text": "Hi.", "flush": 0}, "flush"),
])
def test_websocket_messages_are_strict(server, message, param):
    with connect(server.replace("http://", "ws://") + "/v1/audio/speech/stream") as socket:
        socket.send(json.dumps(message))
        error = json.loads(socket.recv(timeout=30))["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"


def test_websocket_query_settings_are_strings(server):
    """The query string can only carry strings: there, "1.5" is a speed."""
    with connect(server.replace("http://", "ws://") + "/stream?text=Hi.&speed=1.5") as socket:
        while isinstance(event := socket.recv(timeout=30), bytes) or json.loads(event)["type"] != "done":
            assert isinstance(event, bytes) or json.loads(event)["type"] != "error", event


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
    assert response.json()["error"]["code"] == "body_too_large"  # as when the length is declared


def test_unknown_route_and_method_use_the_error_model(server):
    assert httpx.get(f"{server}/v1/audio/speech").json()["error"]["type"] == "invalid_request_error"
    response = httpx.get(f"{server}/v1/models/tts-9")
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_server_keeps_serving_after_bad_input(server, speak):
    httpx.post(f"{server}/v1/audio/speech", content=b"\xff\xfe garbage", timeout=30)
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    assert speak("Still here.").status_code == 200
