"""A real Chorus process with short timeouts and small caps, so that each fault shows in seconds.

Tests tell their callers apart by X-Forwarded-For (the server trusts 127.0.0.1 as a proxy), so
one test's sockets and uploads never count against another's."""

from __future__ import annotations

import json

import pytest
from websockets.sync.client import connect

from bench.server import ServerProcess, start_server

HEADER_TIMEOUT_S = 1.0
WS_IDLE_TIMEOUT_S = 3.0
WS_MAX_PER_CALLER = 2


@pytest.fixture(scope="session")
def hostile_server(tmp_path_factory) -> ServerProcess:
    process = start_server(tmp_path_factory.mktemp("faults"), log_level="info", calibration_sizes="1",
                           trusted_proxies="127.0.0.1", header_timeout_s=str(HEADER_TIMEOUT_S),
                           ws_idle_timeout_s=str(WS_IDLE_TIMEOUT_S), ws_max_per_caller=str(WS_MAX_PER_CALLER))
    yield process
    process.stop()


def connect_as(server: str, caller: str, path: str = "/v1/audio/speech/stream"):
    """A speech WebSocket for the caller at address `caller` (sent as a trusted proxy would)."""
    return connect(server.replace("http://", "ws://") + path, additional_headers={"X-Forwarded-For": caller},
                   open_timeout=30)


def receive_event(socket, timeout_s: float = 60) -> dict:
    """The next JSON event, skipping audio frames."""
    while True:
        message = socket.recv(timeout=timeout_s)
        if isinstance(message, str):
            return json.loads(message)


def speak(socket, text: str = "Still here.") -> dict:
    """Speak text on the socket; its last event (done, or error)."""
    socket.send(json.dumps({"text": text}))
    while (event := receive_event(socket))["type"] not in ("done", "error"):
        pass
    return event
