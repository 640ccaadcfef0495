"""Dialogue jobs (POST /v1/audio/dialogue/jobs) on real server processes with the real bundled Piper voice: progress
per turn, one recording as long as its turns and pauses, its captions by speaker, the refusals at submission, and a
job of 50 turns that survives the server's SIGKILL."""

import json
import random

import httpx
import pytest

from bench.server import start_server
from tests.audio_check import decode
from tests.integration.test_jobs import TOKEN, finished, key
from tests.serve import wait_until
from tts_core.request.dialogue import SAME_SPEAKER_PAUSE_S, SPEAKER_CHANGE_PAUSE_S

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

VOICES = {"Ann": "alloy", "Bob": "echo"}
LINES = ["The train was late again.", "Then we walked to the old bridge.", "I would go back tomorrow.",
         "Did you see the lake?", "Yes, and the hills behind it."]
DETERMINISTIC = {"piper_noise_scale": "0", "piper_noise_w": "0"}  # the same text, the same length, every time


def script_of(turns: int, seed: int = 5) -> list[tuple[str, str]]:
    """`turns` turns of the LINES, by Ann and Bob in an order with both changes of speaker and runs of one."""
    chooser = random.Random(seed)
    return [(chooser.choice(["Ann", "Bob"]), LINES[index % len(LINES)]) for index in range(turns)]


def written(turns: list[tuple[str, str]]) -> str:
    return "\n".join(f"{speaker}: {text}" for speaker, text in turns)


def pauses_s(turns: list[tuple[str, str]]) -> float:
    return sum(SAME_SPEAKER_PAUSE_S if before[0] == turn[0] else SPEAKER_CHANGE_PAUSE_S
               for before, turn in zip(turns, turns[1:]))


def job_of(base_url: str, job_id: str) -> dict:
    return httpx.get(f"{base_url}/v1/audio/jobs/{job_id}").json()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = start_server(tmp_path_factory.mktemp("dialogue-jobs"), admin_token=TOKEN, calibration_sizes="1",
                           operator_defaults=json.dumps({"anonymous_tier": "enterprise"}), **DETERMINISTIC)
    yield process.base_url
    process.stop()


def test_a_dialogue_job_answers_one_recording_and_its_captions_by_speaker(server):
    turns = script_of(4)
    submitted = httpx.post(f"{server}/v1/audio/dialogue/jobs", json={
        "script": written(turns), "voices": VOICES, "response_format": "wav", "captions": True})
    assert submitted.status_code == 202, submitted.text
    assert submitted.json()["progress"] == {"turns_done": 0, "turns": 4}
    assert submitted.headers["location"] == f"/v1/audio/jobs/{submitted.json()['id']}"
    job = finished(server, submitted.json()["id"], {})
    assert job["status"] == "succeeded" and job["progress"] == {"turns_done": 4, "turns": 4}
    samples, rate = decode(httpx.get(f"{server}{job['audio_url']}").content, "wav")
    assert samples.size / rate == pytest.approx(job["audio_s"], abs=0.01)
    captions = httpx.get(f"{server}{job['captions_url']}").json()
    assert [turn["speaker"] for turn in captions["turns"]] == [speaker for speaker, _ in turns]
    assert captions["turns"][-1]["end"] == pytest.approx(job["audio_s"], abs=0.01)
    assert {word["speaker"] for word in captions["words"]} == {speaker for speaker, _ in turns}
    srt = httpx.get(f"{server}{job['captions_url']}", params={"timestamps_format": "srt"})
    assert srt.headers["content-type"].startswith("application/x-subrip")
    assert f"{turns[0][0]}: {turns[0][1].split()[0]}" in srt.text


def test_a_job_without_captions_has_none_to_fetch(server):
    job = httpx.post(f"{server}/v1/audio/dialogue/jobs", json={"script": "Ann: Hi.\nBob: Hello.", "voices": VOICES,
                                                               "response_format": "mp3"}).json()
    assert finished(server, job["id"], {})["captions_url"] is None
    missing = httpx.get(f"{server}/v1/audio/jobs/{job['id']}/captions")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "job_id"


@pytest.mark.parametrize("body, code, named", [
    ({"script": "Ann: Hi.\nCid: Who?"}, "unknown_speaker", "line 2"),
    ({"script": "Ann: Hi.\nBob:  "}, "invalid_dialogue", "line 2"),
    ({"script": "Ann: Hi.", "stream": True}, "unsupported_value", "streamed"),
    ({"script": "Ann: Hi.", "voices": {"Ann": "nobody"}}, "voice_not_found", "voices['Ann']"),
])
def test_a_bad_dialogue_job_is_refused_at_once_naming_what(server, body, code, named):
    refused = httpx.post(f"{server}/v1/audio/dialogue/jobs", json={"voices": VOICES, **body})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == code
    assert named in refused.json()["error"]["message"]


def test_the_tier_limit_counts_the_script_text(server):
    free = key(server, "free dialogue caller", tier="free")
    short_turns = written([("Ann", "word " * 20)] * 15)  # no turn is long; the script is
    too_long = httpx.post(f"{server}/v1/audio/dialogue/jobs", headers=free,
                          json={"script": short_turns, "voices": VOICES})
    assert too_long.status_code == 400, too_long.text
    assert too_long.json()["error"]["code"] == "tier_text_limit" and too_long.json()["error"]["param"] == "script"


def test_a_50_turn_job_survives_a_sigkill_and_ends_with_one_recording_of_its_turns_and_pauses(tmp_path):
    turns = script_of(50)
    # one replica id across the restart: the job it left running is queued again at start-up, not a lease later
    # and every text in whole sentences: a request's first passage is cut at its clauses, whole or streamed (a line
    # spoken alone would be, its turn later in the dialogue not, nor the first turn the job makes after the restart)
    settings = dict(calibration_sizes="1", replica_id="crash-test", stream_first_chunk_chars="0", **DETERMINISTIC)
    process = start_server(tmp_path, **settings)
    try:
        said = {text: float(httpx.post(f"{process.base_url}/v1/audio/speech", timeout=60, json={
            "model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav"}).headers[
            "x-chorus-audio-duration"]) for text in LINES}  # each line spoken alone, its length
        job = httpx.post(f"{process.base_url}/v1/audio/dialogue/jobs", json={
            "script": written(turns), "voices": VOICES, "response_format": "wav"}).json()
        progress = []
        assert wait_until(lambda: progress.append(job_of(process.base_url, job["id"])) or
                          0 < progress[-1]["progress"]["turns_done"] < 50, 120), progress[-1]
        assert progress[-1]["status"] == "running"
    finally:
        process.process.kill()  # SIGKILL: no shutdown, the job left running with some of its turns made
        process.process.wait()
    process = start_server(tmp_path, **settings)  # the same data dir: the same database and results folder
    try:
        done = finished(process.base_url, job["id"], {}, timeout=300)
        assert done["status"] == "succeeded" and done["attempts"] == 2, done
        assert done["progress"] == {"turns_done": 50, "turns": 50}
        samples, rate = decode(httpx.get(f"{process.base_url}{done['audio_url']}").content, "wav")
        expected = sum(said[text] for _, text in turns) + pauses_s(turns)
        assert samples.size / rate == pytest.approx(expected, abs=0.05)
    finally:
        process.stop()
