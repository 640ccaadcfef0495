"""Cloned voices across replicas: two real servers (each its own data dir) on one SQLite database, with a
tiny random Pocket TTS. A voice cloned through one is listed and spoken by the other within 2 s, its
model loaded then or already; made public there, deleted there, it follows within 2 s too; a replica
started afterwards with an empty data dir offers it (its prompt is in the database)."""

import threading

import httpx
import numpy as np
import pytest

from bench.server import start_server
from storage import Storage, sqlite_url
from tests.audio_check import decode
from tests.integration.test_voice_cloning import (  # noqa: F401 (speech: a fixture)
    ADMIN,
    TOKEN,
    caller,
    clip,
    clone,
    listed,
    speak,
    speech,
)
from tests.pocket_models import build_tiny_pocket
from tests.serve import wait_until

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

PROMPT = "voices/cloned/tiny-pocket/{}.safetensors"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cloning-replicas")
    registry, pocket = folder / "voices.yaml", build_tiny_pocket(folder / "tiny-pocket")
    registry.write_text(f"voices:\n  pocket: {{engine: pocket_tts, model: '{pocket}', fixed_length: true}}\n")
    database = sqlite_url(folder / "shared.db")
    Storage(database).migrate()  # before the replicas start at once (only Postgres has them wait for one)
    settings = dict(voices_file=str(registry), device="cpu", calibration_sizes="1", torch_threads="1",
                    admin_token=TOKEN, trusted_proxies="127.0.0.1", database_url=database)
    return folder, settings


@pytest.fixture(scope="module")
def replicas(setup):
    folder, settings = setup
    started = {}

    def start(name: str) -> None:  # at once: the start-up is most of this module's time
        started[name] = start_server(folder / name, **settings)

    starting = [threading.Thread(target=start, args=(name,)) for name in ("a", "b")]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    try:
        assert set(started) == {"a", "b"}, "a replica did not start"
        yield started["a"], started["b"]
    finally:
        for server in started.values():
            server.stop()


def arrives(base: str, voice: str, headers: dict) -> bool:
    """Within 2 s, the voice is listed for these headers' caller."""
    return wait_until(lambda: voice in listed(base, headers), timeout_s=2)


def refusal(base: str, voice: str, headers: dict) -> str | None:
    """The error code a request for the voice gets (None: it is spoken)."""
    answer = speak(base, voice, headers)
    return None if answer.status_code == 200 else answer.json()["error"]["code"]


def test_a_voice_cloned_on_one_replica_is_spoken_by_the_other(replicas, speech):  # noqa: F811
    a, b = replicas
    assert clone(a.base_url, clip(speech, 5.0), "shared", caller(1)).status_code == 201
    assert arrives(b.base_url, "shared", caller(1)) and "shared" not in listed(b.base_url, caller(2))
    assert (b.log_path.parent / PROMPT.format("shared")).is_file()  # written from the database's copy
    spoken, default = speak(b.base_url, "shared", caller(1)), speak(b.base_url, "pocket", caller(1))  # loads it
    assert spoken.status_code == 200 and spoken.headers["x-chorus-voice"] == "shared"
    mine, theirs = decode(spoken.content, "wav")[0], decode(default.content, "wav")[0]
    assert mine.size == theirs.size > 0 and not np.allclose(mine, theirs)
    # the model is loaded on both now: the next voice goes to B's running engine
    assert clone(a.base_url, clip(speech, 4.0), "second", caller(1)).status_code == 201
    assert arrives(b.base_url, "second", caller(1))
    assert speak(b.base_url, "second", caller(1)).status_code == 200


def test_made_public_or_deleted_on_one_replica_it_follows_on_the_other(replicas, speech):  # noqa: F811
    a, b = replicas
    assert clone(a.base_url, clip(speech, 4.0), "going", caller(3)).status_code == 201
    assert arrives(b.base_url, "going", caller(3))
    published = httpx.put(f"{a.base_url}/admin/api/voices/cloned/going/public", headers=ADMIN, json={"public": True})
    assert published.status_code == 200
    assert arrives(b.base_url, "going", caller(4)) and speak(b.base_url, "going", caller(4)).status_code == 200
    assert httpx.delete(f"{a.base_url}/admin/api/voices/cloned/going", headers=ADMIN).status_code == 200
    missing = refusal(b.base_url, "no-such-voice", caller(3))
    assert missing == "voice_not_found"
    assert wait_until(lambda: refusal(b.base_url, "going", caller(3)) == missing, timeout_s=2)
    assert not (b.log_path.parent / PROMPT.format("going")).exists()


def test_a_replica_started_later_with_an_empty_data_dir_offers_the_voices(replicas, setup, speech):  # noqa: F811
    a, _ = replicas
    folder, settings = setup
    assert clone(a.base_url, clip(speech, 4.0), "kept", caller(5)).status_code == 201
    later = start_server(folder / "c", **settings)
    try:
        assert listed(later.base_url, caller(5))["kept"]["owner"] == "ip:10.77.0.5"
        assert speak(later.base_url, "kept", caller(5)).status_code == 200
    finally:
        later.stop()
