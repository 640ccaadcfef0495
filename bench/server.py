"""Start a real Chorus server process on 127.0.0.1 (used by the benchmarks and the tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerProcess:
    process: subprocess.Popen
    base_url: str
    log_path: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# Load generators and tests send far more than a free tier allows; unless a caller says otherwise,
# anonymous callers of these servers get the unlimited tier.
UNLIMITED_ANONYMOUS = '{"anonymous_tier": "enterprise"}'


def start_server(data_dir: Path, ready_timeout_s: float = 180, wrapper: Sequence[str] = (), **settings: str
                 ) -> ServerProcess:
    """`python app.py` with TTS_<KEY>=value for each setting (run by `wrapper`, a command that runs another, if
    given); returns once /ready answers 200."""
    data_dir.mkdir(parents=True, exist_ok=True)
    settings.setdefault("operator_defaults", UNLIMITED_ANONYMOUS)
    port = free_port()
    env = {**os.environ, "TTS_HOST": "127.0.0.1", "TTS_PORT": str(port), "TTS_DATA_DIR": str(data_dir),
           "TTS_LOG_LEVEL": "warning", "GRADIO_ANALYTICS_ENABLED": "False",
           **{f"TTS_{key.upper()}": str(value) for key, value in settings.items()}}
    return _start([*wrapper, sys.executable, "app.py"], env, port, data_dir, ready_timeout_s)


def start_ray_peer(data_dir: Path, voice: str, voices_file: Path | None = None,
                   ready_timeout_s: float = 300) -> ServerProcess:
    """`python -m bench.ray_peer` (the same engine behind Ray Serve); returns once /ready answers 200."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, "-m", "bench.ray_peer", "--port", str(port), "--voice", voice,
               *(["--voices-file", str(voices_file)] if voices_file else [])]
    return _start(command, {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, port, data_dir, ready_timeout_s)


def start_kokoro_fastapi(data_dir: Path, source: Path, python: str, models: Path, voices: Path, gpu: bool,
                         ready_timeout_s: float = 300) -> ServerProcess:
    """Kokoro-FastAPI from its own source folder (run by `python`, an environment with its packages: see
    docs/benchmarking.md), serving the Kokoro model in `models/v1_0` and the packs in `voices`, on the GPU or not."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "MODEL_DIR": str(models), "VOICES_DIR": str(voices), "USE_GPU": str(gpu).lower(),
           "ENABLE_WEB_PLAYER": "false", "TEMP_FILE_DIR": str(data_dir / "temp")}
    return _start([python, "-m", "uvicorn", "api.src.main:app", "--host", "127.0.0.1", "--port", str(port),
                   "--log-level", "warning"], env, port, data_dir, ready_timeout_s, cwd=source, ready_path="/health")


def _start(command: list[str], env: dict, port: int, data_dir: Path, ready_timeout_s: float, cwd: Path = ROOT,
           ready_path: str = "/ready?calibrated=true") -> ServerProcess:
    log_path = data_dir / "server.log"
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    server = ServerProcess(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            # calibrated: measurements (and tests of batching) start with the batchers' sweeps done
            if httpx.get(f"{server.base_url}{ready_path}", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"server not ready within {ready_timeout_s} s:\n{log_path.read_text()}")
