"""Voice cloning on a real server (a tiny random Pocket TTS and a tiny random VibeVoice from a registry,
loaded when first asked for; a real SQLite file), with real clips: the bundled Piper voice's speech
encoded as wav, mp3, flac and ogg.

A clip makes a voice its owner (an API key, or an address) can use and others cannot see until the
admin makes it public; each bad clip, name, model or missing consent is refused saying which; the
voice can be deleted; it survives a restart; the admin's actions are audited."""

import httpx
import numpy as np
import pytest
import safetensors.numpy
from gradio_client import Client, handle_file

from bench.server import start_server
from tests.audio_check import decode
from tests.pocket_models import build_tiny_pocket, request
from tests.vibevoice_models import build_tiny_vibevoice
from tts_core.audio.encoding import encode
from tts_core.engines.piper import PiperEngine, bundled_voice_path

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "clone-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}", "X-Chorus-Actor": "ops-carol"}
CAP = 3  # cloned voices per caller on this server
TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs back home again, "
        "because the evening is cold and the fields are wide.")


def caller(n: int) -> dict:
    """An anonymous caller of its own (the server believes 127.0.0.1's X-Forwarded-For)."""
    return {"X-Forwarded-For": f"10.77.0.{n}"}


@pytest.fixture(scope="module")
def speech() -> tuple[np.ndarray, int]:
    engine = PiperEngine(bundled_voice_path())
    [output] = engine.synthesize([request(engine, TEXT, engine.voices()[0].name)])
    return output.audio, engine.sample_rate


def clip(speech, seconds: float, format_name: str = "wav", level: float = 1.0) -> bytes:
    audio, rate = speech
    return encode(level * np.resize(audio, int(seconds * rate)), rate, format_name)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cloning")
    pocket, vibe = build_tiny_pocket(folder / "tiny-pocket"), build_tiny_vibevoice(folder / "tiny-vibe")
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  pocket: {{engine: pocket_tts, model: '{pocket}', fixed_length: true}}\n"
                        f"  vibe: {{engine: vibevoice, model: '{vibe}', fixed_length: true}}\n")
    settings = dict(voices_file=str(registry), device="cpu", calibration_sizes="1", admin_token=TOKEN,
                    trusted_proxies="127.0.0.1", max_cloned_voices_per_caller=str(CAP), torch_threads="1")
    return folder / "data", settings


@pytest.fixture(scope="module")
def server(setup):
    process = start_server(setup[0], **setup[1])
    yield process
    process.stop()


def clone(base: str, data: bytes, name: str, headers: dict, filename: str = "clip.wav", **fields) -> httpx.Response:
    form = {"name": name, "model": "pocket_tts", "consent": "true", **fields}
    return httpx.post(f"{base}/v1/audio/voices", data=form, files={"audio": (filename, data)}, headers=headers,
                      timeout=120)


def speak(base: str, voice: str, headers: dict, text: str = "A few words in this voice.") -> httpx.Response:
    return httpx.post(f"{base}/v1/audio/speech", headers=headers, timeout=120,
                      json={"model": "tts-1", "voice": voice, "input": text, "response_format": "wav"})


def listed(base: str, headers: dict) -> dict[str, dict]:
    return {voice["id"]: voice for voice in httpx.get(f"{base}/v1/audio/voices", headers=headers).json()["data"]}


def test_a_clip_makes_a_voice_its_owner_lists_and_speaks_with(server, speech):
    base = server.base_url
    made = clone(base, clip(speech, 6.0), "alice", caller(1), text=TEXT)
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["id"] == "alice" and body["owner"] == "ip:10.77.0.1" and body["public"] is False
    assert body["model"] == "pocket_tts" and body["transcript"] == TEXT and body["duration_s"] == pytest.approx(6, 0.01)
    assert listed(base, caller(1))["alice"]["owner"] == "ip:10.77.0.1"
    spoken, default = speak(base, "alice", caller(1)), speak(base, "pocket", caller(1))
    assert spoken.status_code == 200 and spoken.headers["x-chorus-voice"] == "alice"
    mine, theirs = decode(spoken.content, "wav")[0], decode(default.content, "wav")[0]
    assert mine.size == theirs.size and not np.allclose(mine, theirs)
    assert (server_data(server) / "voices/cloned/tiny-pocket/alice.safetensors").is_file()


def server_data(server):
    return server.log_path.parent


@pytest.mark.parametrize("format_name", ["mp3", "flac", "opus"])
def test_each_container_makes_a_voice_whatever_the_file_is_called(server, speech, format_name):
    made = clone(server.base_url, clip(speech, 4.0, format_name), f"in-{format_name}", caller(2), filename="x.txt")
    assert made.status_code == 201, made.text
    assert speak(server.base_url, f"in-{format_name}", caller(2)).status_code == 200


