"""Issue #30's smaller defects, on a real server that can clone (a tiny Pocket TTS from a registry, never
loaded here: every refusal comes before the engine) and requires API keys:

- a clip whose header is odd (0 bits, channels or rate; an encoding FFmpeg cannot decode; sizes far past
  the bytes; cut short) answers 400 param audio with its code, never a 500, and the server keeps serving;
- JSON nested 50,000 deep answers 422 (admin) or 400 invalid_json, never a 500 (RecursionError);
- a voice name must match whole: "trail\\n" is refused (re.match's "$" matched before a final newline);
- consent is the word true only (a form bool took "yes", "1" and "on");
- /metrics and /api/v1/batch/status need a key where keys are required (or TTS_METRICS_TOKEN), the probes
  stay open."""

from __future__ import annotations

import struct

import httpx
import numpy as np
import pytest

from app import create_app
from bench.server import start_server
from tests.fakes import FakeEngine
from tests.pocket_models import build_tiny_pocket
from tests.serve import serve_in_thread
from tts_core.config import Settings

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

ADMIN_TOKEN = "small-defects-admin"
METRICS_TOKEN = "small-defects-scraper"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
RATE = 16000
DEEP = 50_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small-defects")
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  pocket: {{engine: pocket_tts, model: '{build_tiny_pocket(folder / 'tiny')}'}}\n")
    process = start_server(folder / "data", voices_file=str(registry), device="cpu", calibration_sizes="1",
                           admin_token=ADMIN_TOKEN, metrics_token=METRICS_TOKEN, require_api_key="true",
                           torch_threads="1")
    yield process.base_url
    process.stop()


@pytest.fixture(scope="module")
def key(server) -> dict:
    made = httpx.post(f"{server}/admin/api/keys", headers=ADMIN, json={"name": "small", "tier": "enterprise"})
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['key']}"}


def wav(channels: int = 1, rate: int = RATE, bits: int = 16, encoding: int = 1, seconds: float = 4.0,
        data_size: int | None = None) -> bytes:
    """A wav file whose header says what the arguments say, whatever its samples are (16-bit speech-loud)."""
    samples = (np.sin(np.arange(int(seconds * RATE)) / 10) * 10_000).astype("<i2").tobytes()
    block = channels * bits // 8
    header = struct.pack("<HHIIHH", encoding, channels, rate, (rate * block) & 0xFFFFFFFF, block & 0xFFFF, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + header + b"data" + struct.pack(
        "<I", len(samples) if data_size is None else data_size) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


def clone(server: str, key: dict, data: bytes, name: str = "fresh", consent: str = "true") -> httpx.Response:
    return httpx.post(f"{server}/v1/audio/voices", headers=key, timeout=60, files={"audio": ("clip.wav", data)},
                      data={"name": name, "model": "pocket_tts", "consent": consent})


def assert_error(response: httpx.Response, status: int, param: str | None, code: str) -> None:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code) and error["message"], error


@pytest.mark.parametrize("data, code", [
    (wav(bits=0), "audio_unreadable"),  # was a 500: 'AudioStream' object has no attribute 'sample_rate'
    (wav(bits=65535), "audio_unreadable"),
    (wav(encoding=3), "audio_unreadable"),  # float samples of 16 bits: no decoder
    (wav(encoding=0xFFFE), "audio_unreadable"),  # "extensible" without its extension
    (wav(channels=0), "audio_unreadable"),
    (wav(channels=65535), "audio_unreadable"),
    (wav(rate=0), "audio_unreadable"),
    (wav(rate=0xFFFFFFFF), "audio_unreadable"),
    (wav(seconds=1.0, data_size=0xFFFFFFFF), "audio_too_short"),  # the size says 4 GiB; the bytes are 1 s
    (wav(rate=10**9), "audio_too_short"),  # 64,000 samples at a billion a second
    (wav(rate=1), "audio_too_long"),
    (wav()[:30], "audio_unreadable"),  # cut inside the header
    (wav()[:44], "audio_unreadable"),  # a header and no samples
], ids=["0 bits", "65535 bits", "float 16 bits", "extensible", "0 channels", "65535 channels", "0 rate",
        "huge rate", "huge data size", "billion rate", "rate 1", "cut in header", "no samples"])
def test_a_clip_with_an_odd_header_gets_a_400_that_says_so(server, key, data, code):
    assert_error(clone(server, key, data), 400, "audio", code)
    assert httpx.get(f"{server}/health").status_code == 200


