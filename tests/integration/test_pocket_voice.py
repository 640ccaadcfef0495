"""An autoregressive voice (a tiny random Pocket TTS from the registry) served by a real server:
whole files of the model's own length, streams that arrive piece by piece, requests that run
together in one step (continuous batching), and a clear 400 for what the model cannot do."""

import asyncio
import base64
import json
import math

import httpx
import pytest
from websockets.sync.client import connect

from bench.server import start_server
from tests.audio_check import decode
from tests.pocket_models import build_tiny_pocket
from tests.serve import metric, metric_total

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

FRAME_S = 1920 / 24000  # Pocket TTS: 12.5 frames a second


@pytest.fixture(scope="module")
def pocket(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pocket")
    model = build_tiny_pocket(folder / "tiny-pocket")
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  pocket: {{engine: pocket_tts, model: '{model}', fixed_length: true, "
                        "pinned: true}\n")
    # one torch thread: a tiny model's millisecond steps stall with two threads on two busy cores
    process = start_server(folder / "data", voices_file=str(registry), device="cpu", calibration_sizes="1,2",
                           trusted_proxies="127.0.0.1", torch_threads="1")
    yield process.base_url
    process.stop()


def speak(base: str, text: str, **extra) -> httpx.Response:
    return httpx.post(f"{base}/v1/audio/speech", timeout=120,
                      json={"model": "tts-1", "voice": "pocket", "input": text, "response_format": "wav", **extra})


def test_a_whole_file_has_the_models_own_length(pocket):
    response = speak(pocket, "Hello there, from an autoregressive voice.")
    assert response.status_code == 200 and response.headers["x-chorus-voice"] == "pocket"
    samples, rate = decode(response.content, "wav")
    frames = samples.size / rate / FRAME_S
    assert rate == 24000 and frames == pytest.approx(round(frames), abs=0.01) and frames > 12


def test_a_stream_arrives_in_pieces_as_frames_are_made(pocket):
    body = {"model": "tts-1", "voice": "pocket", "input": "A longer sentence, so that it takes many frames.",
            "response_format": "pcm", "stream": True}
    with httpx.stream("POST", f"{pocket}/v1/audio/speech", json=body, timeout=120) as response:
        pieces = [chunk for chunk in response.iter_raw() if chunk]
    assert len(pieces) > 3 and sum(map(len, pieces)) > 2 * 24000 * 2 * FRAME_S * 10


def test_the_websocket_speaks_with_it_too(pocket):
    with connect(pocket.replace("http", "ws") + "/v1/audio/speech/stream") as socket:
        socket.send(json.dumps({"text": "Over the socket, piece by piece.", "voice": "pocket"}))
        audio, events = b"", []
        while not events or events[-1]["type"] not in ("done", "error"):
            message = socket.recv()
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(json.loads(message))
    assert events[0]["type"] == "started" and events[-1]["type"] == "done" and len(audio) > 24000


def test_requests_from_several_callers_run_together_in_one_step(pocket):
    frames_before = metric(pocket, r'tts_frames_total\{engine="tiny-pocket"\}')
    steps_before = metric(pocket, r'tts_steps_total\{engine="tiny-pocket"\}')

    async def everyone():
        async with httpx.AsyncClient(base_url=pocket, timeout=120) as client:
            return await asyncio.gather(*(client.post(
                "/v1/audio/speech", headers={"X-Forwarded-For": f"10.5.0.{n}"},
                json={"model": "tts-1", "voice": "pocket", "input": f"Caller {n} asks for a sentence of speech.",
                      "response_format": "pcm"}) for n in range(6)))

    responses = asyncio.run(everyone())
    assert all(response.status_code == 200 for response in responses), [response.text[:300] for response in responses]
    frames = metric(pocket, r'tts_frames_total\{engine="tiny-pocket"\}') - frames_before
    steps = metric(pocket, r'tts_steps_total\{engine="tiny-pocket"\}') - steps_before
    assert frames / steps > 1.5  # frames per step: several requests advanced in each step
    engine = httpx.get(f"{pocket}/api/v1/batch/status").json()["engines"]["tiny-pocket"]
    assert engine["running"] == 0 and engine["policy"]["name"] == "adaptive" and not math.isnan(engine["steps_per_s"])


def test_a_speed_the_model_cannot_do_is_refused(pocket):
    response = speak(pocket, "Faster, please.", speed=1.5)
    assert response.status_code == 400 and response.json()["error"]["param"] == "speed"


def test_its_captioned_speech_has_words_found_in_its_audio(pocket):
    """Pocket TTS does not time its words: the captioned route finds them in its audio (aligned, or estimated where
    the aligner cannot place them in a random model's sounds), in order and inside the audio, whole, as subtitles
    and streamed; never an error. The aligner's cost is in the metrics."""
    text = "Hello there, from an autoregressive voice. It times nothing itself."
    body = {"model": "tts-1", "voice": "pocket", "input": text, "response_format": "wav"}
    whole = httpx.post(f"{pocket}/v1/audio/speech/captioned", json=body, timeout=120)
    assert whole.status_code == 200, whole.text
    answer, ways = whole.json(), {"aligned", "estimated", "aligned,estimated"}
    assert answer["word_timings"] in ways and whole.headers["x-chorus-word-timings"] == answer["word_timings"]
    assert [word["word"] for word in answer["words"]] == [word.strip(",.") for word in text.split()]
    samples, rate = decode(base64.b64decode(answer["audio"]), "wav")
    starts = [word["start"] for word in answer["words"]]
    assert starts == sorted(starts) and answer["words"][-1]["end"] <= samples.size / rate + 0.01
    srt = httpx.post(f"{pocket}/v1/audio/speech/captioned", json={**body, "timestamps_format": "srt"}, timeout=120)
    assert srt.status_code == 200 and srt.text.startswith("1\n00:00:") and "Hello" in srt.text
    streamed = httpx.post(f"{pocket}/v1/audio/speech/captioned", json={**body, "stream": True,
                                                                      "response_format": "pcm"}, timeout=120)
    lines = [json.loads(line) for line in streamed.text.splitlines()]
    assert streamed.status_code == 200 and streamed.headers["x-chorus-word-timings"] in ways
    assert all("error" not in line for line in lines)
    assert [word["word"] for line in lines for word in line["words"]] == [word.strip(",.") for word in text.split()]
    assert {line["word_timings"] for line in lines if line["words"]} <= ways
    assert metric_total(pocket, r"tts_word_timing_audio_seconds_total\{way=\"(?:aligned|estimated)\"\}") > 0
