"""A tier's share of the queue and its deadline, on a real HTTP server with a gated fake engine."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from app import create_app
from tests.fakes import FakeEngine
from tests.serve import serve_in_thread, wait_until
from tts_core.config import Settings


def test_queue_share_503_and_deadline_504(tmp_path):
    engine = FakeEngine()
    settings = Settings(data_dir=tmp_path, batch_policy="sequential", max_queue=8, calibration_sizes=[1],
                        model_aliases={}, voice_aliases={},
                        operator_defaults={"tiers": {"free": {"max_queue_share": 0.25, "request_timeout_s": 0.5}},
                                           "anonymous_tier": "free"})
    with serve_in_thread(create_app(settings, engines=[engine])) as base:
        def speak(text: str) -> httpx.Response:
            return httpx.post(f"{base}/v1/audio/speech", timeout=30,
                              json={"model": "fake", "voice": "fake-voice", "input": text, "response_format": "wav"})

        def queued() -> int:
            return httpx.get(f"{base}/api/v1/batch/status").json()["queue_length"]

        calls_before = len(engine.seen)
        engine.gate.clear()
        engine.calls_started = threading.Semaphore(0)
        with ThreadPoolExecutor(3) as pool:
            running = pool.submit(speak, "running")
            assert engine.calls_started.acquire(timeout=10)
            waiting = [pool.submit(speak, f"waiting {n}") for n in range(2)]
            assert wait_until(lambda: queued() == 2)
            refused = speak("one too many")  # the free tier may hold 2 of the 8 places
            assert refused.status_code == 503 and "share" in refused.json()["error"]["message"]
            assert int(refused.headers["retry-after"]) >= 1
            time.sleep(0.7)  # past the free tier's 0.5 s deadline
            engine.gate.set()
            assert running.result().status_code == 200
            for future in waiting:
                response = future.result()
                assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
        assert len(engine.seen) - calls_before == 1  # the expired requests were never synthesized
