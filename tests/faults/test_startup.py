"""Start-up (#14): a configuration mistake stops `python app.py` with one line that names the setting
and the fault, exit code 2, and no traceback."""

import os
import socket
import subprocess
import sys

import pytest

from bench.server import ROOT, free_port
from tts_core.engines.piper import bundled_voice_path

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)


def start(tmp_path, **env: str) -> subprocess.CompletedProcess:
    """`python app.py` with TTS_<KEY>=value; a server that starts anyway is stopped by the timeout."""
    environment = {**os.environ, "TTS_HOST": "127.0.0.1", "TTS_PORT": str(free_port()), "TTS_LOG_LEVEL": "warning",
                   "TTS_DATA_DIR": str(tmp_path / "data"), "TTS_CALIBRATION_SIZES": "1",
                   "GRADIO_ANALYTICS_ENABLED": "False", **{f"TTS_{key.upper()}": value for key, value in env.items()}}
    return subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=90)


def five_pinned_models(tmp_path) -> str:
    """A voices file pinning four more Piper models (links to the bundled one): five with the bundled voice."""
    voice = bundled_voice_path()
    lines = ["voices:"]
    for n in range(4):
        model = tmp_path / f"copy{n}.onnx"
        model.symlink_to(voice)
        model.with_name(model.name + ".json").symlink_to(voice.with_name(voice.name + ".json"))
        lines += [f"  copy{n}:", "    engine: piper", f"    model: {model}", "    pinned: true"]
    registry = tmp_path / "voices.yaml"
    registry.write_text("\n".join(lines) + "\n")
    return str(registry)


CASES = {  # name: (environment, what the line must say)
    "defaults-not-json": ({"operator_defaults": "{bad"}, ["TTS_OPERATOR_DEFAULTS", "JSON"]),
    "defaults-out-of-bounds": ({"operator_defaults": '{"cap_text_chars": 0}'}, ["TTS_OPERATOR_DEFAULTS",
                                                                                 "cap_text_chars"]),
    "defaults-unknown": ({"operator_defaults": '{"latency_target_ms": 500}'}, ["TTS_OPERATOR_DEFAULTS",
                                                                              "latency_target_ms"]),
    "setting-out-of-bounds": ({"max_chars": "0"}, ["TTS_MAX_CHARS"]),
    "database-url-not-a-url": ({"database_url": "not a url"}, ["TTS_DATABASE_URL"]),
    "database-url-unknown-dialect": ({"database_url": "nosuchdb://host/db"}, ["TTS_DATABASE_URL"]),
    "ratelimit-storage": ({"ratelimit_storage": "nosuch://host"}, ["TTS_RATELIMIT_STORAGE"]),
    "trusted-proxies": ({"trusted_proxies": "proxy.example"}, ["TTS_TRUSTED_PROXIES", "proxy.example"]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_configuration_mistake_stops_with_one_line(tmp_path, case):
    env, words = CASES[case]
    refused(start(tmp_path, **env), words)


def test_an_unwritable_data_dir_stops_with_one_line(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    refused(start(tmp_path, data_dir=str(tmp_path / "a-file" / "data")), ["TTS_DATA_DIR"])


def test_more_pinned_models_than_the_limit_stop_with_what_to_change(tmp_path):
    result = start(tmp_path, voices_file=five_pinned_models(tmp_path))
    refused(result, ["5 models are pinned", "TTS_MAX_LOADED_MODELS is 4", "at least 5"])


def test_a_taken_wyoming_port_stops_with_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused(start(tmp_path, wyoming_port=str(port)), ["TTS_WYOMING_PORT", f"127.0.0.1:{port}"])


def refused(result: subprocess.CompletedProcess, words: list[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "cannot start:" in line]
    assert len(lines) == 1 and all(word in lines[0] for word in words), output[-3000:]
