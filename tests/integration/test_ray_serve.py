"""Chorus on Ray Serve, started as docs/deployment.md says (`serve run deploy/serve.yaml`, two engine replicas of the
bundled voice and one of a tiny Pocket TTS), inside a network namespace of its own: speech and streams of
the right length through the ingress, refusals in OpenAI's shape, a voice cloned earlier on the same
database spoken by its engine replica (cloning through the ingress refused), both replicas of the bundled
voice in the admin's cluster view, and one of them killed mid-service replaced by Ray, the cluster view
saying so, speech going on. Under load, the ingress sees its engine replicas' queues: its status, its refusals
and its degrade mode, and each engine replica's own degrade mode."""

import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from safetensors.numpy import save

from bench.harness import EngineAlone
from storage import Storage, sqlite_url
from tests.integration.conftest import RAY_ONE_MACHINE
from tests.pocket_models import build_tiny_pocket, random_voice
from tests.serve import wait_until
from tts_core.audio.encoding import encode

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

pytest.importorskip("ray.serve")

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "ray-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
BASE = "http://127.0.0.1:7860"  # the namespace is this test's own: the port is free
TEXT = "The quick brown fox jumps over the lazy dog. Then it runs back home again before dark."
ENGINE = "en_US-joe-medium"
POCKET, CLONE = "tiny-pocket", "cloned-earlier"  # a tiny random Pocket TTS, and a voice cloned for it


@contextmanager
def chorus_on_ray(tmp_path: Path):
    """`serve run` of deploy/serve.yaml with two engine replicas, until its ingress answers /ready. (Not a
    fixture: fixtures are set up outside the test's network namespace too.)"""
    config = yaml.safe_load((ROOT / "deploy" / "serve.yaml").read_text())
    config["applications"][0]["args"] = {"replicas": 2, "num_cpus": 0}
    config["applications"][0]["deployments"] = [{"name": f"engine-{POCKET}", "num_replicas": 1}]
    config["http_options"]["host"] = "127.0.0.1"
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    registry = tmp_path / "voices.yaml"
    registry.write_text(f"voices:\n  {POCKET}: {{engine: pocket_tts, model: '{build_tiny_pocket(tmp_path / POCKET)}', "
                        "fixed_length: true}\n")
    store_clone(tmp_path / "data")
    env = {**os.environ, **RAY_ONE_MACHINE, "TTS_DATA_DIR": str(tmp_path / "data"), "TTS_ADMIN_TOKEN": TOKEN,
           "TTS_CALIBRATION_SIZES": "1", "TTS_VOICES_FILE": str(registry), "TTS_TORCH_THREADS": "1"}
    log_path = tmp_path / "serve.log"
    serve = subprocess.Popen([str(Path(sys.executable).with_name("serve")), "run", str(tmp_path / "serve.yaml")],
                             cwd=ROOT, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    try:
        served = wait_until(lambda: serve.poll() is not None or _answers(f"{BASE}/ready"), 300, 0.5)
        assert served and serve.poll() is None, log_path.read_text()[-5000:]
        yield log_path
    finally:
        serve.send_signal(signal.SIGINT)  # serve run tears the application and its local Ray down
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
        subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], env=env,
                       capture_output=True)


def store_clone(data: Path) -> None:
    """A public voice cloned earlier (through `python app.py` on this database) for the tiny Pocket TTS."""
    storage = Storage(sqlite_url(data / "chorus.db"))
    data.mkdir(parents=True, exist_ok=True)
    storage.migrate()
    prompt = save({"audio_prompt_latents": random_voice(12, seed=3)})
    storage.cloned_voices.add(CLONE, POCKET, "key:1", 4.0, None, f"voices/cloned/{POCKET}/{CLONE}.safetensors",
                             datetime.now(UTC), "key:1", prompt)
    storage.cloned_voices.set_public(CLONE, True, "ops")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def speak(stream: bool = False) -> httpx.Response:
    return httpx.post(f"{BASE}/v1/audio/speech", timeout=120, json={
        "model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm", "stream": stream})


def engine_replicas() -> dict[str, bool]:
    """The cluster view's engine replicas: id -> gone (none while the stats do not answer)."""
    try:
        rows = httpx.get(f"{BASE}/admin/api/stats", headers=ADMIN, timeout=30).json()["replicas"]
    except (httpx.HTTPError, ValueError, KeyError):
        return {}
    return {row["id"]: row["gone"] for row in rows if row["id"].startswith(f"{ENGINE}/")}


def serving(replicas: dict[str, bool]) -> int:
    return sum(not gone for gone in replicas.values())


@pytest.mark.loopback_namespace
@pytest.mark.timeout(900)  # room for a run beside a benchmark, on CI's slower machine
def test_chorus_on_ray_serve_speaks_survives_losing_a_replica_and_under_load_sees_its_replicas_queues(tmp_path):
    """One cluster for both halves (its start is most of the time): the replica lost and replaced first, then
    the load, whose settings the first half must not run under."""
    with chorus_on_ray(tmp_path):
        speaks_streams_shows_its_replicas_and_survives_losing_one()
        sees_its_engine_replicas_queues_and_both_degrade()


