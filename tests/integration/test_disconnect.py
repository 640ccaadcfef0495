import json
import socket

import httpx

from tests.serve import metric, wait_until


def queue_length(server: str) -> int:
    return httpx.get(f"{server}/api/v1/batch/status").json()["queue_length"]


def test_client_that_disconnects_has_its_queued_sentences_dropped(server):
    dropped = r'tts_dropped_items_total\{reason="cancelled"\}'
    batches = r'tts_batch_size_count\{engine="en_US-joe-medium"\}'
    dropped_before, batches_before = metric(server, dropped), metric(server, batches)
    # 64 short sentences (within TTS_MAX_CHARS, and few enough to be queued one piece each, not packed): queued
    # long enough to be seen queued on a busy machine
    text = " ".join(f"Go {n}." for n in range(64))
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": text}).encode()
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        sock.setblocking(False)
        answered = b""

        def queued_or_answered() -> bool:  # a refusal comes back at once: say which instead of timing out
            nonlocal answered
            try:
                answered += sock.recv(4096)
            except BlockingIOError:
                pass
            return bool(answered) or queue_length(server) > 30

        assert wait_until(queued_or_answered, 30) and not answered, f"the request never queued: {answered[:300]}"
    assert wait_until(lambda: queue_length(server) == 0, 10)
    # 64 sentences take several seconds to synthesize; almost all were dropped instead.
    assert metric(server, dropped) - dropped_before >= 48
    assert metric(server, batches) - batches_before <= 16
