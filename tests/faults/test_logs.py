"""Credentials and texts never reach the log: not through uvicorn's access log (HTTP or WebSocket
query strings), nor through our own lines or their tracebacks."""

from __future__ import annotations

import io
import logging

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from api.logs import RedactingFilter, redact
from tests.faults.conftest import connect_as, receive_event
from tests.serve import wait_until

KEY = "ck-LogSecretKey0123456789abcdef"
TEXT = "Confidential words for the log"


@pytest.mark.parametrize("line, secret", [
    ('127.0.0.1:5 - "GET /stream?api_key=ck-abc123456&voice=alloy HTTP/1.1" 200', "ck-abc123456"),
    ('127.0.0.1:5 - "WebSocket /stream?text=my%20private%20words" [accepted]', "private"),
    ("/x?input=hello+there&token=t0k3n&key=k3y", "hello"),
    ("/x?input=hello+there&token=t0k3n&key=k3y", "t0k3n"),
    ("/x?input=hello+there&token=t0k3n&key=k3y", "k3y"),
    ("/x?Api%5FKey=percent-encoded-name", "percent-encoded-name"),
    ("headers: {'authorization': 'Bearer sk-proj-XYZ', 'host': 'a'}", "sk-proj-XYZ"),
    ("Authorization: Bearer someone-elses-token", "someone-elses-token"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ('body {"model": "tts-1", "input": "He said \\"hi\\" to me", "voice": "alloy"}', "said"),
    ("revoked ck-QmFzZTY0S2V5Rm9yVGVzdHM while serving", "QmFzZTY0S2V5Rm9yVGVzdHM"),
])
def test_redact_removes_credentials_and_texts(line, secret):
    cleaned = redact(line)
    assert secret not in cleaned and "[redacted]" in cleaned


def test_redact_leaves_ordinary_lines_alone():
    line = "batch of 4 (1200 padded tokens) took 0.31 s; voice=alloy status=200; back-end ready"
    assert redact(line) == line


def test_the_filter_cleans_arguments_and_tracebacks():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("tests.faults.redaction")
    logger.addHandler(handler)
    try:
        logger.warning("caller sent %s with %s", f"Authorization: Bearer {KEY}", "ok")
        try:
            raise ValueError(f"bad request /speech?text={TEXT.replace(' ', '+')}")
        except ValueError:
            logger.exception("request failed")
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert KEY not in written and "Confidential" not in written
    assert "caller sent Authorization: Bearer [redacted] with ok" in written and "ValueError" in written


def test_the_server_log_holds_no_keys_or_texts(hostile_server):
    base = hostile_server.base_url
    query = {"api_key": KEY, "text": TEXT, "input": TEXT, "token": KEY, "key": KEY}
    httpx.get(f"{base}/v1/models", params=query, timeout=30)
    httpx.post(f"{base}/v1/audio/speech", params={"text": TEXT}, headers={"Authorization": f"Bearer {KEY}"},
               json={"model": "tts-1", "voice": "alloy", "input": TEXT}, timeout=30)
    with connect_as(base, "10.14.0.1", "/v1/audio/speech/stream?api_key=" + KEY) as socket:
        assert receive_event(socket)["error"]["code"] == "invalid_api_key"
        with pytest.raises(ConnectionClosed):
            socket.recv(timeout=30)
    with connect_as(base, "10.14.0.2", "/stream?voice=alloy&text=" + TEXT.replace(" ", "%20")) as socket:
        while receive_event(socket)["type"] not in ("done", "error"):
            pass
    # the lines are there, their secrets are not
    assert wait_until(lambda: "/stream?voice=alloy&text=[redacted]" in hostile_server.log_path.read_text(), 10)
    log = hostile_server.log_path.read_text()
    assert "/v1/models?api_key=[redacted]&text=[redacted]" in log
    assert KEY not in log and KEY.removeprefix("ck-") not in log
    assert "Confidential" not in log
