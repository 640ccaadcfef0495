"""Jobs and batch submission on real server processes with the real voice."""

import io
import json
import time
import zipfile

import httpx
import pytest

from bench.server import start_server
from tests.audio_check import decode
from tests.serve import wait_until

pytestmark = pytest.mark.slow  # servers, browsers or clusters: the full run only (see pytest.ini)

TOKEN = "jobs-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def body(text: str, **extra) -> dict:
    return {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav", **extra}


def key(base_url: str, name: str, tier: str = "pro") -> dict:
    created = httpx.post(f"{base_url}/admin/api/keys", headers=ADMIN, json={"name": name, "tier": tier}).json()
    return {"Authorization": f"Bearer {created['key']}"}


def finished(base_url: str, job_id: str, headers: dict, timeout: float = 60) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = httpx.get(f"{base_url}/v1/audio/jobs/{job_id}", headers=headers).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {job}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = start_server(tmp_path_factory.mktemp("jobs"), admin_token=TOKEN, calibration_sizes="1",
                           operator_defaults=json.dumps({"anonymous_tier": "enterprise"}))
    yield process.base_url
    process.stop()


def test_submit_poll_fetch_and_the_audio_is_speech_of_the_right_length(server):
    submitted = httpx.post(f"{server}/v1/audio/jobs", json=body("A job runs in the background."))
    assert submitted.status_code == 202 and submitted.headers["location"].endswith(submitted.json()["id"])
    job = finished(server, submitted.json()["id"], {})
    assert job["status"] == "succeeded" and job["attempts"] == 1 and job["timings"]["run_s"] > 0
    audio = httpx.get(f"{server}{job['audio_url']}")
    samples, rate = decode(audio.content, "wav")
    assert audio.headers["content-type"] == "audio/wav"
    assert samples.size / rate == pytest.approx(job["audio_s"], abs=0.05)
    assert 1.0 < job["audio_s"] < 4.0


def test_each_key_sees_only_its_own_jobs(server):
    alice, bob = key(server, "alice"), key(server, "bob")
    mine = httpx.post(f"{server}/v1/audio/jobs", headers=alice, json=body("Alice's job.")).json()
    theirs = httpx.post(f"{server}/v1/audio/jobs", headers=bob, json=body("Bob's job.")).json()
    listed = {job["id"] for job in httpx.get(f"{server}/v1/audio/jobs", headers=alice).json()["data"]}
    assert mine["id"] in listed and theirs["id"] not in listed
    assert httpx.get(f"{server}/v1/audio/jobs/{theirs['id']}", headers=alice).status_code == 404
    assert httpx.get(f"{server}/v1/audio/jobs/{theirs['id']}/audio", headers=alice).status_code == 404
    assert httpx.delete(f"{server}/v1/audio/jobs/{theirs['id']}", headers=alice).status_code == 404
    assert finished(server, theirs["id"], bob)["status"] == "succeeded"


def test_cancel_a_queued_job_and_a_finished_one_cannot_be(server):
    many = [httpx.post(f"{server}/v1/audio/jobs", json=body(f"Job number {n} waits its turn in the queue."))
            .json()["id"] for n in range(12)]
    last = many[-1]
    cancelled = httpx.delete(f"{server}/v1/audio/jobs/{last}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert finished(server, last, {})["status"] == "cancelled"
    assert httpx.get(f"{server}/v1/audio/jobs/{last}/audio").json()["error"]["code"] == "job_not_ready"
    done = finished(server, many[0], {})
    assert httpx.delete(f"{server}/v1/audio/jobs/{done['id']}").status_code == 409


@pytest.mark.parametrize("bad, param", [({"voice": "nobody"}, "voice"), ({"speed": 9}, "speed"),
                                        ({"stream": True}, "stream")])
def test_a_bad_job_is_refused_at_once(server, bad, param):
    refused = httpx.post(f"{server}/v1/audio/jobs", json=body("Hello.", **bad))
    assert refused.status_code == 400 and refused.json()["error"]["param"] == param


def test_batch_answers_per_item_in_a_zip(server):
    items = [body("The first item."), body("   "), body("The third item.", response_format="mp3"),
             {"model": "tts-1", "input": "no voice"}, body("Fifth.", voice="nobody")]
    answer = httpx.post(f"{server}/v1/audio/speech/batch", json={"items": items}, timeout=60)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(answer.content))
    manifest = {item["index"]: item for item in json.loads(archive.read("manifest.json"))["items"]}
    assert manifest[0]["file"] == "item-000.wav" and manifest[2]["file"] == "item-002.mp3"
    assert manifest[1]["error"]["param"] == "input" and manifest[3]["error"]["param"] == "voice"
    assert manifest[4]["error"]["code"] == "voice_not_found"
    samples, rate = decode(archive.read("item-002.mp3"), "mp3")
    assert samples.size / rate == pytest.approx(manifest[2]["audio_s"], abs=0.1)


def test_batch_as_jobs_and_its_limits(server):
    answer = httpx.post(f"{server}/v1/audio/speech/batch", json={"mode": "jobs", "items": [
        body("One as a job."), body("Two", speed=0)]})
    assert answer.status_code == 202
    data = answer.json()["data"]
    assert data[0]["job"]["status"] == "queued" and data[1]["error"]["param"] == "speed"
    assert finished(server, data[0]["job"]["id"], {})["status"] == "succeeded"
    too_many = httpx.post(f"{server}/v1/audio/speech/batch", json={"items": [body("x")] * 33})
    assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "too_many_items"


def test_expired_results_answer_410(tmp_path):
    process = start_server(tmp_path, calibration_sizes="1", result_ttl_s="1")
    try:
        job = httpx.post(f"{process.base_url}/v1/audio/jobs", json=body("Soon gone.")).json()
        assert finished(process.base_url, job["id"], {})["status"] == "succeeded"
        assert wait_until(lambda: httpx.get(f"{process.base_url}/v1/audio/jobs/{job['id']}/audio").status_code == 410,
                          10)
        gone = httpx.get(f"{process.base_url}/v1/audio/jobs/{job['id']}/audio").json()["error"]
        assert gone["code"] == "job_expired" and "expired" in gone["message"]
        expired = httpx.get(f"{process.base_url}/v1/audio/jobs/{job['id']}").json()
        assert expired["expired"] is True and expired["request"]["characters"] == len("Soon gone.")
        assert not list((tmp_path / "results").glob("*.wav"))
    finally:
        process.stop()


def test_sigkill_with_jobs_queued_and_running_loses_and_duplicates_nothing(tmp_path):
    # at the kill, two run (job_concurrency 2) and three wait
    texts = [f"Job {n} of the crash test says its number, {n}, and a few more words." for n in range(5)]
    # one replica id across the restart: its jobs left running are queued again at start-up, not a lease later
    settings = dict(calibration_sizes="1", piper_noise_scale="0", piper_noise_w="0", job_concurrency="2",
                    replica_id="crash-test")
    process = start_server(tmp_path, **settings)
    submitted = [httpx.post(f"{process.base_url}/v1/audio/jobs", json=body(text)) for text in texts]
    assert all(answer.status_code == 202 for answer in submitted), [answer.text for answer in submitted]
    ids = [answer.json()["id"] for answer in submitted]
    assert wait_until(lambda: any(job["status"] == "running" for job in
                                  httpx.get(f"{process.base_url}/v1/audio/jobs").json()["data"]), 30)
    process.process.kill()  # SIGKILL: no shutdown, jobs left queued and running
    process.process.wait()
    process = start_server(tmp_path, **settings)
    try:
        jobs = [finished(process.base_url, job_id, {}, timeout=120) for job_id in ids]
        assert [job["status"] for job in jobs] == ["succeeded"] * len(ids)
        listed = [job["id"] for job in httpx.get(f"{process.base_url}/v1/audio/jobs").json()["data"]]
        assert sorted(listed) == sorted(ids)  # none lost, none duplicated
        assert len(list((tmp_path / "results").glob("*.wav"))) == len(ids)
        for text, job in zip(texts, jobs):  # the right audio: as long as the same text spoken directly
            direct = httpx.post(f"{process.base_url}/v1/audio/speech", json=body(text), timeout=60)
            assert job["audio_s"] == pytest.approx(float(direct.headers["x-chorus-audio-duration"]), abs=0.05)
    finally:
        process.stop()


def test_tiers_and_rate_limits_apply_to_job_submission(server):
    free = key(server, "free caller", tier="free")  # a caller of the free tier, with a limit of its own
    too_long = httpx.post(f"{server}/v1/audio/jobs", headers=free, json=body("word " * 250))
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "tier_text_limit"
    answers = [httpx.post(f"{server}/v1/audio/jobs", headers=free, json=body(f"Job {n}.")) for n in range(10)]
    assert [answer.status_code for answer in answers].count(202) == 9  # free: 10 a minute, one spent above
    limited = answers[-1]
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) > 0
