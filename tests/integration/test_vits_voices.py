"""A transformers VITS voice from the registry file, served next to the bundled Piper voice."""

import httpx
import pytest

from bench.random_vits import TINY, save_random_vits
from bench.server import start_server
from tests.audio_check import decode

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vits")
    model = save_random_vits(folder / "tiny-vits", **TINY)
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  tiny: {{engine: vits, model: '{model}', language: en}}\n")
    process = start_server(folder / "data", voices_file=str(registry), device="cpu", calibration_sizes="1")
    yield process.base_url
    process.stop()


def test_the_registry_voice_is_listed_with_its_engine_and_language(server):
    voices = {voice["id"]: voice for voice in httpx.get(f"{server}/v1/audio/voices").json()["data"]}
    assert voices["tiny"]["engine"] == "tiny-vits" and voices["tiny"]["model"] == "vits"
    assert voices["tiny"]["language"] == "en" and voices["tiny"]["sample_rate"] == 16000
    assert voices["en_US-joe-medium"]["model"] == "piper"
    engines = httpx.get(f"{server}/api/v1/batch/status").json()["engines"]
    assert set(engines) == {"en_US-joe-medium", "tiny-vits"}


@pytest.mark.parametrize("model", ["tts-1", "vits"])
def test_speech_from_the_vits_voice(server, model):
    response = httpx.post(f"{server}/v1/audio/speech", timeout=60, json={
        "model": model, "voice": "tiny", "input": "Hello there. A second sentence.", "response_format": "wav"})
    assert response.status_code == 200 and response.headers["x-chorus-voice"] == "tiny"
    samples, rate = decode(response.content, "wav")
    assert rate == 16000 and samples.size > 0.2 * rate


def test_a_model_named_as_itself_takes_only_its_own_voices(server):
    response = httpx.post(f"{server}/v1/audio/speech", timeout=60, json={
        "model": "piper", "voice": "tiny", "input": "Hello.", "response_format": "wav"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "voice_model_mismatch"


def test_a_missing_model_stops_the_start_with_a_message_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    registry = tmp_path / "voices.yaml"
    registry.write_text("voices:\n  ghost: {engine: vits, model: facebook/mms-tts-ghost}\n")
    with pytest.raises(RuntimeError) as raised:
        start_server(tmp_path / "data", voices_file=str(registry), ready_timeout_s=60)
    assert "exited with 2" in str(raised.value) and "facebook/mms-tts-ghost" in str(raised.value)
    assert "Traceback" not in str(raised.value)


def test_the_admin_reloads_the_registry_without_a_restart(tmp_path):
    first = save_random_vits(tmp_path / "first-vits", **TINY)
    second = save_random_vits(tmp_path / "second-vits", seed=1, **TINY)
    registry = tmp_path / "voices.yaml"
    registry.write_text(f"voices:\n  one: {{engine: vits, model: '{first}'}}\n")
    process = start_server(tmp_path / "data", voices_file=str(registry), device="cpu", calibration_sizes="1",
                           admin_token="reload-token")
    admin = {"Authorization": "Bearer reload-token"}
    try:
        registry.write_text(f"voices:\n  two: {{engine: vits, model: '{second}', language: de}}\n")
        summary = httpx.post(f"{process.base_url}/admin/api/voices/reload", headers=admin, timeout=60).json()
        assert summary["added"] == ["second-vits"] and summary["removed"] == ["first-vits"]
        voices = {voice["id"]: voice for voice in httpx.get(f"{process.base_url}/v1/audio/voices").json()["data"]}
        assert "one" not in voices and voices["two"]["language"] == "de"
        response = httpx.post(f"{process.base_url}/v1/audio/speech", timeout=60, json={
            "model": "tts-1", "voice": "two", "input": "Hello.", "response_format": "wav"})
        assert response.status_code == 200
        audit = httpx.get(f"{process.base_url}/admin/api/audit", headers=admin).json()["data"]
        assert audit[0]["action"] == "voices.reload"
        registry.write_text("voices: {two: {engine: tacotron, model: x}}\n")
        refused = httpx.post(f"{process.base_url}/admin/api/voices/reload", headers=admin, timeout=60)
        assert refused.status_code == 422 and "voices.two.engine" in refused.json()["error"]["message"]
    finally:
        process.stop()
