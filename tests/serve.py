"""Test helpers: an ASGI app on a real HTTP server on 127.0.0.1 (in a thread of the test process),
metrics reading, waiting, and the Debian tools some tests drive."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from bench.server import free_port


@contextmanager
def serve_in_thread(app, ready_path: str = "/ready?calibrated=true"):
    port = free_port()
    # a connection left open (a browser's or a Gradio client's event stream) is cut 2 s into the shutdown,
    # not waited for past the join below; the app's own shutdown runs then
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           proxy_headers=False, timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + ready_path, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("server did not become ready")
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(10)


def wait_until(condition, timeout_s: float = 10.0, every_s: float = 0.05) -> bool:
    """Poll condition() until it is true (True) or the time is up (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return False


def _samples(server: str, pattern: str) -> list[float]:
    """The values of the /metrics samples matching the regular expression pattern, in order."""
    return [float(value) for value in re.findall(pattern + r" ([0-9.e+]+)", httpx.get(f"{server}/metrics").text)]


def metric(server: str, pattern: str) -> float:
    """The value of the first /metrics sample matching the regular expression pattern (0 if none)."""
    return next(iter(_samples(server, pattern)), 0.0)


def metric_total(server: str, pattern: str) -> float:
    """The sum of every /metrics sample matching the pattern (one metric across its labels)."""
    return sum(_samples(server, pattern))


def require_tools(*commands: str, install: str) -> None:
    """Skip the test when a command is missing, or fail it where CI promised the tools
    (CHORUS_REQUIRE_TOOLS=1, set by .ci/run after installing them)."""
    missing = [command for command in commands if shutil.which(command) is None]
    if not missing:
        return
    if os.environ.get("CHORUS_REQUIRE_TOOLS"):
        pytest.fail(f"{', '.join(missing)} required ({install})")
    pytest.skip(f"no {', '.join(missing)} on this machine")
