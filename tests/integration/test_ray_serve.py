"""Chorus on Ray Serve, started the README's way (`serve run deploy/serve.yaml`, two engine replicas of the
bundled voice), inside a network namespace of its own: speech and streams of the right length through the
ingress, refusals in OpenAI's shape, both engine replicas in the admin's cluster view, and an engine
replica killed mid-service replaced by Ray, the cluster view saying so, speech going on."""

import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from bench.harness import EngineAlone
from tests.integration.conftest import RAY_ONE_MACHINE
from tests.serve import wait_until

pytest.importorskip("ray.serve")

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "ray-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
BASE = "http://127.0.0.1:7860"  # the namespace is this test's own: the port is free
TEXT = "The quick brown fox jumps over the lazy dog. Then it runs back home again before dark."
ENGINE = "en_US-joe-medium"


@contextmanager
def chorus_on_ray(tmp_path: Path):
    """`serve run` of deploy/serve.yaml with two engine replicas, until its ingress answers /ready. (Not a
    fixture: fixtures are set up outside the test's network namespace too.)"""
    config = yaml.safe_load((ROOT / "deploy" / "serve.yaml").read_text())
    config["applications"][0]["args"] = {"replicas": 2, "num_cpus": 0}
    config["http_options"]["host"] = "127.0.0.1"
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, **RAY_ONE_MACHINE, "TTS_DATA_DIR": str(tmp_path / "data"), "TTS_ADMIN_TOKEN": TOKEN,
           "TTS_CALIBRATION_SIZES": "1"}
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
def test_chorus_on_ray_serve_speaks_streams_shows_its_replicas_and_survives_losing_one(tmp_path):
    with chorus_on_ray(tmp_path):
        speaks_streams_shows_its_replicas_and_survives_losing_one()


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
