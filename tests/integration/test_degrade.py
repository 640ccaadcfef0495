"""Degrade mode and overload end to end: a slow fake engine (with the bundled Piper voice beside it, where its
lower precision is checked) behind the real app and a real HTTP server.

The load callers come from distinct addresses (X-Forwarded-For through a trusted proxy), as real
traffic does: within one caller requests keep their order, so one address alone is not an overload."""

import threading
import time

import httpx
import pytest

from app import create_app
from tests.fakes import FakeEngine
from tests.serve import serve_in_thread, wait_until
from tts_core.config import Settings
from tts_core.engines.piper import PiperEngine, bundled_voice_path

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "test-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
LONG_TEXT = "word " * 30  # 150 characters


def speak(base: str, text: str, caller: str = "10.0.0.1") -> httpx.Response:
    return httpx.post(f"{base}/v1/audio/speech", timeout=60, headers={"X-Forwarded-For": caller},
                      json={"model": "fake", "voice": "fake-voice", "input": text, "response_format": "wav"})


def degrade_state(base: str) -> dict:
    return httpx.get(f"{base}/admin/api/stats", headers=ADMIN).json()["degrade"]


def precision(base: str) -> dict:
    return httpx.get(f"{base}/admin/api/stats", headers=ADMIN).json()["precision"]


@pytest.fixture
def slow_engine():
    return FakeEngine(cost=lambda size, padded: 0.05)


def degrade_app(tmp_path, engines):
    settings = Settings(data_dir=tmp_path, admin_token=TOKEN, batch_policy="sequential", max_queue=20,
                        calibration_sizes=[1], model_aliases={}, voice_aliases={}, trusted_proxies=["127.0.0.1"],
                        aging_horizon_s=0.2,
                        operator_defaults={"tiers": {"open": {"rate_limit": None, "sheddable": True}},
                                           "anonymous_tier": "open"})
    return create_app(settings, engines=engines)


@pytest.fixture
def slow_server(tmp_path, slow_engine):
    with serve_in_thread(degrade_app(tmp_path, [slow_engine])) as base:
        yield base


@pytest.fixture
def slow_server_beside_piper(tmp_path, slow_engine):
    """The slow fake engine with the bundled Piper voice loaded beside it (idle: the load is the fake's)."""
    with serve_in_thread(degrade_app(tmp_path, [slow_engine, PiperEngine(bundled_voice_path())])) as base:
        yield base


class Load:
    """Keeps about `clients` requests in flight until stopped."""

    def __init__(self, base: str, clients: int):
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(base, n)) for n in range(clients)]

    def _run(self, base: str, n: int) -> None:
        while not self.stop.is_set():
            speak(base, f"load {n} {time.monotonic()}", caller=f"10.1.0.{n}")

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def test_degrade_enters_under_load_caps_text_serves_cache_lowers_precision_and_leaves(slow_server_beside_piper):
    base = slow_server_beside_piper
    assert precision(base) == {"fake": "full", "en_US-joe-medium": "full"}
    put = httpx.put(f"{base}/admin/api/settings", headers=ADMIN, json={
        "enter_threshold": 0.5, "exit_threshold": 0.2, "queue_wait_target_s": 1.0, "cap_text_chars": 100})
    assert put.status_code == 200, put.text
    cached_text = "say this again"
    first = speak(base, cached_text)
    assert first.status_code == 200 and first.headers["x-chorus-cache"] == "miss"
    assert speak(base, LONG_TEXT).status_code == 200  # not degraded: long text is fine

    with Load(base, clients=16):
        assert wait_until(lambda: degrade_state(base)["active"]), degrade_state(base)
        refused = speak(base, LONG_TEXT)
        # a temporary overload, not a bad request: 503, Retry-After from the mode's expected end, and what is
        # accepted now
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "degraded_text_limit" and "up to 100 characters" in error["message"]
        hit = speak(base, cached_text)
        assert hit.status_code == 200 and hit.headers["x-chorus-cache"] == "hit"
        assert "cache_first" in hit.headers["x-chorus-degraded"]
        assert hit.content == first.content
        # Piper runs its int8 graph (the fake engine has no lower precision) and speaks with it
        assert wait_until(lambda: precision(base) == {"fake": "low (unsupported: no-op)", "en_US-joe-medium": "low"})
        piper = httpx.post(f"{base}/v1/audio/speech", timeout=60, headers={"X-Forwarded-For": "10.0.0.2"},
                           json={"model": "piper", "voice": "en_US-joe-medium", "input": "Spoken in int8.",
                                 "response_format": "pcm"})
        assert piper.status_code == 200 and len(piper.content) > 24000  # over half a second of 24 kHz 16-bit

        # An operator raises the wait target and the thresholds: the running server leaves degrade mode within
        # a second (the same load is then far under them, however fast this machine runs the queue)
        put = httpx.put(f"{base}/admin/api/settings", headers=ADMIN,
                        json={"enter_threshold": 1.0, "exit_threshold": 0.99, "queue_wait_target_s": 10.0})
        assert put.status_code == 200
        assert wait_until(lambda: not degrade_state(base)["active"], 1.0)
        assert speak(base, LONG_TEXT).status_code == 200

        httpx.put(f"{base}/admin/api/settings", headers=ADMIN, json={"exit_threshold": 0.2, "enter_threshold": 0.5,
                                                                  "queue_wait_target_s": 1.0})
        assert wait_until(lambda: degrade_state(base)["active"])

    # it leaves once the score has stayed below exit_threshold for exit_hold_s (5 s)
    assert wait_until(lambda: not degrade_state(base)["active"], 20), "degrade did not end after the load"
    assert wait_until(lambda: precision(base) == {"fake": "full", "en_US-joe-medium": "full"})
    assert speak(base, LONG_TEXT).status_code == 200
    metrics = httpx.get(f"{base}/metrics").text
    for action in ("cap_text", "cache_first", "lower_precision", "lower_precision_noop"):
        assert f'tts_degrade_actions_total{{action="{action}"}}' in metrics


