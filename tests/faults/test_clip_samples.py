"""A float clip holding NaN, infinity or samples far past full scale is refused with 400 naming the
problem (it answered 500 `synthesis_failed` once the codec read it), on a real server's upload route."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
import soundfile

from bench.server import start_server
from tests.pocket_models import build_tiny_pocket

pytestmark = pytest.mark.slow  # a real server

RATE = 16000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip-samples")
    pocket = build_tiny_pocket(folder / "tiny-pocket")
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  pocket: {{engine: pocket_tts, model: '{pocket}', fixed_length: true}}\n")
    process = start_server(folder / "data", voices_file=str(registry), device="cpu", calibration_sizes="1",
                           trusted_proxies="127.0.0.1", torch_threads="1")
    yield process.base_url
    process.stop()


def float_wav(audio: np.ndarray) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, audio, RATE, format="WAV", subtype="FLOAT")
    return out.getvalue()


def speech_like(seconds: float = 4.0) -> np.ndarray:
    times = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * times) * (1 + np.sin(2 * np.pi * 3 * times))).astype(np.float32)


def clone(server: str, data: bytes, name: str) -> httpx.Response:
    return httpx.post(f"{server}/v1/audio/voices", timeout=120, headers={"X-Forwarded-For": "10.78.0.1"},
                      data={"name": name, "model": "pocket_tts", "consent": "true"}, files={"audio": ("c.wav", data)})


@pytest.mark.parametrize("bad, words", [(np.nan, "not numbers"), (np.inf, "not numbers"), (-np.inf, "not numbers"),
                                        (1e30, "full scale")])
def test_a_clip_with_samples_that_are_no_audio_is_refused_naming_why(server, bad, words):
    audio = speech_like()
    audio[RATE: RATE + 100] = bad
    response = clone(server, float_wav(audio), "odd")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("audio_unreadable", "audio", "invalid_request_error")
    assert words in error["message"]


def test_a_clip_all_nan_is_refused_and_the_server_goes_on(server):
    assert clone(server, float_wav(np.full(4 * RATE, np.nan, np.float32)), "nans").status_code == 400
    over_a_little = speech_like() * 3.0  # a float mix that clips is still a recording
    made = clone(server, float_wav(over_a_little), "loud")
    assert made.status_code == 201, made.text
