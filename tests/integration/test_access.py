"""API keys, tiers and rate limits on real server processes."""

import json
import subprocess
import time

import httpx
import pytest
from gradio_client import Client

from bench.server import free_port, start_server
from tests.serve import require_tools

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "access-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def tiers(free_limit: str, **extra) -> str:
    return json.dumps({"tiers": {"free": {"rate_limit": free_limit, "max_chars": 60, "sheddable": True},
                                 "pro": {"rate_limit": "100/minute", "priority": 1}},
                       "anonymous_tier": "free", **extra})


def speak(base: str, text: str = "Hi.", key: str | None = None, **headers) -> httpx.Response:
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(f"{base}/v1/audio/speech", headers=headers, timeout=60,
                      json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav"})


def new_key(base: str, tier: str, name: str = "test") -> str:
    response = httpx.post(f"{base}/admin/api/keys", headers=ADMIN, json={"name": name, "tier": tier})
    assert response.status_code == 201, response.text
    return response.json()["key"]


@pytest.fixture(scope="module")
def process(tmp_path_factory):
    process = start_server(tmp_path_factory.mktemp("access"), admin_token=TOKEN, calibration_sizes="1",
                           operator_defaults=tiers("4/minute"), log_level="info")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def server(process):
    return process.base_url


def test_anonymous_limit_with_headers_that_spoofing_and_the_ui_do_not_escape(server, process):
    for remaining in (3, 2, 1, 0):
        ok = speak(server)
        assert ok.status_code == 200
        assert ok.headers["x-ratelimit-limit"] == "4" and ok.headers["x-ratelimit-remaining"] == str(remaining)
    limited = speak(server, **{"X-Forwarded-For": "198.51.100.7"})  # not a trusted proxy: ignored
    assert limited.status_code == 429
    error = limited.json()["error"]
    assert error["type"] == "rate_limit_exceeded" and "4 per 1 minute" in error["message"]
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert limited.headers["x-ratelimit-remaining"] == "0" and int(limited.headers["x-ratelimit-reset"]) > time.time()
    with pytest.raises(Exception, match="rate limit"):
        Client(f"{server}/", verbose=False).predict("Hi.", "en_US-joe-medium", 1.0, "wav", api_name="/synthesize")
    log = process.log_path.read_text()  # an expected refusal is one line in the log, not a traceback
    assert "UI request refused (429 rate_limit_exceeded)" in log and "Traceback" not in log


def test_keys_carry_their_tier_and_revoked_or_unknown_keys_get_401(server):
    from openai import OpenAI

    pro = new_key(server, "pro", "pro customer")
    response = speak(server, key=pro)
    assert response.status_code == 200 and response.headers["x-ratelimit-limit"] == "100"
    client = OpenAI(base_url=f"{server}/v1", api_key=pro)
    assert len(client.audio.speech.create(model="tts-1", voice="alloy", input="Keyed.").content) > 0

    free = new_key(server, "free", "free customer")
    too_long = speak(server, "This text is longer than the sixty characters the free tier allows.", key=free)
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "tier_text_limit"

    keys = httpx.get(f"{server}/admin/api/keys", headers=ADMIN).json()["data"]
    assert all("key_hash" not in k and "key" not in k for k in keys)
    pro_id = next(k["id"] for k in keys if k["name"] == "pro customer")
    assert pro.startswith(next(k["prefix"] for k in keys if k["id"] == pro_id))
    assert httpx.delete(f"{server}/admin/api/keys/{pro_id}", headers=ADMIN).json()["revoked_at"]
    revoked = speak(server, key=pro)
    assert revoked.status_code == 401 and revoked.json()["error"]["type"] == "authentication_error"
    assert speak(server, key="ck-not-a-real-key").status_code == 401
    actions = [entry["action"] for entry in httpx.get(f"{server}/admin/api/audit", headers=ADMIN).json()["data"]]
    assert "api_key.create" in actions and "api_key.revoke" in actions
    assert httpx.post(f"{server}/admin/api/keys", headers=ADMIN, json={"name": "x", "tier": "gold"}).status_code == 422


def test_trusted_proxy_forwarded_addresses_are_limited_separately(tmp_path):
    process = start_server(tmp_path, calibration_sizes="1", trusted_proxies="127.0.0.1",
                           operator_defaults=tiers("2/minute"))
    try:
        alice, bob = {"X-Forwarded-For": "198.51.100.1"}, {"X-Forwarded-For": "198.51.100.2"}
        assert [speak(process.base_url, **alice).status_code for _ in range(3)] == [200, 200, 429]
        assert speak(process.base_url, **bob).status_code == 200
        # The openai client's placeholder key is not a Chorus key: the caller is anonymous.
        assert speak(process.base_url, key="sk-placeholder", **{"X-Forwarded-For": "198.51.100.3"}).status_code == 200
    finally:
        process.stop()


def test_require_api_key_mode(tmp_path):
    process = start_server(tmp_path, calibration_sizes="1", admin_token=TOKEN, require_api_key="true")
    try:
        refused = speak(process.base_url)
        assert refused.status_code == 401 and "API key is required" in refused.json()["error"]["message"]
        assert speak(process.base_url, key=new_key(process.base_url, "pro")).status_code == 200
    finally:
        process.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    require_tools("redis-server", install="apt-get install redis-server")
    port = free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(tmp_path_factory.mktemp("redis"))],
                               stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() != b"PONG":
        assert time.monotonic() < deadline, "redis did not start"
        time.sleep(0.1)
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(10)


