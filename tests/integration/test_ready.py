"""GET /ready answers 200 only once the models loaded at start are calibrated; a restart on the same database and
machine reuses the calibration kept there (no sweep before it is ready), and checks it again in the background."""

import sqlite3

import httpx
import pytest

from bench.server import start_server

pytestmark = pytest.mark.slow  # server processes of their own

SETTINGS = {"calibration_sizes": "1,2", "log_level": "info"}


def calibrated_now(server) -> bool:
    return httpx.get(f"{server.base_url}/api/v1/batch/status", timeout=10).json()["calibrated"]


def test_ready_waits_for_the_calibration_and_a_restart_reuses_the_kept_one(tmp_path):
    server = start_server(tmp_path, **SETTINGS)  # returns at the first 200 from /ready
    try:
        assert calibrated_now(server)  # before: /ready said 200 some seconds before the sweep ended
        first_log = server.log_path.read_text()
        assert "is calibrated: {" in first_log and "kept from its last start" not in first_log
    finally:
        server.stop()
    with sqlite3.connect(tmp_path / "chorus.db") as database:
        models = [row[0] for row in database.execute("SELECT model FROM calibrations")]
    assert models  # kept per model, its settings and this machine

    again = start_server(tmp_path, **SETTINGS)
    try:
        assert calibrated_now(again)
        log = again.log_path.read_text()
        assert "kept from its last start" in log  # calibrated by the kept one, not by sweeping first
        assert log.index("kept from its last start") < log.index("Chorus is ready")
        assert "calibrated again" not in log[: log.index("Chorus is ready")]  # its recheck comes after, when idle
        hello = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}
        assert httpx.post(f"{again.base_url}/v1/audio/speech", json=hello, timeout=30).status_code == 200
    finally:
        again.stop()
