"""`normalize` and `normalization_options` over HTTP and the WebSocket: accepted by every route that
takes a speech body, applied (the fake engine makes 100 samples per character spoken, so the audio's
length tells what was said), and refused in OpenAI's error shape when misspelt or of the wrong type."""

import io
import json
import time
import zipfile

import httpx
import pytest
from websockets.sync.client import connect

from app import create_app
from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine
from tests.serve import serve_in_thread
from tts_core.config import Settings

TEXT = "It costs $5."
SAID, AS_WRITTEN = "It costs five dollars.", "It costs $5."


def seconds(text: str) -> float:
    return round(len(text) * SAMPLES_PER_TOKEN / 16000, 3)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    # many requests from one address: a tier without a rate limit
    settings = Settings(data_dir=tmp_path_factory.mktemp("normalization"), calibration_sizes=[1], model_aliases={},
                        voice_aliases={}, operator_defaults={"cache_enabled": False, "anonymous_tier": "enterprise"})
    with serve_in_thread(create_app(settings, engines=[FakeEngine()])) as url:
        yield url


def body(**extra) -> dict:
    return {"model": "fake", "voice": "fake-voice", "input": TEXT, "response_format": "wav", **extra}


@pytest.mark.parametrize("extra, spoken", [
    ({}, SAID), ({"normalize": False}, AS_WRITTEN), ({"normalization_options": {"currency_normalization": False}},
                                                       AS_WRITTEN),
    ({"normalization_options": {"normalize": False}}, AS_WRITTEN),  # Kokoro-FastAPI's spelling of the switch
    ({"normalize": True, "normalization_options": {"unit_normalization": False}}, SAID),
])
def test_speech_takes_the_options(base, extra, spoken):
    response = httpx.post(f"{base}/v1/audio/speech", json=body(**extra), timeout=30)
    assert response.status_code == 200, response.text
    assert float(response.headers["x-chorus-audio-duration"]) == seconds(spoken)


@pytest.mark.parametrize("extra, code", [
    ({"normalization_options": {"unit_normalisation": False}}, "unknown_option"),
    ({"normalization_options": {"unit_normalization": "no"}}, "bool_type"),
    ({"normalization_options": "off"}, "model_attributes_type"), ({"normalize": "false"}, "bool_type"),
])
def test_a_bad_option_is_refused_in_openais_shape(base, extra, code):
    response = httpx.post(f"{base}/v1/audio/speech", json=body(**extra), timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code
    assert error["param"] == next(iter(extra)) and error["message"]
    if code == "unknown_option":
        assert "'unit_normalisation'" in error["message"] and "unit_normalization" in error["message"]


def test_jobs_and_batch_items_take_the_options(base):
    queued = httpx.post(f"{base}/v1/audio/jobs", json=body(normalize=False), timeout=30)
    assert queued.status_code == 202, queued.text
    job_url = f"{base}{queued.headers['location']}"
    deadline = time.monotonic() + 30
    while (job := httpx.get(job_url).json())["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job["status"] == "succeeded" and job["audio_s"] == pytest.approx(seconds(AS_WRITTEN), abs=0.001)

    items = [body(), body(normalize=False), body(normalization_options={"bogus": True})]
    zipped = httpx.post(f"{base}/v1/audio/speech/batch", json={"items": items}, timeout=30)
    manifest = json.loads(zipfile.ZipFile(io.BytesIO(zipped.content)).read("manifest.json"))["items"]
    assert [item.get("audio_s") for item in manifest[:2]] == [seconds(SAID), seconds(AS_WRITTEN)]
    assert manifest[2]["error"]["param"] == "normalization_options"


def test_the_websocket_takes_the_options_for_what_follows(base):
    def utterance(socket, message: dict) -> dict:
        socket.send(json.dumps(message))
        while True:
            event = socket.recv()
            if isinstance(event, str) and json.loads(event)["type"] in ("done", "error"):
                return json.loads(event)

    with connect(base.replace("http://", "ws://") + "/v1/audio/speech/stream?voice=fake-voice&model=fake") as socket:
        assert utterance(socket, {"text": TEXT})["audio_s"] == seconds(SAID)
        assert utterance(socket, {"text": TEXT, "normalize": False})["audio_s"] == seconds(AS_WRITTEN)
        assert utterance(socket, {"text": TEXT})["audio_s"] == seconds(AS_WRITTEN)  # a setting lasts
        refused = utterance(socket, {"text": TEXT, "normalization_options": {"unit_normalisation": False}})
        assert refused["error"]["param"] == "normalization_options" and refused["error"]["code"] == "unknown_option"
        options = {"normalize": True, "normalization_options": {"currency_normalization": True}}
        assert utterance(socket, {"text": TEXT, **options})["audio_s"] == seconds(SAID)  # the socket stayed open
