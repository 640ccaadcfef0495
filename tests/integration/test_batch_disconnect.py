"""A zip batch (POST /v1/audio/speech/batch) whose client hangs up is dropped like any other request:
its queued items are cancelled, not synthesized for no one. On the shared server of conftest.py
(degrade off, so the flood changes nothing for the tests after it)."""

import json
import socket

import httpx

from tests.serve import metric, wait_until
from tts_core.config import Settings

ITEMS, SENTENCES = 32, 12  # TTS_MAX_BATCH_ITEMS items; 384 sentences take far longer than the waits below
# One caller's batch is held to its share of the queue and to the wait target (the rest of its items
# are refused at once, 503 in the manifest); what was queued must go when the client does. Between the
# look at the queue and the hang-up, the engine may take one batch (TTS_MAX_BATCH_SIZE pieces) off it
# to run: those are synthesized, not dropped, so the queue is looked at until it holds that much more.
QUEUED, MAX_BATCH_SIZE = 2 * SENTENCES, Settings.model_fields["max_batch_size"].default  # the shared server's


def queue_length(server: str) -> int:
    return httpx.get(f"{server}/api/v1/batch/status").json()["queue_length"]


def test_a_zip_batch_whose_client_hangs_up_has_its_items_dropped(server):
    dropped = r'tts_dropped_items_total\{reason="cancelled"\}'
    dropped_before = metric(server, dropped)
    text = " ".join(f"Line {n} is here." for n in range(SENTENCES))
    items = [{"model": "tts-1", "voice": "alloy", "input": f"Item {index}. {text}", "response_format": "wav"}
             for index in range(ITEMS)]
    body = json.dumps({"items": items}).encode()
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/audio/speech/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert wait_until(lambda: queue_length(server) > QUEUED + MAX_BATCH_SIZE, 30), "the batch never queued"
    # the client has gone: what was queued for it is dropped, and the server is idle soon
    assert wait_until(lambda: queue_length(server) == 0, 10), "the server kept working for a client that left"
    assert metric(server, dropped) - dropped_before >= QUEUED
