"""The benchmark's Ray Serve peer (bench/ray_peer.py): a real Ray Serve deployment with the same
engine answers speech of the right length. Runs where Ray is installed (it is optional)."""

import httpx
import pytest

pytest.importorskip("ray")

from bench.harness import EngineAlone
from bench.server import start_ray_peer

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TEXT = "The quick brown fox jumps over the lazy dog near the river bank"


@pytest.mark.loopback_namespace
def test_ray_serve_peer_speaks_with_the_same_engine(tmp_path, monkeypatch):
    for noise in ("TTS_PIPER_NOISE_SCALE", "TTS_PIPER_NOISE_W"):  # the same durations there and here, every time
        monkeypatch.setenv(noise, "0")
    server = start_ray_peer(tmp_path, "en_US-joe-medium")
    try:
        refused = [httpx.post(f"{server.base_url}/v1/audio/speech", timeout=120, json=body)
                   for body in ({}, {"input": " ... "}, {"input": 42})]
        answers = [httpx.post(f"{server.base_url}/v1/audio/speech", timeout=120,
                              json={"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm"})
                   for _ in range(2)]
        metrics = httpx.get(f"{server.base_url}/metrics").text
    finally:
        server.stop()
    assert [answer.status_code for answer in refused] == [422, 422, 422]
    assert 'tts_batch_size_count{engine="en_US-joe-medium"}' in metrics
    alone_s = EngineAlone("en_US-joe-medium", None).speak(TEXT)
    for answer in answers:
        assert answer.status_code == 200 and answer.headers["content-type"] == "audio/pcm"
        seconds = len(answer.content) / 2 / 22050
        assert abs(seconds - alone_s) < 0.15 * alone_s, (seconds, alone_s)