def test_a_voice_is_cloned_for_the_model_asked_for(server, speech):
    made = clone(server.base_url, clip(speech, 4.0), "vibe-clone", caller(15), model="vibevoice")
    assert made.status_code == 201 and (made.json()["model"], made.json()["engine"]) == ("vibevoice", "tiny-vibe")
    spoken = speak(server.base_url, "vibe-clone", caller(15))
    assert spoken.status_code == 200 and spoken.headers["x-chorus-voice"] == "vibe-clone"
    tensors = safetensors.numpy.load_file(server_data(server) / "voices/cloned/tiny-vibe/vibe-clone.safetensors")
    assert list(tensors) == ["acoustic_latents"]  # as the model's own voice files name them


def test_others_cannot_see_or_use_a_voice_until_the_admin_makes_it_public(server, speech):
    base = server.base_url
    key = httpx.post(f"{base}/admin/api/keys", headers=ADMIN, json={"name": "bob", "tier": "free"}).json()["key"]
    bob = {"Authorization": f"Bearer {key}", **caller(3)}
    made = clone(base, clip(speech, 5.0), "bobs-voice", bob)
    assert made.status_code == 201 and made.headers["x-ratelimit-remaining"] == "9"  # counted like a speech request
    assert speak(base, "bobs-voice", bob).headers["x-ratelimit-remaining"] == "8"
    stranger = caller(3)  # the same address without the key: another caller
    missing = speak(base, "no-such-voice", stranger).json()["error"]
    hidden = speak(base, "bobs-voice", stranger).json()["error"]
    assert (hidden["code"], hidden["param"], hidden["type"]) == (missing["code"], missing["param"], missing["type"])
    assert "bobs-voice" not in hidden["message"].split("available")[1] and "bobs-voice" not in listed(base, stranger)
    published = httpx.put(f"{base}/admin/api/voices/cloned/bobs-voice/public", headers=ADMIN, json={"public": True})
    assert published.status_code == 200 and published.json()["public"] is True
    assert speak(base, "bobs-voice", stranger).status_code == 200
    assert "owner" not in listed(base, stranger)["bobs-voice"] and listed(base, bob)["bobs-voice"]["owner"] == "key:1"
    httpx.put(f"{base}/admin/api/voices/cloned/bobs-voice/public", headers=ADMIN, json={"public": False})
    assert speak(base, "bobs-voice", stranger).status_code == 400


def test_its_owner_deletes_it_and_nobody_else_can(server, speech):
    base = server.base_url
    assert clone(base, clip(speech, 4.0), "short-lived", caller(4)).status_code == 201
    path = server_data(server) / "voices/cloned/tiny-pocket/short-lived.safetensors"
    other = httpx.delete(f"{base}/v1/audio/voices/short-lived", headers=caller(5))
    assert other.status_code == 404 and speak(base, "short-lived", caller(4)).status_code == 200
    deleted = httpx.delete(f"{base}/v1/audio/voices/short-lived", headers=caller(4))
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert not path.exists() and "short-lived" not in listed(base, caller(4))
    assert speak(base, "short-lived", caller(4)).json()["error"]["code"] == "voice_not_found"
    assert clone(base, clip(speech, 4.0), "short-lived", caller(5)).status_code == 201  # the name is free again
    assert speak(base, "short-lived", caller(5)).headers["x-chorus-cache"] == "miss"  # not the old voice's audio


@pytest.mark.parametrize("make, code", [
    (lambda speech: clip(speech, 1.5), "audio_too_short"),
    (lambda speech: clip(speech, 34.0, "mp3"), "audio_too_long"),
    (lambda speech: clip(speech, 5.0, level=0.0), "audio_silent"),
    (lambda speech: b"%PDF-1.4 " + bytes(range(256)) * 100, "audio_unreadable"),
])
def test_a_clip_that_cannot_make_a_voice_gets_a_400_that_says_why(server, speech, make, code):
    refused = clone(server.base_url, make(speech), "never", caller(6))
    error = refused.json()["error"]
    assert refused.status_code == 400 and (error["param"], error["code"]) == ("audio", code), error


