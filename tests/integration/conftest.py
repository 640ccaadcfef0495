"""A real Chorus server process on 127.0.0.1, with the real bundled voice."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from bench.server import start_server
from tests.serve import require_tools

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


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (Debian's chromium and chromium-driver), one a test module."""
    require_tools("chromium", "chromedriver", install="apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()