def speaks_streams_shows_its_replicas_and_survives_losing_one():
    import ray

    whole, streamed = speak(), speak(stream=True)
    assert whole.status_code == streamed.status_code == 200, (whole.text, streamed.text)
    whole_s, streamed_s = (len(answer.content) / 2 / 22050 for answer in (whole, streamed))
    alone_s = EngineAlone(ENGINE, None).speak(TEXT)  # the sentences' speech, without the pauses joining them
    # Piper's durations vary a little from one synthesis to the next; a stream's first sentence is cut
    # shorter (its first audio sooner), which adds a pause, as in one process
    assert 0.9 * alone_s < whole_s < 1.2 * alone_s, (alone_s, whole_s)
    assert 0.9 * whole_s < streamed_s < 1.25 * whole_s, (whole_s, streamed_s)
    page = httpx.get(f"{BASE}/", timeout=60)  # the UI and its admin tab, served by the ingress too
    assert page.status_code == 200 and "gradio" in page.text.lower()
    refused = httpx.post(f"{BASE}/v1/audio/speech", timeout=60, json={"model": "tts-1", "voice": "nobody",
                                                                         "input": "Hello."})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "voice_not_found"

    # A stored cloned voice is listed by the ingress and spoken by its model's engine replica; cloning here is not
    listed = httpx.get(f"{BASE}/v1/audio/voices", timeout=60).json()["data"]
    assert CLONE in {voice["id"] for voice in listed}
    cloned = httpx.post(f"{BASE}/v1/audio/speech", timeout=120, json={"model": "tts-1", "voice": CLONE,
                                                                        "input": "Hi.", "response_format": "pcm"})
    assert cloned.status_code == 200 and len(cloned.content) > 2 * 24000 // 2, cloned.text[:300]
    clip = encode(np.resize(np.sin(np.arange(24000) / 8.0).astype(np.float32) * 0.3, 4 * 24000), 24000, "wav")
    cloning = httpx.post(f"{BASE}/v1/audio/voices", timeout=60, files={"audio": ("clip.wav", clip)},
                         data={"name": "mine", "model": "pocket_tts", "consent": "true"})
    assert cloning.status_code == 400 and cloning.json()["error"]["code"] == "model_cannot_clone", cloning.text
    assert wait_until(lambda: serving(engine_replicas()) == 2, 30, 0.2), engine_replicas()
    before = set(engine_replicas())

    ray.init(address="auto", namespace="serve", logging_level="ERROR")
    try:
        [victim, *_] = [name for name in ray.util.list_named_actors() if f"engine-{ENGINE}" in name]
        ray.kill(ray.get_actor(victim), no_restart=True)
        killed = re.search(r"#(\w+)$", victim).group(1)
        # shown gone once it has been silent for admin.cluster.GONE_AFTER_S; Ray starts another meanwhile
        replaced = wait_until(lambda: (replicas := engine_replicas()).get(f"{ENGINE}/{killed}") is True
                              and serving(replicas) == 2, 120, 0.5)
        assert replaced, engine_replicas()
    finally:
        ray.shutdown()
    assert len(set(engine_replicas()) - before) == 1
    for _ in range(4):  # the router has dropped the dead replica: every request is served
        assert speak().status_code == 200


# degrade mode and the wait target scaled down to what a flood of a few callers does on two CPU replicas
LOADED = {"queue_wait_target_s": 1.0, "overload_wait_target_s": 1.0, "enter_threshold": 0.3, "exit_threshold": 0.1,
          "exit_hold_s": 0.0, "cache_enabled": False, "cache_first_enabled": False}
SHORT = "Sentence {n} says where the fox went. It ran to the river. Then it ran back home. It slept well."
LONG = "The fox is here. " * 24  # over degrade mode's cap on text length (300 characters)


def sees_its_engine_replicas_queues_and_both_degrade():
    changed = httpx.put(f"{BASE}/admin/api/settings", headers=ADMIN, json=LOADED, timeout=30)  # the replicas follow
    assert changed.status_code == 200, changed.text
    stop, answers = threading.Event(), []
    callers = [threading.Thread(target=flood, args=(stop, answers, n)) for n in range(8)]
    for caller in callers:
        caller.start()
    try:
        seen_queue = wait_until(lambda: status()["queue_length"] > 0, 60, 0.2)
        engines_degraded = wait_until(lambda: any(row["id"].startswith(f"{ENGINE}/") and row["figures"]["degraded"]
                                                  for row in stats().get("replicas", [])), 60, 0.2)
        ingress_degraded = wait_until(lambda: stats().get("degrade", {}).get("active"), 60, 0.2)
        capped = httpx.post(f"{BASE}/v1/audio/speech", timeout=120, json={"model": "tts-1", "voice": "alloy",
                                                                           "input": LONG, "response_format": "pcm"})
        refused = wait_until(lambda: any(answer.status_code == 503 and "retry-after" in answer.headers
                                         and answer.json()["error"]["code"] == "queue_wait" for answer in answers),
                             60, 0.2)
    finally:
        stop.set()
        for caller in callers:
            caller.join(150)
    assert seen_queue, status()
    assert engines_degraded, stats().get("replicas")
    assert ingress_degraded, stats().get("degrade")
    assert capped.status_code == 503 and capped.json()["error"]["code"] == "degraded_text_limit", capped.text
    assert refused, sorted({(answer.status_code, answer.text[:80]) for answer in answers})
    assert any(answer.status_code == 200 for answer in answers)
    # drained: the ingress's view follows (the reports are read each second), and degrade mode ends
    assert wait_until(lambda: status()["queue_length"] == 0 and not stats()["degrade"]["active"], 60, 0.5), status()


def flood(stop: threading.Event, answers: list, caller: int) -> None:
    """One caller sending texts one after another (each different: no cache) until stopped."""
    n = 0
    while not stop.is_set():
        n += 1
        try:
            text = SHORT.format(n=f"{caller} {n}")
            answers.append(httpx.post(f"{BASE}/v1/audio/speech", timeout=120, json={
                "model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}))
        except httpx.HTTPError:
            pass


def status() -> dict:
    return httpx.get(f"{BASE}/api/v1/batch/status", timeout=30).json()


def stats() -> dict:
    try:
        return httpx.get(f"{BASE}/admin/api/stats", headers=ADMIN, timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return {}