def test_shed_low_priority_answers_503_with_retry_after(slow_server):
    base = slow_server
    httpx.put(f"{base}/admin/api/settings", headers=ADMIN, json={
        "enter_threshold": 0.5, "exit_threshold": 0.2, "queue_wait_target_s": 1.0,
        "shed_enabled": True})  # the anonymous tier here is sheddable
    with Load(base, clients=16):
        assert wait_until(lambda: degrade_state(base)["active"])
        shed = speak(base, "anyone there")
        assert shed.status_code == 503 and int(shed.headers["retry-after"]) >= 1
        assert shed.json()["error"]["code"] == "shed_low_priority"


def test_one_long_text_on_an_idle_server_does_not_enter_degrade_mode(slow_server):
    # 18 sentences of 50 ms each: 0.9 s of synthesis, almost twice the wait target set here; an idle
    # server's only caller is not a load (the old score, latency over a target, called this overload).
    base = slow_server
    assert httpx.put(f"{base}/admin/api/settings", headers=ADMIN, json={
        "enter_threshold": 0.5, "exit_threshold": 0.2, "queue_wait_target_s": 0.5}).status_code == 200
    long_text = " ".join(f"Sentence {n} of a long answer." for n in range(18))  # the queue holds 20
    scores = []
    watching = threading.Event()

    def watch():
        while not watching.wait(0.05):  # a look every 50 ms (the monitor ticks every 250 ms)
            scores.append(degrade_state(base)["score"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert speak(base, long_text).status_code == 200
    finally:
        watching.set()
        watcher.join(10)
    assert scores and max(scores) < 0.5, max(scores)
    assert not degrade_state(base)["active"]
    follow_up = speak(base, "word " * 60)  # 300 characters: over cap_text_chars, refused only when degraded
    assert follow_up.status_code == 200


def test_overload_answers_503_fast_with_an_honest_retry_after_and_recovers(slow_server, slow_engine):
    base = slow_server
    assert httpx.put(f"{base}/admin/api/settings", headers=ADMIN, json={
        "enter_threshold": 0.5, "exit_threshold": 0.2, "exit_hold_s": 1.0, "queue_wait_target_s": 0.5,
        "cap_text_enabled": False}).status_code == 200
    answers: list[tuple[int, float, str | None]] = []

    def one(n: int) -> None:
        started = time.monotonic()
        response = speak(base, f"caller {n} says hello", caller=f"10.2.0.{n}")
        answers.append((response.status_code, time.monotonic() - started, response.headers.get("retry-after")))

    def queued() -> int:
        return httpx.get(f"{base}/api/v1/batch/status").json()["queue_length"]

    slow_engine.gate.clear()  # the engine holds its first call: nothing is synthesized meanwhile
    threads = [threading.Thread(target=one, args=(n,)) for n in range(40)]  # 2 s of work at once
    for thread in threads:
        thread.start()
    # a refusal comes at once, while the queue's work is held up, saying when to come back
    assert wait_until(lambda: len(answers) + queued() == 40 - 1, 60)  # each refused or queued; one running
    refused = list(answers)
    assert refused and all(status == 503 and 1 <= int(retry) <= 3 for status, _, retry in refused)
    slow_engine.gate.set()
    for thread in threads:
        thread.join(60)
    served = [answer for answer in answers if answer[0] == 200]
    assert len(answers) == 40 and len(refused) + len(served) == 40
    # degrade mode leaves within seconds once the queue has drained (exit_hold_s is 1 s here)
    assert wait_until(lambda: not degrade_state(base)["active"], 5)
    assert speak(base, "after the storm", caller="10.3.0.1").status_code == 200