def test_a_clip_over_the_body_limit_gets_a_413(server, speech):
    refused = clone(server.base_url, clip(speech, 29.0) * 2, "too-big", caller(6))  # over 1 MiB
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("name, fields, status, param", [
    ("pocket", {}, 409, "name"),  # a configured voice's name
    ("alloy", {}, 409, "name"),  # an alias
    ("fresh", {"consent": "false"}, 400, "consent"),
    ("fresh", {"model": "piper"}, 400, "model"),  # Piper cannot clone
    ("fresh", {"model": "tts-1"}, 400, "model"),  # an alias of Piper
    ("fresh", {"model": "no-such-model"}, 400, "model"),
    ("../../etc", {}, 400, "name"),
])
def test_refusals_name_the_field_at_fault(server, speech, name, fields, status, param):
    refused = clone(server.base_url, clip(speech, 4.0), name, caller(7), **fields)
    assert refused.status_code == status and refused.json()["error"]["param"] == param, refused.text


def test_consent_must_be_given_and_a_name_is_taken_once(server, speech):
    base = server.base_url
    no_consent = httpx.post(f"{base}/v1/audio/voices", data={"name": "x", "model": "pocket_tts"},
                            files={"audio": ("a.wav", clip(speech, 4.0))}, headers=caller(8))
    assert no_consent.status_code == 400 and no_consent.json()["error"]["param"] == "consent"
    assert clone(base, clip(speech, 4.0), "twice", caller(8)).status_code == 201
    again = clone(base, clip(speech, 4.0), "twice", caller(9))
    assert again.status_code == 409 and again.json()["error"]["code"] == "voice_exists"


def test_a_caller_may_keep_only_so_many(server, speech):
    for n in range(CAP):
        assert clone(server.base_url, clip(speech, 3.5), f"many-{n}", caller(10)).status_code == 201
    refused = clone(server.base_url, clip(speech, 3.5), "one-more", caller(10))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "cloned_voice_limit"


def test_the_ui_clones_a_voice_for_its_browsers_caller(server, speech, tmp_path):
    path = tmp_path / "recording.wav"
    path.write_bytes(clip(speech, 4.0))
    client = Client(f"{server.base_url}/", verbose=False)
    message, voices = client.predict(handle_file(str(path)), "from-the-ui", "tiny-pocket", "", True,
                                     api_name="/clone_voice")
    client.close()
    assert "from-the-ui" in message and voices["value"] == "from-the-ui"
    assert listed(server.base_url, {})["from-the-ui"]["owner"] == "ip:127.0.0.1"  # the browser's address
    assert "from-the-ui" not in listed(server.base_url, caller(11))


def test_the_admin_lists_and_every_action_is_audited(server, speech):
    base = server.base_url
    assert clone(base, clip(speech, 4.0), "audited", caller(12)).status_code == 201
    rows = {row["name"]: row for row in httpx.get(f"{base}/admin/api/voices/cloned", headers=ADMIN).json()["data"]}
    row = rows["audited"]
    assert (row["model"], row["owner"], row["public"]) == ("tiny-pocket", "ip:10.77.0.12", False)
    assert row["duration_s"] == pytest.approx(4.0, 0.01) and row["created_at"] and row["consent_at"]
    assert "path" not in row and httpx.get(f"{base}/admin/api/voices/cloned", headers={}).status_code == 401
    httpx.put(f"{base}/admin/api/voices/cloned/audited/public", headers=ADMIN, json={"public": True})
    assert httpx.delete(f"{base}/admin/api/voices/cloned/audited", headers=ADMIN).status_code == 200
    assert httpx.delete(f"{base}/admin/api/voices/cloned/audited", headers=ADMIN).status_code == 404
    audit = httpx.get(f"{base}/admin/api/audit", headers=ADMIN).json()["data"]
    mine = [(entry["action"], entry["actor"]) for entry in audit if entry["key"] == "cloned_voice:audited"]
    assert mine == [("cloned_voice.delete", "ops-carol"), ("cloned_voice.public", "ops-carol"),
                    ("cloned_voice.create", "ip:10.77.0.12")]


def test_cloned_voices_survive_a_restart(server, setup, speech):
    """Last: it restarts the server. The model loads when first asked for, and gets its voices then."""
    base = server.base_url
    for name in ("kept", "kept-public"):
        assert clone(base, clip(speech, 4.0), name, caller(13)).status_code == 201
    httpx.put(f"{base}/admin/api/voices/cloned/kept-public/public", headers=ADMIN, json={"public": True})
    server.stop()
    again = start_server(setup[0], **setup[1])
    try:
        status = httpx.get(f"{again.base_url}/api/v1/batch/status").json()["engines"]["tiny-pocket"]
        assert status["loaded"] is False
        assert listed(again.base_url, caller(13))["kept"]["owner"] == "ip:10.77.0.13"
        assert "kept" not in listed(again.base_url, caller(14))
        assert speak(again.base_url, "kept", caller(13)).status_code == 200
        assert speak(again.base_url, "kept-public", caller(14)).status_code == 200
        assert speak(again.base_url, "kept", caller(14)).status_code == 400
    finally:
        again.stop()
