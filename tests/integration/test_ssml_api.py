"""SSML over HTTP with the real bundled voice: a break is silence of its length in a file, in a stream and
in a job's result; malformed SSML is a 400 in OpenAI's shape that says where."""

import time

import httpx
import numpy as np
import pytest

from tests.audio_check import decode

DOCUMENT = '<speak>The first part. <break time="1200ms"/> And the <prosody rate="slow">second</prosody>.</speak>'


def longest_silence_s(samples: np.ndarray, rate: int) -> float:
    """The longest run of samples quieter than -50 dBFS, in seconds."""
    quiet = np.concatenate([[False], np.abs(samples) < 10 ** (-50 / 20), [False]])
    edges = np.flatnonzero(np.diff(quiet.astype(np.int8)))
    runs = edges[1::2] - edges[::2]
    return float(runs.max()) / rate if runs.size else 0.0


def test_a_break_is_silence_in_the_file(speak):
    with_break = speak(DOCUMENT)
    assert with_break.status_code == 200, with_break.text
    samples, rate = decode(with_break.content, "wav")
    assert 1.2 <= longest_silence_s(samples, rate) < 1.6  # the break, and the voice's own quiet edges
    as_text = speak(DOCUMENT, input_type="text")  # the same words, the tags not read and no break
    assert as_text.status_code == 200
    assert longest_silence_s(*decode(as_text.content, "wav")) < 0.8


def test_a_break_is_silence_in_the_stream(speak):
    streamed = speak(DOCUMENT, "pcm", stream=True)
    assert streamed.status_code == 200
    assert 1.2 <= longest_silence_s(*decode(streamed.content, "pcm")) < 1.6


def test_a_job_keeps_its_input_type(server):
    body = {"model": "tts-1", "voice": "alloy", "input": "<speak>Short.</speak>", "response_format": "wav"}
    ssml_job = httpx.post(f"{server}/v1/audio/jobs", json=body, timeout=30)
    text_job = httpx.post(f"{server}/v1/audio/jobs", json={**body, "input_type": "text"}, timeout=30)
    assert ssml_job.status_code == text_job.status_code == 202
    finished = []
    for queued in (ssml_job, text_job):
        deadline = time.monotonic() + 60
        while (job := httpx.get(f"{server}{queued.headers['location']}").json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        finished.append(job)
    assert [job["status"] for job in finished] == ["succeeded", "succeeded"]


@pytest.mark.parametrize("text, extra, where", [
    ("<speak>One <break time='forever'/></speak>", {}, "line 1, column 12"),
    ("<speak>\n  <s>Open\n</speak>", {}, "line 3, column 3"),
    ("Plain words.", {"input_type": "ssml"}, "line 1, column 1"),
])
def test_malformed_ssml_is_a_400_that_says_where(speak, text, extra, where):
    response = speak(text, **extra)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_ssml" and error["param"] == "input" and where in error["message"]