def test_two_instances_share_one_limit_through_redis(tmp_path, redis_url):
    first, second = (start_server(tmp_path / name, calibration_sizes="1", ratelimit_storage=redis_url,
                                  operator_defaults=tiers("3/minute")) for name in ("one", "two"))
    try:
        statuses = [speak(first.base_url).status_code, speak(second.base_url).status_code,
                    speak(first.base_url).status_code, speak(second.base_url).status_code]
        assert statuses == [200, 200, 200, 429]
    finally:
        first.stop()
        second.stop()


def test_open_webui_reads_the_lists_without_a_key_then_speaks_with_one(server):
    """Open WebUI's calls, replayed: the model and voice lists in its shape (no Authorization header),
    then speech with the key its operator configured, in its body (model, input, voice: mp3 back)."""
    models = httpx.get(f"{server}/v1/audio/models").json()["models"]
    voices = httpx.get(f"{server}/v1/audio/voices").json()["voices"]
    assert {"tts-1", "piper"} <= {model["id"] for model in models}
    assert all({"id", "name"} <= set(voice) for voice in voices) and voices
    english = httpx.get(f"{server}/v1/audio/voices", params={"language": "en"}).json()["voices"]
    assert english == voices and httpx.get(f"{server}/v1/audio/voices", params={"language": "de"}).json()[
        "voices"] == []
    assert httpx.get(f"{server}/v1/audio/voices", params={"language": "en-GB"}).json()["voices"] == []
    key = new_key(server, "pro", "open-webui")
    response = httpx.post(f"{server}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                          json={"model": models[0]["id"], "input": "Hello from Open WebUI.", "voice": voices[0]["id"]})
    assert response.status_code == 200 and response.headers["content-type"] == "audio/mpeg"


def test_a_fresh_server_serves_one_persons_script_without_a_limit_in_the_way(tmp_path):
    """No configuration at all (the operator's defaults as shipped): 60 short requests in a row, as a
    script or Open WebUI reading an answer a sentence per request sends them, all succeed."""
    process = start_server(tmp_path, operator_defaults="{}", calibration_sizes="1")
    try:
        statuses = [speak(process.base_url, f"Sentence number {index}.").status_code for index in range(60)]
        assert statuses == [200] * 60
    finally:
        process.stop()
