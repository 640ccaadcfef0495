import httpx


def test_models_and_voices(server):
    models = httpx.get(f"{server}/v1/models").json()
    assert models["object"] == "list"
    assert {"piper", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= {m["id"] for m in models["data"]}
    voices = httpx.get(f"{server}/v1/audio/voices").json()
    joe = next(v for v in voices["data"] if v["id"] == "en_US-joe-medium")
    assert joe["model"] == "piper" and joe["sample_rate"] == 22050 and "alloy" in joe["aliases"]
    assert joe["capabilities"] == {"word_timestamps": True, "cloning": False, "speed": True, "frames": False,
                                   "max_running": None, "mixing": False}
    assert voices["default"] == "en_US-joe-medium"


def test_probes_status_and_metrics(server, speak):
    assert httpx.get(f"{server}/health").status_code == 200
    assert httpx.get(f"{server}/ready").json() == {"status": "ready"}
    speak("Count me.")
    status = httpx.get(f"{server}/api/v1/batch/status").json()
    for field in ("active_batches", "pending_requests", "queue_length", "current_batch_size",
                  "avg_queue_time_ms", "max_batch_utilization", "gpu_free_mem_mb"):
        assert field in status
    assert status["gpu_free_mem_mb"] is None  # no GPU on CI; null, not an error
    policy = status["engines"]["en_US-joe-medium"]["policy"]
    assert policy["name"] == "adaptive" and policy["cost_model"]["per_padded_token_s"] > 0
    metrics = httpx.get(f"{server}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'tts_requests_total{source="api",status="200"}' in metrics.text
    assert "tts_batch_size_bucket" in metrics.text
