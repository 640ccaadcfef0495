"""A stopping server does not wait on the UI's open pages: a page (or a Gradio client) holds a heartbeat stream,
which uvicorn would wait on for ever, until the process manager's kill."""

import signal
import subprocess

import pytest

from bench.server import start_server

pytestmark = pytest.mark.slow  # a server process of its own


def test_sigterm_ends_the_server_though_a_client_holds_its_heartbeat_stream(tmp_path):
    from gradio_client import Client

    server = start_server(tmp_path, calibration_sizes="1", log_level="info")
    try:
        client = Client(server.base_url + "/", verbose=False)  # its heartbeat stream is open from here on
        server.process.send_signal(signal.SIGTERM)
        try:
            returncode = server.process.wait(timeout=10)  # before: still running after 20 s (15 s, then kill)
        except subprocess.TimeoutExpired:
            pytest.fail("the server was still running 10 s after SIGTERM, held by the client's heartbeat stream")
        assert returncode == -signal.SIGTERM  # uvicorn raises the signal again once it has stopped
        assert "Application shutdown complete" in server.log_path.read_text()  # the parts stopped in order
        client.close()
    finally:
        server.stop()
