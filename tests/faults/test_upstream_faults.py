"""A replay of the upstream faults of issue 44 against a real Chorus process in front of a hostile upstream
(tests/faults/hostile_upstream.py): a Retry-After of infinity, nonsense or a year, an answer that never ends, an
error body that never ends, a byte of audio, a WAV. Each is answered in our error shape (or, for a WAV, with its
samples), and the server serves normally after each; the endless answer's memory is measured. The model "brief" is
the same upstream with a breaker that stays open 3 s at most (max_cool_down_s), so that a year's Retry-After is
seen to open it and a healthy upstream to be used again within the test."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.server import ServerProcess, start_server
from tests.faults.hostile_upstream import HostileUpstream, wav_of
from tests.listener import TONE, Answer
from tests.serve import wait_until

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

SPEECH = {"model": "hostile", "voice": "hostile-voice", "response_format": "wav"}
BRIEF = {"model": "brief", "voice": "brief-voice"}
BRIEF_COOL_DOWN_S = 3  # its max_cool_down_s: longer than the first cool-down (2 s), so a year's is seen to count
LONG_TEXT = " ".join(["An upstream that never stops sending is cut off at what this text can use."] * 4)
MOST_GROWTH_MB = 250  # of the server's memory while three endless answers and a stream arrive (was 10 GB)


@pytest.fixture(scope="module")
def fronted(tmp_path_factory) -> tuple[ServerProcess, HostileUpstream]:
    folder = tmp_path_factory.mktemp("upstream-faults")
    upstream = HostileUpstream()
    (folder / "voices.yaml").write_text(f"voices:\n  hostile-voice: {{engine: upstream, model: hostile, "
                                        f"url: '{upstream.url}', timeout_s: 10, pinned: true}}\n"
                                        f"  brief-voice: {{engine: upstream, model: brief, url: '{upstream.url}', "
                                        f"max_cool_down_s: {BRIEF_COOL_DOWN_S}, pinned: true}}\n")
    server = start_server(folder / "data", calibration_sizes="1", voices_file=str(folder / "voices.yaml"))
    yield server, upstream
    server.stop()
    upstream.close()


def speak(server: ServerProcess, text: str, **extra) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/audio/speech", json={**SPEECH, "input": text, **extra}, timeout=60)


def refused_for_now(answer: httpx.Response) -> int:
    """A 503 upstream_unavailable in our error shape; its Retry-After."""
    assert answer.status_code == 503, answer.text
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
    assert answer.json()["error"]["code"] == "upstream_unavailable"
    return int(answer.headers["Retry-After"])


def breaker_state(server: ServerProcess, model: str = "hostile") -> str:
    engines = httpx.get(f"{server.base_url}/api/v1/batch/status").json()["engines"]
    return engines[model]["policy"]["breaker"]["state"]


def serves_normally(server: ServerProcess, upstream: HostileUpstream, model: dict | None = None) -> None:
    """The upstream healthy again: once a breaker that failures opened lets a probe through (within its cool-down,
    a minute at most), a request is served and the breaker closes (of SPEECH's model, or `model`'s)."""
    model = model or SPEECH
    upstream.answer = Answer()
    assert wait_until(lambda: breaker_state(server, model["model"]) != "open", 70, every_s=0.2)
    answer = speak(server, f"Served normally at {time.monotonic():.6f}.", **model)
    assert answer.status_code == 200, answer.text
    assert httpx.get(f"{server.base_url}/health").json()["upstreams"][model["model"]] == "closed"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("status", [500, 429])
@pytest.mark.parametrize("said", ["inf", "-inf", "nan", "-5", "soon", "http-date", "1e9"])
def test_an_absurd_retry_after_is_answered_with_a_bounded_one(fronted, status, said):
    server, upstream = fronted
    said = formatdate(time.time() + 3600, usegmt=True) if said == "http-date" else said
    upstream.answer = Answer("status", status, b'{"error": {"message": "not now"}}', headers={"Retry-After": said})
    assert 1 <= refused_for_now(speak(server, f"Retry after {said}, {status}.")) <= 60
    serves_normally(server, upstream)


def test_an_endless_answer_is_cut_off_and_memory_stays_bounded(fronted):
    server, upstream = fronted
    upstream.answer, upstream.sent = Answer("endless"), 0
    before, peak, done = rss_mb(server.process.pid), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(server.process.pid))
            time.sleep(0.02)

    def streamed(number: int) -> int:
        asked = {**SPEECH, "input": f"{number} {LONG_TEXT}", "stream": True, "response_format": "pcm"}
        received = 0
        try:
            with httpx.stream("POST", f"{server.base_url}/v1/audio/speech", json=asked, timeout=60) as answer:
                for data in answer.iter_bytes():
                    received += len(data)
        except httpx.RemoteProtocolError:  # cut once the upstream went past the bound
            pass
        return received

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            wholes = [pool.submit(speak, server, f"{number} {LONG_TEXT}") for number in range(3)]
            stream = pool.submit(streamed, 3)
            for whole in wholes:  # (three failures at once open the breaker: a request may be refused by it)
                refused_for_now(whole.result())
            assert any("of audio that" in whole.result().json()["error"]["message"] for whole in wholes)
            stream_bytes = stream.result()  # (refused by the open breaker, or cut)
        assert wait_until(lambda: upstream.streaming == 0, 10)  # every connection closed: it stopped sending
    finally:
        done.set()
        sampler.join(5)
    growth = peak[0] - before
    print(f"endless upstream: server RSS {before:.0f} MB -> peak {peak[0]:.0f} MB (+{growth:.0f} MB); "
          f"upstream sent {upstream.sent / 2**20:.1f} MB; the stream passed on {stream_bytes / 2**20:.1f} MB")
    assert growth < MOST_GROWTH_MB
    serves_normally(server, upstream)
    upstream.answer = Answer("endless")  # a stream alone: its audio passes on up to the bound, then it is cut
    stream_bytes = streamed(4)
    print(f"endless upstream, a stream alone: {stream_bytes / 2**20:.2f} MB passed on")
    assert 0 < stream_bytes <= (len(LONG_TEXT) / 3 + 5) * 24000 * 2  # at most one piece's bound, as 16-bit PCM
    serves_normally(server, upstream)


def test_an_error_body_that_never_ends_is_read_only_as_far_as_its_message(fronted):
    server, upstream = fronted
    upstream.answer, upstream.sent = Answer("endless_error", 500), 0
    started = time.monotonic()
    answer = speak(server, "An endless error.")
    assert "500: xxx" in answer.json()["error"]["message"] and len(answer.json()["error"]["message"]) < 1000
    refused_for_now(answer)
    assert time.monotonic() - started < 10
    assert wait_until(lambda: upstream.streaming == 0, 10) and upstream.sent < 32 * 2**20
    serves_normally(server, upstream)


@pytest.mark.parametrize("body", [b"\x01", b"", wav_of(np.zeros(0, np.int16), 24000)])
def test_an_answer_with_no_whole_sample_is_an_upstream_error(fronted, body):
    server, upstream = fronted
    upstream.answer = Answer("body", 200, body, {"content-type": "audio/wav" if body else "audio/pcm"})
    for response_format in ("wav", "mp3", "opus"):
        answer = speak(server, f"No whole sample, {len(body)} bytes.", response_format=response_format)
        assert "no audio" in answer.json()["error"]["message"]
        refused_for_now(answer)
        serves_normally(server, upstream)
        upstream.answer = Answer("body", 200, body, {"content-type": "audio/wav" if body else "audio/pcm"})
    events = speak(server, "No whole sample, streamed.", stream=True, stream_format="sse")
    assert "no audio" in json.loads(events.text.strip().split("\n\n")[-1].removeprefix("data: "))["error"]["message"]
    serves_normally(server, upstream)


def test_a_wav_answer_is_read_as_a_wav(fronted):
    server, upstream = fronted
    upstream.answer = Answer()
    raw = speak(server, "A tone, as raw PCM.", response_format="pcm")
    upstream.answer = Answer("body", 200, wav_of(np.frombuffer(TONE, "<i2"), 24000), {"content-type": "audio/wav"})
    wav = speak(server, "A tone, in a WAV.", response_format="pcm")
    assert raw.status_code == wav.status_code == 200 and wav.content == raw.content  # no header played as samples
    upstream.answer = Answer("body", 200, wav_of(np.zeros(2400), 24000, "ULAW"), {"content-type": "audio/wav"})
    answer = speak(server, "A WAV in mu-law.")
    assert "cannot be read" in answer.json()["error"]["message"]
    refused_for_now(answer)
    serves_normally(server, upstream)


def test_a_retry_after_of_a_year_opens_the_breaker_for_its_bound_and_a_healthy_upstream_is_used_again(fronted):
    """A year is answered with the bound: a minute by default; on "brief", its 3 s, for which its breaker opens
    (refusing at once, sending nothing) before the probe finds the upstream healthy and closes it."""
    server, upstream = fronted
    year = Answer("status", 500, b"{}", headers={"Retry-After": "31536000"})
    upstream.answer = year
    assert refused_for_now(speak(server, "A year, by default.")) == 60  # (one failure: its breaker stays closed)
    serves_normally(server, upstream)
    upstream.answer = year
    for number in range(3):
        assert refused_for_now(speak(server, f"A year, {number}.", **BRIEF)) == BRIEF_COOL_DOWN_S
    assert httpx.get(f"{server.base_url}/health").json()["upstreams"]["brief"] == "open"
    asked, started = len(upstream.requests), time.monotonic()
    assert 1 <= refused_for_now(speak(server, "While it is open.", **BRIEF)) <= BRIEF_COOL_DOWN_S
    assert time.monotonic() - started < BRIEF_COOL_DOWN_S and len(upstream.requests) == asked  # at once, not sent
    serves_normally(server, upstream, BRIEF)  # healthy again: the probe goes after the cool-down, and closes it


def test_a_503_whose_retry_after_is_not_ahead_counts_as_a_failure_and_opens_the_breaker(fronted):
    """Issue 52: `Retry-After: -5` or a past date read as 0 s and counted as "busy", so the breaker never opened."""
    server, upstream = fronted
    for number, said in enumerate(["-5", formatdate(time.time() - 60, usegmt=True), "5_0"]):
        upstream.answer = Answer("status", 503, b"{}", headers={"Retry-After": said})
        refused_for_now(speak(server, f"Not ahead, {number}.", **BRIEF))
    assert httpx.get(f"{server.base_url}/health").json()["upstreams"]["brief"] == "open"
    serves_normally(server, upstream, BRIEF)


@pytest.mark.parametrize("samples", [np.full(2400, np.nan, np.float32), np.full(2400, 1e30, np.float32)])
def test_a_float_wav_that_is_not_audio_is_a_500_to_retry_not_200_with_garbage(fronted, samples):
    server, upstream = fronted
    upstream.answer = Answer("body", 200, wav_of(samples, 24000, "FLOAT"), {"content-type": "audio/wav"})
    for response_format in ("pcm", "wav"):
        answer = speak(server, f"Not audio, {samples[0]}, {response_format}.", response_format=response_format)
        assert answer.status_code == 500, answer.status_code  # was 200, its samples at -32768
        assert answer.json()["error"]["code"] == "synthesis_failed" and "not playable" in answer.text
    upstream.answer = Answer("body", 200, b"<html>" + bytes(4800), {"content-type": "TEXT/HTML"})
    assert "not audio" in speak(server, "Typed in capitals.").json()["error"]["message"]
    serves_normally(server, upstream)
