import httpx
import pytest

from bench.server import start_server


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("small-queue"), max_queue="3", calibration_sizes="1")
    yield server.base_url
    server.stop()


def test_full_queue_answers_503_with_retry_after_before_any_work(small_queue_server):
    five_sentences = "One. Two. Three. Four. Five."
    response = httpx.post(f"{small_queue_server}/v1/audio/speech", timeout=30,
                          json={"model": "tts-1", "voice": "alloy", "input": five_sentences})
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "queue_full"
    metrics = httpx.get(f"{small_queue_server}/metrics").text
    assert "tts_batch_size_count" not in metrics or 'tts_batch_size_count{engine="en_US-joe-medium"} 0.0' in metrics
    ok = httpx.post(f"{small_queue_server}/v1/audio/speech", timeout=30,
                    json={"model": "tts-1", "voice": "alloy", "input": "One. Two."})
    assert ok.status_code == 200
