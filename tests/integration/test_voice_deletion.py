"""A cloned voice deleted through the API while requests in it run and wait (issue 44, case 1), on a real server
with the tiny random Pocket TTS: the running requests finish in their voice, one still waiting is refused with a
400 voice_not_found, and the model goes on for everyone else. Before, every turn raised and the model stalled
(the others got 504s after 120 s)."""

import threading

import httpx
import pytest

from bench.server import start_server
from tests.audio_check import decode
from tests.integration.test_voice_cloning import TEXT, caller, clip, clone, speak, speech  # noqa: F401 (a fixture)
from tests.pocket_models import build_tiny_pocket
from tests.serve import wait_until

pytestmark = pytest.mark.slow  # a server

LONG = ("sentence goes on without a stop so that the tiny model makes frames for a while, and its voice is deleted "
        "while it is made")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deletion")
    pocket = build_tiny_pocket(folder / "tiny-pocket")
    registry = folder / "voices.yaml"
    registry.write_text(f"voices:\n  pocket: {{engine: pocket_tts, model: '{pocket}', fixed_length: true, "
                        "max_running: 2}\n")
    process = start_server(folder / "data", voices_file=str(registry), device="cpu", calibration_sizes="1",
                           trusted_proxies="127.0.0.1", torch_threads="1",
                           operator_defaults='{"anonymous_tier": "enterprise", "queue_wait_target_s": 600}')
    yield process
    process.stop()


def model_status(base: str) -> dict:
    return httpx.get(f"{base}/api/v1/batch/status", timeout=30).json()["engines"]["tiny-pocket"]


def test_deleting_a_voice_while_its_requests_run_and_wait_stalls_nobody(server, speech):  # noqa: F811
    base, owner = server.base_url, caller(1)
    assert clone(base, clip(speech, 6.0), "alice", owner, text=TEXT).status_code == 201
    answers: dict[str, httpx.Response] = {}

    def ask(name: str, voice: str, text: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.__setitem__(name, speak(base, voice, owner, text)))
        thread.start()
        return thread
    asking = [ask("long-1", "alice", f"The first {LONG}"), ask("long-2", "alice", f"The second {LONG}")]
    assert wait_until(lambda: model_status(base)["running"] == 2, timeout_s=60, every_s=0.01)
    asking += [ask("waiting-alice", "alice", "Hello."), ask("waiting-other", "pocket", "Hello there.")]
    assert wait_until(lambda: model_status(base)["queue_length"] >= 2 or "long-1" in answers, timeout_s=30,
                      every_s=0.01)
    running_at_delete = model_status(base)["running"]
    deleted = httpx.delete(f"{base}/v1/audio/voices/alice", headers=owner, timeout=60)
    assert deleted.status_code == 200, deleted.text
    for thread in asking:
        thread.join(120)
    assert running_at_delete >= 1  # the voice went while requests in it ran
    for name in ("long-1", "long-2", "waiting-other"):
        assert answers[name].status_code == 200, answers[name].text
        assert decode(answers[name].content, "wav")[0].size > 0
    waiting = answers["waiting-alice"]  # refused alone if it still waited, or made in its voice if it had begun
    assert waiting.status_code == 200 or (waiting.status_code == 400
                                          and waiting.json()["error"]["code"] == "voice_not_found"), waiting.text
    after = speak(base, "pocket", owner, "And the model goes on.")
    assert after.status_code == 200
    assert speak(base, "alice", owner).json()["error"]["code"] == "voice_not_found"
    assert model_status(base)["turn_failures"] == 0
