"""Registry reloads while requests flow: valid voices keep answering 200, nothing raises in the log."""

import shutil
import threading

import httpx
import pytest

from bench.server import start_server
from tts_core.engines.piper import bundled_voice_path

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "reload-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def reloading_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reload")
    source = bundled_voice_path()
    for name in ("steady", "coming-and-going"):  # two copies of the bundled voice: two models
        shutil.copy(source, folder / f"{name}.onnx")
        shutil.copy(source.with_name(source.name + ".json"), folder / f"{name}.onnx.json")
    process = start_server(folder / "data", voices_file=str(write_registry(folder, extra=False)),
                           admin_token=TOKEN, calibration_sizes="1", max_loaded_models="3")
    yield process, folder
    process.stop()


def write_registry(folder, extra: bool):
    lines = ["voices:", f"  steady-joe: {{engine: piper, model: '{folder / 'steady.onnx'}', pinned: true}}"]
    if extra:
        lines.append(f"  extra-joe: {{engine: piper, model: '{folder / 'coming-and-going.onnx'}', pinned: true}}")
    path = folder / "voices.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reloads_under_concurrent_traffic_never_fail_a_valid_voice(reloading_server):
    process, folder = reloading_server
    base = process.base_url
    failures: list[str] = []
    answered = {"count": 0}
    stop = threading.Event()

    def traffic(voice: str, n: int) -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                body = {"model": "tts-1", "voice": voice, "input": f"Still here {n}.", "response_format": "wav"}
                response = client.post(f"{base}/v1/audio/speech", json=body)
                answered["count"] += 1
                if response.status_code != 200:
                    failures.append(f"{voice}: {response.status_code} {response.text[:200]}")

    threads = [threading.Thread(target=traffic, args=(voice, n))
               for n, voice in enumerate(["steady-joe", "alloy", "steady-joe", "en_US-joe-medium"])]
    for thread in threads:
        thread.start()
    try:
        for round_ in range(12):  # the extra model comes and goes; the others stay
            write_registry(folder, extra=round_ % 2 == 0)
            reload = httpx.post(f"{base}/admin/api/voices/reload", headers=ADMIN, timeout=120)
            assert reload.status_code == 200, reload.text
            assert ("extra-joe" in reload.json()["voices"]) == (round_ % 2 == 0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert answered["count"] >= 12 and not failures, failures[:5]
    log = process.log_path.read_text()
    assert "Traceback" not in log and "changed size during iteration" not in log
