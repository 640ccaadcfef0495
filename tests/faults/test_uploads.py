"""The UI's upload route (Gradio's /gradio_api/upload) is limited per caller (uploads and bytes an
hour) and in total (bytes kept on disk), with answers in OpenAI's error shape."""

from __future__ import annotations

import httpx
import pytest

from api.uploads import HOUR_S, KEPT_S, UploadLedger
from bench.server import start_server
from tts_core.errors import Overloaded, RateLimited

PER_CALLER = 3
CALLER_MB = 0.25
TOTAL_MB = 0.6
KB = 1024


@pytest.fixture(scope="module")
def upload_server(tmp_path_factory):
    process = start_server(tmp_path_factory.mktemp("uploads"), calibration_sizes="1", trusted_proxies="127.0.0.1",
                           upload_max_per_caller_per_hour=str(PER_CALLER),
                           upload_max_mb_per_caller_per_hour=str(CALLER_MB), upload_max_total_mb=str(TOTAL_MB))
    yield process.base_url
    process.stop()


def upload(server: str, caller: str, size: int) -> httpx.Response:
    return httpx.post(f"{server}/gradio_api/upload", files={"files": ("voice.wav", b"\0" * size, "audio/wav")},
                      headers={"X-Forwarded-For": caller}, timeout=30)


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def test_each_caller_may_upload_so_many_files_an_hour(upload_server):
    for _ in range(PER_CALLER):
        response = upload(upload_server, "10.15.0.1", KB)
        assert response.status_code == 200 and response.json()[0].endswith("voice.wav")
    refused = upload(upload_server, "10.15.0.1", KB)
    assert_error(refused, 429, "rate_limit_exceeded")
    assert int(refused.headers["Retry-After"]) > 0 and refused.headers["X-RateLimit-Remaining"] == "0"
    assert upload(upload_server, "10.15.0.2", KB).status_code == 200  # others are not affected


def test_each_caller_may_upload_so_many_bytes_an_hour(upload_server):
    assert upload(upload_server, "10.15.1.1", 150 * KB).status_code == 200
    assert_error(upload(upload_server, "10.15.1.1", 150 * KB), 429, "rate_limit_exceeded")
    assert_error(upload(upload_server, "10.15.1.1", 300 * KB), 413, "upload_too_large")  # never fits


def test_an_upload_over_the_body_limit_is_refused_in_openais_shape_even_chunked(upload_server):
    def chunks():  # no Content-Length: the limit is found while Gradio reads it
        yield b'--b\r\nContent-Disposition: form-data; name="files"; filename="big.wav"\r\n\r\n'
        for _ in range(120):
            yield b"\0" * 10_000
        yield b"\r\n--b--\r\n"

    response = httpx.post(f"{upload_server}/gradio_api/upload", content=chunks(), timeout=30,
                          headers={"content-type": "multipart/form-data; boundary=b", "X-Forwarded-For": "10.15.3.1"})
    assert_error(response, 413, "body_too_large")


def test_all_callers_together_may_keep_so_many_bytes(upload_server):
    """Last in this module: it fills the server's upload space."""
    answers = [upload(upload_server, f"10.15.2.{n}", 200 * KB) for n in range(1, 5)]
    refused = [answer for answer in answers if answer.status_code != 200]
    assert refused and len(answers) - len(refused) >= 1
    assert_error(refused[0], 503, "uploads_full")
    assert int(refused[0].headers["Retry-After"]) > 0


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_ledger_forgets_uploads_as_they_age():
    clock = Clock()
    ledger = UploadLedger(per_caller=2, caller_bytes=100, total_bytes=150, clock=clock)
    for caller in ("a", "a", "b"):
        ledger.settle(ledger.admit(caller, 50), 50)
    with pytest.raises(RateLimited) as limited:  # a's hour is full
        ledger.admit("a", 10)
    assert limited.value.retry_after_s == HOUR_S
    with pytest.raises(Overloaded):  # 150 bytes kept: full
        ledger.admit("c", 10)
    ledger.settle(ledger.admit("c", 0), 0)  # a failed upload keeps nothing
    clock.now += HOUR_S
    with pytest.raises(Overloaded) as full:  # a may upload again, but the files are still on disk
        ledger.admit("a", 10)
    assert full.value.retry_after_s == KEPT_S - HOUR_S
    clock.now += KEPT_S - HOUR_S
    ledger.admit("a", 100)
    assert ledger.kept_bytes == 100
