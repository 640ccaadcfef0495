"""A real Chorus server process on 127.0.0.1, with the real bundled voice."""

from __future__ import annotations

import json

import httpx
import pytest

from bench.server import start_server

MAX_CHARS = 1000


# The tests that share this server flood it on purpose (backpressure) and right after expect plain
# answers; degrade mode, which such a flood turns on for a while, has tests and servers of its own.
OPERATOR_DEFAULTS = {"anonymous_tier": "enterprise", "degrade_enabled": False}


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> str:
    process = start_server(tmp_path_factory.mktemp("chorus"), max_chars=str(MAX_CHARS),
                           operator_defaults=json.dumps(OPERATOR_DEFAULTS))
    yield process.base_url
    process.stop()


@pytest.fixture(scope="session")
def speak(server):
    """POST /v1/audio/speech and return the response."""
    def speak(text: str, response_format: str = "wav", voice: str = "alloy", **extra) -> httpx.Response:
        body = {"model": "tts-1", "input": text, "voice": voice, "response_format": response_format, **extra}
        return httpx.post(f"{server}/v1/audio/speech", json=body, timeout=120)
    return speak
