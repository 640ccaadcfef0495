import httpx
import pytest

from bench.server import start_server


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("small-queue"), max_queue="3", calibration_sizes="1")
    yield server.base_url
    server.stop()


def test_a_text_bigger_than_the_queue_answers_400_before_any_work_and_short_sentences_are_packed_to_fit(
        small_queue_server):
    long_sentences = " ".join([("word " * 50).strip() + "."] * 4)  # 4 sentences of 250 characters: no two share a piece
    response = httpx.post(f"{small_queue_server}/v1/audio/speech", timeout=30,
                          json={"model": "tts-1", "voice": "alloy", "input": long_sentences})
    assert response.status_code == 400  # no wait would let 4 pieces into a queue of 3: not a 503 to retry
    assert "retry-after" not in response.headers
    assert response.json()["error"]["code"] == "text_above_queue_capacity"
    metrics = httpx.get(f"{small_queue_server}/metrics").text
    assert "tts_batch_size_count" not in metrics or 'tts_batch_size_count{engine="en_US-joe-medium"} 0.0' in metrics
    ok = httpx.post(f"{small_queue_server}/v1/audio/speech", timeout=30,
                    json={"model": "tts-1", "voice": "alloy", "input": "One. Two. Three. Four. Five."})
    assert ok.status_code == 200