@pytest.mark.parametrize("consent", ["yes", "1", "on", "True", "TRUE", " true"])
def test_consent_is_the_word_true_only(server, key, consent):
    assert_error(clone(server, key, b"not audio", consent=consent), 400, "consent", "consent_required")


def test_consent_true_passes_on_to_the_clip(server, key):
    assert_error(clone(server, key, b"not audio"), 400, "audio", "audio_unreadable")


@pytest.mark.parametrize("name", ["trail\n", "trail\n\n", "\ntrail", "tr\nail", "trail\r"])
def test_a_voice_name_must_match_whole(server, key, name):
    assert_error(clone(server, key, b"not audio", name=name), 400, "name", "invalid_name")


def test_names_with_a_final_newline_are_refused_where_requests_name_voices_and_languages(server, key):
    """pydantic's patterns (Rust regex, where "$" is the end of the text) already refuse them: kept so."""
    for body in ({"voice": "alloy\n"}, {"voice": "alloy", "language": "en\n"}):
        spoken = httpx.post(f"{server}/v1/audio/speech", headers=key, timeout=30,
                            json={"model": "tts-1", "input": "Hello.", **body})
        assert spoken.status_code == 400, spoken.text
    assert httpx.get(f"{server}/v1/audio/jobs/job_ab%0A", headers=key).status_code == 400


def nested(kind: str, depth: int) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("depth", [DEEP, 995, 150])
def test_deep_json_in_the_admin_settings_is_refused_with_422(server, kind, depth):
    """The admin route reads its own body: 50,000 deep was a RecursionError and a 500."""
    for body in (nested(kind, depth), '{"tiers": ' + nested(kind, depth) + "}",
                 '{"anonymous_tier": ' + nested(kind, depth) + "}"):
        changed = httpx.put(f"{server}/admin/api/settings", headers=ADMIN, content=body, timeout=30)
        assert changed.status_code == 422, changed.text[:500]
        assert changed.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{server}/admin/api/settings", headers=ADMIN).status_code == 200


@pytest.mark.parametrize("method, path, status", [
    ("POST", "/v1/audio/speech", 400), ("POST", "/v1/audio/jobs", 400), ("POST", "/v1/audio/speech/batch", 400),
    ("POST", "/admin/api/keys", 422), ("POST", "/admin/api/lexicon", 422), ("PUT", "/admin/api/settings", 422)])
def test_json_too_deep_for_python_says_invalid_json_on_every_route(server, key, method, path, status):
    """FastAPI parses these bodies with json.loads; past Python's stack it answered a bare 400 (no code)."""
    headers = ADMIN if path.startswith("/admin/") else key
    answer = httpx.request(method, server + path, content=nested("dict", DEEP), timeout=30,
                           headers={**headers, "content-type": "application/json"})
    assert_error(answer, status, None, "invalid_json")


def test_status_and_metrics_need_a_key_where_keys_are_required(server, key):
    for path in ("/metrics", "/api/v1/batch/status"):
        for headers in ({}, {"Authorization": "Bearer ck-not-a-key"}, {"Authorization": "Bearer wrong-token"}):
            refused = httpx.get(server + path, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
            assert refused.headers["www-authenticate"] == "Bearer"
        assert httpx.get(server + path, headers=key).status_code == 200
        assert httpx.get(server + path, headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).status_code == 200
    assert "tts_requests_total" in httpx.get(f"{server}/metrics", headers=key).text
    assert httpx.get(f"{server}/health").status_code == 200 and httpx.get(f"{server}/ready").status_code == 200


def test_a_metrics_token_alone_closes_status_and_metrics_to_anonymous_callers(tmp_path):
    settings = Settings(data_dir=tmp_path, metrics_token=METRICS_TOKEN, calibration_sizes=[1], model_aliases={},
                        voice_aliases={})
    with serve_in_thread(create_app(settings, engines=[FakeEngine()])) as base:
        for path in ("/metrics", "/api/v1/batch/status"):
            assert httpx.get(base + path).status_code == 401
            assert httpx.get(base + path, headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).status_code == 200
        spoken = httpx.post(f"{base}/v1/audio/speech", json={"model": "fake", "voice": "fake-voice", "input": "hi"})
        assert spoken.status_code == 200, spoken.text  # speech stays open to anonymous callers
