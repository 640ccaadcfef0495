"""Texts within the limits are served, or refused at once with a 400 that says why (never a 500, never a 503
to retry for ever, never a 504 after the engine worked two minutes): on a server with default settings.

Each test measures a figure: how fast a refusal comes, how long the audio of a text that is served is."""

from __future__ import annotations

import io
import json
import time
import wave

import httpx
import pytest

from bench.server import ServerProcess, start_server
from tests.faults.conftest import connect_as, receive_event, speak

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

FAST_S = 5.0  # a refusal made before any work: well under this, even on a loaded machine
DIGITS_4400 = "9" * 4400  # past the 4,300 digits Python's int() takes


@pytest.fixture(scope="module")
def default_server(tmp_path_factory) -> ServerProcess:
    """Default queue and text limits (TTS_MAX_QUEUE 512, TTS_MAX_QUEUE_PER_CALLER 128, TTS_MAX_CHARS 5000), and the
    tier a fresh server gives callers without a key."""
    process = start_server(tmp_path_factory.mktemp("text-limits"), calibration_sizes="1", operator_defaults="{}")
    yield process
    process.stop()


def post(server: ServerProcess, text: str, timeout_s: float = 150) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(f"{server.base_url}/v1/audio/speech", timeout=timeout_s,
                          json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav"})
    return response, time.monotonic() - started


def audio_seconds(response: httpx.Response) -> float:
    with wave.open(io.BytesIO(response.content)) as audio:
        return audio.getnframes() / audio.getframerate()


def assert_refused_at_once(response: httpx.Response, took_s: float, code: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == "input" and error["type"] == "invalid_request_error", error
    assert "retry-after" not in response.headers  # nothing to wait for
    assert took_s < FAST_S, took_s


@pytest.mark.parametrize("text", [
    f"Total: ${DIGITS_4400}.50 today.",
    f'<speak>You came <say-as interpret-as="ordinal">{"9" * 4900}</say-as>.</speak>',
    f'<speak><say-as interpret-as="cardinal">{"9" * 4940}</say-as></speak>',
], ids=["money", "ssml ordinal", "ssml cardinal"])
def test_a_number_that_says_more_than_the_spoken_limit_is_a_fast_400(default_server, text):
    response, took_s = post(default_server, text)
    assert_refused_at_once(response, took_s, "spoken_text_above_max_length")
    assert "the limit is 10000" in response.json()["error"]["message"]


def test_the_websocket_answers_a_long_number_with_an_error_event_and_stays_open(default_server):
    with connect_as(default_server.base_url, "10.30.6.1") as socket:
        socket.send(json.dumps({"text": f"Total: ${DIGITS_4400}.50 today."}))
        event = receive_event(socket, 30)
        assert event["type"] == "error" and event["error"]["code"] == "spoken_text_above_max_length", event
        assert speak(socket)["type"] == "done"


def test_three_thousand_characters_of_short_sentences_on_an_idle_server_are_served(default_server):
    text = " ".join(["Yes.", "No.", "Maybe."] * 200)[:3000]  # 600 sentences: 600 pieces of text unpacked
    response, took_s = post(default_server, text)
    assert response.status_code == 200, response.text
    seconds = audio_seconds(response)
    assert 100 < seconds < 600, seconds  # 600 one-word sentences: about 0.17-1 s each


def markdown_answer(length: int = 4990) -> str:
    """An answer as a language model writes one (headings, prose, lists, a small table of figures, a quote), cut
    at a line to just under `length`."""
    sections = []
    for number in range(1, 100):
        sections.append(f"""## {number}. What the figures say

The short answer is that the plan works, but it depends on the order you do things in. Start with the
parts that change least, and leave the ones that depend on outside teams for later.

- **Revenue** grew by {number}.5% in 2024, to ${number}.2 million.
- Costs fell 3% on Nov 30, 2024.
- The team shipped {number + 10} releases.
- Nothing was late.

| Step | Owner | Weeks |
|---|---|---|
| Design | Ana | {number + 1} |
| Build | Raj | {number + 3} |

> Note: estimates are rounded to the nearest week.
""")
        if sum(map(len, sections)) > length:
            break
    text = "\n".join(sections)
    return text[:text.rfind("\n", 0, length)]  # whole lines


def test_a_long_markdown_answer_is_served(default_server):
    text = markdown_answer()
    assert 4900 < len(text) <= 4990
    response, took_s = post(default_server, text)
    assert response.status_code == 200, response.text
    seconds = audio_seconds(response)
    assert 250 < seconds < 700, seconds  # about 15 characters a second of speech (5,429 said)
