"""A real Chorus server process on 127.0.0.1, with the real bundled voice."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import httpx
import pytest

from bench.server import start_server
from tests.serve import require_tools

MAX_CHARS = 1000
INSIDE_LOOPBACK_NAMESPACE = "CHORUS_INSIDE_LOOPBACK_NAMESPACE"
# Ray probes public addresses to find its own unless told it runs on one machine
RAY_ONE_MACHINE = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def pytest_configure(config):
    config.addinivalue_line("markers", "loopback_namespace: runs in a network namespace of its own with only a "
                                       "loopback interface (Ray), so nothing it does leaves the machine")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked loopback_namespace runs again in a pytest of its own inside `unshare` (as a user
    namespace's root where this is not root): a network namespace with only loopback, brought up, and a PID
    namespace, so whatever it leaves running (Ray's daemons) ends with it. Its outcome is this test's. (Its
    fixtures are set up out here too, before this hook: what must run inside is started in the test's body.)"""
    if pyfuncitem.get_closest_marker("loopback_namespace") is None or os.environ.get(INSIDE_LOOPBACK_NAMESPACE):
        return None
    require_tools("unshare", "ip", install="apt-get install util-linux iproute2")
    inner = [sys.executable, "-m", "pytest", "-q", "-rs", "-n", "0", "-p", "no:cacheprovider", pyfuncitem.nodeid]
    command = ["unshare", "--net", "--pid", "--fork", "--mount-proc", *([] if os.geteuid() == 0 else ["-r"]),
               "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *inner]
    # a file, not a pipe: nothing left running can hold it open; Ray's files in a folder of the test's own, since
    # another test may run Ray in its own namespace at the same time (pytest-xdist's other worker)
    with (tempfile.TemporaryFile("w+") as output,
          tempfile.TemporaryDirectory(prefix="ray-", ignore_cleanup_errors=True) as ray_files):
        run = subprocess.run(command, cwd=pyfuncitem.config.rootpath, stdout=output, stderr=subprocess.STDOUT,
                             env={**os.environ, **RAY_ONE_MACHINE, INSIDE_LOOPBACK_NAMESPACE: "1",
                                  "RAY_TMPDIR": ray_files})
        output.seek(0)
        said = output.read()
    if run.returncode != 0:
        pytest.fail(f"inside its network namespace the test failed:\n{said[-20000:]}", pytrace=False)
    if skipped := re.search(r"^SKIPPED .*$", said, re.MULTILINE):
        pytest.skip(f"inside its network namespace: {skipped.group(0)}")
    return True


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
    """A headless Chromium (Debian's chromium and chromium-driver), one a test module; its console is kept for
    driver.get_log("browser")."""
    require_tools("chromium", "chromedriver", install="apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, failed requests too (get_log)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()
